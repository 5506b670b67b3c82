"""torch.profiler of one decoder-body forward of the embedded SmolLM2-135M: where the time goes (matmuls of
the linear layers vs the attention kernel) per dtype and length. Explains the curve and rolling figures in
BENCHMARKS.md (see NOTES.md).

    HF_HUB_OFFLINE=1 .venv/bin/python -m ropebench.benchmarks.probes.profile_forward [--lengths 4096 16384]
        [--dtypes float32 bfloat16]
"""

from __future__ import annotations

import sys

from ropebench.benchmarks.errors import ArgumentParser, exit_code, forward_tokens

GROUPS = {
    "aten::mm": "linear layers (mm)",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention (sdpa)",
}


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


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m ropebench.benchmarks.probes.profile_forward", description=__doc__.splitlines()[0]
    )
    p.add_argument("--lengths", type=forward_tokens(4096), nargs="+", default=[4096, 16384])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    args = p.parse_args(argv)

    import torch
    from ropebench import extend
    from ropebench.tasks.scoring import body
    from torch.profiler import ProfilerActivity, profile

    for dtype in args.dtypes:
        model, _ = extend.load("smollm2-135m", device="cpu", dtype=dtype)
        print(
            f"\n{dtype}: SDPA called with {sdpa_call(model, torch.arange(64).reshape(1, -1))}\n", flush=True
        )
        print(
            "| dtype | length | total (s) | linear layers (mm) | attention (sdpa) | other |\n"
            "|---|---:|---:|---:|---:|---:|"
        )
        for length in args.lengths:
            ids = torch.randint(
                0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0)
            )
            with torch.inference_mode():
                body(model)(input_ids=ids[:, :32])  # warm-up
                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    body(model)(input_ids=ids, use_cache=False)
            events = prof.key_averages()
            total = sum(e.self_cpu_time_total for e in events) / 1e6
            parts = {
                name: sum(e.self_cpu_time_total for e in events if e.key == key) / 1e6
                for key, name in GROUPS.items()
            }
            other = total - sum(parts.values())
            print(
                f"| {dtype} | {length} | {total:.1f} | "
                + " | ".join(f"{v:.1f} s ({100 * v / total:.0f}%)" for v in [*parts.values(), other])
                + " |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
