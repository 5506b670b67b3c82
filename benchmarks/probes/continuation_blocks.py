"""What a forward continued on a KV cache costs, in one piece or in blocks
(extend.prefix_cache.CONTINUE_BLOCK).

SmolLM2-135M (float32) with yarn x2: a fresh forward of L random tokens, then, on a cache holding the first
`prefix` of them, the remaining tokens as one forward and in blocks of 2048, 1024 and 512; each against the
fresh forward's hidden states (max |difference|).

    HF_HUB_OFFLINE=1 .venv/bin/python -m ropebench.benchmarks.probes.continuation_blocks
        [prefix, default 2048]
"""

from __future__ import annotations

import sys
import time

from ropebench.benchmarks.errors import ArgumentParser, exit_code, forward_tokens

LENGTH = 8192


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m ropebench.benchmarks.probes.continuation_blocks", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "prefix",
        type=forward_tokens(2048),
        nargs="?",
        default=2048,
        help="tokens on the cache (default 2048)",
    )
    args = p.parse_args(argv)

    import torch
    from ropebench import extend
    from ropebench.extend.forward import body, with_cache
    from ropebench.extend.prefix_cache import native_gqa
    from transformers import DynamicCache

    model, _tok = extend.load("smollm2-135m", device="cpu", dtype="float32")
    extend.patch(model, "yarn", factor=2.0)
    L, a = LENGTH, args.prefix
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (1, L), generator=g)
    B = body(model)
    with torch.inference_mode():
        B(input_ids=ids[:, :64])
        c0 = DynamicCache()
        B(input_ids=ids[:, :a], use_cache=True, **with_cache(B, c0))

        def run(chunk):
            c = DynamicCache()
            B(input_ids=ids[:, :a], use_cache=True, **with_cache(B, c))
            t = time.perf_counter()
            hs = []
            with native_gqa(model):
                for s in range(a, L, chunk):
                    hs.append(
                        B(
                            input_ids=ids[:, s : min(L, s + chunk)], use_cache=True, **with_cache(B, c)
                        ).last_hidden_state
                    )
            return time.perf_counter() - t, torch.cat(hs, 1)

        t = time.perf_counter()
        full = B(input_ids=ids, use_cache=False).last_hidden_state
        tf = time.perf_counter() - t
        print(f"fresh {L}: {tf:.1f}s", flush=True)
        for chunk in [L - a, 2048, 1024, 512]:
            dt, h = run(chunk)
            print(
                f"prefix {a}, tail {L - a} in chunks of {chunk}: {dt:.1f}s  max|dh| vs fresh "
                f"{(h - full[:, a:]).abs().max().item():.2e}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
