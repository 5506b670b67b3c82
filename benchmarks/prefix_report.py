"""The prefix-cache section of BENCHMARKS.md (issue 15) as a pure function of the prefix_sharing child's JSON
(benchmarks/prefix_sharing.py measures; this module only reads what it saved)."""

from __future__ import annotations

from ropebench.benchmarks import cost_model
from ropebench.benchmarks.measured import LEGACY_METHOD, median

START, END = "<!-- prefix-sharing:start -->", "<!-- prefix-sharing:end -->"


def rows(runs) -> tuple[list[dict], dict]:
    """Figure rows (medians over repeats of per-repeat ratios) and the throughput table."""
    first = runs[0]
    L, trials = first["length"], first["trials"]

    def ratio(part):
        return median([r[part]["shared"]["seconds"] / r[part]["unshared"]["seconds"] for r in runs])

    def secs(part, side):
        return median([r[part][side]["seconds"] for r in runs])

    ms, pk, zs = (ratio(p) for p in ("many_shot", "passkey", "nothing_to_share"))
    same_pred = all(r["many_shot"]["same_predictions"] and r["many_shot"]["same_prompts"] for r in runs)
    dmax = max(r["many_shot"]["max_score_diff"] for r in runs)
    same_ans = all(r["passkey"]["same_answers"] and r["passkey"]["same_prompts"] for r in runs)
    zs_same = all(r["nothing_to_share"]["same_predictions"] for r in runs)
    n_pk = first["passkey"]["n"]
    out = [
        (
            (
                f"Many-shot classification, {first['many_shot']['n']} queries at {L} tokens: shared prefix "
                "vs unshared, wall"
            ),
            secs("many_shot", "shared"),
            secs("many_shot", "unshared"),
            ms,
            "<= 0.15",
            ms <= 0.15,
        ),
        (
            "Many-shot: same predictions; max |d log-prob| over every label token",
            f"{dmax:.1e}",
            "",
            None,
            "same, <= 1e-4",
            same_pred and dmax <= 1e-4,
        ),
        (
            (
                f"Passkey grid, {len(first['depths'])} depths x {trials} trials ({n_pk} prompts) at {L}: "
                "shared vs unshared, wall"
            ),
            secs("passkey", "shared"),
            secs("passkey", "unshared"),
            pk,
            "<= 0.6",
            pk <= 0.6,
        ),
        ("Passkey: same prompts and same answers", "yes" if same_ans else "NO", "", None, "same", same_ans),
        (
            (
                f"Nothing to share: zero-shot classification, {first['nothing_to_share']['n']} documents at "
                f"{L}: shared vs unshared, wall"
            ),
            secs("nothing_to_share", "shared"),
            secs("nothing_to_share", "unshared"),
            zs,
            "<= 1.03",
            zs <= 1.03 and zs_same,
        ),
    ]
    speed = L / median([r["bare_seconds"] for r in runs])
    table = {"bare_tokens_per_s": speed, "rows": []}
    method, factor = (first.get(k, LEGACY_METHOD[k]) for k in ("method", "factor"))
    for name, part, side in (
        (f"perplexity, one pass ({method} x{factor:g})", None, None),
        ("many-shot classification, shared", "many_shot", "shared"),
        ("many-shot classification, unshared", "many_shot", "unshared"),
        ("passkey, shared", "passkey", "shared"),
        ("passkey, unshared", "passkey", "unshared"),
        ("zero-shot classification, shared", "nothing_to_share", "shared"),
        ("zero-shot classification, unshared", "nothing_to_share", "unshared"),
    ):
        if part is None:
            tokens, wall = first["perplexity_tokens"], median([r["perplexity_seconds"] for r in runs])
            computed = tokens
        else:
            tokens, wall = first[part][side]["tokens"], secs(part, side)
            computed = first[part][side]["computed"]
        table["rows"].append(
            {
                "task": name,
                "tokens": tokens,
                "computed": computed,
                "seconds": wall,
                "tokens_per_s": tokens / wall,
                "relative": tokens / wall / speed,
            }
        )
    return [
        {"figure": f, "ours": o, "comparison": c, "ratio": r, "target": t, "met": m}
        for f, o, c, r, t, m in out
    ], table


def _fmt(x):
    return f"{x:.1f} s" if isinstance(x, float) else str(x)


def rolling_windows_text(full_json: dict) -> str:
    """Why the rolling wall ratio is what it is: window counts and per-window cost, from the full run."""
    runs, window = full_json["runs"], full_json["args"]["window"]
    n_text = runs[0]["rolling_ropebench"]["text_tokens"]
    ours, theirs = cost_model.rolling_windows(window, n_text)
    ours_per = median([r["rolling_ropebench"]["seconds"] for r in runs]) / ours
    theirs_per = median([r["rolling_lmeval"]["seconds"] for r in runs]) / theirs
    text = (
        f"The rolling wall ratio compares {ours} ropebench windows (BOS + {window - 1} new tokens each) with "
        f"lm-eval's {theirs} windows of {window} on a {n_text}-token text (see the analysis above): per "
        f"window ropebench takes {ours_per:.1f} s, lm-eval {theirs_per:.1f} s"
    )
    if ours > theirs and ours_per <= theirs_per:
        return (
            text
            + f"; ropebench runs {ours - theirs} window(s) more. The figure moves only with fewer windows, "
            "i.e. with the protocol, not with the scorer."
        )
    return text + "."


def perplexity_restated(full_json: dict | None) -> list[str]:
    """The perplexity targets restated against their floors, from the full run's saved measurements."""
    if not full_json:
        return ["(no full run saved in benchmarks/BENCHMARKS.json: run `ropebench bench run`)"]
    runs = full_json["runs"]
    lmax = max(int(k) for k in runs[0]["perlength"]["length_seconds"])
    curve = median([r["onepass"]["seconds"] / r["perlength"]["seconds"] for r in runs])
    floor = (full_json.get("checks") or {}).get("curve_bound")  # as the report above computes it
    if floor is None:
        floor = median(
            [
                r["perlength"]["length_seconds"][str(lmax)] / sum(r["perlength"]["length_seconds"].values())
                for r in runs
            ]
        )
    wall = median([r["rolling_ropebench"]["seconds"] / r["rolling_lmeval"]["seconds"] for r in runs])
    mem = median([r["rolling_ropebench"]["score_rss"] / r["rolling_lmeval"]["score_rss"] for r in runs])
    lengths = sorted(int(k) for k in runs[0]["perlength"]["length_seconds"])
    return [
        (
            f"From the full run of {full_json.get('date')} (`{full_json.get('command')}`, "
            f"{full_json['machine']['cpu']}, {full_json['args']['dtype']}; the tables above):"
        ),
        "",
        "| figure | measured | floor / restated target | met? |",
        "|---|---|---|---|",
        (
            f"| One-pass curve {lengths}: wall vs per-length passes | {curve:.3f} | floor t({lmax}) / sum "
            f"t(L) = {floor:.3f}; target within 5% of it (<= {1.05 * floor:.3f}) | "
            f"{'yes' if curve <= 1.05 * floor else '**no**'} |"
        ),
        (
            f"| Rolling perplexity vs lm-eval `loglikelihood_rolling`: wall | {wall:.3f} | <= 1.05 | "
            f"{'yes' if wall <= 1.05 else '**no**'} |"
        ),
        (
            f"| Rolling perplexity vs lm-eval: memory above the loaded model | {mem:.3f} | <= 0.5 | "
            f"{'yes' if mem <= 0.5 else '**no**'} |"
        ),
        "",
        rolling_windows_text(full_json),
    ]


def section(data: dict, full_json: dict | None) -> str:
    """The markdown section (between markers) for BENCHMARKS.md."""
    runs, m = data["runs"], data["machine"]
    figs, table = rows(runs)
    first = runs[0]
    # older runs: the alias they all loaded
    model = (first.get("model") or {}).get("name") or "`smollm2-135m`"
    lines = [
        START,
        "## Tasks sharing work: prefix cache (issue 15)",
        "",
        f"- Date: {data['date']}; command: `{data['command']}`",
        (
            f"- Machine: {m['cpu']}, {m['cores']} cores, avx512_bf16: {'yes' if m['avx512_bf16'] else 'no'}; "
            f"load average at start {m['load'][0]:.1f} / {m['load'][1]:.1f} / {m['load'][2]:.1f}. The ratios "
            "compare the two sides in one process, order alternated between repeats, and are what the "
            "targets are about."
        ),
        (
            f"- Model: embedded {model}, CPU, {data['dtype']}, {first.get('threads')} torch thread(s); "
            f"{len(runs)} repeat(s), figures are medians of per-repeat ratios."
        ),
        f"- Length {first['length']}"
        + (" (REDUCED run: the targets are stated for 8192)" if first["length"] < 8192 else "")
        + ".",
        "",
        "| figure | shared | unshared | ratio | target | met? |",
        "|---|---|---|---|---|---|",
    ]
    for f in figs:
        r = "—" if f["ratio"] is None else f"{f['ratio']:.3f}"
        lines.append(
            f"| {f['figure']} | {_fmt(f['ours'])} | {_fmt(f['comparison'])} | {r} | {f['target']} | "
            f"{'yes' if f['met'] else '**no**'} |"
        )
    ms, pk, zs = first["many_shot"], first["passkey"], first["nothing_to_share"]
    lines += [
        "",
        (
            "Tokens run through the model (prompt tokens, label / answer tokens not counted): "
            f"many-shot {ms['shared']['computed']} shared vs {ms['unshared']['computed']} unshared; passkey "
            f"{pk['shared']['computed']} vs {pk['unshared']['computed']} (answers correct: "
            f"{pk['shared']['correct']:.0f} vs {pk['unshared']['correct']:.0f} of {pk['n']}); zero-shot "
            f"{zs['shared']['computed']} vs {zs['unshared']['computed']}."
            + (
                f" The passkey prompts' token trie has {pk['trie_tokens']} nodes, "
                f"{pk['trie_tokens'] / pk['unshared']['computed']:.3f} of the unshared tokens: exact reuse "
                "of a prefix's keys and values cannot compute fewer (a token's keys depend on every token "
                "before it, and each prompt's haystack past its needle follows a different needle), and the "
                "tokens past a needle sit late in the prompt, where attention costs the most, so the wall "
                "floor lies above that fraction (priced with this model's forward times: `python -m "
                "benchmarks.probes.passkey_floor`, Notes item 6)."
                if "trie_tokens" in pk
                else ""
            )
        ),
        (
            f"Wall per cell at {first['length']}: passkey ({pk['n']} prompts) {pk['shared']['seconds']:.0f} "
            f"s shared, {pk['unshared']['seconds']:.0f} s unshared; many-shot ({ms['n']} queries) "
            f"{ms['shared']['seconds']:.0f} s shared, {ms['unshared']['seconds']:.0f} s unshared (first "
            "repeat)."
        ),
        "",
        "### Task throughput",
        "",
        (
            "Prompt tokens per second of wall (each prompt's tokens counted once, whether computed or taken "
            f"from the cache) relative to a bare decoder-body forward of {first['length']} tokens "
            f"({table['bare_tokens_per_s']:.0f} tokens/s here): how close each task runs to the model's own "
            "speed; above 1 means work was shared."
        ),
        "",
        "| task | prompt tokens | tokens computed | wall (s) | tokens/s | relative to a bare forward |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in table["rows"]:
        lines.append(
            f"| {r['task']} | {r['tokens']} | {r['computed']} | {r['seconds']:.1f} | "
            f"{r['tokens_per_s']:.0f} | {r['relative']:.2f} |"
        )
    if data.get("note"):
        lines += ["", data["note"]]
    lines += ["", "### Perplexity targets restated against their floors", ""]
    lines += perplexity_restated(full_json)
    lines += [
        "",
        (
            "Protocols: see benchmarks/prefix_sharing.py (docstring). Scorer: extend/prefix_cache.py — "
            "prompts of a cell in lexicographic token order (a depth-first walk of their token trie), one "
            "transformers `DynamicCache` cropped to the prefix the next prompt shares; a prompt sharing "
            "fewer than `MIN_SHARED` tokens starts from an empty cache (SDPA's causal kernel is cheaper "
            "than a masked continuation of a short prefix); a continuation runs in blocks of "
            "`CONTINUE_BLOCK` tokens (a masked forward also computes the triangle the mask hides) and, on "
            "CPU, attends grouped key/value heads without copying them (`native_gqa`)."
        ),
        END,
        "",
    ]
    return "\n".join(lines)


def splice(report: str, block: str) -> str:
    """Put the section into BENCHMARKS.md: replace the previous one, else insert it before '## Notes' (else
    append it)."""
    if START in report and END in report:
        head, rest = report.split(START, 1)
        return head + block.rstrip("\n") + rest.split(END, 1)[1]
    if "\n## Notes" in report:
        head, tail = report.split("\n## Notes", 1)
        return head.rstrip("\n") + "\n\n" + block + "\n## Notes" + tail
    return report.rstrip("\n") + "\n\n" + block
