"""``report``: one markdown report over run directories — what the run shows first, then the evidence.

Writes ``<out>/report.md``, ``<out>/tables/*.{md,csv,tex}`` and ``<out>/plots/*.png``. report.md opens with a
headline (at most ``HEADLINE_LINES`` lines, from the significant paired differences and the established
reaches, each with its n in independent units and its p), then the summary (informative columns only, one
footnote line for the rest), the paired differences, the reach rules the grid supports, theory, one section
per task with its tables and plots, the legend, and the failed cells. Every treatment comes from the metrics'
declarations (:mod:`results.meaning`), never from their names or values.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from . import report_output
from .arguments import as_path, as_paths
from .comparisons import MIXED_MARK, compare
from .frame import load
from .headline import BASELINE, Evidence, headline
from .longppl_report import longppl_lines
from .meaning import declarations, undeclared_note
from .overview import (
    MAX_COLUMNS,
    Quantity,
    distance_text,
    left_out,
    legend_lines,
    measured_tasks,
    metrics_of,
    reach_column,
    setting_label,
    short_model,
    summary,
)
from .plots import (
    plot_by_distance,
    plot_loss_by_position,
    plot_metric,
    plot_passkey,
    plot_perplexity,
)
from .reach import (
    THEORY_TASK,
    check_trained_context,
    load_theory,
    recorded_contexts,
)
from .reach_rules import DEFAULT_BAR, check_rules
from .report_output import Report, check_report_dir, slug, staging
from .stats import (
    MIN_T_UNITS,
    SKEW_T_ONE_SIDED_MISS,
)
from .store import ResultsError, atomic_write_text, json_object
from .strata_report import per_distance_table
from .tables import (
    fmt_interval,
    fmt_number,
    is_unit,
    select,
    shared,
    table,
    to_csv,
    to_markdown,
)
from .timing import time_section


def _manifests(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        if not p.is_dir():
            continue
        for m in sorted(p.glob("manifest*.json")):
            try:
                out.append({"_path": str(m), **json.loads(m.read_text(encoding="utf-8"))})
            except (OSError, json.JSONDecodeError):
                continue
    return out


def _trained_context_for(
    model: str | None, given: int | None, manifests: list[dict], rows: pd.DataFrame
) -> int | None:
    """Argument first; else None when the model's rows record a trained context (the patch's resolved value:
    it follows ``-o original_max_position_embeddings``, per setting, so the rows decide); else the
    ``trained_context`` the sweep read from the model's config into a manifest (int, or dict by model)."""
    if given:
        return given
    if recorded_contexts(rows[rows["model"] == model]):
        return None
    for m in manifests:
        for section in (m.get("extra") or {}, m.get("config") or {}):
            tc = section.get("trained_context")
            if isinstance(tc, dict):
                tc = tc.get(model)
            if isinstance(tc, (int, float)) and tc > 0:
                return int(tc)
    return None


def _groups(sub: pd.DataFrame) -> Iterable[tuple[Any, Any]]:
    keys = sub[["model", "corpus"]].drop_duplicates().itertuples(index=False)
    return [(m if not pd.isna(m) else None, c if not pd.isna(c) else None) for m, c in keys]


def _where(model, corpus) -> dict:
    return {k: v for k, v in (("model", model), ("corpus", corpus)) if v is not None}


def _with_chance_row(t: pd.DataFrame, chance: pd.Series, name: str) -> pd.DataFrame:
    names = list(t.index.names)
    label = name if "chance" in name else f"{name} (chance)"  # a metric named chance says so itself
    key = tuple(label if n == "method" else "" for n in names)
    row = pd.DataFrame(
        [[fmt_number(chance.get(c)) if c in chance.index else "–" for c in t.columns]],
        columns=t.columns,
        index=pd.MultiIndex.from_tuples([key], names=names)
        if len(names) > 1
        else pd.Index([key[0]], name=names[0]),
    )
    return pd.concat([t, row])


# -- sections ------------------------------------------------------------------------------------------------
def _summary(r: Report, ev: Evidence) -> None:
    r.md += ["## Summary", ""]
    try:
        kw = {"trained_context": ev.tc, "threshold": ev.threshold, "tolerance": ev.tolerance, "seed": ev.seed}
        shown = summary(ev.ok, **kw)
        numeric = summary(ev.ok, with_ci=False, **kw)
    except ResultsError as e:
        r.md += [f"_No summary: {e}_", ""]
        return
    r.add_table(
        "summary",
        "One row per setting: value [95% interval] n (independent units), * = significant paired difference "
        f"to {BASELINE} (unmarked: the difference its test would mark with 80% power; {MIXED_MARK}: needle "
        "distances significantly apart, no pooled mark), reach = effective length (legend below)",
        shown,
        numeric,
    )
    dropped = left_out(shown)
    if dropped:
        r.md += ["Not in the summary: " + _footnote(dropped) + ".", ""]
    note = undeclared_note(declarations(ev.ok))
    if note:
        r.md += [note, ""]
    if ev.excluded:
        r.md += [ev.excluded, ""]


def _footnote(dropped: list[tuple[str, str]]) -> str:
    """The left-out columns grouped by why: "a, b (why); c (why)"; those that did not fit named once."""
    room = [c for c, why in dropped if why.startswith("no room")]
    parts = [f"{c} ({why})" for c, why in dropped if not why.startswith("no room")]
    if room:
        parts.append(f"{', '.join(room)} (no room in {MAX_COLUMNS} columns: in their task's section)")
    return "; ".join(parts)


def _differences(r: Report, ev: Evidence) -> None:
    r.md += [f"## Differences to {BASELINE} (paired, same documents / prompts)", ""]
    for q in ev.qs.values:
        if q not in ev.diffs:
            continue
        try:
            shown = compare(ev.ok, q.task, q.metric, BASELINE, with_ci=True, seed=ev.seed)
            numeric = compare(ev.ok, q.task, q.metric, BASELINE, seed=ev.seed)
        except ResultsError:
            continue
        better = {"higher": " — above 0 is better", "lower": " — below 0 is better"}.get(
            q.meaning.direction, ""
        )
        if q.kind == "log":
            better = better.replace("0", "1")
            caption = f"{q.task}/{q.metric}: ratio to {BASELINE} on the same units{better}"
        else:
            caption = f"{q.task}/{q.metric} minus {BASELINE} on the same units{better}"
        kinds = sorted(set(ev.diffs[q]["interval"]) - {"baseline"})
        unit = q.meaning.independent_unit
        where = distance_text(select(ev.ok, q.task, q.metric, units=True))
        caption += f"; {where}" if where else ""
        r.add_table(
            f"{q.task}_{q.metric}_vs_{BASELINE}",
            f"{caption}; n = {unit}s (independent units) [95% interval: {', '.join(kinds)}]; unmarked: the "
            "difference the test would mark with 80% power (legend)"
            + (f"; {MIXED_MARK}: needle positions disagree (table below)" if q in ev.strata else ""),
            shown,
            numeric,
        )
        if q in ev.strata:
            shown_by, numeric_by, caption_by = per_distance_table(q, ev.strata[q], BASELINE, ev.factors)
            r.add_table(f"{q.task}_{q.metric}_vs_{BASELINE}_by_distance", caption_by, shown_by, numeric_by)


def _reach(r: Report, ev: Evidence) -> set[tuple[str, str]]:
    """The reach tables the grid supports; one line for the others. Returns the (kind, rule) pairs shown."""
    r.md += ["## Effective context length", ""]
    shown_rules: set[tuple[str, str]] = set()
    unsupported = []
    for (q, rule), e in ev.reach.items():
        name = reach_column(q, rule)
        if isinstance(e, str):
            unsupported.append(f"{name}: {e}")
            continue
        claims = e["claim"].astype(str)
        if (claims == "–").all():
            unsupported.append(f"{name}: {e['rule'].iloc[0].removeprefix('not computed: ')}")
            continue
        if claims.str.startswith("not established").all() or (claims == "–").all():
            unsupported.append(
                f"{name}: not established in any setting "
                f"(needs more {q.meaning.independent_unit}s per length)"
            )
            continue
        _reach_table(r, q, rule, e, ev)
        shown_rules.add((q.kind, rule))
    if not shown_rules:
        r.md += ["No reach rule is supported by this grid.", ""]
    if unsupported:
        r.md += ["Not shown: " + "; ".join(unsupported) + ".", ""]
    return shown_rules


def _reach_table(r: Report, q: Quantity, rule: str, e: pd.DataFrame, ev: Evidence) -> None:
    unit = q.meaning.independent_unit
    caption = (
        f"{reach_column(q, rule)} ({q.task}/{q.metric}) — value [95% interval] n = {unit}s at the reach and "
        "where the walk stopped"
    )
    where = distance_text(select(ev.ok, q.task, q.metric, units=True))
    caption += f"; {where}" if where else ""
    shown = pd.DataFrame(
        {
            "model": e["model"].map(short_model),
            "method": e["method"],
            "factor": e["factor"],
            "reach": e["claim"],
            "at reach": [
                fmt_interval(v, lo, hi, n if not pd.isna(n) else None) if not pd.isna(v) else "–"
                for v, lo, hi, n in zip(e["at_value"], e["at_lo"], e["at_hi"], e["at_n"])
            ],
            "stopped at": [
                f"{int(x)} ({why})" if not pd.isna(x) else "–"
                for x, why in zip(e["stopped_at"], e["stopped"])
            ],
            "there": [
                fmt_interval(v, lo, hi, n if not pd.isna(n) else None) if not pd.isna(v) else "–"
                for v, lo, hi, n in zip(e["fail_value"], e["fail_lo"], e["fail_hi"], e["fail_n"])
            ],
            "rule": e["rule"],
        }
    )
    if shown["model"].nunique() == 1:
        shown = shown.drop(columns="model")
    if shown["rule"].nunique() == 1:  # the same bar for every setting: said in the caption
        caption += f"; bar: {shown['rule'].iloc[0]}"
        shown = shown.drop(columns="rule")
    shown = shown.set_index([c for c in ("model", "method", "factor") if c in shown.columns])
    r.add_table(f"reach_{q.task}_{q.metric}_{rule}", caption, shown, e)


def _theory(r: Report, ok: pd.DataFrame) -> None:
    """The sweep's theory rows, one line per setting, each column labelled by its declaration's description;
    never in the summary, never compared."""
    rows = ok[ok["task"] == THEORY_TASK]
    if rows.empty:
        return
    meant = declarations(rows)
    keys = ["model", "method", "factor", "options"]
    latest = rows.drop_duplicates([*keys, "metric", "length"], keep="last")
    shown = pd.DataFrame(index=pd.MultiIndex.from_frame(latest[keys].drop_duplicates()))
    for metric in metrics_of(latest, THEORY_TASK):
        at = latest[latest["metric"] == metric]
        lengths = sorted(at["length"].dropna().unique())
        for L in lengths or [None]:
            part = at if L is None else at[at["length"] == L]
            label = meant[(THEORY_TASK, metric)].description or metric
            if len(lengths) > 1:
                label += f" @ {int(L)}"
            shown[label] = pd.Series(
                [_theory_value(v, o) for v, o in zip(part["value"], part["task_options"])],
                index=pd.MultiIndex.from_frame(part[keys]),
            )
    shown = shown.fillna("–").reset_index()
    shown["model"] = shown["model"].map(short_model)
    shown["method"] = [setting_label(m, f) for m, f in zip(shown["method"], shown["factor"])]
    several = len(shown) > 1  # with one setting every column is "the same": keep them in the table
    same = [c for c in shown.columns if c != "method" and several and shown[c].astype(str).nunique() == 1]
    note = [f"{c} = {shown[c].iloc[0]}" for c in same if c not in ("model", "factor", "options")]
    drop = [*same, *(c for c in ("factor", "options") if c not in same)]
    if not several:
        drop += [c for c in ("model",) if c not in drop]
    shown = shown.drop(columns=drop).set_index([c for c in ("model", "method") if c not in drop])
    r.md += ["## Theory (not measurements)", ""]
    r.add_table(
        "theory",
        "What RoPE theory says about each setting's frequencies as patched. Men et al. (2024, "
        "arXiv:2405.14591) bound the base a model needs when it is *trained* for a context: a bound for a "
        "base trained for that context, not a training-free prediction of what a patched model retrieves "
        "(≥: held up to the distance checked). Liu et al. (2024, arXiv:2310.05209): the extrapolation "
        "bound of the critical dimension fixed by pretraining",
        shown,
    )
    if note:
        r.md += ["The same for every setting: " + "; ".join(note) + ".", ""]


def _theory_value(value: Any, task_options: Any) -> str:
    """ "3616", "≥ 65536" when the value reached the limit it was checked to, "2.05e+05" for a large float."""
    if pd.isna(value):
        return "–"
    limit = json_object(task_options).get("limit")
    v = float(value)
    text = str(int(v)) if v == int(v) and abs(v) < 1e6 else f"{v:.3g}"
    return f"≥ {text}" if isinstance(limit, (int, float)) and v >= limit else text


def _task_section(r: Report, ev: Evidence, task: str) -> None:
    """A task's tables (headline metrics with intervals; detail metrics in tables/ only) and its plots, all
    from the declarations."""
    ok = ev.ok
    r.md += [f"## {task}", ""]
    shown = [q for q in [*ev.qs.values, *ev.qs.reaches] if q.task == task]
    shown = list(dict.fromkeys(shown))
    references = {q.metric: q for q in ev.qs.references if q.task == task}
    for q in shown:
        _metric_table(r, ok, q, references, ev.seed)
    _withheld_longppl(r, ok, task)
    r.md += longppl_lines(ok, task)  # evaluator, selection, settings, key-token counts, limits
    details = [q for q in ev.qs.details if q.task == task]
    for q in details:
        t = table(ok, task, q.metric)
        stem = r.tables / slug(task, q.metric)
        to_markdown(t.map(fmt_number), stem.with_suffix(".md"))
        to_csv(t, stem.with_suffix(".csv"))
        r.written += [stem.with_suffix(".md"), stem.with_suffix(".csv")]
    if details:
        r.md += [
            "Details (tables/ only): "
            + ", ".join(f"[{q.metric}](tables/{slug(task, q.metric)}.csv)" for q in details),
            "",
        ]
    for q in shown:
        _metric_plots(r, ev, q)
    for q in details:  # a metric declared by position (rows are bins; ``depth`` = a bin's start): by position
        if q.meaning.by_position and select(ok, task, q.metric)["depth"].notna().any():
            for model, corpus in _groups(select(ok, task, q.metric)):
                r.add_plot(
                    slug("loss_by_position", task, short_model(model), short_model(corpus)),
                    f"{q.metric} by position, {short_model(model)}",
                    plot_loss_by_position,
                    ok,
                    task=task,
                    metric=q.metric,
                    trained_context=ev.tc.get(model),
                    **_where(model, corpus),
                )
            break


def _metric_table(r: Report, ok: pd.DataFrame, q: Quantity, references: dict, seed: int) -> None:
    d = q.meaning
    better = {"higher": "higher is better", "lower": "lower is better"}.get(d.direction, "no direction")
    how = {
        "log": f"skew_t (results.stats.skew_t: skew-robust t on the log scale; each bound alone "
        f"{1 - SKEW_T_ONE_SIDED_MISS:.0%}), none below {MIN_T_UNITS}",
        "rate": "Wilson",
        "mean": f"t over units, none below {MIN_T_UNITS}",
    }[q.kind]
    caption = (
        f"{q.task}/{q.metric}: {d.description or q.metric} ({d.unit or 'value'}; {better}) by method and "
        f"length [95% interval: {how}], n = {d.independent_unit}s"
    )
    shown = table(ok, q.task, q.metric, with_ci=True, seed=seed)
    ref = references.get(d.chance_metric) if d.chance_metric else None
    if ref is not None:
        chance = select(ok, q.task, ref.metric).groupby("length")["value"].mean()
        shown = _with_chance_row(shown, chance, ref.metric)
        caption += f" (last row: {ref.metric})"
    dist = distance_text(select(ok, q.task, q.metric, units=True))
    if dist:
        caption += f"; {dist}"
    r.add_table(slug(q.task, q.metric), caption, shown, table(ok, q.task, q.metric))


def _metric_plots(r: Report, ev: Evidence, q: Quantity) -> None:
    """Per model and corpus: perplexities vs length (log axis), rates with depths as a heatmap, any other
    metric vs length; and vs the needle's distance where the rows record one."""
    ok = ev.ok
    sub = select(ok, q.task, q.metric)
    by_distance = _has_distance(select(ok, q.task, q.metric, units=True))
    seeded = {"seed": ev.seed}
    for model, corpus in _groups(sub):
        # (file name part, title, plot function, its own arguments): one row per plot of this model/corpus
        if q.meaning.kind == "perplexity":
            tc = {"trained_context": ev.tc.get(model)}
            plots = [("", f"{q.metric} vs length", plot_perplexity, {**seeded, **tc})]
        elif q.kind == "rate" and sub["depth"].notna().any() and not _has_distance(sub):
            plots = [("heatmap", f"{q.task} {q.metric} by depth and length", plot_passkey, {})]
        else:
            plots = [("", f"{q.task} {q.metric} vs length", plot_metric, seeded)]
        if by_distance:
            plots.append(("by_distance", f"{q.task} {q.metric} by needle distance", plot_by_distance, seeded))
        tag = (short_model(model), short_model(corpus))
        for part, title, fn, kwargs in plots:
            r.add_plot(
                slug(q.task, q.metric, part, *tag),
                f"{title}, {tag[0]}",
                fn,
                ok,
                task=q.task,
                metric=q.metric,
                **kwargs,
                **_where(model, corpus),
            )


def _has_distance(rows: pd.DataFrame) -> bool:
    return "distance" in rows.columns and rows["distance"].notna().any()


# LongPPL's key-token count (helper metric of the perplexity task, docs/tasks.md): LongPPL is written only
# where enough key tokens back it; the report says where it was withheld
KEY_TOKENS = "longppl_key_tokens"


def _withheld_longppl(r: Report, ok: pd.DataFrame, task: str) -> None:
    rows = ok[(ok["task"] == task) & (ok["metric"] == KEY_TOKENS)]
    if rows.empty:
        return
    have = ok[(ok["task"] == task) & (ok["metric"] == "longppl")]
    lines = []
    for (method, factor, L), g in rows.groupby(["method", "factor", "length"], dropna=False, sort=True):
        written = have[(have["method"] == method) & (have["factor"] == factor) & (have["length"] == L)]
        if len(written):
            continue
        units = g[is_unit(g)]
        k = int((units if len(units) else g)["value"].sum())
        docs = len(units) if len(units) else int(g["n"].fillna(1).iloc[0])
        minimum = _recorded_option(g, ("min_key_tokens", "key_tokens_min"))
        bar = f" (below the minimum of {minimum})" if minimum else " (below the declared minimum)"
        documents = f"{docs} document{'s' if docs != 1 else ''}"
        who = setting_label(method, factor)
        lines.append(f"LongPPL withheld at {int(L)}: {k} key tokens in {documents}{bar}, for {who}.")
    r.md += [*lines, ""] if lines else []


def _recorded_option(rows: pd.DataFrame, names: tuple[str, ...]) -> Any:
    for text in rows["task_options"].dropna().unique() if "task_options" in rows.columns else []:
        opts = json_object(text)
        for source in (opts, opts.get("key_tokens") if isinstance(opts.get("key_tokens"), dict) else {}):
            for n in names:
                if isinstance(source.get(n), (int, float)):
                    return source[n]
    return None


def _legend(r: Report, ev: Evidence, rules: set[tuple[str, str]]) -> None:
    r.md += ["## Legend", ""]
    r.md += [f"- {line}" for line in legend_lines(rules, ev.threshold, ev.tolerance, BASELINE)]
    r.md += [""]


def _failures(df: pd.DataFrame) -> list[str]:
    bad = df[df["status"] == "error"]
    if bad.empty:
        return ["## Failed cells", "", "None.", ""]
    cols = ["run", "cell", "model", "method", "factor", "task", "length", "error"]
    cells = bad.drop_duplicates(subset=["run", "cell"])[cols].copy()
    cells["model"] = cells["model"].map(lambda m: short_model(m) if not pd.isna(m) else m)
    cells["factor"] = cells["factor"].map(lambda f: "" if pd.isna(f) else f"{f:g}")
    cells["error"] = cells["error"].fillna("").map(lambda s: s.splitlines()[0][:160] if s else "")
    t = cells.set_index(["run", "cell"])
    return [f"## Failed cells ({len(cells)})", "", to_markdown(t), ""]


def report(
    run_dirs: str | os.PathLike | Iterable[str | os.PathLike],
    out: str | os.PathLike | None = None,
    *,
    trained_context: int | None = None,
    threshold: float | str = DEFAULT_BAR,
    tolerance: float = 0.10,
    seed: int = 0,
) -> Path:
    """Write ``report.md`` + ``tables/`` + ``plots/`` for the runs; returns the path of report.md.

    ``out`` defaults to the first run directory. ``trained_context`` (the model's original context) draws
    the dashed line in perplexity plots and is the reference of the summary and the effective lengths;
    without it each setting's rows decide (the patch's resolved ``trained_context``, which follows
    ``original_max_position_embeddings``), and only for rows that record none the manifest's (the model
    config's). The report opens with a headline of at most five lines, then :func:`results.summary`, the
    paired differences to plain, the effective lengths the grid supports, theory, and per-task tables and
    plots with n and 95% intervals (closed-form: ``seed`` changes nothing). ``threshold``: the bar of the
    rates' "threshold" reach, an accuracy (default 0.8, an absolute bar in RULER's style) or "ruler" (RULER's
    own 0.856, Llama-2-7B's 4K average over its 13 tasks).
    """
    threshold = check_rules(threshold, tolerance)
    paths = as_paths(run_dirs, "run directory", "results.report('runs/demo')")
    if out is not None:
        out = as_path(out, "report directory", "results.report('runs/demo', out='reports/demo')")
    check_trained_context(trained_context)
    df = load(paths)  # bad records are named first; then where the report may go
    theory = load_theory(paths)  # the sweep's theory rows, kept beside the records
    if len(theory):
        df = pd.concat([df, theory], ignore_index=True)
    out = Path(out) if out is not None else (paths[0] if paths[0].is_dir() else paths[0].parent)
    owned = check_report_dir(out)
    with staging(out) as folder, shared():  # each comparison computed once (memo.py)
        _write_report(Report(folder), df, paths, trained_context, threshold, tolerance, seed)
        report_output.commit(folder, out, owned)
    return out / "report.md"


def _write_report(
    r: Report,
    df: pd.DataFrame,
    paths: list[Path],
    trained_context: int | None,
    threshold: float,
    tolerance: float,
    seed: int,
) -> None:
    manifests = _manifests(paths)
    ok = df[df["status"].isna() | (df["status"] == "ok")]
    tc = {m: _trained_context_for(m, trained_context, manifests, ok) for m in ok["model"].dropna().unique()}
    tc = {m: v for m, v in tc.items() if v}
    tasks = measured_tasks(ok)
    ev = Evidence(ok, tc, seed, threshold, tolerance) if tasks else None
    r.md += ["# ropebench report", ""]
    if ev is not None:
        r.md += [*headline(ev), ""]
    r.md += [
        f"Runs: {', '.join(sorted(map(str, df['run'].dropna().unique())))}  ",
        f"Models: {', '.join(sorted({short_model(m) for m in df['model'].dropna().unique()}))}  ",
        f"Rows: {len(df)} ({int((df['status'] == 'error').sum())} error rows)  ",
    ]
    for m in manifests:
        v = m.get("versions") or {}
        git = (m.get("git") or {}).get("commit")
        r.md.append(
            f"Manifest `{Path(m['_path']).parent.name}/{Path(m['_path']).name}`: "
            f"start {m.get('start_time')}, end {m.get('end_time')}, device {m.get('device')}, "
            f"seed {m.get('seed')}, torch {v.get('torch')}, transformers {v.get('transformers')}"
            + (f", commit {git[:10]}" if git else "")
            + "  "
        )
    r.md.append("")
    rules: set[tuple[str, str]] = set()
    if ev is not None:
        _summary(r, ev)
        _differences(r, ev)
        rules = _reach(r, ev)
        _theory(r, ok)
        for task in tasks:
            _task_section(r, ev, task)
        _legend(r, ev, rules)
    time_section(r, df)  # results/timing.py: the cells' recorded wall per task and setting
    r.md += _failures(df)
    atomic_write_text(r.out / "report.md", "\n".join(r.md))
