"""The `ropebench` command: one entry point, a subcommand per job. Each subcommand hands the rest of the
command line to the CLI that owns the job and returns its exit code (bad input: one `error: ...` line, 2):

    ropebench sweep ...        the sweep (ropebench.sweep_lib; also `python scripts/sweep.py`)
    ropebench report ...       reports and tables from run directories (`ropebench report|table`)
    ropebench inspect ...      a model's RoPE per layer type (`ropebench inspect`)
    ropebench lm-eval ...      lm-eval with the `ropebench` model and ropebench's tasks registered
                               (`python -m ropebench.integrations.lm_eval`: the same, without the task
                               folder)
    ropebench bench ...        the speed and memory benchmarks (`python -m ropebench.benchmarks`)
    ropebench export ...       a setting in the form transformers, vLLM or llama.cpp reads (docs/export.md)

    ropebench help COMMAND     that command's help (`ropebench COMMAND --help`)

Each subcommand imports its package only when it runs: `ropebench --help` loads no torch. No command at
all is a usage error (one line, exit 2).
"""

from __future__ import annotations

import difflib
import os
import sys


def _sweep(argv: list[str]) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the sweep forks data loaders after tokenizing
    from .sweep_lib import main

    return main(argv)


def _report(argv: list[str]) -> int:
    from ropebench.results.__main__ import main

    # `ropebench report RUN_DIR ...` is `ropebench report RUN_DIR ...`; `report table ...` is
    # `ropebench report table ...`
    return main(argv if argv[:1] == ["table"] else ["report", *argv])


def _inspect(argv: list[str]) -> int:
    from ropebench.extend.__main__ import main

    return main(["inspect", *argv])


def _lm_eval(argv: list[str]) -> int:
    from ropebench.integrations.lm_eval import main
    from ropebench.tasks.lm_eval_export import (
        OUT_DIR,  # the task folder: the core is handed it, never looks up for it
    )

    return main(argv, tasks_dir=OUT_DIR)


def _export(argv: list[str]) -> int:
    from .export_cli import main

    return main(argv)


def _bench(argv: list[str]) -> int:
    from ropebench.benchmarks.cli import main

    return main(argv)


# name -> (what it does, in one line; the function that runs it)
SUBCOMMANDS = {
    "sweep": ("run a grid of model x method x factor x task x length into a run directory", _sweep),
    "report": (
        "write report.md, tables/ and plots/ for run directories (`report table ...`: one table to stdout)",
        _report,
    ),
    "inspect": ("show a model's RoPE per layer type and what a method would change (config only)", _inspect),
    "lm-eval": ("run lm-eval's CLI with the `ropebench` model and ropebench's tasks registered", _lm_eval),
    "bench": ("measure speed and memory per method (BENCHMARKS.md in a checkout)", _bench),
    "export": ("write a RoPE setting as an engine's config (transformers, vllm, llama.cpp)", _export),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [
        "usage: ropebench COMMAND [ARGS ...]    (`ropebench help COMMAND`: that command's options)",
        "",
        "commands:",
    ]
    lines += [f"  {name:<{width}}  {about}" for name, (about, _) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def _usage_error(message: str, hint: str = "") -> int:
    """A command line without a known command: one line, exit 2."""
    print(
        f"error: {message} — {hint}the commands are {', '.join(SUBCOMMANDS)} (`ropebench --help`)",
        file=sys.stderr,
    )
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        return _usage_error("no command given: ropebench COMMAND [ARGS ...]")
    if argv[0] in ("-h", "--help") or argv == ["help"]:
        print(usage())
        return 0
    if argv[0] == "help":  # `ropebench help sweep` is `ropebench sweep --help`
        argv = [argv[1], "--help"]
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f"did you mean `ropebench {close[0]}`? " if close else ""
        return _usage_error(f"unknown command {name!r}", hint)
    code = SUBCOMMANDS[name][1](rest)
    return 0 if code is None else code


if __name__ == "__main__":  # `python -m ropebench.cli ...` (the console script is `ropebench`)
    sys.exit(main())
