"""The least wall time exact prefix reuse can reach on the prefix-sharing benchmark's passkey grid (issue 15).

The prompts are the benchmark's own (`tasks.passkey.run` with the generation stubbed out, so nothing runs), in
the scorer's sharing order; each prompt must compute the segment [shared, len) of its tokens, where `shared`
is what it has in common with the previous prompt (zero below `MIN_SHARED`): together, the prompts' token
trie. A forward is modelled as t(L) = a L + b L^2 (benchmarks/cost_model.py), fitted to fresh forwards of this
model timed here, so a segment costs a (e - s) + b (e^2 - s^2): its linear layers, and attention over
everything before each token. The floor is sum(segments) / sum(t(len)) of the unshared path. A measured
continuation (a tail on a cached prefix, in the scorer's blocks) checks the model on the kind of forward the
shared path runs.

    HF_HUB_OFFLINE=1 .venv/bin/python -m ropebench.benchmarks.probes.passkey_floor [--length 8192]
        [--trials 4] [--dtype float32]
"""

from __future__ import annotations

import sys
import time
from unittest import mock

from ropebench.benchmarks.cost_model import quadratic_fit
from ropebench.benchmarks.errors import ArgumentParser, count, exit_code, forward_tokens
from ropebench.benchmarks.orchestrate import machine
from ropebench.benchmarks.prefix_sharing import DEPTHS


def prompts(model, tok, length: int, trials: int, depths=DEPTHS) -> list[list[int]]:
    """The benchmark's passkey prompts, built by the task itself (generation stubbed: no forward runs)."""
    from ropebench.tasks import passkey

    seen = []
    with mock.patch.object(passkey, "_generate", lambda m, t, ids, n, cache: seen.append(list(ids)) or ""):
        passkey.run(model, tok, lengths=[length], depths=depths, trials=trials, progress=False)
    return seen


def segments(cell: list[list[int]]) -> list[tuple[int, int]]:
    """(first computed position, prompt length) per prompt, in the scorer's order and by its sharing rule."""
    from ropebench.extend.prefix_cache import MIN_SHARED, common_prefix, sharing_order

    out, last = [], []
    for i in sharing_order(cell):
        ids = cell[i]
        shared = min(common_prefix(last, ids), len(ids) - 1)
        out.append((shared if shared >= MIN_SHARED else 0, len(ids)))
        last = ids
    return out


def timed_forward(model, ids, cache=None, block=None) -> float:
    import torch
    from ropebench.extend.forward import with_cache

    with torch.inference_mode():
        start = time.perf_counter()
        step = block or ids.shape[1]
        for i in range(0, ids.shape[1], step):
            model.model(
                input_ids=ids[:, i : i + step], use_cache=cache is not None, **with_cache(model.model, cache)
            )
        return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m ropebench.benchmarks.probes.passkey_floor", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--length", type=forward_tokens(8192), default=8192)
    parser.add_argument("--trials", type=count(4, 1000, "one prompt each"), default=4)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--tail-from",
        type=forward_tokens(2048),
        default=2048,
        help="cached prefix of the measured continuation",
    )
    args = parser.parse_args(argv)

    import torch
    from ropebench import extend
    from ropebench.extend.prefix_cache import CONTINUE_BLOCK
    from transformers import DynamicCache

    model, tok = extend.load("smollm2-135m", dtype=args.dtype)
    cell = prompts(model, tok, args.length, args.trials)
    segs = segments(cell)
    L = args.length
    ids = torch.randint(100, 40000, (1, L), generator=torch.Generator().manual_seed(0))
    timed_forward(model, ids)  # warm-up: page faults and allocator growth of the first long forward
    times = {
        n: min(timed_forward(model, ids[:, :n]) for _ in range(2)) for n in (L // 4, L // 2, 3 * L // 4, L)
    }
    a, b = quadratic_fit(times)

    def model_t(s, e):  # modelled seconds of computing positions [s, e) on a cache holding [0, s)
        return a * (e - s) + b * (e * e - s * s)

    cache = DynamicCache()
    timed_forward(model, ids[:, : args.tail_from], cache)
    tail = timed_forward(model, ids[:, args.tail_from :], cache, block=CONTINUE_BLOCK)
    unshared = sum(model_t(0, e) for _, e in segs)
    m = machine()
    print(
        f"SmolLM2-135M, {model.dtype}, {torch.get_num_threads()} threads, {m['cpu']} ({m['cores']} cores, "
        f"avx512_bf16: {'yes' if m['avx512_bf16'] else 'no'})"
    )
    print("fresh forwards (best of 2): " + ", ".join(f"{n}: {t:.1f} s" for n, t in times.items()))
    print(
        f"fit t(L) = a L + b L^2: attention share at {L}: {b * L / (a + b * L):.3f}; "
        + ", ".join(f"{n}: model {model_t(0, n):.1f} s" for n in times)
    )
    print(
        f"continuation {args.tail_from}->{L} on a cache in {CONTINUE_BLOCK}-token blocks: {tail:.1f} s "
        f"measured, {model_t(args.tail_from, L):.1f} s modelled"
    )
    print(
        f"{len(cell)} prompts: tokens computed {sum(e - s for s, e in segs)} of {sum(e for _, e in segs)} "
        f"({sum(e - s for s, e in segs) / sum(e for _, e in segs):.3f}); modelled prefill cost, shared / "
        f"unshared: {sum(model_t(s, e) for s, e in segs) / unshared:.3f} (the floor of exact prefix reuse, "
        "before the answer tokens, which cost the same on both sides)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
