"""CLI: ``python -m results report RUN_DIR [RUN_DIR ...] [--out DIR]`` and ``python -m results table ...``.

User errors print one line ``error: <what is wrong> — <what to do>`` and exit with code 2 (no traceback).
"""

from __future__ import annotations

import argparse
import sys

from .store import ResultsError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m results", description="ropebench results: reports and tables")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report", help="write report.md, tables/ and plots/ for one or more run directories")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="sweep output directories (or lm-eval .json)")
    r.add_argument("--out", help="report directory (default: the first RUN_DIR)")
    r.add_argument("--trained-context", type=int, default=None,
                   help="the model's trained context in tokens (dashed line in perplexity plots)")
    t = sub.add_parser("table", help="print one table (method x length) to stdout")
    t.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    t.add_argument("--task", required=True)
    t.add_argument("--metric", required=True)
    t.add_argument("--rows", default="method")
    t.add_argument("--cols", default="length", help="column variable ('none' for a single column)")
    t.add_argument("--baseline", default=None, help="show ratios to this method instead of values")
    t.add_argument("--ci", action="store_true", help="show mean ± 95%% interval")
    t.add_argument("--format", choices=("md", "csv", "tex"), default="md")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "report":
            from .reporting import report

            path = report(args.run_dirs, out=args.out, trained_context=args.trained_context)
            print(f"wrote {path}")
            return 0
        from .frame import load
        from .tables import compare, table, to_csv, to_latex, to_markdown

        df = load(args.run_dirs)
        cols = None if args.cols.lower() == "none" else args.cols
        if args.baseline:
            t = compare(df, args.task, args.metric, baseline=args.baseline, rows=args.rows, cols=cols)
        else:
            t = table(df, args.task, args.metric, rows=args.rows, cols=cols, with_ci=args.ci)
        writer = {"md": to_markdown, "csv": to_csv, "tex": to_latex}[args.format]
        sys.stdout.write(writer(t))
        return 0
    except ResultsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e.strerror or e} ({e.filename}) — check the path and permissions", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
