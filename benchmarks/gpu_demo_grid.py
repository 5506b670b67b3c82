"""The GPU check's demo-grid section (issue 30.2): the demo's grid (scripts/configs/demo.yaml: its tasks,
methods, factor and corpus) through the sweep's own entry point (`ropebench.sweep_lib.cli.main`) on a
SmolLM2-135M-shaped model with **random weights from a seed** and the SmolLM2 tokenizer, on the device in
bf16 and in fp32 and on the CPU in fp32; then the three runs' tables compared with `results`: every summary
estimate (`results.estimates` of each headline metric, per method, factor and length) within a tolerance
derived from the run's dtype, every paired significance mark (`results.paired_differences` against plain)
equal, every reach verdict (`results.effective_length`, each rule the metric declares) equal. The sweeps write
their records only (`main(argv, report=False)`): the tables compared are computed here, and a report.md per
run would cost each run seconds of CPU (device time on a GPU; `ropebench report DIR` writes one later).

The real SmolLM2 does not travel (its GGUF is 98 MB, more than one device call carries; the device image has
no gguf): the weights are generated from the seed on each side, so values are meaningless and the comparison
is the point. The tokenizer (3.5 MB) travels: `ropebench bench gpu --save-tokenizer` writes it from the
embedded GGUF into runs/smollm2-tokenizer (ignored), which the device call carries.

Grids: a scale s divides the demo's lengths and the model's trained context (8192) alike, so every length
keeps its place relative to the trained context (perplexity to 1.5x, retrieval at 1x, passkey at 1.25x). On a
GPU the device runs the demo's own grid (s = 1) in bf16 and fp32 (their walls; bf16 compared with fp32), and
the comparison with the CPU runs at the reference scale (default 4: trained context 2048, lengths 512..3072;
the full grid takes ~17 min on a 2-core CPU) on the device in bf16 and fp32 and on the CPU in fp32, the CPU
run in a subprocess while the device works. `--cpu-sizes`: one tiny grid (s = 24) on a tiny model of the
same shape family, and the "device" is the CPU itself (bf16 vs fp32 still runs the comparison's code).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ropebench.benchmarks.errors import BenchmarkError

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "scripts" / "configs" / "demo.yaml"  # the checkout's (the device runs from one)
DEFAULT_TOKENIZER = ROOT / "runs" / "smollm2-tokenizer"
TRAINED = 8192  # SmolLM2-135M's trained context: the demo's lengths are placed against it
VOCAB = 49152  # the SmolLM2 tokenizer's vocabulary (the tiny shape's 512 would not hold its ids)
SPECIAL = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}  # as the embedded SmolLM2's config
# Tolerance on a summary estimate, relative to its magnitude: ulps of the run's dtype (machine epsilon). fp32:
# 256 ulps, as the correctness section's device-vs-CPU check; bf16: 4 ulps (torch.testing's own bf16 rtol is
# 2 ulps for one operation; a 30-layer pass rounds its activations many times).
EPS = {"bfloat16": 2.0**-7, "float32": 2.0**-23}
ULPS = {"bfloat16": 4, "float32": 256}
OUTPUT_COLUMNS = {
    "mean",
    "n",
    "rows",
    "unit",
    "lo",
    "hi",
    "half",
    "interval",
    "estimate",
    "informative",
    "p",
    "significant",
    "how",
    "baseline",
    "model",
}


def tolerance(dtype: str) -> float:
    return ULPS[dtype] * EPS[dtype]


# ---------------------------------------------------------------------------------------------- inputs


def smollm2_tokenizer(folder: str | os.PathLike | None = None):
    """(tokenizer, where from): `folder`, else runs/smollm2-tokenizer (written by --save-tokenizer), else the
    embedded GGUF (its cached snapshot when there is one: parsing the GGUF takes seconds)."""
    from transformers import AutoTokenizer

    candidate = Path(folder) if folder else DEFAULT_TOKENIZER
    if (candidate / "tokenizer.json").is_file() or (candidate / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(str(candidate)), str(candidate)
    if folder:
        raise BenchmarkError(f"no tokenizer in {candidate} — run `ropebench bench gpu --save-tokenizer`")
    from ropebench.extend.errors import ExtendError
    from ropebench.extend.loading import _snapshot_dir, embedded_gguf

    try:
        path = embedded_gguf("smollm2-135m")
    except ExtendError as e:
        raise BenchmarkError(
            f"no SmolLM2 tokenizer here ({e}) — run `ropebench bench gpu --save-tokenizer` where the "
            f"embedded model is installed and carry {DEFAULT_TOKENIZER.relative_to(ROOT)}"
        ) from None
    snapshot = _snapshot_dir(path)
    if (snapshot / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(snapshot)), f"the embedded GGUF's snapshot ({snapshot})"
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name), f"the embedded GGUF ({path})"


def save_tokenizer(folder: str | os.PathLike = DEFAULT_TOKENIZER) -> Path:
    """Write the SmolLM2 tokenizer (from the embedded GGUF) into `folder` for the device call to carry."""
    from ropebench.extend.owned_paths import OwnedDir

    owned = OwnedDir.open(folder, "--save-tokenizer", error=BenchmarkError)  # new, empty or ropebench's
    tokenizer, _ = smollm2_tokenizer()
    with owned.staged() as stage:  # never over a tokenizer.json (or any file) of the user's
        tokenizer.save_pretrained(str(stage))
    return owned.root


def save_model(folder: Path, tokenizer, *, tiny: bool, context: int, seed: int) -> Path:
    """The SmolLM2-shaped random model (fp32 weights from `seed`; trained context `context`) + tokenizer."""
    import torch
    from ropebench.benchmarks.tiny_models import build_shape

    if len(tokenizer) > VOCAB:
        raise BenchmarkError(f"the tokenizer has {len(tokenizer)} tokens, more than the model's {VOCAB}")
    model = build_shape(
        "smollm2-135m",
        device="cpu",
        dtype=torch.float32,
        tiny=tiny,
        seed=seed,
        vocab_size=VOCAB,
        max_position_embeddings=context,
        **SPECIAL,
    )
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


# ---------------------------------------------------------------------------------------------- the sweep


def sweep_cli():
    """`ropebench.sweep_lib.cli` (imported when used: the sweep's command line is a tool above this one)."""
    from ropebench.sweep_lib import cli

    return cli


def demo_lengths() -> dict[str, list[int]]:
    import yaml

    tasks = yaml.safe_load(DEMO.read_text())["tasks"]
    return {name: list(opts["lengths"]) for name, opts in tasks.items() if opts and "lengths" in opts}


# --cpu-sizes: fewer units too (retrieval's 36 questions took ~36 s a method on the loaded 2-core CPU): the
# comparison's code paths, not the demo's statistics (n < 6 marks nothing significant)
TINY_OPTIONS = {"retrieval": {"haystacks": 2, "trials": 1}, "passkey": {"trials": 2}}


def grid(scale: int, tiny: bool = False) -> dict:
    """The demo's grid at `scale`: its trained context and each task's lengths, divided by scale (`tiny`:
    with TINY_OPTIONS)."""
    return {
        "scale": scale,
        "trained_context": TRAINED // scale,
        "lengths": {task: [n // scale for n in ls] for task, ls in demo_lengths().items()},
        "options": TINY_OPTIONS if tiny else {},
    }


def sweep_argv(model: Path, out: Path, *, device: str, dtype: str, g: dict) -> list[str]:
    argv = ["--config", str(DEMO), "--model", str(model), "--out", str(out), "--device", device]
    argv += ["--dtype", dtype, "--quiet", "--fresh"]  # --fresh: a rerun into the same --out does not resume
    if g["scale"] != 1:
        for task, lengths in g["lengths"].items():
            argv += ["-t", f"{task}.lengths=[{','.join(map(str, lengths))}]"]
    for task, options in g.get("options", {}).items():
        argv += [x for key, value in options.items() for x in ("-t", f"{task}.{key}={value}")]
    return argv


def run_in_process(argv: list[str]) -> tuple[int, float]:
    import gc

    import torch

    start = time.perf_counter()
    code = sweep_cli().main(argv, report=False)
    seconds = time.perf_counter() - start
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return code, seconds


def start_subprocess(argv: list[str], log: Path) -> tuple[subprocess.Popen, float, object]:
    f = log.open("w")
    command = [sys.executable, "-m", "ropebench.benchmarks.gpu_demo_grid", *argv]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # the CPU's run: no CUDA context beside the device's
    proc = subprocess.Popen(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env)
    return proc, time.perf_counter(), f


# ---------------------------------------------------------------------------------------------- tables


def _key(task: str, metric: str, row: dict) -> str:
    parts = [f"{c}={row[c]}" for c in row if c not in OUTPUT_COLUMNS]
    return f"{task}/{metric} | " + ", ".join(parts)


def _flag(value) -> bool | None:
    try:
        return None if value is None or math.isnan(value) else bool(value)
    except TypeError:
        return bool(value)


def tables(run_dir: Path) -> dict:
    """What the run's report shows, keyed alike in every run: estimates, paired marks, reach verdicts."""
    from ropebench import results
    from ropebench.results.overview import ok_rows, quantities
    from ropebench.results.reach import rules_of
    from ropebench.results.store import ResultsError

    df = ok_rows(results.load(run_dir))
    qs = quantities(df)
    values, marks, reach = {}, {}, {}
    for q in qs.values:
        try:
            est = results.estimates(df, q.task, q.metric)
            diffs = results.paired_differences(df, q.task, q.metric, "plain")
        except ResultsError as e:  # recorded, so that the comparison shows it
            values[f"{q.task}/{q.metric} | error"] = math.nan
            print(f"[gpu check] demo-grid: {q.task}/{q.metric}: {e}", flush=True)
            continue
        for r in est.to_dict("records"):
            values[_key(q.task, q.metric, r)] = float(r["mean"])
        for r in diffs.to_dict("records"):
            if r["interval"] != "baseline":
                marks[_key(q.task, q.metric, r)] = _flag(r["significant"])
    for q in qs.reaches:
        for rule in rules_of(q.meaning):
            try:
                eff = results.effective_length(df, q.task, q.metric, rule=rule)
            except ResultsError:
                continue
            for r in eff.to_dict("records"):
                key = f"{q.task}/{q.metric} reach ({rule}) | {r['method']} x{float(r['factor']):g}"
                reach[key] = str(r["claim"])
    return {"values": values, "marks": marks, "reach": reach}


def compare(run: dict, reference: dict, dtype: str) -> dict:
    """`run`'s tables against `reference`'s: values within tolerance(dtype) of their magnitude, marks and
    reach verdicts equal; every mismatch listed."""
    tol = tolerance(dtype)
    a, b = run["tables"], reference["tables"]
    worst, within, mismatches = 0.0, 0, []
    keys = sorted(set(a["values"]) | set(b["values"]))
    for key in keys:
        x, y = a["values"].get(key), b["values"].get(key)
        if x is None or y is None:
            mismatches.append(f"value {key}: only in {'the reference' if x is None else 'the run'}")
            continue
        if key.endswith("| error"):
            mismatches.append(f"value {key}: its table failed (the run's output says why)")
            continue
        if math.isnan(x) and math.isnan(y):
            within += 1
            continue
        scale = max(abs(x), abs(y))
        rel = 0.0 if scale == 0 else abs(x - y) / scale
        rel = math.inf if math.isnan(rel) else rel
        worst = max(worst, rel)
        if rel <= tol:
            within += 1
        else:
            mismatches.append(f"value {key}: {x:.6g} vs {y:.6g} (relative {rel:.2e})")
    out = {
        "run": run["name"],
        "reference": reference["name"],
        "dtype": dtype,
        "tolerance": tol,
        "values": len(keys),
        "values_within": within,
        "max_relative": worst,
    }
    for part in ("marks", "reach"):
        keys = sorted(set(a[part]) | set(b[part]))
        equal = [k for k in keys if k in a[part] and k in b[part] and a[part][k] == b[part][k]]
        out[part], out[f"{part}_equal"] = len(keys), len(equal)
        mismatches += [
            f"{part[:-1] if part == 'marks' else part} {k}: {a[part].get(k)} vs {b[part].get(k)}"
            for k in keys
            if k not in equal
        ]
    out["mismatches"] = mismatches
    out["ok"] = not mismatches and out["values"] > 0
    return out


# ---------------------------------------------------------------------------------------------- the section


def demo_grid(
    *,
    device: str,
    tiny: bool,
    scale: int,
    reference_scale: int,
    out: Path,
    seed: int = 0,
    tokenizer: str | None = None,
) -> dict:
    """Run the grids, compare their tables; the section's JSON (runs with walls, comparisons)."""
    from ropebench.extend.owned_paths import OwnedDir

    owned = OwnedDir.open(out, "demo-grid folder", error=BenchmarkError)  # new, empty or ropebench's
    tokenizer, source = smollm2_tokenizer(tokenizer)
    owned.mkdir()
    grids = {s: grid(s, tiny) for s in dict.fromkeys([scale, reference_scale])}
    planned = []  # (name, device, dtype, scale)
    if scale != reference_scale:
        planned += [
            (f"{device} bf16 demo", device, "bfloat16", scale),
            (f"{device} fp32 demo", device, "float32", scale),
        ]
    planned += [
        (f"{device} bf16 ref", device, "bfloat16", reference_scale),
        (f"{device} fp32 ref", device, "float32", reference_scale),
    ]
    reference = ("cpu fp32 reference", "cpu", "float32", reference_scale)
    # off the CPU the reference starts first, in a subprocess, and runs while the device works
    planned = [reference, *planned] if device != "cpu" else [*planned, reference]
    data = {
        "model": f"SmolLM2-135M-shaped model, random weights (seed {seed}){', tiny widths' if tiny else ''}",
        "tokenizer": source,
        "grids": {str(s): g for s, g in grids.items()},
        "runs": [],
        "comparisons": [],
    }
    with tempfile.TemporaryDirectory(prefix="rb-demo-grid-") as tmp:
        models = {
            s: save_model(
                Path(tmp) / f"scale{s}", tokenizer, tiny=tiny, context=g["trained_context"], seed=seed
            )
            for s, g in grids.items()
        }
        runs, background = {}, None
        try:
            for name, dev, dtype, s in planned:
                run_dir = out / name.replace(" ", "-")
                argv = sweep_argv(models[s], run_dir, device=dev, dtype=dtype, g=grids[s])
                runs[name] = {"name": name, "device": dev, "dtype": dtype, "scale": s, "dir": str(run_dir)}
                if dev == "cpu" and device != "cpu":  # the CPU reference runs while the device works
                    owned.check([f"{run_dir.name}.log"])  # never over a log of the user's
                    background = (name, *start_subprocess(argv, out / f"{run_dir.name}.log"))
                    runs[name]["how"] = "subprocess, beside the device runs (wall includes Python's start)"
                    continue
                print(f"[gpu check] demo-grid: {name} ...", flush=True)
                code, seconds = run_in_process(argv)
                runs[name].update(how="in process", code=code, seconds=seconds)
            if background:
                print(f"[gpu check] demo-grid: waiting for {background[0]} ...", flush=True)
                code = background[1].wait()
                runs[background[0]].update(code=code, seconds=time.perf_counter() - background[2])
        finally:
            if background:
                if background[1].poll() is None:  # the device side failed: stop the CPU's run too
                    background[1].kill()
                    background[1].wait()
                background[3].close()
                owned.record([Path(background[3].name).name])
    for run in runs.values():
        if run["code"] == 0:
            run["tables"] = tables(Path(run["dir"]))
        else:
            log = Path(run["dir"]).with_suffix(".log")
            run["error"] = f"the sweep exited {run['code']}" + (
                f": {log.read_text()[-1500:]}" if log.is_file() else ""
            )
    pairs = []
    if scale != reference_scale:
        pairs.append((f"{device} bf16 demo", f"{device} fp32 demo", "bfloat16"))
    pairs += [
        (f"{device} bf16 ref", "cpu fp32 reference", "bfloat16"),
        (f"{device} fp32 ref", "cpu fp32 reference", "float32"),
    ]
    for run, reference, dtype in pairs:
        if "tables" in runs[run] and "tables" in runs[reference]:
            data["comparisons"].append(compare(runs[run], runs[reference], dtype))
    for run in runs.values():
        t = run.pop("tables", None)
        if t:
            run["counts"] = {k: len(v) for k, v in t.items()}
        data["runs"].append(run)
    return data


if __name__ == "__main__":  # the CPU reference's subprocess: one sweep
    sys.exit(sweep_cli().main(sys.argv[1:], report=False))
