"""BENCHMARKS.md as a pure function of the measured JSON: no model, no subprocess, no file access.

    rows, checks = figure_rows(saved)            # the figures table and the pass/fail checks
    text = render(saved, notes=NOTES_TEXT)       # the whole markdown report

`saved` is what `ropebench bench run` writes to BENCHMARKS*.json: "date", "machine", "versions",
"command", "args" (the run's settings), "runs" (one dict per repeat: child name -> what benchmarks/figures.py
measured) and, after `ropebench bench report JSON --demo-seconds N`, "demo_command". Figures are medians
over repeats of ratios measured within one repeat. Whatever the text says about the model or the run comes
from `saved`; a fact an older JSON lacks is reported as not measured.
"""

from __future__ import annotations

import math

from ropebench.benchmarks import analysis, prefix_report
from ropebench.benchmarks.measured import GB, MB, method_of, model_facts, model_name, per_repeat

# "Identical numbers" is a float32 property. In bf16 a matmul may round differently at another row count
# (Intel AMX: one-pass vs per-length |d log ppl| 2.5e-4 at the quick lengths, 9.3e-4 at 2048), so bf16 runs
# are held to one bf16 rounding instead: the unit roundoff 2^-8 (torch.finfo(torch.bfloat16).eps / 2).
FP32_SAME = 1e-4
BF16_SAME = 2.0**-8


def figure_rows(saved) -> tuple[list[dict], dict]:
    runs, s = saved["runs"], saved["args"]
    lmax = max(s["lengths"])
    L = str(lmax)
    method, factor = method_of(saved)
    rows, checks = [], {}

    def row(figure, ours, comparison, ratio, target, met, key):
        rows.append(
            {
                "figure": figure,
                "ropebench": ours,
                "comparison": comparison,
                "ratio": "—" if ratio is None else f"{ratio:.3f}",
                "target": target,
                "met": "—" if met is None else ("yes" if met else "**no**"),
                "key": key,
            }
        )

    def secs(child, field="seconds", digits=1):
        return f"{per_repeat(runs, lambda r: r[child][field]):.{digits}f} s"

    # 1. perplexity curve, one forward vs per-length passes
    dmax = max(
        max(abs(rep["onepass"]["loss"][k] - rep["perlength"]["loss"][k]) for k in rep["onepass"]["loss"])
        for rep in runs
    )
    same_tol = FP32_SAME if s["dtype"] == "float32" else BF16_SAME
    checks.update(same_tolerance=same_tol, curve_identical=dmax <= same_tol, curve_max_dloss=dmax)
    ratio = per_repeat(runs, lambda r: r["onepass"]["seconds"] / r["perlength"]["seconds"])
    row(
        f"Perplexity curve {s['lengths']} ({method} x{factor:g}): one forward vs per-length passes, wall",
        secs("onepass"),
        secs("perlength"),
        ratio,
        "<= 0.55",
        ratio is not None and ratio <= 0.55,
        "curve_wall",
    )
    row(
        f"Perplexity curve: identical numbers (float32; {s['dtype']} here), max |d log ppl| over lengths",
        f"{dmax:.2e}",
        "",
        None,
        f"<= {same_tol:.1e}",
        checks["curve_identical"],
        "curve_identical",
    )
    checks["curve_bound"] = per_repeat(
        runs, lambda r: r["onepass"]["model_seconds"] / r["perlength"]["model_seconds"]
    )

    # 2. peak memory of scoring lmax tokens
    same = max(abs(rep["labels"]["loss"][L] - rep["onepass"]["loss"][L]) for rep in runs)
    checks.update(labels_same_loss=same <= same_tol, labels_max_dloss=same)
    ratio = per_repeat(runs, lambda r: r["onepass"]["score_rss"] / r["labels"]["score_rss"])
    row(
        f"Peak RSS of scoring {lmax} tokens (above the loaded model): ropebench vs `model(ids, "
        "labels=ids).loss`",
        f"{per_repeat(runs, lambda r: r['onepass']['score_rss']) / MB:.0f} MB",
        f"{per_repeat(runs, lambda r: r['labels']['score_rss']) / MB:.0f} MB",
        ratio,
        "<= 0.4",
        ratio is not None and ratio <= 0.4,
        "mem_score",
    )
    tot = per_repeat(runs, lambda r: r["onepass"]["peak_rss"])
    ratio = per_repeat(runs, lambda r: r["onepass"]["peak_rss"] / r["labels"]["peak_rss"])
    row(
        f"Peak RSS of scoring {lmax} tokens, whole process (model included)",
        f"{tot / GB:.2f} GB",
        f"{per_repeat(runs, lambda r: r['labels']['peak_rss']) / GB:.2f} GB",
        ratio,
        "ropebench <= 3 GB",
        tot <= 3 * GB,
        "mem_total",
    )
    row(
        f"Same loss as `labels=` at {lmax}: |d log ppl|",
        f"{same:.2e}",
        "",
        None,
        f"<= {same_tol:.1e}",
        checks["labels_same_loss"],
        "labels_identical",
    )

    # 3. overhead over a bare decoder forward (paired: all measured in the bare child's one process)
    for figure, comparison, key in (
        (
            (
                f"Overhead over a bare `model.model(ids)` forward at {lmax} (patch, LM head, chunked loss, "
                "bookkeeping)"
            ),
            lambda r: r["bare"]["seconds"],
            "overhead_body",
        ),
        (
            f"Time vs a plain `model(ids).logits` forward at {lmax} (body + full logits, no loss)",
            lambda r: r["bare"]["forward_seconds"],
            "overhead_forward",
        ),
        (
            "Overhead over the bare forward + the LM head alone (the compute any scoring needs)",
            lambda r: r["bare"]["seconds"] + r["bare"]["head_seconds"],
            "overhead_head",
        ),
    ):
        ratio = per_repeat(runs, lambda r, c=comparison: r["bare"]["ours_seconds"] / c(r))
        over = None if ratio is None else ratio - 1
        row(
            figure,
            secs("bare", "ours_seconds"),
            f"{per_repeat(runs, comparison):.1f} s",
            over,
            "<= 0.05",
            over is not None and over <= 0.05,
            key,
        )

    # 4. rolling perplexity vs lm-eval
    rb, le = runs[0]["rolling_ropebench"], runs[0]["rolling_lmeval"]
    ratio = per_repeat(runs, lambda r: r["rolling_ropebench"]["seconds"] / r["rolling_lmeval"]["seconds"])
    row(
        f"Rolling perplexity, sotu {rb['doc']} ({rb['text_tokens']} tokens), window {s['window']}: wall vs "
        "lm-eval `loglikelihood_rolling`",
        secs("rolling_ropebench"),
        secs("rolling_lmeval"),
        ratio,
        "<= 0.5",
        ratio is not None and ratio <= 0.5,
        "rolling_wall",
    )
    ratio = per_repeat(runs, lambda r: r["rolling_ropebench"]["score_rss"] / r["rolling_lmeval"]["score_rss"])
    row(
        "Rolling perplexity: peak RSS above the loaded model",
        f"{per_repeat(runs, lambda r: r['rolling_ropebench']['score_rss']) / MB:.0f} MB",
        f"{per_repeat(runs, lambda r: r['rolling_lmeval']['score_rss']) / MB:.0f} MB",
        ratio,
        "< 1",
        ratio is not None and ratio < 1,
        "rolling_mem",
    )
    checks["rolling_ppl"] = (
        math.exp(rb["nll_sum"] / rb["tokens"]),
        math.exp(le["nll_sum"] / le["tokens"]),
        rb["tokens"],
        le["tokens"],
    )

    # 5. passkey, demo
    ratio = per_repeat(runs, lambda r: r["passkey"]["seconds"] / r["passkey"]["plain_seconds"])
    # The answer is compared in float32 only: in bf16 the prefix cache's prefill (prompt minus its last token,
    # then that token) rounds differently from generate's one-shot prefill, and a near-tie in the greedy
    # digits may flip.
    checks["passkey_same_prompt"] = all(r["passkey"]["same_prompt"] for r in runs)
    checks["passkey_same_answer"] = all(r["passkey"]["same_answer"] for r in runs)
    checks["passkey_same"] = checks["passkey_same_prompt"] and (
        checks["passkey_same_answer"] or s["dtype"] != "float32"
    )
    row(
        f"Passkey, one trial at {runs[0]['passkey']['prompt_tokens']} prompt tokens: cost vs a plain "
        "`generate` on the same prompt",
        secs("passkey", digits=2),
        secs("passkey", "plain_seconds", 2),
        ratio,
        "(report)",
        None,
        "passkey_trial",
    )
    demo = s.get("demo_seconds")  # a number: the CLI reads it (or the file holding it) before saving
    row(
        "Demo sweep, total wall time",
        "not measured in this run" if demo is None else f"{float(demo) / 60:.1f} min",
        "",
        None,
        "<= 10 min",
        None if demo is None else float(demo) <= 600,
        "demo_sweep",
    )

    # 6. bf16 vs fp32 (one of them is the run's dtype, "otherdtype" the other)
    def by_dtype(rep, want):
        return rep["onepass"] if (s["dtype"] == "bfloat16") == (want == "bfloat16") else rep["otherdtype"]

    speed = per_repeat(runs, lambda r: by_dtype(r, "bfloat16")["seconds"] / by_dtype(r, "float32")["seconds"])
    drel = max(
        max(
            abs(math.exp(by_dtype(rep, "bfloat16")["loss"][k] - by_dtype(rep, "float32")["loss"][k]) - 1)
            for k in rep["onepass"]["loss"]
        )
        for rep in runs
    )
    checks.update(
        bf16_speed=speed, bf16_drel=drel, bf16_default=speed is not None and speed < 1 and drel <= 0.01
    )
    row(
        f"bf16 vs fp32, perplexity curve wall (one forward at {lmax})",
        f"{per_repeat(runs, lambda r: by_dtype(r, 'bfloat16')['seconds']):.1f} s",
        f"{per_repeat(runs, lambda r: by_dtype(r, 'float32')['seconds']):.1f} s",
        speed,
        "< 1 to adopt",
        speed is not None and speed < 1,
        "bf16_speed",
    )
    row(
        "bf16 vs fp32, max relative change of perplexity over lengths",
        f"{100 * drel:.2f} %",
        "",
        None,
        "<= 1 %",
        drel <= 0.01,
        "bf16_ppl",
    )
    return rows, checks


def header(saved) -> list[str]:
    m, s, facts = saved["machine"], saved["args"], model_facts(saved)
    method, factor = method_of(saved)
    command = saved.get("command") or "(not recorded)"
    if saved.get("demo_command"):
        command += f"`, then `{saved['demo_command']}"
    about = (
        f"width {facts['hidden_size']}, vocabulary {facts['vocab_size']}, {facts['layers']} layers, "
        f"{facts['parameters'] / 1e6:.1f}M parameters, trained context {facts['trained_context']}"
        if facts
        else "width, vocabulary and trained context not measured in this run"
    )
    dtype_note = "extend.load's default on this CPU" if s.get("dtype_auto") else "set"
    return [
        (
            "# ropebench "
            f"benchmarks{' (quick smoke run — tiny lengths, not the real figures)' if s.get('quick') else ''}"
        ),
        "",
        f"- Date: {saved['date']}",
        (
            f"- Machine: {m['cpu']}, {m['cores']} cores, {m['ram'] / GB:.0f} GB RAM, avx512_bf16: "
            f"{'yes' if m['avx512_bf16'] else 'no'}; {m['os']}; load average at start "
            f"{m['load'][0]:.1f} / {m['load'][1]:.1f} / {m['load'][2]:.1f}"
        ),
        "- Versions: " + ", ".join(f"{k} {x}" for k, x in saved["versions"].items()),
        f"- Command: `{command}`",
        (
            (
                f"- Model: {model_name(saved)} from `--model-dir {saved['model_given']}` ({about}), CPU, "
                if saved.get("model_given")
                else f'- Model: embedded {model_name(saved)} (`extend.load("smollm2-135m")`; {about}), CPU, '
            )
            + f"{s['dtype']} (--dtype; {dtype_note}) unless stated; method {method} x{factor:g} "
            "(length-independent) where a method is patched."
        ),
        f"- Lengths: {s['lengths']}"
        + (f" (capped with --max-length {s['max_length']})" if s.get("max_length") else "")
        + f"; rolling window {s['window']}; passkey length {s['passkey_length']}; {s['repeats']} repeat(s), "
        "every figure the median over repeats of the ratio measured within one repeat.",
        (
            f"- Total benchmark time {saved['total_seconds'] / 60:.1f} min (estimated beforehand "
            f"{saved['estimate_seconds'] / 60:.1f} min)."
        ),
        "",
    ]


def table(rows) -> list[str]:
    lines = ["| figure | ropebench | comparison | ratio | target | met? |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['figure']} | {r['ropebench']} | {r['comparison']} | {r['ratio']} | {r['target']} | {r['met']} "
        "|"
        for r in rows
    ]
    return lines + ["", "Overhead rows give ratio - 1 (the fraction of extra time).", ""]


def render(saved, notes: str | None = None) -> str:
    """The whole report. `notes` (benchmarks/NOTES.md's text) goes under '## Notes'. The prefix-cache section
    is included when this run measured it (a full run does; `--only prefix-sharing` splices its own)."""
    rows, checks = figure_rows(saved)
    lines = (
        header(saved)
        + table(rows)
        + analysis.protocols(saved, checks)
        + analysis.analysis(saved, rows, checks)
    )
    if notes:
        lines += ["## Notes", "", notes.strip(), ""]
    text = "\n".join(lines)
    prefix_runs = [r["prefix_sharing"] for r in saved["runs"] if "prefix_sharing" in r]
    if prefix_runs:  # the prefix-cache section (issue 15), from this same run
        full = {**saved, "checks": checks}
        prefix = {**full, "dtype": saved["args"].get("prefix_dtype", "float32"), "runs": prefix_runs}
        text = prefix_report.splice(text, prefix_report.section(prefix, full))
    return text


def keep_from_previous(previous: str, text: str) -> str:
    """What the previous report holds that this JSON does not produce survives a re-render: the prefix-cache
    section of a separate `--only prefix-sharing` run, and sections appended after the notes by hand (e.g.
    issue 17's remap cost, from remap_cost.py's JSON). NOTES.md itself has no '## ' headings."""
    start, end = prefix_report.START, prefix_report.END
    if start in previous and end in previous and start not in text:
        block = start + previous.split(start, 1)[1].split(end, 1)[0] + end + "\n"
        text = prefix_report.splice(text, block)
    if "\n## Notes\n" in previous:
        after_notes = previous.split("\n## Notes\n", 1)[1]
        if "\n## " in after_notes:
            appended = "## " + after_notes.split("\n## ", 1)[1]
            if appended not in text:
                text = text.rstrip("\n") + "\n\n" + appended
    return text
