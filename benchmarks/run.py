"""ropebench benchmarks: ropebench against the naive way and against lm-eval, measured in the same run.

    ropebench bench run                    # full: lengths 1k..16k, 3 repeats -> benchmarks/BENCHMARKS.md
    ropebench bench run --max-length 8192  # shorter full run (the cap is stated in the report)
    ropebench bench run --quick            # CI smoke run (tiny lengths, 1 repeat) -> BENCHMARKS.quick.md
    ropebench bench report benchmarks/BENCHMARKS.json --demo-seconds 501   # add the demo sweep's time,
        # measured on its own (`bash scripts/demo.sh` prints "sweep time N s"), to a finished run's report
        # (= run --from-json JSON ...)
    ropebench bench prefix                 # only the prefix-cache section (issue 15, float32, 8192):
        # -> BENCHMARKS.prefix.json and its section of BENCHMARKS.md, the rest of the report kept
        # (= run --only prefix-sharing)
    ropebench bench prefix --prefix-length 2048 --prefix-queries 24   # a reduced one

`python benchmarks/run.py ARGS` (the command of older docs) is `ropebench bench run ARGS`.

This file is the command line only. orchestrate.py runs the children (each in a fresh subprocess,
`ropebench bench run --child NAME ...`) and saves their JSON; report.py turns that JSON into the markdown
(a pure function); figures.py and prefix_sharing.py are what the children measure.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import tempfile
from argparse import SUPPRESS
from pathlib import Path

from ropebench.benchmarks import orchestrate, report
from ropebench.benchmarks.errors import (
    MAX_TOKENS,
    REPEATS,
    ArgumentParser,
    BenchmarkError,
    at_least,
    count,
    exit_code,
    forward_tokens,
)

HERE = Path(__file__).resolve().parent
PROG = "ropebench bench run"
FULL_LENGTHS = [1024, 2048, 4096, 8192, 16384]
# Powers of two >= 512: in bf16 the CPU attention kernel blocks these lengths alike, so a prefix of a longer
# forward is bit-identical to the shorter forward (at 256 vs 512, or 768, it is not: ~3e-3 in log ppl).
QUICK_LENGTHS = [512, 1024]
PREFIX_DEFAULTS = {
    "prefix_length": (8192, 512),
    "prefix_queries": (24, 4),
    "prefix_trials": (4, 1),
    "prefix_zero_shot_queries": (4, 2),
}  # (full, quick)


def demo_seconds(spec):
    """--demo-seconds: seconds, or a file holding them (e.g. the demo's output with its "sweep time N s")."""
    if spec is None:
        return None
    path = Path(str(spec))
    text = path.read_text() if path.is_file() else str(spec)
    found = re.search(r"\d+(\.\d+)?", text)
    if not found:
        raise BenchmarkError(
            f"--demo-seconds {spec!r}: no number found — pass seconds or a file containing them"
        )
    seconds = float(found.group())
    return int(seconds) if seconds.is_integer() else seconds


def rewrite(args) -> None:
    """Regenerate the markdown of a finished run from its JSON (numbers unchanged; --demo-seconds may be
    added)."""
    source = Path(args.from_json)
    try:
        saved = json.loads(source.read_text())
        fresh = "ours_seconds" in saved["runs"][0]["bare"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
        raise BenchmarkError(
            f"--from-json {source}: not a saved benchmark run ({e}) — pass a BENCHMARKS*.json "
            "written by `ropebench bench run`"
        ) from None
    if not fresh:
        raise BenchmarkError(f"{source} was written by an older version of the benchmark — re-run it")
    settings = saved["args"]
    if args.demo_seconds is not None:  # kept in the JSON, with how the demo row got its number
        settings["demo_seconds"] = demo_seconds(args.demo_seconds)
        saved["demo_command"] = f"ropebench bench report {source} --demo-seconds {args.demo_seconds}"
        orchestrate.save_json(source, saved)
    # older runs saved the flag as given
    settings["demo_seconds"] = demo_seconds(settings.get("demo_seconds"))
    out = Path(args.out) if args.out else source.with_suffix(".md")
    orchestrate.write_report(out, report.render(saved, orchestrate.notes_text(args.notes)))
    print(f"wrote {out}")


def resolve(args) -> Path:
    """Fill the defaults a full or --quick run implies; returns the report path (checked writable)."""
    q = args.quick
    args.lengths = sorted(set(args.lengths or (QUICK_LENGTHS if q else FULL_LENGTHS)))
    if args.max_length:
        args.lengths = [n for n in args.lengths if n <= args.max_length] or [args.max_length]
    cap = max(args.lengths)
    args.only_repeats = args.repeats or 1  # a section alone: one repeat unless asked
    args.repeats = args.repeats or (1 if q else 3)
    for name, (full, quick) in PREFIX_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    args.window = min(args.window or (256 if q else 4096), cap)
    args.rolling_tokens = args.rolling_tokens if args.rolling_tokens is not None else (1024 if q else 16384)
    args.passkey_length = min(args.passkey_length or (512 if q else 8192), cap)
    args.dtype_auto = args.dtype == "auto"
    if args.dtype_auto:
        from ropebench.extend.loading import default_dtype

        args.dtype = str(default_dtype("cpu")).removeprefix("torch.")
    if args.dtype not in ("float32", "bfloat16"):
        raise BenchmarkError(f"--dtype {args.dtype!r}: use float32, bfloat16 or auto")
    args.demo_seconds = demo_seconds(args.demo_seconds)
    if args.model_dir and not (Path(args.model_dir) / "config.json").is_file():
        raise BenchmarkError(
            f"--model-dir {args.model_dir}: no config.json there — pass a folder saved with save_pretrained "
            "(model and tokenizer), or leave it out for the embedded SmolLM2"
        )
    from ropebench.tasks.scoring import token_nll

    args.chunk = inspect.signature(token_nll).parameters["chunk_size"].default  # what the children use
    out = Path(args.out) if args.out else HERE / ("BENCHMARKS.quick.md" if q else "BENCHMARKS.md")
    if not orchestrate.is_package_file(out):  # a file the user named: new, or ropebench's and unchanged
        from ropebench.extend.owned_paths import check_loose_file

        for path in (out, out.with_suffix(".json")):
            check_loose_file(path, "--out", BenchmarkError)
    try:  # before any measuring: a report that cannot be written would lose the whole run
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out.parent, prefix=f".{out.name}.", suffix=".probe"):
            pass  # a new file of a fresh name (never one of the user's), removed on exit
    except OSError as e:
        raise BenchmarkError(
            f"cannot write the report to {out} ({e.strerror}) — pass a writable --out"
        ) from None
    return out


def prefix_trials(text: str) -> int:
    """--prefix-trials: a count up to the tasks' trial bound, read when the flag is given (the tasks load
    torch: `--help` does not)."""
    from ropebench.tasks.sizes import MAX_TRIALS, TRIAL_COST

    return count(4, MAX_TRIALS, TRIAL_COST)(text)


prefix_trials.__name__, prefix_trials.bounded = "int", True  # as at_least's checks (benchmarks/errors.py)


def parser() -> ArgumentParser:
    p = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick", action="store_true", help="CI smoke run: tiny lengths, 1 repeat, BENCHMARKS.quick.md"
    )
    p.add_argument(
        "--lengths", type=forward_tokens(4096), nargs="+", help=f"perplexity lengths (default {FULL_LENGTHS})"
    )
    p.add_argument(
        "--max-length",
        type=forward_tokens(8192),
        help="drop lengths above this (e.g. 8192 for a shorter run)",
    )
    p.add_argument("--repeats", type=REPEATS, help="runs per figure (default 3; quick: 1)")
    p.add_argument(
        "--window", type=forward_tokens(4096), help="rolling-perplexity window (default 4096; quick: 256)"
    )
    p.add_argument(
        "--rolling-tokens",
        type=at_least(0, 16384, high=MAX_TOKENS, cost="tokens of one forward"),
        help="cut the rolling document to this many tokens (default 16384; quick: 1024; 0 = whole document)",
    )
    p.add_argument(
        "--passkey-length", type=forward_tokens(8192), help="passkey prompt length (default 8192; quick: 512)"
    )
    p.add_argument(
        "--dtype", default="auto", help="float32, bfloat16 or auto (default: extend.load's CPU default)"
    )
    p.add_argument("--demo-seconds", help="demo sweep wall time: seconds, or a file holding them")
    p.add_argument("--notes", default=str(HERE / "NOTES.md"), help="markdown appended as '## Notes'")
    p.add_argument(
        "--out",
        help="report path (default benchmarks/BENCHMARKS.md; quick: BENCHMARKS.quick.md; "
        "with --from-json: the JSON's name with .md)",
    )
    p.add_argument(
        "--from-json", help="rewrite the report from a saved BENCHMARKS*.json (e.g. to add --demo-seconds)"
    )
    p.add_argument(
        "--estimate", action="store_true", help="print the plan and its estimated duration, then exit"
    )
    p.add_argument(
        "--only",
        choices=["prefix-sharing"],
        help="run only this section (its part of the report is replaced, the rest kept)",
    )
    p.add_argument(
        "--prefix-length",
        type=forward_tokens(8192),
        help="prefix-sharing prompt length (default 8192; quick: 512)",
    )
    p.add_argument(
        "--prefix-queries",
        type=count(24, 10_000, "each query is one more continuation"),
        help="many-shot queries per cell (default 24; quick: 4)",
    )
    p.add_argument(
        "--prefix-trials",
        type=prefix_trials,
        help="passkey trials, x 5 depths (default 4; quick: 1)",
    )
    p.add_argument(
        "--prefix-zero-shot-queries",
        type=count(4, 10_000, "each document is one more forward"),
        help="zero-shot documents for the nothing-to-share figure (default 4; quick: 2)",
    )
    p.add_argument(
        "--prefix-dtype",
        default="float32",
        help="dtype of the prefix-sharing child (default float32: "
        "its targets ask for the same predictions and scores within 1e-4)",
    )
    p.add_argument(
        "--prefix-repeats",
        type=REPEATS,
        default=1,
        help="repeats of the prefix-sharing child in a full "
        "run (default 1; it takes ~35 min at 8192 on a quiet 2-core CPU)",
    )
    p.add_argument("--prefix-json", help=SUPPRESS)
    p.add_argument("--child", help=SUPPRESS)
    p.add_argument(
        "--model-dir",
        help="a saved model folder (config, weights, tokenizer) to measure instead of the embedded SmolLM2 "
        "(the harness's own test runs a tiny one: every child, in seconds)",
    )
    p.add_argument("--repeat-index", type=at_least(0, 0, high=1000), default=0, help=SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    """Bad input raises BenchmarkError (one line); `exit_code` (benchmarks/errors.py) makes it exit code 2."""
    args = parser().parse_args(argv)
    if args.child:
        orchestrate.child_main(args)
        return 0
    if args.from_json:
        rewrite(args)
        return 0
    out = resolve(args)
    command = f"{PROG} {' '.join(sys.argv[1:] if argv is None else argv)}".strip()
    if args.only == "prefix-sharing" and not args.estimate:
        args.repeats = args.only_repeats
        orchestrate.run_prefix_only(args, out, command)
        return 0
    if args.estimate:
        for name, est in orchestrate.plan(args):
            print(f"  {name:18s} {est:7.0f} s per repeat")
        print(
            f"total ~{orchestrate.total_estimate(args) / 60:.0f} min for {args.repeats} repeat(s) "
            "(+ about a minute once to snapshot the model)"
        )
        return 0
    orchestrate.run_all(args, out, command)
    return 0


if __name__ == "__main__":  # `python benchmarks/run.py ARGS`, the older command (needs ropebench installed)
    sys.exit(exit_code(main, None))
