"""The command line: flags, the config they make, and `main(argv) -> exit code` — the one place that turns a
RopebenchError (bad input anywhere in ropebench) into one line `error: ...` and exit 2."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ropebench.extend.errors import RopebenchError

from .config import DEMO_CONFIG, ConfigError, config_path, merge_cli, read_yaml
from .resolve import resolve

# The flags that change the grid: with any of them and no --config, the demo's grid is not the demo any more.
GRID_FLAGS = (
    "model",
    "methods",
    "factors",
    "lengths",
    "tasks",
    "corpus",
    "seed",
    "dtype",
    "option",
    "task_option",
    "plugin",
)


class UsageError(ConfigError):
    pass


class _Once(argparse.Action):
    """A list flag given twice is an error (argparse would keep only the last: `--methods plain --methods
    yarn` ran yarn alone)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            raise UsageError(
                f"{option_string} is given twice — give it once (a list: every value after one "
                f"{option_string}, e.g. {option_string} a b)"
            )
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the whole usage first)
        raise UsageError(f"{message} — run `ropebench sweep --help` for usage")


def parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ropebench sweep",
        description=(
            "Grid of model x method x factor x task x lengths for RoPE context extension. Without arguments "
            "runs the embedded demo (the shipped config `demo`); with --config FILE the file is the base, "
            "flags override it."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n  ropebench sweep\n  ropebench sweep --config llama2-7b-gpu     # a shipped config\n"
            "  ropebench sweep --methods plain yarn --factors 2 4 --tasks perplexity --lengths 2048 8192\n"
            "  accelerate launch -m ropebench.sweep --config my.yaml   # one share of the cells per process\n"
            "(python -m ropebench.sweep ... is the same command)\n"
        ),
    )
    p.add_argument(
        "--config",
        action=_Once,
        help="YAML config file, or a shipped config's name (default: demo; also demo-remap, llama2-7b-gpu)",
    )
    p.add_argument(
        "--model", nargs="+", action=_Once, help="model spec(s): hub id, local dir, .gguf file, smollm2-135m"
    )
    p.add_argument("--methods", nargs="+", action=_Once, help="RoPE methods (space or comma separated)")
    p.add_argument("--factors", nargs="+", action=_Once, help="scale factors")
    p.add_argument(
        "--lengths", nargs="+", action=_Once, help="context lengths for every task (e.g. 2048 4096 8k)"
    )
    p.add_argument(
        "--tasks", nargs="+", action=_Once, help="tasks: perplexity passkey classification retrieval"
    )
    p.add_argument(
        "--corpus", nargs="+", action=_Once, help="corpus name(s): sotu, pg19, proof-pile, hub id, path"
    )
    p.add_argument("--out", action=_Once, help="run directory (rerun with the same --out to resume)")
    p.add_argument("--seed", action=_Once, help="random seed (an integer >= 0)")
    p.add_argument("--device", action=_Once, help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", action=_Once, help="float32, bfloat16, float16 or auto")
    p.add_argument(
        "-o",
        "--option",
        action="append",
        metavar="[METHOD.]KEY=VALUE",
        help="method option, e.g. yarn.beta_fast=16 (without METHOD: every method that takes KEY); VALUE as "
        "in a config file: 16k, 1e5, true, none, [1, 2], 'quoted text' (docs/sweeps.md)",
    )
    p.add_argument(
        "-t",
        "--task-option",
        action="append",
        metavar="TASK.KEY=VALUE",
        help="task option, e.g. passkey.trials=4 or perplexity.num_docs=2",
    )
    p.add_argument(
        "--plugin", action="append", help="module or .py file to import first (registers methods/tasks)"
    )
    p.add_argument("--trust-remote-code", action="store_true", help="allow models that ship their own code")
    p.add_argument("--fresh", action="store_true", help="delete this run directory's previous results first")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument(
        "--dry-run", action="store_true", help="list the cells (and which are finished), run nothing"
    )
    return p


def load_config(args) -> dict:
    """The config file (default: the demo) with the flags over it, resolved (shape and types; names later)."""
    source = str(config_path(args.config)) if args.config else str(DEMO_CONFIG)
    base = read_yaml(source)
    if not args.config and not args.out and any(getattr(args, f) is not None for f in GRID_FLAGS):
        base["out"] = "runs/sweep"  # a changed demo grid does not go into (and mix with) runs/demo
    cfg = resolve(merge_cli(base, args), source=source)
    cfg["config_file"] = str(Path(source).resolve())
    return cfg


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {' '.join(str(message).split())}", file=file or sys.stderr)


def main(argv: list[str] | None = None, *, report: bool = True) -> int:
    """`ropebench sweep ARGV`; `report=False`: records only (see orchestrate.sweep)."""
    import warnings

    shown = warnings.showwarning
    warnings.showwarning = _one_line_warning  # e.g. damaged records: one line each
    try:
        args = parser().parse_args(argv)  # --help exits here: the sweep's imports (torch) come after
        from .orchestrate import sweep

        # shape errors fail in load_config, before anything is checked
        return sweep(args, load_config(args), report=report)
    except KeyboardInterrupt:
        print("interrupted — finished cells are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    except RopebenchError as e:  # bad input (exit 2), or a failed disk write (WriteFailure, exit 1)
        print(f"error: {' '.join(str(e).split()) or type(e).__name__}", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    finally:
        warnings.showwarning = shown
