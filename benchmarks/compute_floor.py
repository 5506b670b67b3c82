"""The demo's compute floor on this CPU (issue 29): its forward FLOPs over this CPU's measured GEMM rate in
the demo's dtype, and the demo's wall as a ratio to that floor.

FLOPs: every forward the demo's tasks run, counted rather than modelled — the demo's cells (read from
scripts/configs/demo.yaml at run time, through the sweep's own config and grid code) run on a one-layer
stand-in that has the demo model's tokenizer, vocabulary, head size and RoPE (so the prompts, the prefix
sharing and the patches are the demo's), with hooks recording each forward's new tokens, the cached tokens
before them and the rows the LM head scores; those counts priced at the real model's config
(benchmarks/flops.py: linear + causal attention + LM head). Generated continuations can differ in length
from the real model's (the stand-in stops at other tokens); they are a few tokens against thousands.
GEMM rate: a 2048 x 2048 matmul in the demo's dtype, best of 3: on all of torch's threads in wall time, and
(`--per-core`, for a shared CPU) on one thread in its CPU time x the thread count; the floor uses the first
unless --per-core is given.

    ropebench bench compute-floor [--config FILE] [--demo-seconds 501 | --run-dir runs/demo] [--json F]

The wall: `--demo-seconds` as given, or `--run-dir`'s recorded cell times (each cell's wall, start to finish,
model loading apart). A ratio below 1 is impossible and is refused with its likely cause (exit 2).
"""

from __future__ import annotations

import sys
import time
from itertools import groupby
from pathlib import Path

from ropebench.benchmarks.errors import ArgumentParser, BenchmarkError, at_least, check_json_path, exit_code


def demo_cells(config: str | None) -> tuple[dict, list]:
    """The sweep's resolved config and cells for `config` (default: the demo), as the sweep builds them."""
    from ropebench.sweep_lib.checks import check_registries
    from ropebench.sweep_lib.cli import load_config, parser
    from ropebench.sweep_lib.orchestrate import _cells
    from ropebench.sweep_lib.plugins import import_plugins

    cfg = load_config(parser().parse_args(["--config", config] if config else []))
    import_plugins(cfg["plugins"])
    check_registries(cfg)  # as the sweep does: e.g. plain runs once, at factor 1 (its cells' keys say so)
    return cfg, _cells(cfg, "cpu")


def tokenizer_of(spec: str):
    from ropebench.extend.loading import ALIASES, embedded_gguf, gguf_snapshot
    from transformers import AutoTokenizer

    if spec in ALIASES or spec.endswith(".gguf"):
        path = embedded_gguf(spec) if spec in ALIASES else Path(spec).expanduser()
        return AutoTokenizer.from_pretrained(str(gguf_snapshot(path)))
    return AutoTokenizer.from_pretrained(spec)


def stand_in(config):
    """A one-layer random model with `config`'s vocabulary, head size, RoPE and trained context."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    small = copy.deepcopy(config)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    small.num_hidden_layers, small.num_attention_heads, small.num_key_value_heads = 1, 2, 1
    small.hidden_size, small.intermediate_size, small.head_dim = 2 * head_dim, 128, head_dim
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(small, dtype=torch.float32).eval()


class Counter:
    """Hooks on the stand-in: (new tokens, cached tokens before them) per sequence of each forward, and the
    rows the LM head scores."""

    def __init__(self, model):
        self.forwards: list[tuple[int, int]] = []
        self.head_rows = 0
        self.hidden = model.config.hidden_size
        self.handles = [
            model.base_model.rotary_emb.register_forward_pre_hook(self.rotary, with_kwargs=True),
            model.get_output_embeddings().register_forward_pre_hook(self.head),
        ]

    def rotary(self, module, args, kwargs):
        x = args[0] if args else kwargs.get("x")
        positions = args[1] if len(args) > 1 else kwargs.get("position_ids")
        if x is None or positions is None or x.numel() == 0:  # a remap's extra rotation: no new tokens
            return
        for row in positions.reshape(-1, positions.shape[-1]):
            self.forwards.append((int(row.numel()), int(row.min())))

    def head(self, module, args):
        self.head_rows += args[0].numel() // self.hidden

    def close(self):
        for h in self.handles:
            h.remove()


def count_forwards(cfg: dict, cells: list, *, progress: bool = False) -> dict:
    """Counts per task over every cell, running each on the stand-in under its method's patch."""
    from ropebench import extend, tasks
    from ropebench.extend.loading import load_config

    spec = cells[0].model
    if any(c.model != spec for c in cells):
        raise BenchmarkError("compute-floor prices one model; the config names several — pass one --model")
    config = load_config(spec)
    model, tokenizer = stand_in(config), tokenizer_of(spec)
    counts = {}
    for (method, factor, _), group in groupby(cells, key=lambda c: (c.method, c.factor, str(c.options))):
        group = list(group)
        with extend.patched(model, method, factor=factor, **group[0].options):
            for cell in group:
                counter = Counter(model)
                try:
                    tasks.TASKS[cell.base_task](
                        model, tokenizer, lengths=list(cell.lengths), seed=cell.seed, progress=progress,
                        **cell.call_options(),
                    )  # fmt: skip
                finally:
                    counter.close()
                entry = counts.setdefault(cell.task, {"forwards": [], "head_rows": 0})
                entry["forwards"] += counter.forwards
                entry["head_rows"] += counter.head_rows
    return {"config": config, "tasks": counts}


def price(config, counts: dict) -> dict:
    """FLOPs per task and part from the counted forwards, at the real model's config."""
    from ropebench.benchmarks import flops

    out = {}
    for task, entry in counts.items():
        linear = sum(flops.linear_flops_per_token(config) * new for new, _ in entry["forwards"])
        attention = sum(flops.attention_flops(config, new, past) for new, past in entry["forwards"])
        head = flops.head_flops(config, entry["head_rows"])
        out[task] = {
            "forwards": len(entry["forwards"]),
            "tokens": sum(new for new, _ in entry["forwards"]),
            "linear": linear,
            "attention": attention,
            "lm head": head,
            "total": linear + attention + head,
        }
    return out


PREDATES = "predates cell timing"  # what the refusal of an old run says (tests read it)


def run_wall(run_dir: Path, cells: list) -> dict:
    """The recorded wall of `run_dir`'s cells that are `cells` (the config's): {"cells": the sum of their
    `cell_seconds` (each cell's wall, start to finish), "load": the sum of their `load_seconds` (model
    loading, outside the cells), "count": how many, "by_task": task -> the sum over its cells}. Never the
    rows' `seconds`: those are each row's own part (a retrieval question's continuation), so a haystack's
    prefill or most of a perplexity forward is in none.
    Refused (one line) when the run lacks one of the config's cells or finished one with an error (its wall
    is not the forwards the floor counts), or predates cell timing."""
    from ropebench import results

    frame = results.load(str(run_dir))
    wanted = {c.key: c for c in cells}
    ok = frame[(frame["status"] == "ok") & frame["cell"].isin(list(wanted))].drop_duplicates("cell")
    missing = [wanted[k].label() for k in wanted if k not in set(ok["cell"])]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise BenchmarkError(
            f"{run_dir} has {len(wanted) - len(missing)} of the config's {len(wanted)} cells finished "
            f"(missing or failed: {shown}) — finish the run (rerun its sweep) or pass the --config it ran"
        )
    if ok["cell_seconds"].isna().any():
        raise BenchmarkError(
            f"{run_dir} {PREDATES}: its records carry no cell_seconds (each cell's wall time) and the rows' "
            f"seconds leave out most of the work — rerun its sweep with --fresh, or pass --demo-seconds with "
            f"the sweep's measured wall"
        )
    tasks = ok["cell"].map(lambda k: wanted[k].task)
    return {
        "cells": float(ok["cell_seconds"].sum()),
        "load": float(ok["load_seconds"].fillna(0.0).sum()),
        "count": len(ok),
        "by_task": {t: float(v) for t, v in ok["cell_seconds"].groupby(tasks).sum().items()},
    }


def ran_elsewhere(run_dir: Path) -> str | None:
    """The host a run's manifest names when it is not this one (None when it is, or is not recorded)."""
    import json
    import platform

    for path in sorted(Path(run_dir).glob("manifest*.json")):
        try:
            host = json.loads(path.read_text(encoding="utf-8")).get("hostname")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(host, str) and host and host != platform.node():
            return host
    return None


def check_ratio(seconds: float, floor: float, what: str, run_dir: Path | None) -> float:
    """`seconds / floor`; below 1 (faster than the FLOPs allow on this CPU) refused with the likely cause."""
    ratio = seconds / floor
    if ratio >= 1:
        return ratio
    host = ran_elsewhere(run_dir) if run_dir is not None else None
    if host is not None:
        cause = f"the run was made on another machine ({host}): measure its floor there"
    elif run_dir is None:
        cause = (
            "the seconds given are not the sweep's wall for this config (a part of it, or another config's), "
            "or this CPU is busier now than when it ran (the GEMM rate measured low: try --per-core)"
        )
    else:
        cause = (
            "this CPU is busier now than when the run was made (the GEMM rate measured low: measure on an "
            "idle machine, or with --per-core), or the run was made on a faster CPU"
        )
    raise BenchmarkError(
        f"{what} {seconds:.1f} s is below its compute floor {floor:.1f} s ({ratio:.2f}x), which no run can "
        f"be; likely cause: {cause}"
    )


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="ropebench bench compute-floor", description=__doc__.splitlines()[0])
    p.add_argument("--config", default=None, help="sweep config (default: scripts/configs/demo.yaml)")
    wall = p.add_mutually_exclusive_group()
    wall.add_argument("--demo-seconds", type=float, default=None, help="the demo's measured wall (sweep)")
    wall.add_argument(
        "--run-dir", type=Path, default=None, help="a finished run of the config: its recorded cell times"
    )
    p.add_argument(
        "--gemm-size",
        type=at_least(64, 2048, high=16384, cost="an n x n GEMM is 2n^3 FLOPs, best of 3"),
        default=2048,
    )
    p.add_argument(
        "--per-core", action="store_true", help="the GEMM rate from one thread's CPU time x threads"
    )
    p.add_argument("--json", default=None, help="also write the figures here (a new file)")
    args = p.parse_args(argv)
    check_json_path(args.json)

    import torch
    from ropebench.benchmarks.flops import gemm_rate
    from ropebench.extend.loading import _dtype, cpu_key

    cfg, cells = demo_cells(args.config)
    wall = run_wall(args.run_dir, cells) if args.run_dir is not None else None  # refused before counting
    dtype = _dtype(cfg["dtype"])
    start = time.perf_counter()
    counted = count_forwards(cfg, cells)
    counting = time.perf_counter() - start
    priced = price(counted["config"], counted["tasks"])
    rate = gemm_rate(dtype=dtype, size=args.gemm_size, per_core=args.per_core)
    total = sum(t["total"] for t in priced.values())
    floor = total / rate["flops_per_second"]
    if wall is not None:  # refused before anything is printed
        ratio = check_ratio(wall["cells"], floor, "the run's recorded cell time", args.run_dir)
    elif args.demo_seconds is not None:
        ratio = check_ratio(args.demo_seconds, floor, "the wall given", None)
    print(
        f"- CPU: {cpu_key()}; {torch.get_num_threads()} threads; demo dtype {cfg['dtype']} "
        f"({cfg['dtype_reason']})"
    )
    print(f"- Config: {cfg['config_file']}; {len(cells)} cells; counted in {counting:.0f} s on the stand-in")
    print(
        f"- GEMM rate ({rate['dtype']}, {rate['size']}^3, best of {rate['rounds']}, {rate['clock']}): "
        f"{rate['flops_per_second'] / 1e9:.1f} GFLOP/s\n"
    )
    walls = wall["by_task"] if wall is not None else None  # where the time went, against each task's floor
    print(
        "| task | forwards | tokens | linear GFLOP | attention GFLOP | LM head GFLOP | total GFLOP "
        "| floor s |" + (" cells' wall s | wall / floor |" if walls else "")
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if walls else ""))
    for task, t in priced.items():
        task_floor = t["total"] / rate["flops_per_second"]
        spent = f" {walls[task]:.0f} | {walls[task] / task_floor:.1f}x |" if walls else ""
        print(
            f"| {task} | {t['forwards']} | {t['tokens']} | {t['linear'] / 1e9:.0f} | "
            f"{t['attention'] / 1e9:.0f} | {t['lm head'] / 1e9:.0f} | {t['total'] / 1e9:.0f} | "
            f"{task_floor:.1f} |{spent}"
        )
    spent = f" **{wall['cells']:.0f}** | **{wall['cells'] / floor:.1f}x** |" if walls else ""
    print(f"| **all** | | | | | | **{total / 1e9:.0f}** | **{floor:.1f}** |{spent}")
    if wall is not None:
        print(
            f"\nThe run's {wall['count']} cells took {wall['cells']:.0f} s (their recorded wall times; model "
            f"loading {wall['load']:.0f} s besides): {ratio:.1f}x its compute floor ({floor:.1f} s)."
        )
    elif args.demo_seconds is not None:
        print(
            f"\nThe demo's wall {args.demo_seconds:.0f} s is {ratio:.1f}x its compute floor ({floor:.1f} s)."
        )
    if args.json:
        words = argv if argv is not None else sys.argv[1:]
        write_record(args, "ropebench bench compute-floor " + " ".join(words), cfg, rate, priced, floor, wall)
    return 0


def run_facts(run_dir: Path) -> dict:
    """When and from what code the run was made (its manifest)."""
    import json

    manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    keep = ("start_time", "end_time", "git", "device", "versions")
    return {k: manifest.get(k) for k in keep} | {"dtype": manifest.get("config", {}).get("dtype")}


def write_record(
    args, command: str, cfg: dict, rate: dict, priced: dict, floor: float, wall: dict | None
) -> None:
    """The figures printed, as JSON (`--json`): what BENCHMARKS.md quotes and its tests read."""
    import datetime
    import json

    import torch
    from ropebench.extend.loading import cpu_key
    from ropebench.extend.owned_paths import write_loose_file

    seconds = wall["cells"] if wall is not None else args.demo_seconds
    record = {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu": cpu_key(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "config": str(cfg["config_file"]),
        "dtype": cfg["dtype"],
        "gemm": {k: rate[k] for k in ("dtype", "size", "rounds", "clock", "flops_per_second")},
        "tasks": {
            task: {**t, "floor_seconds": t["total"] / rate["flops_per_second"]}
            | ({"wall_seconds": wall["by_task"][task]} if wall is not None else {})
            for task, t in priced.items()
        },
        "floor_seconds": floor,
        "wall_seconds": seconds,
        "wall_from": str(args.run_dir) if wall is not None else ("--demo-seconds" if seconds else None),
        "load_seconds": wall["load"] if wall is not None else None,
        "run": run_facts(args.run_dir) if wall is not None else None,
        "ratio": seconds / floor if seconds else None,
    }
    write_loose_file(args.json, json.dumps(record, indent=1), "--json", BenchmarkError)


if __name__ == "__main__":
    sys.exit(exit_code(main, None))
