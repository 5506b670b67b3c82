"""One passkey prompt (the task's own: filler haystack, depth 0.95, trial 0) under one method: the answer of
`tasks.passkey`'s cached generation and the top first tokens of one full forward without any cache, to tell a
model that does not retrieve from a broken cached path.

    HF_HUB_OFFLINE=1 .venv/bin/python -m ropebench.benchmarks.probes.passkey_probe METHOD FACTOR LENGTH
"""

from __future__ import annotations

import sys
import time

from ropebench.benchmarks.errors import ArgumentParser, exit_code, forward_tokens


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(
        prog="python -m ropebench.benchmarks.probes.passkey_probe", description=__doc__.splitlines()[0]
    )
    p.add_argument("method", help="a registered method, e.g. plain, yarn, self-extend")
    p.add_argument("factor", type=float, help="its factor, e.g. 2")
    p.add_argument("length", type=forward_tokens(8192), help="prompt length in tokens, e.g. 8192")
    args = p.parse_args(argv)

    import torch
    from ropebench import extend
    from ropebench.benchmarks.probes.passkey_floor import prompts
    from ropebench.extend.forward import body
    from ropebench.extend.prefix_cache import PrefixCache
    from ropebench.tasks import passkey

    model, tok = extend.load("smollm2-135m", dtype="float32")
    method, factor, length = args.method, args.factor, args.length
    ids = prompts(model, tok, length, 1, depths=[0.95])[0]
    print(len(ids), "tokens, ending", repr(tok.decode(ids[-60:])))
    with extend.patched(model, method, factor=factor):
        t = time.perf_counter()
        answer = passkey._generate(model, tok, ids, 8, PrefixCache(model, share=False))
        print("generate:", repr(answer), f"{time.perf_counter() - t:.0f}s", flush=True)
        with torch.inference_mode():
            h = body(model)(input_ids=torch.tensor([ids]), use_cache=False).last_hidden_state[0, -1]
            top = model.get_output_embeddings()(h).topk(5).indices.tolist()
        print("full forward top5:", [tok.decode([i]) for i in top])
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
