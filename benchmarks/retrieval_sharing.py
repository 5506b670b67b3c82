"""The retrieval task's haystack sharing: `tasks.retrieval.run` with share_prefix True vs False in one
process, the same model and grid; prints the shared/unshared wall-time ratio, the tokens each side computed
and the largest difference between the two sides' values (float32: ~1e-5; the 0/1 metrics must agree).

    HF_HUB_OFFLINE=1 .venv/bin/ropebench bench retrieval-sharing        # SmolLM2, 4096, 3 repeats
    HF_HUB_OFFLINE=1 .venv/bin/ropebench bench retrieval-sharing --tiny --lengths 512 --repeats 1
        # a tiny random model with SmolLM2's vocabulary: seconds

The two sides alternate their order between repeats; the ratio is the median over repeats. Run it on an idle
machine (the lead's measurement goes to benchmarks/BENCHMARKS.md).
"""

from __future__ import annotations

import statistics
import sys
import time

from ropebench.benchmarks.errors import REPEATS, ArgumentParser, count, exit_code, forward_tokens, fraction


def _model(tiny: bool):
    import torch
    from ropebench import extend

    model, tok = extend.load("smollm2-135m", device="cpu", dtype=torch.float32)
    if not tiny:
        return model, tok
    from ropebench.benchmarks.tiny_models import SMALL_CONFIG
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**{**SMALL_CONFIG, "vocab_size": len(tok), "max_position_embeddings": 8192})
    return LlamaForCausalLM(config).eval(), tok


def _side(model, tok, share: bool, kw: dict):
    """(seconds, tokens computed, rows) of one run."""
    from ropebench.benchmarks.prefix_sharing import _spy_caches
    from ropebench.tasks import retrieval

    counting, made = _spy_caches()  # every PrefixCache the task makes, kept for its token counter
    with counting:
        t0 = time.perf_counter()
        rows = retrieval.run(model, tok, share_prefix=share, progress=False, **kw)
        secs = time.perf_counter() - t0
    return secs, sum(c.computed for c in made), rows


def main(argv=None) -> int:
    from ropebench.tasks.sizes import MAX_TRIALS, TRIAL_COST  # the tasks' bound (tasks load torch: here)

    p = ArgumentParser(prog="ropebench bench retrieval-sharing", description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=forward_tokens(4096), nargs="+", default=[4096])
    p.add_argument("--variants", nargs="+", default=["niah_multikey", "niah_multiquery"])
    p.add_argument("--depths", type=fraction, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0])
    p.add_argument("--trials", type=count(2, MAX_TRIALS, TRIAL_COST), default=2)
    p.add_argument("--scoring", default="likelihood", choices=["likelihood", "generate", "both"])
    p.add_argument("--repeats", type=REPEATS, default=3)
    p.add_argument(
        "--tiny", action="store_true", help="a tiny random model with SmolLM2's vocabulary (a smoke run)"
    )
    args = p.parse_args(argv)
    kw = {
        "lengths": args.lengths,
        "variants": args.variants,
        "depths": args.depths,
        "trials": args.trials,
        "scoring": args.scoring,
    }
    from ropebench.tasks.checks import check_task

    # the retrieval task's own checks (variant names, pools), before SmolLM2 loads (with --tiny too)
    check_task("retrieval", {k: v for k, v in kw.items() if k != "lengths"})
    model, tok = _model(args.tiny)
    ratios, tokens, diff = [], None, 0.0
    for repeat in range(args.repeats):
        order = (True, False) if repeat % 2 == 0 else (False, True)
        sides = {share: _side(model, tok, share, kw) for share in order}
        (s_secs, s_tok, s_rows), (u_secs, u_tok, u_rows) = sides[True], sides[False]
        ratios.append(s_secs / u_secs)
        tokens = (s_tok, u_tok)
        for a, b in zip(s_rows, u_rows, strict=True):
            diff = max(diff, abs(a["value"] - b["value"]))
        print(f"repeat {repeat}: shared {s_secs:.2f} s, unshared {u_secs:.2f} s, ratio {s_secs / u_secs:.3f}")
    print(
        f"retrieval {args.variants} {args.scoring}, lengths {args.lengths}, depths {args.depths}, trials "
        f"{args.trials}, {'tiny model' if args.tiny else 'SmolLM2-135M'}: shared/unshared time "
        f"{statistics.median(ratios):.3f} (median of {len(ratios)}); tokens computed {tokens[0]} vs "
        f"{tokens[1]} ({tokens[0] / tokens[1]:.3f}); largest |difference| of a value {diff:.2e}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
