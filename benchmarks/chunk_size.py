"""Profile of the LM head + loss step that `tasks.scoring.token_nll` runs after the decoder body: seconds for
each chunk size (positions per lm_head block) at one long window, against the head alone, in fp32 and bf16.
Checks whether `token_nll`'s default chunk_size (1024) costs time on a CPU; see benchmarks/NOTES.md.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/chunk_size.py [--length 8192] [--chunks 64 128 256 512 1024 4096]
"""
import argparse
import time

import torch
import torch.nn.functional as F

import extend
from tasks.scoring import body, head_logits


def best_of(fn, repeats, *args):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return min(times)


def head_and_loss(model, hidden, targets, chunk):
    """What token_nll does after the body: lm_head + float32 cross-entropy, `chunk` positions at a time."""
    out = torch.empty(targets.shape[0])
    for i in range(0, targets.shape[0], chunk):
        out[i:i + chunk] = F.cross_entropy(head_logits(model, hidden[i:i + chunk]), targets[i:i + chunk],
                                           reduction="none")
    return out


def head_only(model, hidden, chunk):
    for i in range(0, hidden.shape[0], chunk):
        model.get_output_embeddings()(hidden[i:i + chunk])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--length", type=int, default=8192)
    p.add_argument("--chunks", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 4096])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    print("| dtype | chunk | head + loss (s) | head alone (s) | body (s) |\n|---|---:|---:|---:|---:|")
    for dtype in args.dtypes:
        model, _ = extend.load("smollm2-135m", device="cpu", dtype=dtype)
        ids = torch.randint(0, model.config.vocab_size, (1, args.length), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            t0 = time.perf_counter()
            hidden = body(model)(input_ids=ids, use_cache=False).last_hidden_state[0, :-1]
            body_s = time.perf_counter() - t0
            targets = ids[0, 1:]
            for chunk in args.chunks:
                loss_s = best_of(head_and_loss, args.repeats, model, hidden, targets, chunk)
                head_s = best_of(head_only, args.repeats, model, hidden, chunk)
                print(f"| {dtype} | {chunk} | {loss_s:.2f} | {head_s:.2f} | {body_s:.1f} |", flush=True)

if __name__ == "__main__":
    main()
