"""CLI: ``ropebench report RUN_DIR [RUN_DIR ...] [--out DIR]`` and ``ropebench report table ...`` (also
``ropebench report ...`` and ``ropebench report table ...``).

User errors print one line ``error: <what is wrong> — <what to do>`` and exit with code 2 (no traceback).
"""

from __future__ import annotations

import argparse
import sys

from ropebench.extend.errors import RopebenchError
from ropebench.extend.flags import forget_given, refuse_repeats
from ropebench.extend.values import as_length, as_number

from .reach_rules import DEFAULT_BAR, RULER_BAR, bar_value


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        refuse_repeats(self)  # `--out a --out b`: one line, not the first value dropped

    def parse_known_args(self, args=None, namespace=None):
        parsed, extra = super().parse_known_args(args, namespace)
        return forget_given(parsed), extra

    def error(self, message):  # one line and exit 2 (argparse prints the whole usage first)
        print(f"error: {message} — run `{self.prog} --help` for usage", file=sys.stderr)
        sys.exit(2)


def _parser() -> argparse.ArgumentParser:
    # named as `ropebench` runs them: `ropebench report RUN_DIR ...` is this CLI's `report RUN_DIR ...`,
    # `ropebench report table ...` its `table ...` (scripts/cli.py)
    p = _Parser(prog="ropebench report", description="ropebench results: reports and tables")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "report",
        prog="ropebench report",
        help="write report.md, tables/ and plots/ for one or more run directories",
    )
    r.add_argument(
        "run_dirs", nargs="+", metavar="RUN_DIR", help="sweep output directories (or lm-eval .json)"
    )
    r.add_argument("--out", help="report directory (default: the first RUN_DIR)")
    r.add_argument(
        "--trained-context",
        default=None,
        help="the model's trained context in tokens, e.g. 8192 or 8k (reference of the summary / effective "
        "lengths)",
    )
    r.add_argument(
        "--threshold",
        "--bar",
        dest="threshold",
        default=DEFAULT_BAR,
        metavar="BAR",
        help=f"the 0/1 rates' threshold reach (passkey, retrieval): Wilson lower bound at or above this "
        f"absolute bar, per task (default {DEFAULT_BAR:g}, RULER-style); 'ruler' for RULER's own "
        f"{RULER_BAR:g} (Llama-2-7B's 4K average over its 13 tasks)",
    )
    r.add_argument(
        "--tolerance",
        default=0.10,
        help="perplexity effective length: ppl_tail within this fraction of its trained-context value",
    )
    t = sub.add_parser(
        "table", prog="ropebench report table", help="print one table (method x length) to stdout"
    )
    t.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    t.add_argument("--task", required=True)
    t.add_argument("--metric", required=True)
    t.add_argument("--rows", default="method")
    t.add_argument("--cols", default="length", help="column variable ('none' for a single column)")
    t.add_argument(
        "--baseline",
        default=None,
        help="show each method's paired difference (ratio for perplexities) to this method",
    )
    t.add_argument(
        "--ci",
        action="store_true",
        help="show value [95%% interval] n=N (with --baseline: paired, "
        "* where the interval excludes no-difference)",
    )
    t.add_argument("--format", choices=("md", "csv", "tex"), default="md")
    return p


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {' '.join(str(message).split())}", file=file or sys.stderr)


def main(argv: list[str] | None = None) -> int:
    import warnings

    warnings.showwarning = _one_line_warning  # damaged records: one line each, not a source excerpt
    args = _parser().parse_args(argv)
    try:
        if args.command == "report":  # flag values by extend.values' rules (8k, 1e5): one line when bad
            if args.trained_context is not None:
                args.trained_context = as_length(
                    args.trained_context,
                    "--trained-context",
                    "--trained-context 8192 (or leave it out: the sweep records it)",
                )
            args.tolerance = as_number(args.tolerance, "--tolerance", "--tolerance 0.1", low=0)
            args.threshold = bar_value(args.threshold)  # an accuracy, or 'ruler' (RULER's own 0.856)
            from .reporting import report

            path = report(
                args.run_dirs,
                out=args.out,
                trained_context=args.trained_context,
                threshold=args.threshold,
                tolerance=args.tolerance,
            )
            print(f"wrote {path}")
            return 0
        from .comparisons import compare
        from .frame import load
        from .tables import check_axes, table, to_csv, to_latex, to_markdown

        df = load(args.run_dirs)
        cols = None if args.cols.lower() == "none" else args.cols
        check_axes(df, [args.rows], [cols] if cols else [], ("--rows", "--cols"))
        if args.baseline:
            t = compare(
                df, args.task, args.metric, baseline=args.baseline, rows=args.rows, cols=cols, with_ci=args.ci
            )
        else:
            t = table(df, args.task, args.metric, rows=args.rows, cols=cols, with_ci=args.ci)
        writer = {"md": to_markdown, "csv": to_csv, "tex": to_latex}[args.format]
        sys.stdout.write(writer(t))
        return 0
    except RopebenchError as e:  # every layer's user error (ResultsError, ExtendError, ...)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.strerror or e} ({e.filename}) — check the path and permissions", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
