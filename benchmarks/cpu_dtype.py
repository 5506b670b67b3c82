"""bf16 vs fp32 speed on this CPU at SmolLM2-135M's shapes (hidden 576, MLP 1536, 9 heads x 64): a GEMM,
causal SDPA and a decoder layer's worth of both (4 GEMMs + attention), as fp32-time / bf16-time (> 1: bf16
faster), on one core in thread CPU time, over several lengths — the measurement behind
`extend.loading.dtype_choice` (which runs it once, at 1024 tokens). Prints a markdown table for
benchmarks/BENCHMARKS.md. Takes a few seconds.

    .venv/bin/ropebench bench cpu-dtype [--tokens 256 512 1024 2048 4096] [--rounds 3]
"""

from __future__ import annotations

import datetime
import os
import sys

from ropebench.benchmarks.errors import REPEATS, ArgumentParser, exit_code, forward_tokens


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="ropebench bench cpu-dtype", description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=forward_tokens(1024), nargs="+", default=[256, 512, 1024, 2048, 4096])
    p.add_argument(
        "--rounds", type=REPEATS, default=3, help="timed rounds per side (best of), after one warm-up"
    )
    args = p.parse_args(argv)

    import torch
    from ropebench.extend import loading

    caps = torch.cpu.get_capabilities()
    native = [k for k in ("avx512_bf16", "amx_bf16") if caps.get(k)]
    print(
        f"- Date: {datetime.date.today()}; CPU: {loading.cpu_key()}; torch capability "
        f"{torch.backends.cpu.get_cpu_capability()}; native bf16: {', '.join(native) or 'none'}; load "
        f"average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(
        "\n| tokens | GEMM | attention (SDPA) | decoder layer | choice at these ratios |\n"
        "|---:|---:|---:|---:|---|"
    )
    for tokens in args.tokens:
        s = loading.measure_bf16_speedup(tokens=tokens, rounds=args.rounds)
        dtype = str(loading.choose_cpu_dtype(s).dtype).removeprefix("torch.")
        print(
            f"| {tokens} | {s['gemm']:.2f}x | {s['attention']:.2f}x | {s['layer']:.2f}x | {dtype} |",
            flush=True,
        )
    choice = loading.dtype_choice("cpu")
    dtype = str(choice.dtype).removeprefix("torch.")
    print(f"\n`extend.loading.dtype_choice('cpu')`: {dtype} — {choice.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
