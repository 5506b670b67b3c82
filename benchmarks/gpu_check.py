"""The GPU check (issue 30): correctness of every method on CUDA, and ropebench's speed and memory at long
context against transformers' `model(ids, labels=ids)` and the GPU's measured bf16 GEMM rate, on random-weight
models generated from a seed (nothing carried). Writes report.md and gpu_check.json into --out. Budget: at
most 8 minutes on one H100. `--cpu-sizes` runs the same code at tiny sizes on the CPU (CI runs it that way).

    python -m ropebench.benchmarks gpu --out runs/gpu-check  # on the GPU machine (docs/benchmarks.md)
    ropebench bench gpu --cpu-sizes --out /tmp/gpu-check     # the same code on a CPU, in seconds

Sections (--skip NAME leaves one out):
- gemm: the measured matmul rate (bf16 and fp32; TF32 off) of one size x size product;
- correctness: benchmarks/gpu_correctness.py (every method x tested family x attention implementation);
- long-context: per model shape (SmolLM2-135M, Llama-3-8B; bf16) and length, ropebench's perplexity pass
  (`tasks.scoring.token_nll`: decoder body, then the LM head in chunks) against `model(ids, labels=ids).loss`:
  wall time and its ratio, forward FLOPs (benchmarks/flops.py) over the wall as a share of the GEMM rate,
  peak memory against `extend.memory.estimate`; a length whose estimate does not fit is skipped, and an out of
  memory is recorded as such;
- remap-cost: plain vs self-extend, rerope and dca on the Llama-3-8B shape at one length (32k);
- demo-grid: benchmarks/gpu_demo_grid.py (the demo's grid through the sweep on a SmolLM2-shaped random model,
  on the device in bf16 and fp32 and on the CPU in fp32; the tables compared: values, paired marks, reach).
  It needs the SmolLM2 tokenizer: `ropebench bench gpu --save-tokenizer` writes runs/smollm2-tokenizer
  here (from the embedded GGUF), for the device call to carry.
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
import time
from pathlib import Path

from ropebench.benchmarks.errors import ArgumentParser, BenchmarkError, at_least, exit_code

SECTIONS = ("gemm", "correctness", "long-context", "remap-cost", "demo-grid")
GPU = {
    "lengths": [32768, 65536, 131072],
    "remap_length": 32768,
    "gemm_size": 8192,
    "check_length": 192,
    "demo_scale": 1,  # the device runs the demo's own grid ...
    "reference_scale": 4,  # ... and the CPU comparison a quarter of it (gpu_demo_grid.py)
}
CPU = {
    "lengths": [128, 256],
    "remap_length": 256,
    "gemm_size": 512,
    "check_length": 96,
    # the demo's grid / 24: trained context 341, retrieval at 341 (its prompt needs > 267), perplexity to 512
    "demo_scale": 24,
    "reference_scale": 24,
}
# --cpu-sizes: rotate-half with grouped KV heads, and layer types (sliding + global): the paths, in seconds
CPU_FAMILIES = ["llama", "gemma3_text"]
REMAP_METHODS = ("self-extend", "rerope", "dca")


# Sizes a flag sets, bounded by their work (a zero or a negative is refused too: `x or default` would make a
# zero the default)
TOKENS = at_least(2, 32768, high=1 << 20, cost="tokens of one forward at each length, on every shape")
SCALE = at_least(1, 4, high=1024, cost="the demo grid's divisor: above its size the grid is empty")


def parser() -> ArgumentParser:
    p = ArgumentParser(prog="ropebench bench gpu", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/gpu-check", help="folder for report.md and gpu_check.json")
    p.add_argument("--cpu-sizes", action="store_true", help="tiny sizes on the CPU (CI): the same code paths")
    p.add_argument("--device", default=None, help="default: cuda (with --cpu-sizes: cpu)")
    p.add_argument(
        "--families", nargs="+", default=None, help="default: every tested family (--cpu-sizes: 2)"
    )
    p.add_argument("--methods", nargs="+", default=None, help="default: every registered method")
    p.add_argument("--shapes", nargs="+", default=["smollm2-135m", "llama-3-8b"])
    p.add_argument(
        "--lengths", nargs="+", type=TOKENS, default=None, help="long-context lengths (GPU: 32k..128k)"
    )
    p.add_argument("--remap-length", type=TOKENS, default=None, help="the remap methods' length (GPU: 32k)")
    p.add_argument("--skip", nargs="+", default=[], choices=SECTIONS, help="sections to leave out")
    p.add_argument("--seed", type=at_least(0, 0, high=2**32 - 1, cost="a seed"), default=0)
    p.add_argument(
        "--demo-scale",
        type=SCALE,
        default=None,
        help="demo-grid: the device grid's divisor (GPU: 1, the demo)",
    )
    p.add_argument(
        "--reference-scale",
        type=SCALE,
        default=None,
        help="demo-grid: the divisor of the grid compared with the CPU (GPU: 4; 1 = the demo's own grid)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="demo-grid: the SmolLM2 tokenizer's folder (default: see --save-tokenizer)",
    )
    p.add_argument(
        "--save-tokenizer",
        nargs="?",
        const="runs/smollm2-tokenizer",
        default=None,
        metavar="DIR",
        help="write the SmolLM2 tokenizer (from the embedded GGUF) into DIR for the device call, and stop",
    )
    return p


def settings(args) -> dict:
    sizes = CPU if args.cpu_sizes else GPU
    return {
        "device": args.device or ("cpu" if args.cpu_sizes else "cuda"),
        "tiny": args.cpu_sizes,
        "lengths": args.lengths or sizes["lengths"],
        "remap_length": args.remap_length or sizes["remap_length"],
        "gemm_size": sizes["gemm_size"],
        "check_length": sizes["check_length"],
        "demo_scale": args.demo_scale or sizes["demo_scale"],
        "reference_scale": args.reference_scale or sizes["reference_scale"],
    }


def sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def environment(device: str) -> dict:
    import torch
    import transformers
    from ropebench.extend.loading import cpu_key

    env = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": cpu_key(),
        "device": device,
    }
    if str(device).startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name(device)
        env["gpu_memory_gb"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
        env["cuda"] = torch.version.cuda
        env["bf16"] = torch.cuda.is_bf16_supported(including_emulation=False)
    return env


def gemm_section(device: str, size: int) -> dict:
    import torch
    from ropebench.benchmarks.flops import gemm_rate

    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return {
            str(dtype).removeprefix("torch."): gemm_rate(device=device, dtype=dtype, size=size)
            for dtype in (torch.bfloat16, torch.float32)
        }
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved


def peak_bytes(device: str) -> int | None:
    import torch

    return torch.cuda.max_memory_allocated(device) if str(device).startswith("cuda") else None


def reset_peak(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def timed(fn, device: str) -> tuple[float | None, int | None, str]:
    """(seconds, peak bytes, error) of fn(); an out of memory is an error, not a crash."""
    import torch

    reset_peak(device)
    sync(device)
    start = time.perf_counter()
    try:
        fn()
        sync(device)
    except torch.OutOfMemoryError:
        reset_peak(device)
        return None, None, "out of memory"
    return time.perf_counter() - start, peak_bytes(device), ""


def fits(config, length: int, device: str, extra: int = 0) -> bool:
    """Does a forward of `length` tokens fit in the device's free memory, by extend.memory's estimate?"""
    from ropebench.extend import memory

    room = memory.available(device)
    estimate = memory.estimate(config, length, dtype="bfloat16", device=device, kv_cache=False).total
    return room is None or estimate + extra <= room


def labels_forward(model, ids):
    import torch

    with torch.no_grad():
        return model(ids, labels=ids).loss


def long_context_rows(shape: str, *, device: str, lengths: list[int], tiny: bool, gemm: dict, seed: int):
    """ropebench's perplexity pass vs `labels=` at each length on the random `shape` model (bf16)."""
    import torch
    from ropebench.benchmarks.flops import forward_flops
    from ropebench.benchmarks.tiny_models import build_shape
    from ropebench.extend import memory
    from ropebench.tasks.scoring import token_nll

    model = build_shape(shape, device=device, dtype=torch.bfloat16, tiny=tiny, seed=seed)
    config, rows = model.config, []
    ids_all = torch.randint(
        0, config.vocab_size, (1, max(lengths)), generator=torch.Generator().manual_seed(seed)
    )
    token_nll(model, ids_all[:, :64], start=1)  # warm-up: kernels chosen, allocator primed
    rate = (gemm.get("bfloat16") or {}).get("flops_per_second")
    for length in lengths:
        ids = ids_all[:, :length].to(device)
        row = {"shape": shape, "length": length}
        # the perplexity pass keeps no KV cache (use_cache=False)
        estimate = memory.estimate(config, length, dtype="bfloat16", device=device, kv_cache=False).total
        row["estimate_gb"] = estimate / 2**30
        if not fits(config, length, device):
            rows.append(dict(row, error="skipped: the estimate does not fit in free memory"))
            continue
        seconds, peak, error = timed(lambda ids=ids: token_nll(model, ids, start=1), device)
        flops = forward_flops(config, length, head_rows=length - 1)["total"]
        row.update(ropebench_s=seconds, ropebench_peak_gb=peak and peak / 2**30, ropebench_error=error)
        row["flops"] = flops
        if seconds and rate:
            row["gemm_share"] = flops / seconds / rate
        if peak:
            row["memory_error"] = peak / estimate - 1
        logits_bytes = length * config.vocab_size * (2 + 4 + 4)  # bf16 logits, their fp32 copy, its softmax
        if fits(config, length, device, extra=logits_bytes):
            seconds_l, peak_l, error_l = timed(lambda ids=ids: labels_forward(model, ids), device)
        else:
            seconds_l, peak_l, error_l = None, None, "skipped: its full logits do not fit"
        row.update(labels_s=seconds_l, labels_peak_gb=peak_l and peak_l / 2**30, labels_error=error_l)
        if seconds and seconds_l:
            row["ratio_to_labels"] = seconds / seconds_l
        rows.append(row)
    return rows


def remap_cost_rows(*, device: str, length: int, tiny: bool, seed: int):
    """Wall of the perplexity pass at `length` on the Llama-3-8B shape: plain, then each remap method at the
    factor that reaches `length`."""
    import math

    import torch
    from ropebench import extend
    from ropebench.benchmarks.tiny_models import build_shape
    from ropebench.tasks.scoring import token_nll

    model = build_shape("llama-3-8b", device=device, dtype=torch.bfloat16, tiny=tiny, seed=seed)
    factor = float(max(1, math.ceil(length / model.config.max_position_embeddings)))
    ids = torch.randint(
        0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed)
    ).to(device)
    rows = []
    for method in ("plain", *REMAP_METHODS):
        f = 1.0 if method == "plain" else factor
        with extend.patched(model, method, factor=f):
            token_nll(model, ids[:, :64], start=1)  # warm-up
            seconds, peak, error = timed(lambda: token_nll(model, ids, start=1), device)
        rows.append(
            {
                "method": method,
                "factor": f,
                "length": length,
                "seconds": seconds,
                "peak_gb": peak and peak / 2**30,
            }
            | ({"error": error} if error else {})
        )
    plain = rows[0]["seconds"]
    for row in rows:
        if plain and row["seconds"]:
            row["vs_plain"] = row["seconds"] / plain
    return rows


def check_options(args, device: str) -> None:
    """What the flags name, before any section runs: a device torch knows, shapes the long-context section
    can build, a tokenizer folder that exists."""
    import torch
    from ropebench.benchmarks.tiny_models import SHAPES
    from ropebench.extend.loading import check_device

    try:
        torch.device(device)
    except RuntimeError:
        raise BenchmarkError(f"unknown device {device!r} — use cuda, cuda:N or cpu") from None
    check_device(device)
    unknown = [s for s in args.shapes if s not in SHAPES]
    if unknown and "long-context" not in args.skip:
        raise BenchmarkError(f"unknown shape {unknown[0]!r} — use {', '.join(SHAPES)}")
    if args.tokenizer is not None and "demo-grid" not in args.skip and not Path(args.tokenizer).is_dir():
        raise BenchmarkError(
            f"--tokenizer {args.tokenizer} is not a folder — run `ropebench bench gpu --save-tokenizer` first"
        )


def run(args) -> dict:
    import torch
    from ropebench import extend

    s = settings(args)
    device = s["device"]
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BenchmarkError("no CUDA GPU here — run `ropebench bench gpu --cpu-sizes` on a CPU")
    check_options(args, device)
    families = args.families or (CPU_FAMILIES if args.cpu_sizes else list(extend.TESTED_FAMILIES))
    methods = args.methods or extend.methods()
    unknown = [f for f in families if f not in extend.TESTED_FAMILIES] + [
        m for m in methods if m not in extend.methods()
    ]
    if unknown:
        raise BenchmarkError(f"unknown family or method {unknown[0]!r} — see `ropebench inspect --help`")
    data = {"settings": s, "environment": environment(device), "command": " ".join(sys.argv), "seconds": {}}
    sections = [x for x in SECTIONS if x not in args.skip]
    for section in sections:
        start = time.perf_counter()
        print(f"[gpu check] {section} ...", flush=True)
        if section == "gemm":
            data["gemm"] = gemm_section(device, s["gemm_size"])
        elif section == "correctness":
            from ropebench.benchmarks.gpu_correctness import correctness

            data["correctness"] = correctness(
                device=device,
                families=families,
                methods=methods,
                length=s["check_length"],
                factor=4.0,
                seed=args.seed,
            )
        elif section == "long-context":
            data["long_context"] = [
                row
                for shape in args.shapes
                for row in long_context_rows(
                    shape,
                    device=device,
                    lengths=s["lengths"],
                    tiny=s["tiny"],
                    gemm=data.get("gemm", {}),
                    seed=args.seed,
                )
            ]
        elif section == "remap-cost":
            data["remap_cost"] = remap_cost_rows(
                device=device, length=s["remap_length"], tiny=s["tiny"], seed=args.seed
            )
        elif section == "demo-grid":
            from ropebench.benchmarks.gpu_demo_grid import demo_grid

            data["demo_grid"] = demo_grid(
                device=device,
                tiny=s["tiny"],
                scale=s["demo_scale"],
                reference_scale=s["reference_scale"],
                out=Path(args.out) / "demo-grid",
                seed=args.seed,
                tokenizer=args.tokenizer,
            )
        data["seconds"][section] = time.perf_counter() - start
    return data


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.save_tokenizer:
        from ropebench.benchmarks.gpu_demo_grid import save_tokenizer

        folder = save_tokenizer(args.save_tokenizer)
        size = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
        print(f"[gpu check] the SmolLM2 tokenizer: {folder} ({size / 2**20:.1f} MiB) — carry it", flush=True)
        return 0
    from ropebench.extend.owned_paths import OwnedDir

    owned = OwnedDir.open(args.out, "--out", error=BenchmarkError)  # refused before anything runs
    owned.check(["gpu_check.json", "report.md"])
    start = time.perf_counter()
    data = run(args)
    data["seconds"]["total"] = time.perf_counter() - start
    from ropebench.benchmarks.gpu_report import render

    with owned.staged() as stage:  # through the guard: never over a report.md of the user's
        (stage / "gpu_check.json").write_text(json.dumps(data, indent=1, default=str))
        (stage / "report.md").write_text(render(data))
    failed = [r for r in data.get("correctness", []) if r["ok"] is False]
    for c in data.get("demo_grid", {}).get("comparisons", []):  # reported, not failed: issue 30.4's target
        verdict = "equal" if c["ok"] else f"{len(c['mismatches'])} difference(s)"
        print(f"[gpu check] demo grid, {c['run']} vs {c['reference']}: {verdict}", flush=True)
    print(f"[gpu check] {len(failed)} failed check(s); report: {owned.root / 'report.md'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
