"""The benchmarks' one entry point: `ropebench bench NAME [ARGS]`, or `ropebench bench NAME [ARGS]`
(which calls `main`). NAME picks the module that owns the benchmark and ARGS go to it unchanged
(`ropebench bench NAME --help`: its options). Bad input prints one line `error: ...`, exit code 2.

    ropebench bench run                    # full: lengths 1k..16k, 3 repeats -> benchmarks/BENCHMARKS.md
    ropebench bench run --quick            # CI smoke run (tiny lengths, 1 repeat) -> BENCHMARKS.quick.md
    ropebench bench prefix                 # only the prefix-cache section (= run --only prefix-sharing)
    ropebench bench report benchmarks/BENCHMARKS.json --demo-seconds 501   # re-render (run --from-json)
    ropebench bench cpu-dtype --tokens 256 --rounds 1                      # a few seconds

One-off probes (investigations NOTES.md quotes) are not subcommands:
`python -m ropebench.benchmarks.probes.NAME`.
Importing this module loads nothing heavy: a benchmark's module is imported when it runs.
"""

from __future__ import annotations

import difflib
import importlib
import sys
from pathlib import Path

from ropebench.benchmarks.errors import BenchmarkError, exit_code

PROG = "python -m ropebench.benchmarks"
EXAMPLE_JSON = "benchmarks/BENCHMARKS.json"


def _report_args(rest: list[str]) -> list[str]:
    if rest[:1] in (["-h"], ["--help"]):
        return ["--help"]
    if not rest or rest[0].startswith("-"):
        raise BenchmarkError(
            f"report needs the saved run first — e.g. `{PROG} report {EXAMPLE_JSON} --demo-seconds 501`"
        )
    return ["--from-json", *rest]


# name -> (module, what it does in one line, how its arguments reach the module's main)
COMMANDS = {
    "run": (
        "ropebench.benchmarks.run",
        (
            "ropebench vs the naive way and lm-eval -> BENCHMARKS.md (--quick: a smoke run; "
            "--estimate: the plan only)"
        ),
        list,
    ),
    "prefix": (
        "ropebench.benchmarks.run",
        "only the prefix-cache section (issue 15) of BENCHMARKS.md (= run --only prefix-sharing)",
        lambda rest: ["--only", "prefix-sharing", *rest],
    ),
    "report": (
        "ropebench.benchmarks.run",
        "re-render a finished run's report from its JSON, e.g. to add --demo-seconds (= run --from-json)",
        _report_args,
    ),
    "cpu-dtype": (
        "ropebench.benchmarks.cpu_dtype",
        "bf16 vs fp32 speed on this CPU at SmolLM2-135M's shapes (what picks the CPU default dtype)",
        list,
    ),
    "remap-cost": (
        "ropebench.benchmarks.remap_cost",
        "cost and effect of the position-remapping methods (Self-Extend, ReRoPE, DCA) at 16k",
        list,
    ),
    "longppl-cost": (
        "ropebench.benchmarks.longppl_cost",
        "what LongPPL (key_tokens) and loss by position cost next to the bare perplexity pass",
        list,
    ),
    "longppl-bias": (
        "ropebench.benchmarks.longppl_bias",
        "LongPPL's evaluator bias by the swap test: plain (evaluator self) vs a method as evaluator",
        list,
    ),
    "llamacpp-parity": (
        "ropebench.benchmarks.llamacpp_parity",
        "llama.cpp (llama-cpp-python: --llama-python) vs ropebench: perplexity ratio to plain per method",
        list,
    ),
    "retrieval-sharing": (
        "ropebench.benchmarks.retrieval_sharing",
        "the retrieval task with vs without haystack sharing (--tiny: a smoke run in seconds)",
        list,
    ),
    "shape-check": (
        "ropebench.benchmarks.shape_check",
        "sanity check of the core at 16k: each method's loss on the first vs the last 4k tokens",
        list,
    ),
    "gpu": (
        "ropebench.benchmarks.gpu_check",
        "the GPU check (issue 30): correctness on CUDA, long-context speed and memory (--cpu-sizes: CPU)",
        list,
    ),
    "wheels": (
        "ropebench.benchmarks.wheels",
        "gather the wheels the GPU machine's image lacks (Python 3.12) into .device-wheels/ (<= 56 MiB)",
        list,
    ),
    "compute-floor": (
        "ropebench.benchmarks.compute_floor",
        "the demo's forward FLOPs over this CPU's measured GEMM rate, and the demo's wall as a ratio to it",
        list,
    ),
}


def probes() -> list[str]:
    return sorted(p.stem for p in (Path(__file__).parent / "probes").glob("*.py") if p.stem != "__init__")


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [
        f"usage: {PROG} NAME [ARGS ...]    (`{PROG} NAME --help`: that benchmark's options)",
        "",
        "benchmarks:",
    ]
    lines += [f"  {name:<{width}}  {about}" for name, (_, about, _) in COMMANDS.items()]
    lines += [
        "",
        f"probes (one-off investigations quoted in NOTES.md): {PROG}.probes.NAME [ARGS ...]",
        "  " + ", ".join(probes()),
    ]
    return "\n".join(lines)


def _unknown(name: str) -> str:
    probe = name.replace("-", "_")
    if probe in probes():
        return f"{name!r} is a probe, not a benchmark — run it as `{PROG}.probes.{probe}`"
    close = difflib.get_close_matches(name, COMMANDS, n=1) or difflib.get_close_matches(
        name.replace("_", "-"), COMMANDS, n=1
    )
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown benchmark {name!r} — {hint}choose one of: {', '.join(COMMANDS)} (`{PROG} --help`)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: {_unknown(name)}", file=sys.stderr)
        return 2
    module, _, arguments = COMMANDS[name]

    def run(args):
        return importlib.import_module(module).main(arguments(args))

    return exit_code(run, rest)
