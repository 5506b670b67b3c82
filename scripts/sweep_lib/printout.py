"""What a sweep prints: its plan, the grid it will run (when it inherits the demo's task options), and its
outcome at the end: the summary and main tables, the report and the failed cells."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from . import grid as G
from .run import describe_error


def main_tables(entries: dict | None = None) -> list[tuple[str, str, str]]:
    """(task, metric, caption) of the tables printed at the end: what each task declares (tasks/kit.py).
    `entries`: the grid's `tasks:` (name -> resolved entry); then each entry's name with the tables of the
    task it runs (`retrieval-vt: {task: retrieval}` gets retrieval's), in the registry's order. Default: every
    registered task."""
    from ropebench import tasks
    from ropebench.tasks.kit import task_spec

    if entries is None:
        entries = {name: {} for name in tasks.TASKS}
    order = list(tasks.TASKS)
    named = [(name, G.base_task(name, entry)) for name, entry in entries.items()]
    named = sorted((n for n in named if n[1] in tasks.TASKS), key=lambda n: order.index(n[1]))
    return [
        (name, metric, caption)
        for name, base in named
        for metric, caption in task_spec(base, tasks.TASKS[base]).tables
    ]


def print_plan(cfg: dict) -> None:
    """What the numbers will rest on: per task, the lengths and every task option (set or default) that a run
    overriding only --model or --corpus inherits from the demo, and which num_docs it raised (see
    config.raise_demo_num_docs)."""
    from ropebench import tasks
    from ropebench.tasks.checks import signature_options

    print(
        f"grid (options inherited from {cfg['config_file']} unless set on the command line):", file=sys.stderr
    )
    for name, t in cfg["tasks"].items():
        base = G.base_task(name, t)
        defaults, _ = signature_options(tasks.TASKS[base])
        effective = {k: v for k, v in defaults.items() if v is not inspect.Parameter.empty}
        effective.update(t["options"])
        effective.pop("corpus", None)
        opts = ", ".join(f"{k}={v}" for k, v in effective.items())
        runs = f" (task {base})" if base != name else ""
        print(f"  {name}{runs}: lengths {t['lengths']}; {opts}", file=sys.stderr)
    print(
        f"  corpus {', '.join(cfg['corpus'])}; seed {cfg['seed']}; methods "
        f"{', '.join(m['method'] for m in cfg['methods'])}",
        file=sys.stderr,
    )
    raised = cfg.get("num_docs_raised") or {}
    if raised:
        print(
            "  num_docs raised from the demo's to each task's default (enough documents for an interval; "
            "-t TASK.num_docs=N sets it): " + ", ".join(f"{t} {a} -> {b}" for t, (a, b) in raised.items()),
            file=sys.stderr,
        )


def print_outcome(cfg: dict, cells: list[G.Cell]) -> int:
    """The outcome: the summary and main tables to stdout, report.md, failed cells; returns the exit code (1
    if any cell of the grid failed)."""
    import pandas as pd
    from ropebench import results
    from ropebench.results.overview import rules_caption
    from ropebench.results.reach import load_theory

    out = Path(cfg["out"])
    df = results.load(out)
    in_grid = df[df["cell"].isin({c.key for c in cells})]
    ok = in_grid[in_grid["status"] == "ok"]
    theory = load_theory(out)  # the predicted reach beside the measured one
    # no trained_context argument: every row records the one its patch resolved (it follows
    # -o original_max_position_embeddings); the model config's, in the manifest, only fills in where none is
    if not ok.empty:
        try:  # the report's first table: what each setting reaches, every value with its interval and n
            print("\n## summary — value [95% interval] n (details and paired differences in report.md)\n")
            print(
                results.to_markdown(results.summary(pd.concat([ok, theory]) if len(theory) else ok)).rstrip()
            )
            print(f"\n{rules_caption()}")
        except results.ResultsError as e:
            print(f"(no summary: {e})")
    for task, metric, caption in main_tables(cfg["tasks"]):
        if ((ok["task"] == task) & (ok["metric"] == metric)).any():
            try:
                t = results.table(in_grid, task, metric, with_ci=True)
                print(f"\n## {caption} — {task}/{metric}, mean [95% interval] n\n")
                print(results.to_markdown(t).rstrip())
            except results.ResultsError as e:
                print(f"(no {task} table: {e})")
    try:
        report = results.report(out)
    except Exception as e:  # noqa: BLE001 - the records are safe; say so instead of a traceback at the very end
        report = None
        print(f"\nreport failed: {describe_error(e)} — rebuild it with `ropebench report {out}`")
    finished = set(ok["cell"])
    failed = [c for c in cells if c.key not in finished]
    print()
    if failed:
        errors = in_grid[in_grid["status"] == "error"].drop_duplicates("cell").set_index("cell")["error"]
        print(f"FAILED cells ({len(failed)} of {len(cells)}; tracebacks in {out / 'logs'}):")
        for c in failed:
            print(f"  {c.key}  {c.model}  {c.label()}: {errors.get(c.key, 'not run (interrupted?)')}")
    else:
        print(f"all {len(cells)} cells finished")
    if report is not None:
        print(f"report: {report}")
    return 1 if failed or report is None else 0
