"""Tasks sharing work (issue 15): the prefix-cache scorer against the unshared path, side by side in one
process, plus the "task throughput" table. Run by `ropebench bench prefix` (or as part of
`ropebench bench run`); its section of BENCHMARKS.md is benchmarks/prefix_report.py's.

What the child measures (one process, the same model; the two sides of every ratio alternate their order
between repeats):
- many-shot: `tasks.classification.run(mode="many-shot", lengths=[L], num_docs=Q)` with share_prefix True vs
  False; same predictions, largest |d score| over every label token of every query;
- passkey: `tasks.passkey.run(lengths=[L], depths=D, trials=T)` shared vs unshared; same prompts and answers;
- nothing to share: zero-shot classification (a different document per query, so prompts share only a few
  header tokens) shared vs unshared: sharing must not cost anything there;
- throughput: one bare decoder-body forward of L tokens (`model.model(ids)`) gives the model's own tokens/s;
  each task's prompt tokens per second of wall (prefilled or scored, counted once per prompt whether or not
  they came from the cache) relative to it, and the one-pass perplexity at L the same way.
"""

from __future__ import annotations

import time
from unittest import mock

from ropebench.benchmarks import figures

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
# What one child measures; the orchestrator runs each part in its own child and saves after each, so a long
# run (~50 min at 8192 on a 2-core CPU) keeps what finished.
PARTS = ("many_shot", "passkey", "nothing_to_share", "speed")


def _spy_caches():
    """Patch the task kit's PrefixCache (every task makes its caches in tasks.kit.run_cells) so every
    cache is kept (for its token counters)."""
    from ropebench.extend import prefix_cache
    from ropebench.tasks import kit

    made = []

    def make(*a, **k):
        made.append(prefix_cache.PrefixCache(*a, **k))
        return made[-1]

    return mock.patch.object(kit, "PrefixCache", make), made


def trie_tokens(prompts) -> int:
    """Nodes of the prompts' token trie: the tokens any exact prefix reuse must still compute (each node's
    keys and values depend on every token before it, so it runs at least once)."""
    from ropebench.extend.prefix_cache import common_prefix

    ordered = sorted(map(list, prompts))
    return sum(len(p) - (common_prefix(ordered[i - 1], p) if i else 0) for i, p in enumerate(ordered))


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def child_prefix_sharing(model_dir, dtype, repeat_index=0, prefix=None, **_):
    import torch
    import transformers
    from ropebench import extend, tasks
    from ropebench.extend.forward import with_cache
    from ropebench.tasks import classification, passkey

    opts = prefix or {}
    L, queries = int(opts.get("length", 8192)), int(opts.get("queries", 24))
    trials, zero_queries = int(opts.get("trials", 4)), int(opts.get("zero_shot_queries", 4))
    parts = opts.get("parts") or PARTS
    model, tok = figures.load(model_dir, dtype)
    from ropebench.tasks.data import iter_corpus

    list(iter_corpus("sotu"))  # warm-up: the corpus read (cached in-process) is not charged to the first side
    # warm-up: a process's first L-token forward also pays page faults and allocator growth (~9 s of a 33 s 8k
    # forward here), which would land on whichever side runs first
    with torch.inference_mode():
        model.model(
            input_ids=torch.randint(100, 40000, (1, L), generator=torch.Generator().manual_seed(1)),
            use_cache=True,
            **with_cache(model.model, transformers.DynamicCache()),
        )
    out = {
        "length": L,
        "queries": queries,
        "trials": trials,
        "depths": DEPTHS,
        "zero_shot_queries": zero_queries,
        "threads": torch.get_num_threads(),
        "model": figures.model_facts(model),
        "method": figures.METHOD,
        "factor": figures.FACTOR,
    }

    def scores_spy():
        seen, real = {}, classification.continuation_logprobs

        def spy(m, p, conts, **kw):
            seen[tuple(p)] = res = real(m, p, conts, **kw)
            return res

        return mock.patch.object(classification, "continuation_logprobs", spy), seen

    def classify(mode, n, share):
        spy, seen = scores_spy()
        caches_patch, caches = _spy_caches()
        with spy, caches_patch:
            recs, secs = _timed(
                lambda: classification.run(
                    model, tok, lengths=[L], mode=mode, num_docs=n, share_prefix=share, progress=False
                )
            )
        preds = {p: int(max(range(len(s)), key=lambda i: s[i].sum().item())) for p, s in seen.items()}
        return {
            "seconds": secs,
            "scores": seen,
            "preds": preds,
            "records": recs,
            "computed": sum(c.computed for c in caches),
            "reused": sum(c.reused for c in caches),
            "tokens": sum(len(p) for p in seen),
        }

    def key(share):
        answers, real = {}, passkey._generate

        def spy(m, t, ids, n, cache):
            answers[tuple(ids)] = res = real(m, t, ids, n, cache)
            return res

        caches_patch, caches = _spy_caches()
        with mock.patch.object(passkey, "_generate", spy), caches_patch:
            recs, secs = _timed(
                lambda: passkey.run(
                    model, tok, lengths=[L], depths=DEPTHS, trials=trials, share_prefix=share, progress=False
                )
            )
        return {
            "seconds": secs,
            "answers": answers,
            "records": recs,
            "tokens": sum(len(p) for p in answers),
            "computed": sum(c.computed for c in caches),
            "reused": sum(c.reused for c in caches),
            "correct": sum(r["value"] for r in recs if r["metric"] == "correct"),
        }

    def pair(run):
        first, second = (True, False) if repeat_index % 2 == 0 else (False, True)
        a = run(first)
        b = run(second)
        return (a, b) if first else (b, a)

    def summary(side):
        return {k: side[k] for k in ("seconds", "computed", "reused", "tokens")}

    def classified(mode, n):  # both sides of one classification cell, and how their scores compare
        shared, unshared = pair(lambda share: classify(mode, n, share))
        s, u = shared["scores"], unshared["scores"]
        return {
            "shared": summary(shared),
            "unshared": summary(unshared),
            "same_prompts": s.keys() == u.keys(),
            "same_predictions": shared["preds"] == unshared["preds"],
            "max_score_diff": max(abs(x - y).max().item() for p in s for x, y in zip(s[p], u.get(p, s[p]))),
            "n": len(s),
        }

    if "many_shot" in parts:
        out["many_shot"] = classified("many-shot", queries)
    if "passkey" in parts:
        shared, unshared = pair(key)
        out["passkey"] = {
            "shared": {**summary(shared), "correct": shared["correct"]},
            "unshared": {**summary(unshared), "correct": unshared["correct"]},
            "same_prompts": shared["answers"].keys() == unshared["answers"].keys(),
            "same_answers": shared["answers"] == unshared["answers"],
            "n": len(shared["answers"]),
            "trie_tokens": trie_tokens(shared["answers"]),
        }
    if "nothing_to_share" in parts:
        out["nothing_to_share"] = classified("zero-shot", zero_queries)
    # the model's own speed: one bare body forward of L tokens; the one-pass perplexity at L
    if "speed" in parts:
        ids = torch.randint(100, 40000, (1, L), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            _, bare = _timed(lambda: model.model(input_ids=ids, use_cache=False))
        with extend.patched(model, figures.METHOD, factor=figures.FACTOR):
            _, ppl_secs = _timed(
                lambda: tasks.perplexity.run(
                    model, tok, lengths=[L], corpus="sotu", num_docs=1, seed=figures.SEED, progress=False
                )
            )
        out.update(bare_seconds=bare, perplexity_seconds=ppl_secs, perplexity_tokens=L)
    return out
