"""torch.profiler of the demo's perplexity forward on the embedded SmolLM2-135M (`tasks.scoring.token_nll`:
the decoder body, then the LM head and the loss in chunks), by op class: linear layers' GEMMs, attention
(SDPA), the LM head's GEMM, the loss, norms and elementwise work, and what no op accounts for (Python and
framework overhead). With each class's FLOP rate where FLOPs are counted (benchmarks/flops.py), against a
measured GEMM rate on the same threads. Explains the compute-floor and curve figures in BENCHMARKS.md.

    HF_HUB_OFFLINE=1 .venv/bin/python -m ropebench.benchmarks.probes.profile_forward
        [--lengths 2048 4096 8192 12288] [--dtypes auto float32 bfloat16]
"""

from __future__ import annotations

import sys
import time

from ropebench.benchmarks.errors import ArgumentParser, exit_code, forward_tokens

ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_attention_math")
GEMMS = ("aten::mm", "aten::addmm", "aten::bmm")
LOSS = ("aten::_log_softmax", "aten::nll_loss_forward", "aten::nll_loss2d_forward")
CLASSES = ("linear layers", "attention", "LM head", "loss", "norms, elementwise", "overhead")


def sdpa_call(model, ids) -> str:
    """How transformers calls SDPA for this model: mask tensor or is_causal, GQA handling."""
    import torch
    import torch.nn.functional as F
    from ropebench.tasks.scoring import body

    seen, inner = [], F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        seen.append(
            f"q {tuple(q.shape)} k {tuple(k.shape)} attn_mask "
            f"{None if attn_mask is None else tuple(attn_mask.shape)} is_causal {is_causal} {kw}"
        )
        return inner(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, **kw)

    F.scaled_dot_product_attention = spy
    try:
        with torch.inference_mode():
            body(model)(input_ids=ids, use_cache=False)
    finally:
        F.scaled_dot_product_attention = inner
    return seen[0] if seen else "SDPA not called"


def op_class(event, vocab: int) -> str:
    """The class of one profiled op (self time): a GEMM whose weight has `vocab` columns is the LM head."""
    if event.key in ATTENTION:
        return "attention"
    if event.key in GEMMS:
        return "LM head" if any(vocab in shape for shape in event.input_shapes) else "linear layers"
    return "loss" if event.key in LOSS else "norms, elementwise"


def profile(model, length: int) -> tuple[float, dict[str, float]]:
    """(wall seconds, class -> self seconds) of one token_nll over `length` random tokens."""
    import torch
    from ropebench.tasks.scoring import token_nll
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    token_nll(model, ids)  # warm-up at this length (oneDNN builds its kernels per shape)
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        token_nll(model, ids)
        wall = time.perf_counter() - t0
    parts = dict.fromkeys(CLASSES, 0.0)
    for event in prof.key_averages(group_by_input_shape=True):
        parts[op_class(event, model.config.vocab_size)] += event.self_cpu_time_total / 1e6
    parts["overhead"] = max(0.0, wall - sum(parts.values()))
    return wall, parts


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m ropebench.benchmarks.probes.profile_forward", description=__doc__.splitlines()[0]
    )
    p.add_argument("--lengths", type=forward_tokens(4096), nargs="+", default=[2048, 4096, 8192, 12288])
    p.add_argument("--dtypes", nargs="+", default=["auto"], help="auto: the dtype extend.load picks here")
    args = p.parse_args(argv)

    import torch
    from ropebench import extend
    from ropebench.benchmarks.flops import attention_flops, gemm_rate, head_flops, linear_flops_per_token

    for dtype in args.dtypes:
        model, _ = extend.load("smollm2-135m", device="cpu", dtype=None if dtype == "auto" else dtype)
        chosen = next(model.parameters()).dtype
        rate = gemm_rate(dtype=chosen)["flops_per_second"] / 1e9
        name = str(chosen).removeprefix("torch.")
        print(
            f"\n{dtype} ({name}), {torch.get_num_threads()} threads, GEMM 2048^3 {rate:.1f} GFLOP/s; "
            f"SDPA called with {sdpa_call(model, torch.arange(64).reshape(1, -1))}\n"
        )
        print(
            "| length | wall (s) | "
            + " | ".join(CLASSES)
            + " | GEMMs GFLOP/s (linear + head) | attention GFLOP/s | attention / GEMM rate |\n"
            + "|---:" * (len(CLASSES) + 5)
            + "|",
            flush=True,
        )
        for length in args.lengths:
            wall, parts = profile(model, length)
            linear = (
                linear_flops_per_token(model.config) * length + head_flops(model.config, length - 1)
            ) / (parts["linear layers"] + parts["LM head"])
            attention = attention_flops(model.config, length) / parts["attention"]
            print(
                f"| {length} | {wall:.1f} | "
                + " | ".join(f"{v:.2f} s ({100 * v / wall:.0f}%)" for v in parts.values())
                + f" | {linear / 1e9:.1f} | {attention / 1e9:.1f} | {attention / 1e9 / rate:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
