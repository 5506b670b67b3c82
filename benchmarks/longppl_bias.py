"""LongPPL's evaluator bias: key tokens selected by the unpatched evaluated model with the package's rule
(split "none") favour plain; the cross-fitted split sample (split "positions", the default for evaluator
"self": each half of the position blocks selected by the other) does not. Prints plain's and a method's
LongPPL under both selections, per document and pooled.

    HF_HUB_OFFLINE=1 .venv/bin/ropebench bench longppl-bias [--length 4096] [--num-docs 4]
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

from ropebench.benchmarks.errors import ArgumentParser, at_least, exit_code, positive_int


def evaluator_bias(model, tokenizer, *, method="ntk", factor=2.0, length=4096, num_docs=4, corpus="sotu"):
    """LongPPL of `method` x `factor` over plain at `length` on the task's first `num_docs` documents, key
    tokens by the default rule with evaluator "self", selected by the package's rule (split "none") and by
    the split sample ("positions"). Returns {"ppl": {plain, other, ratio}, split: {"pooled": {key_tokens,
    plain, other, ratio}, "documents": {doc: {...}}}, "bias": {...}, "seconds": ...}; a ratio is None
    where a LongPPL is withheld (fewer than MIN_KEY_TOKENS key tokens over the documents).

    The key spans of split "none" are found once (on plain's own pass, cold cache) and the split sample is
    derived from them (tasks.key_tokens.key_spans), so the two selections rest on the same evaluator losses;
    the evaluated model's pass over a window is computed once per method and reused by the second selection
    (`_one_pass_per_window`: the same model, patch and tokens give the same losses). `ropebench bench
    longppl-bias` prints it for the embedded SmolLM2 (docs/measured.md)."""
    from ropebench import extend
    from ropebench.tasks import perplexity
    from ropebench.tasks.key_tokens import _MEMORY, SPLITS

    def run(name: str, split: str) -> list[dict]:
        patch = extend.patched(model, method, factor=factor) if name != "plain" else contextlib.nullcontext()
        with patch:
            return perplexity.run(
                model,
                tokenizer,
                lengths=[length],
                corpus=corpus,
                num_docs=num_docs,
                key_tokens={"split": split},
                progress=False,
            )

    def values(rows: list[dict], metric: str) -> dict:
        return {r["doc"]: (r["value"], r["n"]) for r in rows if r["metric"] == metric}

    t0 = time.perf_counter()
    out: dict = {"method": method, "factor": factor, "length": length, "corpus": corpus}
    _MEMORY.clear()
    with tempfile.TemporaryDirectory() as cold, _cache_at(Path(cold)), _one_pass_per_window(model):
        for split in SPLITS:  # "none" first: "positions" is derived from its spans
            rows = {name: run(name, split) for name in ("plain", method)}
            plain, other = values(rows["plain"], "longppl"), values(rows[method], "longppl")
            counts = {r["doc"]: r["value"] for r in rows["plain"] if r["metric"] == "longppl_key_tokens"}
            docs = sorted(d for d in plain if d is not None)
            entry = {"pooled": _ratio(plain.get(None), other.get(None), counts[None]), "documents": {}}
            for d in docs:
                entry["documents"][d] = _ratio(plain[d], other.get(d), plain[d][1])
            out[split] = entry
            if "ppl" not in out:
                p, o = values(rows["plain"], "ppl"), values(rows[method], "ppl")
                out["ppl"] = {
                    ("pooled" if d is None else d): {
                        "plain": p[d][0],
                        "other": o[d][0],
                        "ratio": o[d][0] / p[d][0],
                    }
                    for d in p
                }
    out["bias"] = _bias(out)
    out["seconds"] = time.perf_counter() - t0
    return out


def _ratio(plain, other, key_tokens) -> dict:
    """{key_tokens, plain, other, ratio} of one document or the pool (values None where withheld)."""
    if plain is None or other is None:
        return {"key_tokens": key_tokens, "plain": None, "other": None, "ratio": None}
    return {"key_tokens": key_tokens, "plain": plain[0], "other": other[0], "ratio": other[0] / plain[0]}


def _bias(out: dict) -> dict:
    """The ratio under the package's selection over the ratio under the split sample, pooled and per document
    where both are written (> 1: the package's selection by the baseline makes the method look worse)."""
    pooled = [out[s]["pooled"]["ratio"] for s in ("none", "positions")]
    docs = {}
    for d, entry in out["none"]["documents"].items():
        split = out["positions"]["documents"].get(d)
        if entry["ratio"] is not None and split is not None and split["ratio"] is not None:
            docs[d] = entry["ratio"] / split["ratio"]
    logs = [math.log(v) for v in docs.values()]
    return {
        "pooled": pooled[0] / pooled[1] if None not in pooled else None,
        "documents": docs,
        "geometric_mean_of_documents": math.exp(sum(logs) / len(logs)) if logs else None,
    }


@contextlib.contextmanager
def _one_pass_per_window(model):
    """Inside the block the perplexity task's pass (tasks.perplexity.token_nll) is memoised per (active patch,
    tokens, start): the second selection re-reads the losses of the first instead of a second forward. The
    key-token windows (tasks.key_tokens.token_nll) are not touched."""
    from ropebench import extend
    from ropebench.tasks import perplexity

    real, memo = perplexity.token_nll, {}

    def memoised(m, ids, *, start, chunk_size):
        active = extend.current(m)
        state = None if active is None else (active.method, active.factor, repr(active.options))
        key = (id(m), state, tuple(ids), start)
        if key not in memo:
            memo[key] = real(m, ids, start=start, chunk_size=chunk_size)
        return memo[key]

    perplexity.token_nll = memoised
    try:
        yield
    finally:
        perplexity.token_nll = real


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
    parser.add_argument("--num-docs", type=positive_int, default=4, help="documents of sotu (>= 1)")
    args = parser.parse_args(argv)
    import torch
    from ropebench import extend

    torch.manual_seed(0)
    m, t = extend.load("smollm2-135m", device="cpu", dtype=torch.float32)
    print(json.dumps(evaluator_bias(m, t, length=args.length, num_docs=args.num_docs), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
