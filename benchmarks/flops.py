"""Forward FLOPs of a decoder from its config, and a measured GEMM rate: the two halves of a compute floor
(benchmarks/compute_floor.py for the demo on a CPU, benchmarks/gpu_check.py for long contexts on a GPU).

FLOPs count multiply-adds as 2: per new token, the linear layers (q, k, v, o and the gated MLP's three
projections in every layer); per (query, key) pair a query attends, 2 x 2 x head_dim x heads per layer
(q.k and the weighted sum of v); per row the LM head scores, 2 x hidden x vocab. Norms, RoPE, softmax and the
loss are left out (a few percent at most). Causal attention of q new tokens after `past` cached ones attends
q x past + q (q + 1) / 2 pairs.
"""

from __future__ import annotations

import time


def _dims(config) -> dict:
    c = getattr(config, "text_config", None) or config
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return {
        "hidden": c.hidden_size,
        "inter": c.intermediate_size,
        "layers": c.num_hidden_layers,
        "heads": heads,
        "kv_heads": getattr(c, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "vocab": c.vocab_size,
    }


def linear_flops_per_token(config) -> int:
    d = _dims(config)
    attention = d["hidden"] * d["head_dim"] * (2 * d["heads"] + 2 * d["kv_heads"])  # q, o; k, v
    mlp = 3 * d["hidden"] * d["inter"]
    return 2 * d["layers"] * (attention + mlp)


def attention_pairs(new: int, past: int = 0) -> int:
    """(query, key) pairs of causal attention: `new` tokens after `past` cached ones."""
    return new * past + new * (new + 1) // 2


def attention_flops(config, new: int, past: int = 0) -> int:
    d = _dims(config)
    return 4 * d["layers"] * d["heads"] * d["head_dim"] * attention_pairs(new, past)


def head_flops(config, rows: int) -> int:
    d = _dims(config)
    return 2 * d["hidden"] * d["vocab"] * rows


def forward_flops(config, new: int, *, past: int = 0, head_rows: int | None = None) -> dict:
    """FLOPs of one forward of `new` tokens after `past` cached ones, the LM head on `head_rows` rows
    (default: every new token), by part."""
    rows = new if head_rows is None else head_rows
    parts = {
        "linear": linear_flops_per_token(config) * new,
        "attention": attention_flops(config, new, past),
        "lm head": head_flops(config, rows),
    }
    return dict(parts, total=sum(parts.values()))


def gemm_rate(
    *, device: str = "cpu", dtype=None, size: int = 2048, rounds: int = 3, per_core: bool = False
) -> dict:
    """Measured FLOP/s of one size x size @ size x size matrix product in `dtype` on `device`, best of
    `rounds` after a warm-up: on torch's threads in wall time; or, `per_core` (CPU), on one thread in that
    thread's CPU time — what other processes on a shared CPU take is not counted — times torch's thread count
    (an upper bound: it assumes perfect scaling over the cores). On CUDA TF32 is left as torch has it (off for
    float32 matmuls unless the caller allows it)."""
    import torch

    dtype = dtype or torch.float32
    g = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(size, size, generator=g).to(device=device, dtype=dtype) for _ in range(2))
    cuda = str(device).startswith("cuda")
    threads = torch.get_num_threads()
    clock = time.thread_time if per_core else time.perf_counter
    best = float("inf")
    if per_core:
        torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for r in range(rounds + 1):
                if cuda:
                    torch.cuda.synchronize()
                t0 = clock()
                a @ b
                if cuda:
                    torch.cuda.synchronize()
                if r:  # round 0 warms up (kernel selection, oneDNN's first-use build)
                    best = min(best, clock() - t0)
    finally:
        torch.set_num_threads(threads)
    rate = 2 * size**3 / best
    return {
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "size": size,
        "rounds": rounds,
        "threads": threads,
        "clock": "one thread's CPU time x threads" if per_core else "wall, all threads",
        "seconds": best,
        "flops_per_second": rate * threads if per_core else rate,
    }
