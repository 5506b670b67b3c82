"""Cell execution: load each model once, patch once per method x factor x options, run every task cell of
this rank, write one atomic append of rows per cell (an error row for a failed one), and keep going after a
failure."""

from __future__ import annotations

import gc
import math
import sys
import time
import traceback
from itertools import groupby
from pathlib import Path

from ropebench.extend.errors import RopebenchError

from . import grid as G


class WriteFailure(RopebenchError):
    """The records could not be written (e.g. a full disk): the sweep stops; finished cells stay on disk. Not
    bad input — the environment failed — so the exit code is 1, not 2."""

    exit_code = 1


def say(msg: str, quiet: bool = False) -> None:
    if quiet:
        return
    from tqdm.auto import tqdm

    tqdm.write(msg, file=sys.stderr)


def ok_rows(cell: G.Cell, run: str, records: list[dict], options: dict | None = None) -> list[dict]:
    """`options`: the patch's resolved options (start_from, trained_context, base_theta, shipped_rope, ...),
    recorded in every row; default the cell's. Each row carries its metric's declaration (``meaning``,
    results/meaning.py): the task's own (for a `tasks:` entry under a name of its own, the task it runs:
    `cell.base_task`), the built-in one for theory rows, none for a metric a plugin task
    describes with a plain string (results then read it with their fallback)."""
    from ropebench import tasks
    from ropebench.results.meaning import BUILT_IN
    from ropebench.tasks.kit import task_spec

    options = cell.options if options is None else options
    base = cell.base_task  # the registered task: an entry under its own name (retrieval-vt) runs another
    if base in tasks.TASKS:
        declared = task_spec(base, tasks.TASKS[base]).meaning
    else:  # theory rows (THEORY_TASK): written here, declared in results.meaning

        def declared(metric):
            return BUILT_IN.get((cell.task, metric))

    rows = []
    for r in records:
        row = _row(cell, run, options, r)
        row.update(
            run=run,
            cell=cell.key,
            model=cell.model,
            method=cell.method,
            factor=cell.factor,
            options=options,
            seed=cell.seed,
            status="ok",
            error=None,
        )
        if base != cell.task:  # the task's records name the task; rows name the entry, and record the task
            row["task"] = cell.task
            recorded = row["task_options"] if isinstance(row["task_options"], dict) else cell.task_options
            row["task_options"] = {**recorded, G.BASE_TASK: base}
        meaning = declared(row["metric"])
        if meaning is not None:
            row["meaning"] = meaning.to_json()
        rows.append(row)
    return rows


def _row(cell: G.Cell, run: str, options: dict, fields: dict) -> dict:
    """A row of `cell`, its fields in the order rows keep: the cell's, then `fields` over an empty record."""
    row = {
        "run": run,
        "cell": cell.key,
        "model": cell.model,
        "method": cell.method,
        "factor": cell.factor,
        "options": options,
        "task": cell.task,
        "corpus": cell.corpus,
        "task_options": cell.task_options,
        "length": None,
        "depth": None,
        "doc": None,
        "trial": None,
        "metric": None,
        "value": math.nan,
        "n": None,
        "seed": cell.seed,
        "seconds": None,
    }
    row.update(fields)
    return row


def error_row(cell: G.Cell, run: str, message: str, seconds: float) -> dict:
    length = cell.lengths[0] if len(cell.lengths) == 1 else None
    fields = {"length": length, "metric": "error", "n": 0, "seconds": seconds, "status": "error"}
    return _row(cell, run, cell.options, dict(fields, error=message))


def describe_error(exc: BaseException, lengths=None) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    kind = type(exc).__name__
    low = text.lower()
    if "out of memory" in low or "can't allocate memory" in low or kind == "OutOfMemoryError":
        # e.g. Gemma3's sliding-window mask at 100k tokens: name the length, not only the allocator's bytes
        lengths = list(lengths or [])
        where = (
            f" at length {lengths[0]}"
            if len(lengths) == 1
            else (f" with lengths up to {max(lengths)}" if lengths else "")
        )
        kind = f"out of memory{where} ({kind}) — use shorter lengths or more memory"
    return f"{kind}: {first}"[:2000] if first else kind


def length_warning(method: str, factor: float, lengths, patch_options: dict) -> str | None:
    """A warning when a length exceeds what the method reaches from the trained context (registry fact
    `Method.reach`: factor x the trained context for most; the trained context for plain; any length for
    dca)."""
    from ropebench.extend import registry

    context = patch_options.get("trained_context")
    if not context:
        return None
    limit = registry.get(method).reach(factor, context, patch_options)
    over = [L for L in lengths if L > limit]
    if not over:
        return None
    return (
        f"warning: {method} x{factor:g}: length(s) {', '.join(map(str, over))} exceed {limit:g} tokens "
        f"(what it reaches from the trained context {context}) — expect extrapolation, and memory grows with "
        f"length"
    )


# Men et al.'s criterion is checked up to this many times the longest tested length (it stops at the first
# failing distance: milliseconds); the base bound is computed for the trained context only (seconds, cached
# per process).
THEORY_LIMIT = 4
THEORY_TASK = "theory"  # results.reach.THEORY_TASK: rows the report sets beside the measured reaches


def theory_records(model, handle, longest: int) -> list[dict]:
    """What RoPE theory predicts for the patched frequencies (extend.theory), as records with task "theory",
    each with its declaration (`meaning`, results.meaning.BUILT_IN), over the layer types the method extends
    (the most limiting), dynamic methods at factor x the trained context:
    - men_reach: Men et al.'s criterion on the patched frequencies, the first distance where
      sum_i cos(m theta_i) < 0, checked up to THEORY_LIMIT x the longest tested length;
    - critical_dimension: Liu et al.'s d_crit, fixed by pretraining: from the frequencies the patch starts
      from (as loaded with start_from="shipped", the pretrained ones with "pretrained") at the trained
      context — the same for every setting of a model;
    - effective_base, extrapolation_bound: the patched setting's base beta and Liu et al.'s
      T_extra = 2 pi beta^(d_crit/d) (extend.theory.effective_base, extrapolation_bound);
    - base_lower_bound (`length` = the trained context): Men et al.'s lower bound on the base of a model
      trained for that context — a property of the model, the same for every setting.
    None for position-remapping methods: they change distances, not frequencies, so the criterion on
    frequencies says nothing about them."""
    from ropebench.extend import registry, shipped, theory

    if registry.get(handle.method).remap:
        return []
    context = int(handle.options["trained_context"])
    target = math.ceil(context * handle.factor)
    limit = THEORY_LIMIT * int(longest)
    types = list(handle.extended_layer_types or handle.layer_types)  # the layer types the method extends
    freqs = {lt: handle.frequencies(lt, target).inv_freq.detach().double().cpu().numpy() for lt in types}
    ships = shipped.shipped_ropes(model.config)

    def trained(lt):  # the frequencies the model was trained with, from the start the patch takes
        if handle.options.get("start_from") == "pretrained" and ships[lt].scaled:
            info = ships[lt]
            return shipped.pretrained_frequencies(info.theta, 2 * len(freqs[lt]), "cpu", info.p_rope)
        return handle.loaded_frequencies(lt)

    critical = {lt: theory.critical_dimension(trained(lt).double().cpu().numpy(), context) for lt in types}
    reach = min(theory.men_reach(f, limit) for f in freqs.values())
    extrapolation = {lt: theory.extrapolation_bound(f, critical[lt]) for lt, f in freqs.items()}
    most = min(types, key=lambda lt: extrapolation[lt])  # the most limiting layer type
    dim = 2 * min(len(f) for f in freqs.values())
    where = {"layer_types": [str(lt) for lt in types], "rotary_dim": dim, "frequencies_at": target}
    values = {
        "men_reach": (float(reach), {**where, "limit": limit}),
        "critical_dimension": (float(critical[most]), where),
        "effective_base": (theory.effective_base(freqs[most], critical[most]), where),
        "extrapolation_bound": (float(extrapolation[most]), where),
    }
    if context <= theory.BOUND_MAX_CONTEXT:  # the bound's search grows with the context (extend/theory.py)
        values["base_lower_bound"] = (float(theory.base_lower_bound(dim, context)), where)
    rows = []
    for metric, (value, options) in values.items():
        row = {"metric": metric, "value": value, "n": 1, "task_options": options}
        if metric == "base_lower_bound":
            row["length"] = context
        rows.append(row)  # its meaning (results.meaning.BUILT_IN) is attached by ok_rows
    return rows


def write_theory(
    out: Path, rank: int, model, handle, group: list[G.Cell], run: str, resolved: dict, quiet: bool
) -> None:
    """Record the theory rows of one setting (a cell of its own, task "theory") in the run's theory file
    beside the records (results.reach.record_theory); a failure here is only a warning."""
    from ropebench.results.reach import record_theory

    first = group[0]
    longest = max(L for c in group for L in c.lengths)
    t0 = time.perf_counter()
    try:
        records = theory_records(model, handle, longest)
    except Exception as e:  # noqa: BLE001 - theory is context, never a reason to lose the measurements
        say(f"warning: no theory rows for {first.method} x{first.factor:g}: {describe_error(e)}", quiet)
        return
    if not records:
        return
    cell = G.make_cell(
        model=first.model,
        method=first.method,
        factor=first.factor,
        options=first.options,
        task=THEORY_TASK,
        task_options={"limit": THEORY_LIMIT * longest},
        lengths=(longest,),
        seed=first.seed,
        dtype=first.dtype,
    )
    seconds = time.perf_counter() - t0
    try:
        record_theory(out, ok_rows(cell, run, [dict(r, seconds=seconds) for r in records], resolved), rank)
    except OSError as e:
        say(f"warning: could not record theory rows in {out}: {e.strerror or e}", quiet)


def _free_memory() -> None:
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _log_failure(out: Path, cell: G.Cell, tb: str) -> None:
    from .rundir import open_run_dir

    try:  # through the guard: listed in the run directory's marker, never over a file of the user's
        text = f"{cell.label()}\n{G.canonical(cell.definition())}\n\n{tb}"
        open_run_dir(out).write_text(f"logs/{cell.key}.log", text)
    except (OSError, RopebenchError):
        pass


def write_rows(writer, rows: list[dict]) -> None:
    """All rows of one cell in one append (the store marks each row with the cell's row count, so a write cut
    short is never taken for a finished cell)."""
    try:
        writer.write(rows)
    except OSError as e:
        raise WriteFailure(
            f"cannot write records to {writer.path}: {e.strerror or e} — free space (or fix the "
            f"directory), then rerun the same command: finished cells are kept, the rest resume"
        ) from e


def run_cells(
    cells: list[G.Cell], cfg: dict, writer, *, run: str, device: str | None, show: bool, rank: int
) -> tuple[int, int]:
    """Run this rank's unfinished cells. Returns (ok, failed)."""
    from ropebench import extend, tasks
    from tqdm.auto import tqdm

    out = Path(cfg["out"])
    done = failed = 0
    bar = tqdm(
        total=len(cells),
        desc="sweep" if rank == 0 else f"sweep rank {rank}",
        unit="cell",
        position=0,
        disable=not show,
        dynamic_ncols=True,
    )

    pending_load = 0.0  # the last model load's seconds, until a cell's rows carry it

    def timed(rows: list[dict], cell_seconds: float) -> list[dict]:
        """Every row of a cell carries the cell's wall time; the first cell a model load served carries that
        load (0 on the others), so the sum over cells is the sweep's load time, counted once."""
        nonlocal pending_load
        for row in rows:
            row.update(cell_seconds=cell_seconds, load_seconds=pending_load)
        pending_load = 0.0
        return rows

    def fail_cells(group, msg: str) -> int:
        """Every cell of a group that could not start (model load or patch failed): one error row each."""
        for cell in group:
            write_rows(writer, timed([error_row(cell, run, msg, 0.0)], 0.0))
            _log_failure(out, cell, traceback.format_exc())
            bar.update()
        return len(group)

    for model_spec, by_model in groupby(cells, key=lambda c: c.model):
        by_model = list(by_model)
        say(f"loading {model_spec} ...", not show)
        loading = time.perf_counter()
        try:
            model, tokenizer = extend.load(
                model_spec, device=device, dtype=cfg["dtype"], trust_remote_code=cfg["trust_remote_code"]
            )
        except extend.ExtendError:
            raise  # bad input (unknown / unsupported model): one line, exit 2
        except Exception as e:  # noqa: BLE001 - e.g. out of memory while loading: every cell of this model fails
            pending_load = time.perf_counter() - loading
            failed += fail_cells(by_model, f"loading the model failed: {describe_error(e)}")
            _free_memory()
            continue
        pending_load = time.perf_counter() - loading
        groups = groupby(by_model, key=lambda c: (c.method, c.factor, G.canonical(c.options)))
        for (method, factor, _), by_method in groups:
            by_method = list(by_method)
            options = by_method[0].options
            try:
                patch = extend.patch(model, method, factor=factor, **options)
            except Exception as e:  # noqa: BLE001 - e.g. "not supported: <family>": these cells fail, sweep goes on
                failed += fail_cells(by_method, f"patching failed: {describe_error(e)}")
                continue
            resolved = dict(options, **patch.options)  # + what the patch derived (trained context, theta ...)
            try:
                write_theory(out, rank, model, patch, by_method, run, resolved, not show)
                for cell in by_method:
                    bar.set_postfix_str(cell.label(), refresh=True)
                    t0 = time.perf_counter()
                    error = None
                    try:
                        run_task = tasks.TASKS[cell.base_task]
                        warning = length_warning(method, factor, cell.lengths, resolved)
                        if warning:
                            say(f"{cell.label()}: {warning}")
                        records = run_task(
                            model,
                            tokenizer,
                            lengths=list(cell.lengths),
                            seed=cell.seed,
                            progress=show,
                            **cell.call_options(),
                        )
                        if not records:
                            raise RuntimeError("the task returned no records")
                        rows = ok_rows(cell, run, list(records), resolved)
                    except Exception as e:  # noqa: BLE001 - failure isolation (OOM included); Ctrl-C propagates
                        error = (describe_error(e, cell.lengths), traceback.format_exc())
                    if error is None:
                        write_rows(writer, timed(rows, time.perf_counter() - t0))
                        done += 1
                    else:  # outside the except block: the traceback (and the tensors it holds) is gone
                        records = rows = None
                        _free_memory()
                        elapsed = time.perf_counter() - t0
                        write_rows(writer, timed([error_row(cell, run, error[0], elapsed)], elapsed))
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
