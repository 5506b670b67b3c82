"""Run a sweep: load each model once, patch per method x factor, run every suite cell, write records per cell,
resume, isolate failures, shard over accelerate ranks, and finish with tables and a report."""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import math
import os
import shutil
import sys
import time
import traceback
from itertools import groupby
from pathlib import Path

from . import config as C
from . import grid as G
from . import rundir

MAIN_TABLES = (("perplexity", "ppl", "perplexity (lower is better)"),
               ("perplexity", "ppl_tail", "perplexity of the tokens since the previous length (lower is better)"),
               ("passkey", "correct", "passkey retrieval accuracy"),
               ("classification", "accuracy", "classification accuracy"))


class UsageError(C.ConfigError):
    pass


class WriteFailure(RuntimeError):
    """The records could not be written (e.g. a full disk): the sweep stops; finished cells stay on disk."""


class _Once(argparse.Action):
    """A list flag given twice is an error (argparse would keep only the last: `--methods plain --methods yarn`
    ran yarn alone)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest, None) is not None:
            raise UsageError(f"{option_string} is given twice — give it once (a list: every value after one "
                             f"{option_string}, e.g. {option_string} a b)")
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse would print the whole usage first)
        raise UsageError(f"{message} — run `python scripts/sweep.py --help` for usage")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python scripts/sweep.py", description=(
        "Grid of model x method x factor x task x lengths for RoPE context extension. Without arguments runs the "
        "embedded demo (scripts/configs/demo.yaml); with --config FILE the file is the base, flags override it."),
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
        "examples:\n  python scripts/sweep.py\n  python scripts/sweep.py --config scripts/configs/llama2-7b-gpu.yaml\n"
        "  python scripts/sweep.py --methods plain yarn --factors 2 4 --tasks perplexity --lengths 2048 8192\n"
        "  accelerate launch scripts/sweep.py --config my.yaml     # one share of the cells per process\n"))
    p.add_argument("--config", action=_Once, help="YAML config (default: scripts/configs/demo.yaml)")
    p.add_argument("--model", nargs="+", action=_Once, help="model spec(s): hub id, local dir, .gguf file, smollm2-135m")
    p.add_argument("--methods", nargs="+", action=_Once, help="RoPE methods (space or comma separated)")
    p.add_argument("--factors", nargs="+", action=_Once, help="scale factors")
    p.add_argument("--lengths", nargs="+", action=_Once, help="context lengths for every task (e.g. 2048 4096 8k)")
    p.add_argument("--tasks", nargs="+", action=_Once, help="suites: perplexity passkey classification")
    p.add_argument("--corpus", nargs="+", action=_Once, help="corpus name(s): sotu, pg19, proof-pile, hub id, path")
    p.add_argument("--out", action=_Once, help="run directory (rerun with the same --out to resume)")
    p.add_argument("--seed", type=_int, action=_Once, help="random seed")
    p.add_argument("--device", action=_Once, help="cpu, cuda, cuda:N or auto")
    p.add_argument("--dtype", action=_Once, help="float32, bfloat16, float16 or auto")
    p.add_argument("-o", "--option", action="append", metavar="[METHOD.]KEY=VALUE",
                   help="method option, e.g. yarn.beta_fast=16 (without METHOD: every method that takes KEY)")
    p.add_argument("-t", "--task-option", action="append", metavar="TASK.KEY=VALUE",
                   help="suite option, e.g. passkey.trials=4 or perplexity.num_docs=2")
    p.add_argument("--plugin", action="append", help="module or .py file to import first (registers methods/suites)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow models that ship their own code")
    p.add_argument("--fresh", action="store_true", help="delete this run directory's previous results first")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--dry-run", action="store_true", help="list the cells (and which are finished), run nothing")
    return p


def _int(text):
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None


# ---------------------------------------------------------------------------------------------- distributed
class Dist:
    """rank / world size from accelerate (when launched with several processes), else a single process."""

    def __init__(self):
        self.state = None
        self.rank, self.world = 0, 1
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            import torch
            from accelerate import PartialState

            # cpu=True without a GPU: gloo process group (else accelerate falls back to one process per rank,
            # each believing it is alone). Long timeout: ranks may finish their shares hours apart.
            cpu = not torch.cuda.is_available() or os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true")
            self.state = PartialState(cpu=cpu, timeout=dt.timedelta(days=7))
            self.rank, self.world = self.state.process_index, self.state.num_processes

    @property
    def main(self) -> bool:
        return self.rank == 0

    def wait(self):
        if self.state is not None:
            self.state.wait_for_everyone()

    def device(self, wanted: str | None) -> str | None:
        if self.state is not None and wanted is None:
            d = str(self.state.device)
            return d if d.startswith(("cuda", "mps", "xpu")) else "cpu"
        return wanted


# ---------------------------------------------------------------------------------------------- helpers
def say(msg: str, quiet: bool = False) -> None:
    if quiet:
        return
    from tqdm.auto import tqdm

    tqdm.write(msg, file=sys.stderr)


def trained_context_of(spec: str, trust_remote_code: bool) -> int | None:
    """The model's trained context from its config alone (no weights); None when unknown."""
    try:
        import types

        from transformers import AutoConfig

        import extend

        if spec in extend.ALIASES:
            path = extend.embedded_gguf(spec)
            cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        elif spec.endswith(".gguf"):
            path = Path(spec).expanduser()
            cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        else:
            cfg = AutoConfig.from_pretrained(spec, trust_remote_code=trust_remote_code)
        return int(extend.trained_context(types.SimpleNamespace(config=cfg)))
    except Exception:  # noqa: BLE001 - best effort; the report then draws no trained-context line
        return None


def ok_rows(cell: G.Cell, run: str, records: list[dict], options: dict | None = None) -> list[dict]:
    """`options`: the patch's resolved options (start_from, trained_context, base_theta, shipped_rope, ...),
    recorded in every row; default the cell's."""
    options = cell.options if options is None else options
    rows = []
    for r in records:
        row = {"run": run, "cell": cell.key, "model": cell.model, "method": cell.method, "factor": cell.factor,
               "options": options, "task": cell.task, "corpus": cell.corpus, "task_options": cell.task_options,
               "length": None, "depth": None, "doc": None, "trial": None, "metric": None, "value": math.nan,
               "n": None, "seed": cell.seed, "seconds": None}
        row.update(r)
        row.update(run=run, cell=cell.key, model=cell.model, method=cell.method, factor=cell.factor,
                   options=options, seed=cell.seed, status="ok", error=None)
        rows.append(row)
    return rows


def error_row(cell: G.Cell, run: str, message: str, seconds: float) -> dict:
    return {"run": run, "cell": cell.key, "model": cell.model, "method": cell.method, "factor": cell.factor,
            "options": cell.options, "task": cell.task, "corpus": cell.corpus, "task_options": cell.task_options,
            "length": cell.lengths[0] if len(cell.lengths) == 1 else None, "depth": None, "doc": None,
            "trial": None, "metric": "error", "value": math.nan, "n": 0, "seed": cell.seed, "seconds": seconds,
            "status": "error", "error": message}


def describe_error(exc: BaseException, lengths=None) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    kind = type(exc).__name__
    low = text.lower()
    if "out of memory" in low or "can't allocate memory" in low or kind == "OutOfMemoryError":
        # e.g. Gemma3's sliding-window mask at 100k tokens: name the length, not only the allocator's bytes
        lengths = list(lengths or [])
        where = f" at length {lengths[0]}" if len(lengths) == 1 else (
            f" with lengths up to {max(lengths)}" if lengths else "")
        kind = f"out of memory{where} ({kind}) — use shorter lengths or more memory"
    return f"{kind}: {first}"[:2000] if first else kind


def length_warning(method: str, factor: float, lengths, patch_options: dict) -> str | None:
    """A warning when a length exceeds factor x the trained context (plain: the trained context itself)."""
    context = patch_options.get("trained_context")
    if not context:
        return None
    limit = context * (1.0 if method == "plain" else factor)
    over = [L for L in lengths if L > limit]
    if not over:
        return None
    return (f"warning: {method} x{factor:g}: length(s) {', '.join(map(str, over))} exceed {limit:g} tokens "
            f"(factor x the trained context {context}) — expect extrapolation, and memory grows with length")


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _log_failure(out: Path, cell: G.Cell, tb: str) -> None:
    try:
        logs = out / "logs"
        logs.mkdir(exist_ok=True)
        (logs / f"{cell.key}.log").write_text(f"{cell.label()}\n{G.canonical(cell.definition())}\n\n{tb}")
    except OSError:
        pass


# ---------------------------------------------------------------------------------------------- running
def write_rows(writer, rows: list[dict]) -> None:
    """All rows of one cell in one append (the store marks each row with the cell's row count, so a write cut
    short is never taken for a finished cell)."""
    try:
        writer.write(rows)
    except OSError as e:
        raise WriteFailure(f"cannot write records to {writer.path}: {e.strerror or e} — free space (or fix the "
                           f"directory), then rerun the same command: finished cells are kept, the rest resume"
                           ) from e


def run_cells(cells: list[G.Cell], cfg: dict, writer, *, run: str, device: str | None, show: bool,
              rank: int) -> tuple[int, int]:
    """Run this rank's unfinished cells. Returns (ok, failed)."""
    from tqdm.auto import tqdm

    import extend
    import tasks

    out = Path(cfg["out"])
    done = failed = 0
    bar = tqdm(total=len(cells), desc="sweep" if rank == 0 else f"sweep rank {rank}", unit="cell",
               position=0, disable=not show, dynamic_ncols=True)

    def fail_cells(group, msg: str) -> int:
        """Every cell of a group that could not start (model load or patch failed): one error row each."""
        for cell in group:
            write_rows(writer, [error_row(cell, run, msg, 0.0)])
            _log_failure(out, cell, traceback.format_exc())
            bar.update()
        return len(group)

    for model_spec, by_model in groupby(cells, key=lambda c: c.model):
        by_model = list(by_model)
        say(f"loading {model_spec} ...", not show)
        try:
            model, tokenizer = extend.load(model_spec, device=device, dtype=cfg["dtype"],
                                           trust_remote_code=cfg["trust_remote_code"])
        except extend.ExtendError:
            raise  # bad input (unknown / unsupported model): one line, exit 2
        except Exception as e:  # noqa: BLE001 - e.g. out of memory while loading: every cell of this model fails
            failed += fail_cells(by_model, f"loading the model failed: {describe_error(e)}")
            _free_memory()
            continue
        groups = groupby(by_model, key=lambda c: (c.method, c.factor, G.canonical(c.options)))
        for (method, factor, _), by_method in groups:
            by_method = list(by_method)
            options = by_method[0].options
            try:
                patch = extend.patch(model, method, factor=factor, **options)
            except Exception as e:  # noqa: BLE001 - e.g. "not supported: <family>": these cells fail, sweep goes on
                failed += fail_cells(by_method, f"patching failed: {describe_error(e)}")
                continue
            try:
                for cell in by_method:
                    bar.set_postfix_str(cell.label(), refresh=True)
                    t0 = time.perf_counter()
                    error = None
                    try:
                        suite = tasks.SUITES[cell.task]
                        warning = length_warning(method, factor, cell.lengths, patch.options)
                        if warning:
                            say(f"{cell.label()}: {warning}")
                        records = suite(model, tokenizer, lengths=list(cell.lengths), seed=cell.seed,
                                        progress=show, **cell.task_options)
                        if not records:
                            raise RuntimeError("the suite returned no records")
                        rows = ok_rows(cell, run, list(records), dict(cell.options, **patch.options))
                    except Exception as e:  # noqa: BLE001 - failure isolation (OOM included); Ctrl-C propagates
                        error = (describe_error(e, cell.lengths), traceback.format_exc())
                    if error is None:
                        write_rows(writer, rows)
                        done += 1
                    else:  # outside the except block: the traceback (and the tensors it holds) is gone
                        records = rows = None
                        _free_memory()
                        write_rows(writer, [error_row(cell, run, error[0], time.perf_counter() - t0)])
                        _log_failure(out, cell, error[1])
                        say(f"FAILED {cell.label()}: {error[0]}", not show)
                        failed += 1
                    bar.update()
            finally:
                patch.undo()
        del model, tokenizer
        _free_memory()
    bar.close()
    return done, failed


def summarize(cfg: dict, cells: list[G.Cell], quiet: bool) -> int:
    """Tables to stdout, report.md, failed cells; returns the exit code (1 if any cell of the grid failed)."""
    import results

    out = Path(cfg["out"])
    df = results.load(out)
    keys = {c.key for c in cells}
    in_grid = df[df["cell"].isin(keys)]
    ok = in_grid[in_grid["status"] == "ok"]
    for task, metric, caption in MAIN_TABLES:
        if ((ok["task"] == task) & (ok["metric"] == metric)).any():
            try:
                t = results.table(in_grid, task, metric)
                print(f"\n## {caption} — {task}/{metric}\n")
                print(results.to_markdown(t).rstrip())
            except results.ResultsError as e:
                print(f"(no {task} table: {e})")
    contexts = {m: cfg.get("trained_context", {}).get(m) for m in cfg["model"]}
    single = next(iter(contexts.values())) if len(contexts) == 1 else None
    try:
        report = results.report(out, trained_context=single)
    except Exception as e:  # noqa: BLE001 - the records are safe; say so instead of a traceback at the very end
        report = None
        print(f"\nreport failed: {describe_error(e)} — rebuild it with `python -m results report {out}`")
    finished = set(ok["cell"])
    failed = [c for c in cells if c.key not in finished]
    print()
    if failed:
        errors = in_grid[in_grid["status"] == "error"].drop_duplicates("cell").set_index("cell")["error"]
        print(f"FAILED cells ({len(failed)} of {len(cells)}; tracebacks in {out / 'logs'}):")
        for c in failed:
            msg = errors.get(c.key, "not run (interrupted?)")
            print(f"  {c.key}  {c.model}  {c.label()}: {msg}")
    else:
        print(f"all {len(cells)} cells finished")
    if report is not None:
        print(f"report: {report}")
    return 1 if failed or report is None else 0


def load_config(args) -> dict:
    base = C.read_yaml(args.config) if args.config else C.read_yaml(C.DEMO_CONFIG)
    source = args.config or str(C.DEMO_CONFIG)
    grid_flags = ("model", "methods", "factors", "lengths", "tasks", "corpus", "seed", "dtype", "option",
                  "task_option", "plugin")
    if not args.config and not args.out and any(getattr(args, f) is not None for f in grid_flags):
        base["out"] = "runs/sweep"  # a changed demo grid does not go into (and mix with) runs/demo
    merged = C.merge_cli(base, args)
    cfg = C.resolve(merged, source=source)
    cfg["config_file"] = str(Path(source).resolve())
    return cfg


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted — finished cells are saved; rerun the same command to resume", file=sys.stderr)
        return 130
    except WriteFailure as e:  # not bad input: the environment (disk) failed; one line, exit 1
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except Exception as e:
        if _is_user_error(e):
            msg = " ".join(str(e).split()) or type(e).__name__
            print(f"error: {msg}", file=sys.stderr)
            return 2
        raise


def _is_user_error(e: BaseException) -> bool:
    if isinstance(e, C.ConfigError):
        return True
    kinds = []
    for module, name in (("extend", "ExtendError"), ("tasks", "TaskError"), ("results", "ResultsError")):
        mod = sys.modules.get(module)
        if mod is not None and hasattr(mod, name):
            kinds.append(getattr(mod, name))
    try:
        import yaml

        kinds.append(yaml.YAMLError)
    except ImportError:
        pass
    return isinstance(e, tuple(kinds))


def show_grid(cfg: dict) -> None:
    """What the numbers will rest on: per task, the lengths and every suite option (set or default), e.g. the
    demo's num_docs: 1 that a run overriding only --model or --corpus inherits."""
    import inspect

    import tasks
    from tasks.checks import NOT_OPTIONS

    print(f"grid (options inherited from {cfg['config_file']} unless set on the command line):", file=sys.stderr)
    for name, t in cfg["tasks"].items():
        params = inspect.signature(tasks.SUITES[name]).parameters
        effective = {k: p.default for k, p in params.items() if k not in NOT_OPTIONS
                     and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is not p.empty}
        effective.update(t["options"])
        effective.pop("corpus", None)
        opts = ", ".join(f"{k}={v}" for k, v in effective.items())
        print(f"  {name}: lengths {t['lengths']}; {opts}", file=sys.stderr)
    print(f"  corpus {', '.join(cfg['corpus'])}; seed {cfg['seed']}; methods "
          f"{', '.join(m['method'] for m in cfg['methods'])}", file=sys.stderr)


def _main(argv) -> int:
    args = parser().parse_args(argv)
    cfg = load_config(args)  # shape errors fail here, before torch is imported
    C.check_writable(cfg["out"])
    C.import_plugins(cfg["plugins"])
    C.check_registries(cfg)  # names, option values, suite options, corpora, models: all before a model loads
    out = Path(cfg["out"])
    rundir.check_out(out)

    import tasks
    from extend.loading import default_device, default_dtype

    def build(device):
        if cfg["dtype"] is None:  # as extend.load decides for the device (part of every cell's key)
            cfg["dtype"] = str(default_dtype(device)).removeprefix("torch.")
        cells = G.build(cfg, lambda task, opt: C.suite_accepts(tasks.SUITES[task], opt))
        if not cells:
            raise C.ConfigError("empty grid: no cells — check methods, factors, tasks and lengths")
        return cells

    run = out.name
    if args.dry_run:
        import results

        if not args.config and (args.model or args.corpus):
            show_grid(cfg)
        cells = build(cfg["device"] or default_device())
        finished = set() if args.fresh else results.finished_cells(out)
        for c in cells:
            print(f"{c.key}  {'done' if c.key in finished else 'todo'}  {c.model}  {c.label()}")
        print(f"{len(cells)} cells, {len(finished & {c.key for c in cells})} finished; out: {out}")
        return 0

    dist = Dist()
    device = dist.device(cfg["device"])
    cfg["resolved_device"] = device or default_device()
    cells = build(cfg["resolved_device"])
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock = rundir.RunLock(out, dist.rank if dist.world > 1 else None)
    completed = False
    try:
        lock.acquire()
        code = _run(args, cfg, cells, dist, device, out, run)
        completed = True
        return code
    finally:
        lock.release()
        if created and not completed and not any(out.glob("records*.jsonl")):
            shutil.rmtree(out, ignore_errors=True)  # stopped before any record (e.g. the model is rejected)


def _run(args, cfg: dict, cells: list[G.Cell], dist: Dist, device, out: Path, run: str) -> int:
    quiet = args.quiet
    show = not quiet and dist.main
    if not args.config and (args.model or args.corpus) and dist.main:
        show_grid(cfg)  # the demo's num_docs / trials / depths now carry another model's or corpus' numbers
    if not show:  # transformers' own bars ("Loading weights") and reminders
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
    if args.fresh and dist.main:
        rundir.fresh(out)
    rundir.clean_stray_temps(out, dist.rank if dist.world > 1 else None)
    dist.wait()

    import results

    finished = results.finished_cells(out)
    mine = G.shard(cells, dist.rank, dist.world)
    todo = [c for c in mine if c.key not in finished]
    cfg["trained_context"] = {m: trained_context_of(m, cfg["trust_remote_code"]) for m in cfg["model"]}
    writer = results.RecordWriter(out, rank=dist.rank if dist.world > 1 else None)
    manifest_config = {k: v for k, v in cfg.items() if k != "trained_context"}
    manifest_config["cells"] = {c.key: c.definition() for c in cells}
    try:
        writer.write_manifest(config=manifest_config, seed=cfg["seed"], device=cfg["resolved_device"],
                              extra={"trained_context": cfg["trained_context"], "rank": dist.rank,
                                     "world_size": dist.world, "cells_total": len(cells), "cells_mine": len(mine),
                                     "cells_todo": len(todo)})
    except OSError as e:
        raise WriteFailure(f"cannot write {writer.manifest_path}: {e.strerror or e} — free space (or fix the "
                           f"directory), then rerun the same command") from e
    where = f"rank {dist.rank} of {dist.world}: " if dist.world > 1 else ""
    say(f"{len(cells)} cells ({sum(c.key in finished for c in cells)} already finished); {where}{len(todo)} to run "
        f"-> {out}", quiet)
    t0 = time.perf_counter()
    ok, failed = run_cells(todo, cfg, writer, run=run, device=device, show=show, rank=dist.rank)
    try:
        writer.finish()
    except OSError as e:  # every record is on disk; only the end time is missing
        say(f"warning: could not record the end time in {writer.manifest_path}: {e.strerror or e}", False)
    if dist.world > 1:
        print(f"rank {dist.rank}: {ok} cells ok, {failed} failed in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
    dist.wait()
    if not dist.main:
        return 0  # rank 0 reports (and sets the exit code) for the whole grid
    code = summarize(cfg, cells, quiet)
    say(f"sweep time {time.perf_counter() - t0:.0f} s", quiet)
    return code
