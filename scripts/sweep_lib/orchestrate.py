"""A whole sweep from a resolved config: check every name, build the grid, dry-run or take the run directory
(lock, --fresh, resume), run this rank's share of the cells, and let rank 0 print the outcome."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from . import grid as G
from . import rundir
from .checks import check_registries
from .config import ConfigError, raise_demo_num_docs
from .dist import Dist
from .plugins import import_plugins
from .printout import print_outcome, print_plan
from .resolve import check_writable
from .run import WriteFailure, run_cells, say


def sweep(args, cfg: dict, *, report: bool = True) -> int:
    """Run the sweep `args` (the parsed flags) and `cfg` (their resolved config) describe; the exit code.
    `report=False`: records only, no summary, tables or report.md (a caller that reads the records itself, as
    the GPU check's demo grid does; `ropebench report OUT` writes them later)."""
    check_writable(cfg["out"])
    import_plugins(cfg["plugins"])
    check_registries(cfg)  # names, option values, task options, corpora, models: all before a model loads
    out = Path(cfg["out"])
    rundir.check_out(out)
    rundir.check_records(out, args.fresh)  # damaged or foreign records: one line, before the grid is shown
    inherits_demo = not args.config and bool(args.model or args.corpus)
    if inherits_demo:  # the demo's num_docs: 1 gives no interval on another model or corpus
        cfg["num_docs_raised"] = raise_demo_num_docs(cfg, args)
    if args.dry_run:
        return _dry_run(cfg, out, fresh=args.fresh, inherits_demo=inherits_demo)
    dist = Dist()
    device = dist.device(cfg["device"])
    cells = _cells(cfg, device)
    # refused: raises, having touched nothing of the holder's
    lock, created = rundir.take(out, dist.shard_rank)
    completed = False
    try:
        if inherits_demo and dist.main:
            # the demo's num_docs / trials / depths now carry another model's or corpus' numbers
            print_plan(cfg)
        code = _run(args, cfg, cells, dist, device, out, report)
        completed = True
        return code
    finally:
        if created and not completed and not any(out.glob("records*.jsonl")):
            # stopped before any record (e.g. the model is rejected)
            rundir.discard(out, lock, dist.shard_rank)
        lock.release()


def _cells(cfg: dict, device: str | None) -> list[G.Cell]:
    """The grid's cells. Fixes cfg's device and dtype first: as extend.load decides them (the dtype is part of
    every cell's key)."""
    from ropebench import tasks
    from ropebench.extend.loading import default_device, dtype_choice
    from ropebench.tasks.checks import signature_options

    cfg["resolved_device"] = device or default_device()
    # the manifest records the choice and why (on a CPU: measured, see extend.loading)
    if cfg["dtype"] is None:
        choice = dtype_choice(cfg["resolved_device"])
        cfg["dtype"], cfg["dtype_reason"] = str(choice.dtype).removeprefix("torch."), choice.reason
    else:
        cfg.setdefault("dtype_reason", "given (--dtype or dtype: in the config)")

    def takes(task, option):
        known, takes_any = signature_options(tasks.TASKS[task])
        return takes_any or option in known

    cells = G.build(cfg, takes)
    if not cells:
        raise ConfigError("empty grid: no cells — check methods, factors, tasks and lengths")
    return cells


def _dry_run(cfg: dict, out: Path, *, fresh: bool, inherits_demo: bool) -> int:
    from ropebench import results

    if inherits_demo:
        print_plan(cfg)
    cells = _cells(cfg, cfg["device"])
    finished = set() if fresh else results.finished_cells(out)
    for c in cells:
        print(f"{c.key}  {'done' if c.key in finished else 'todo'}  {c.model}  {c.label()}")
    print(f"{len(cells)} cells, {len(finished & {c.key for c in cells})} finished; out: {out}")
    return 0


def _trained_context(spec: str, trust_remote_code: bool) -> int | None:
    """The model's trained context from its config alone; None when unknown (the report draws no line)."""
    from ropebench.extend.loading import trained_context_of

    try:
        return trained_context_of(spec, trust_remote_code)
    except Exception:  # noqa: BLE001 - best effort: the config may not say (the cells still run)
        return None


def _forced_contexts(cells: list[G.Cell]) -> dict[str, int]:
    """model -> the trained context every one of its cells forces with -o original_max_position_embeddings
    (a model whose cells disagree, or do not all force one, keeps its config's in the manifest)."""
    by_model: dict[str, set] = {}
    for c in cells:
        by_model.setdefault(c.model, set()).add(c.options.get("original_max_position_embeddings"))
    return {m: int(next(iter(v))) for m, v in by_model.items() if len(v) == 1 and None not in v}


def _run(args, cfg: dict, cells: list[G.Cell], dist: Dist, device, out: Path, report: bool = True) -> int:
    quiet = args.quiet
    show = not quiet and dist.main
    if not show:  # transformers' own bars ("Loading weights") and reminders
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    if args.fresh and dist.main:
        rundir.fresh(out)
    rundir.clean_stray_temps(out, dist.shard_rank)
    dist.wait()

    from ropebench import results

    finished = results.finished_cells(out)
    mine = G.shard(cells, dist.rank, dist.world)
    todo = [c for c in mine if c.key not in finished]
    cfg["trained_context"] = {m: _trained_context(m, cfg["trust_remote_code"]) for m in cfg["model"]}
    config_context = dict(cfg["trained_context"])
    forced = _forced_contexts(cells)
    cfg["trained_context"].update(forced)  # what the rows record too (the patch follows the forced value)
    writer = results.RecordWriter(out, rank=dist.shard_rank)
    manifest_config = {k: v for k, v in cfg.items() if k != "trained_context"}
    manifest_config["cells"] = {c.key: c.definition() for c in cells}
    try:
        writer.write_manifest(
            config=manifest_config,
            seed=cfg["seed"],
            device=cfg["resolved_device"],
            extra={
                "trained_context": cfg["trained_context"],
                "config_trained_context": config_context,
                "rank": dist.rank,
                "world_size": dist.world,
                "cells_total": len(cells),
                "cells_mine": len(mine),
                "cells_todo": len(todo),
            },
        )
    except OSError as e:
        raise WriteFailure(
            f"cannot write {writer.manifest_path}: {e.strerror or e} — free space (or fix the "
            f"directory), then rerun the same command"
        ) from e
    where = f"rank {dist.rank} of {dist.world}: " if dist.world > 1 else ""
    say(
        f"{len(cells)} cells ({sum(c.key in finished for c in cells)} already finished); "
        f"{where}{len(todo)} to run -> {out}",
        quiet,
    )
    t0 = time.perf_counter()
    ok, failed = run_cells(todo, cfg, writer, run=out.name, device=device, show=show, rank=dist.rank)
    try:
        writer.finish()
    except OSError as e:  # every record is on disk; only the end time is missing
        say(f"warning: could not record the end time in {writer.manifest_path}: {e.strerror or e}", False)
    if dist.world > 1:
        print(
            f"rank {dist.rank}: {ok} cells ok, {failed} failed in {time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
    dist.wait()
    if not dist.main:
        return 0  # rank 0 reports (and sets the exit code) for the whole grid
    if report:
        code = print_outcome(cfg, cells)
    else:  # records only: the exit code as print_outcome's (1 if a cell of the grid is not finished)
        done = results.finished_cells(out)
        missing = sum(c.key not in done for c in cells)
        say(
            f"{len(cells) - missing} of {len(cells)} cells finished; no report (`ropebench report {out}`)",
            quiet,
        )
        code = 1 if missing else 0
    say(f"sweep time {time.perf_counter() - t0:.0f} s", quiet)
    return code
