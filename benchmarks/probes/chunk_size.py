"""Profile of the LM head + loss step that `tasks.scoring.token_nll` runs after the decoder body
(`tasks.scoring.nll_from_hidden`): seconds per chunk size (positions per LM-head call) at one long window,
with the float32 loss in cache-sized blocks (now) and over whole chunks (before), against the head alone.
See benchmarks/NOTES.md.

    HF_HUB_OFFLINE=1 .venv/bin/python -m ropebench.benchmarks.probes.chunk_size [--length 8192]
        [--chunks 256 1024 4096]
"""

from __future__ import annotations

import sys
import time
from unittest import mock

from ropebench.benchmarks.errors import REPEATS, ArgumentParser, exit_code, forward_tokens


def best_of(fn, repeats, *args, **kw):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args, **kw)
        times.append(time.perf_counter() - t0)
    return min(times)


def head_only(model, hidden, chunk):
    for i in range(0, hidden.shape[0], chunk):
        model.get_output_embeddings()(hidden[i : i + chunk])


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m ropebench.benchmarks.probes.chunk_size", description=__doc__.splitlines()[0]
    )
    p.add_argument("--length", type=forward_tokens(8192), default=8192)
    p.add_argument("--chunks", type=forward_tokens(1024), nargs="+", default=[256, 1024, 4096])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    p.add_argument("--repeats", type=REPEATS, default=3)
    args = p.parse_args(argv)

    import torch
    from ropebench import extend
    from ropebench.tasks import scoring

    print(
        "| dtype | chunk | head + loss, blocked (s) | head + loss, whole chunk (s) | head alone (s) "
        "| body (s) |\n|---|---:|---:|---:|---:|---:|"
    )
    for dtype in args.dtypes:
        model, _ = extend.load("smollm2-135m", device="cpu", dtype=dtype)
        ids = torch.randint(
            0, model.config.vocab_size, (1, args.length), generator=torch.Generator().manual_seed(0)
        )
        with torch.inference_mode():
            t0 = time.perf_counter()
            hidden = scoring.body(model)(input_ids=ids, use_cache=False).last_hidden_state[0, :-1]
            body_s = time.perf_counter() - t0
            targets = ids[0, 1:]
            for chunk in args.chunks:
                blocked = best_of(
                    scoring.nll_from_hidden, args.repeats, model, hidden, targets, chunk_size=chunk
                )
                with mock.patch.object(scoring, "LOSS_BLOCK_BYTES", 2**62):  # one block = the whole chunk
                    whole = best_of(
                        scoring.nll_from_hidden, args.repeats, model, hidden, targets, chunk_size=chunk
                    )
                head_s = best_of(head_only, args.repeats, model, hidden, chunk)
                print(
                    f"| {dtype} | {chunk} | {blocked:.2f} | {whole:.2f} | {head_s:.2f} | {body_s:.1f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
