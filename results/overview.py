"""``summary``: one row per setting (model x method x factor x options) — the table a report opens with.

Declaration-driven: what a column is comes from the metrics' declarations (:mod:`results.meaning`), never
from a metric's name or its values, so a plugin task's metrics show up with no edit here. Per task, for each
headline metric: its value at the longest tested length (perplexities also at the trained context, when that
is a different length) with n and its 95% interval, " *" where the paired difference to the baseline at that
length is significant (see :func:`results.compare`); for each metric that declares reach rules, its effective
length under each of them (:data:`results.reach_rules.RULES`); reference metrics (chance) beside the values.

``summary(with_ci=False)`` keeps every column. The display (``with_ci=True``) keeps only the informative
ones: a column that is empty, not computed, not established or identical in every row, or a copy of another,
is left out, and so is what does not fit in ``MAX_COLUMNS``; :func:`left_out` says which and why.

Its size (~670 lines): the summary's columns and the legend that explains them must say the same thing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .comparisons import MIXED_MARK, SIGNIFICANT_MARK, paired_differences, power_text
from .meaning import Metric, declarations
from .ranges import within_range
from .reach import (
    THEORY_TASK,
    check_trained_context,
    effective_length,
    ratio_to,
    rules_of,
    setting_rows,
    trained_context_of,
)
from .reach_rules import DEFAULT_BAR, RULES, caption, check_rules
from .stats import SKEW_T_ONE_SIDED_MISS, Interval
from .store import ResultsError, setting_label  # noqa: F401 (re-exported: overview.setting_label)
from .tables import UNIT_COLUMNS, cell_interval, copy_frame, fmt_interval, remember, select, shared

SETTING = ("model", "method", "factor", "options")
# The display's width, index columns (method, factor, ...) included: the demo's kind of run (3 methods x 4
# tasks) fits, and what does not is named in the footnote
MAX_COLUMNS = 8
EMPTY = ("–", "", "nan")


def short_model(model: Any) -> str:
    """A model label for tables and plots: the last path part of a local path (not /tmp/.../tiny-llama),
    a hub id or alias unchanged."""
    s = str(model)
    return Path(s).name or s if s.startswith(("/", "~", ".")) or "\\" in s else s


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows a table or comparison reads: finished ones whose value is within its metric's declared range
    (results/ranges.py; the report counts those left out)."""
    return within_range(df[df["status"].isna() | (df["status"] == "ok")])


def measured_tasks(df: pd.DataFrame) -> list[str]:
    """The tasks in the rows (not the sweep's theory rows), in the order the rows first name them (the sweep
    writes its tasks in the config's order)."""
    tasks = df["task"].dropna().astype(str)
    return [t for t in dict.fromkeys(tasks) if t != THEORY_TASK]


def metrics_of(df: pd.DataFrame, task: str) -> list[str]:
    """A task's metrics in the order the task writes them: by its aggregate rows first (a cell's summary
    rows, in the task's own order; per-unit rows may come earlier, e.g. perplexity's per-document tails),
    then by any row."""
    rows = df[df["task"] == task]
    unit_cols = [c for c in UNIT_COLUMNS if c in rows.columns]
    aggregate = rows[rows[unit_cols].isna().all(axis=1)] if unit_cols else rows
    order = list(dict.fromkeys(aggregate["metric"].dropna().astype(str)))
    return order + [m for m in dict.fromkeys(rows["metric"].dropna().astype(str)) if m not in order]


@dataclass(frozen=True)
class Quantity:
    """One task/metric as the summary shows it; ``label`` names its columns ("ppl", "passkey",
    "retrieval answer_top1"); ``kind`` is the statistics' kind ("log", "rate", "mean")."""

    task: str
    metric: str
    kind: str
    label: str
    meaning: Metric = field(compare=False, hash=False, repr=False, default=None)


@dataclass
class Quantities:
    values: list[Quantity]  # headline metrics: a summary value and a paired difference
    reaches: list[Quantity]  # metrics that declare reach rules: one reach per rule the kind supports
    references: list[Quantity]  # shown beside their task's values (chance), never compared
    details: list[Quantity] = field(default_factory=list)  # tables and plots only


def quantities(df: pd.DataFrame) -> Quantities:
    """What the summary, the paired differences and the reach tables show, from the declarations."""
    ok = ok_rows(df)
    meant = declarations(ok[ok["task"] != THEORY_TASK]) if len(ok) else {}
    out = Quantities([], [], [])
    for task in measured_tasks(ok):
        metrics = metrics_of(ok, task)
        named = [m for m in metrics if meant[(task, m)].kind != "perplexity" and meant[(task, m)].headline]
        for m in metrics:
            d = meant[(task, m)]
            q = Quantity(task, m, d.stat_kind, _label(task, m, d, named), d)
            if d.reference:
                out.references.append(q)
            elif d.headline:
                out.values.append(q)
            else:
                out.details.append(q)
            if not d.reference and rules_of(d):
                out.reaches.append(q)
    return out


def _label(task: str, metric: str, d: Metric, named: list[str]) -> str:
    """Perplexities by their own name ("ppl", "ppl_tail"); a task with one other headline metric by the task
    ("passkey"), with several by task and metric ("retrieval answer_top1")."""
    if d.kind == "perplexity":
        return metric
    return task if named == [metric] or (not named and not d.reference) else f"{task} {metric}"


def reach_column(q: Quantity, rule: str) -> str:
    """``"passkey reach"`` (the threshold rule), ``"passkey reach (short)"``,
    ``"passkey reach (trained)"``."""
    return f"{q.label} reach" + ("" if rule == "threshold" else f" ({rule})")


def legend_lines(
    rules: set[tuple[str, str]] | None = None,
    threshold: float | str = DEFAULT_BAR,
    tolerance: float = 0.10,
    baseline: str = "plain",
) -> list[str]:
    """One short line per rule behind the tables; ``rules``: the (kind, rule) pairs shown (None: all)."""
    values = (
        "value [lo, hi] n=N: estimate, 95% interval, N independent units (the rows behind them in brackets "
        "when several share a unit); perplexity: skew_t, 0/1 rates: Wilson, means: t"
    )
    skew = (
        "skew_t (results.stats.skew_t): t on the log scale, lengthened on the side the units are skewed "
        f"to; a two-sided 95% interval whose bounds, read alone, each err up to {SKEW_T_ONE_SIDED_MISS:.0%} "
        "of the time in simulation, not 2.5%"
    )
    marked = (
        f"{SIGNIFICANT_MARK}: paired difference to {baseline} at that length significant (the interval "
        "excludes no difference, ≥ 6 independent units differ, and the exact test agrees: McNemar p < 0.05 "
        "for 0/1 outcomes, sign-flip p < 0.05 over clusters where rows share one)"
    )
    unmarked = (
        "unmarked: (80% power at ±d): the true difference its test marks 80% of the time at that n and "
        "spread (normal contrasts; ratio: ×/÷d; exact tests: a lower bound); (p cannot reach 0.05 at n=k): "
        "below 6 units an exact test's smallest p is 2/2^k"
    )
    mixed = (
        f"{MIXED_MARK}: a needle distance is significantly the other way from the pooled difference, which "
        "then gets no mark; the per-distance table says where each setting wins and loses"
    )
    walk = (
        "reach: the longest tested length that passes, lengths read upwards; ≥ L: no longer length "
        "failed; < L: the shortest failed; a length fails only when its favourable bound misses the bar, "
        "else it is not established"
    )
    lines = [values, skew, marked, unmarked, mixed, walk]
    lines += [
        caption(rule, threshold, tolerance, baseline)
        for key, rule in RULES.items()
        if rules is None or key in rules
    ]
    return lines


def rules_caption(
    threshold: float | str = DEFAULT_BAR, tolerance: float = 0.10, baseline: str = "plain"
) -> str:
    """The bars behind the reach columns, in words (the sweep's printout): the legend lines joined."""
    return "; ".join(legend_lines(None, threshold, tolerance, baseline))


def _of(frame: pd.DataFrame, setting: dict) -> pd.DataFrame:
    mask = pd.Series(True, index=frame.index)
    for k, v in setting.items():
        if k in frame.columns:
            mask &= frame[k].astype(str) == str(v)
    return frame[mask]


def _cell(df: pd.DataFrame, q: Quantity, setting: dict, length: int | None, seed: int) -> Interval | None:
    if length is None:
        return None
    rows = _of(select(df, q.task, q.metric, units=True), setting)
    rows = rows[rows["length"] == length]
    return cell_interval(rows, q.metric, seed=seed) if len(rows) else None


def _significant(
    long: pd.DataFrame | None, setting: dict, length: int | None, column: str = "significant"
) -> bool:
    """The paired difference's mark (``column="mixed"``: its strata disagree, results/strata.py)."""
    if long is None or length is None or column not in long.columns:
        return False
    hit = _of(long, {k: v for k, v in setting.items() if k in long.columns})
    hit = hit[hit["length"] == length]
    return bool(len(hit) and hit[column].astype(bool).any())


def _power_note(long: pd.DataFrame | None, setting: dict, length: int | None) -> str:
    """What an unmarked paired difference could have marked (results.comparisons.power_text); "" for a
    marked one, a mixed one (its strata disagree) and the baseline."""
    if long is None or length is None or "detectable" not in long.columns:
        return ""
    hit = _of(long, {k: v for k, v in setting.items() if k in long.columns})
    hit = hit[hit["length"] == length]
    if len(hit) != 1 or hit["significant"].iloc[0] or bool(hit.get("mixed", pd.Series([False])).iloc[0]):
        return ""
    return power_text(hit.iloc[0])


def _lengths(df: pd.DataFrame, q: Quantity, setting: dict) -> list[int]:
    rows = _of(select(df, q.task, q.metric), setting)
    return sorted(int(x) for x in rows["length"].dropna().unique())


def _settings(ok: pd.DataFrame, baseline: str) -> list[dict]:
    rows = ok[ok["task"] != THEORY_TASK]
    settings = rows[list(SETTING)].drop_duplicates()
    return sorted(
        (dict(zip(SETTING, s)) for s in settings.itertuples(index=False)),
        key=lambda s: (str(s["model"]), s["method"] != baseline, *(str(s[k]) for k in SETTING[1:])),
    )


def distance_text(rows: pd.DataFrame) -> str | None:
    """ "needle 4096 tokens from the question" (a range when several) from the rows' ``distance``; None when
    the rows carry none."""
    if "distance" not in rows.columns:
        return None
    d = sorted({int(x) for x in pd.to_numeric(rows["distance"], errors="coerce").dropna()})
    if not d:
        return None
    span = str(d[0]) if len(d) == 1 else f"{d[0]}–{d[-1]}"
    return f"needle {span} tokens from the question"


def check_summary_args(df: Any, trained_context: Any, baseline: str) -> pd.DataFrame:
    """One-line ResultsErrors for what summary cannot use; returns the successful measured rows."""
    if not isinstance(df, pd.DataFrame):
        raise ResultsError(
            f"summary needs a DataFrame of records, got {type(df).__name__} — use results.load(RUN)"
        )
    missing = [c for c in ("task", "metric", "value", "method", "model", "factor", "options") if c not in df]
    if df.empty or missing:
        raise ResultsError(
            "no records to summarise"
            + (f" (missing columns: {', '.join(missing)})" if missing and not df.empty else "")
            + " — load a run directory with finished cells: results.summary(results.load(RUN))"
        )
    check_trained_context(trained_context)
    status = df["status"] if "status" in df.columns else pd.Series(pd.NA, index=df.index)
    ok = within_range(df[status.isna() | (status == "ok")])
    measured = ok[ok["task"] != THEORY_TASK]
    if measured.empty:
        raise ResultsError("no successful rows to summarise — load a run directory with finished cells")
    methods = list(dict.fromkeys(measured["method"].dropna().astype(str)))
    # the default baseline may be absent (a run of extensions only: then nothing is marked); a named one not
    if baseline not in methods and baseline != "plain":
        raise ResultsError(
            f"baseline method {baseline!r} is not in the records — use one of: {', '.join(methods)}"
        )
    return ok


def summary(
    df: pd.DataFrame,
    *,
    trained_context: int | Mapping[str, int] | None = None,
    threshold: float | str = DEFAULT_BAR,
    tolerance: float = 0.10,
    baseline: str = "plain",
    seed: int = 0,
    with_ci: bool = True,
) -> pd.DataFrame:
    """One row per setting. ``with_ci=True`` (default): the informative columns only, as display strings
    "value [lo, hi] n=N" (named with the length when every setting shares it; the needle's distance in the
    name for metrics whose rows record one); :func:`left_out` names the rest. ``with_ci=False``: every
    column, numeric: ``<name>``, ``<name>_lo``, ``<name>_hi``, ``<name>_n`` (independent units),
    ``<name>_rows``, ``<name>_length`` per value; ``<name>`` (the claim), ``<name>_length`` and
    ``<name>_rule`` (the bar in words) per reach.

    Columns: ``<label> @ longest`` per headline metric (perplexities also ``<label> @ trained``: the longest
    tested length not beyond the trained context), ``<label> ratio`` (a perplexity with reach rules: its value
    at the longest length over the trained context's), ``<label> reach`` / ``reach (short)`` / ``reach
    (trained)`` for the rules its declaration names and its kind supports (see
    :func:`results.effective_length`), and the reference metrics (``chance``).

    ``threshold``: the "threshold" rule's bar for rates, an accuracy or "ruler" (RULER's 0.856; see
    :func:`results.reach_rules.bar_value`). ``trained_context``: an int > 0 or {model: int}; else what each
    setting's rows record (the patch's resolved ``trained_context`` in options, else task_options).
    ``baseline``: a method of the rows (the default "plain" may be absent: then no difference is marked and
    no "trained" reach computed).
    """
    with shared():  # effective lengths and paired differences computed once (memo.py)
        return _summary(df, trained_context, threshold, tolerance, baseline, seed, with_ci)


def _summary(
    df: pd.DataFrame,
    trained_context: int | Mapping[str, int] | None,
    threshold: float | str,
    tolerance: float,
    baseline: str,
    seed: int,
    with_ci: bool,
) -> pd.DataFrame:
    threshold = check_rules(threshold, tolerance)
    ok = check_summary_args(df, trained_context, baseline)
    numeric, columns = remember(
        "summary",
        df,
        (trained_context, threshold, tolerance, baseline, seed),
        lambda: _numeric(ok, trained_context, threshold, tolerance, baseline, seed),
        lambda v: (copy_frame(v[0]), list(v[1])),
    )  # with_ci=True and False share it
    if not with_ci:
        return numeric
    shown, dropped = _display(ok, numeric, columns)
    shown.attrs["left_out"] = dropped
    return shown


def reaches(
    ok: pd.DataFrame,
    qs: Quantities,
    trained_context: int | Mapping[str, int] | None,
    threshold: float,
    tolerance: float,
    baseline: str,
    seed: int,
) -> dict[tuple[Quantity, str], pd.DataFrame | str]:
    """The effective length of every metric that declares reach rules, under each rule its kind supports
    (the error's message where one cannot be computed)."""
    out: dict[tuple[Quantity, str], pd.DataFrame | str] = {}
    for q in qs.reaches:
        for rule in rules_of(q.meaning):
            try:
                out[(q, rule)] = effective_length(
                    ok,
                    q.task,
                    q.metric,
                    threshold=threshold,
                    tolerance=tolerance,
                    trained_context=trained_context,
                    rule=rule,
                    baseline=baseline,
                    seed=seed,
                )
            except ResultsError as e:
                out[(q, rule)] = str(e)
    return out


def _numeric(
    ok: pd.DataFrame,
    trained_context: int | Mapping[str, int] | None,
    threshold: float,
    tolerance: float,
    baseline: str,
    seed: int,
) -> tuple[pd.DataFrame, list[tuple[str, str, Quantity]]]:
    """summary(with_ci=False) and the columns in display order."""
    qs = quantities(ok)
    reach = {
        key: e
        for key, e in reaches(ok, qs, trained_context, threshold, tolerance, baseline, seed).items()
        if isinstance(e, pd.DataFrame)
    }
    diffs = {}
    for q in qs.values:
        try:
            diffs[q] = paired_differences(ok, q.task, q.metric, baseline, seed=seed)
        except ResultsError:  # e.g. no baseline rows for this task: nothing is marked
            diffs[q] = None
    columns: list[tuple[str, str, Quantity]] = []  # (name, type, quantity) in display order
    rows = []
    for s in _settings(ok, baseline):
        tc = trained_context_of(setting_rows(ok, s), trained_context, s["model"])  # per setting
        r: dict[str, Any] = dict(s)
        columns = []
        for task in measured_tasks(ok):
            columns += _task_columns(r, ok, qs, task, s, tc, reach, diffs, seed)
        rows.append(r)
    numeric = pd.DataFrame(rows)
    numeric.attrs["columns"] = [(name, kind) for name, kind, _ in columns]
    return numeric, columns


def _task_columns(
    r: dict,
    ok: pd.DataFrame,
    qs: Quantities,
    task: str,
    s: dict,
    tc: int | None,
    reach: dict,
    diffs: dict,
    seed: int,
) -> list[tuple[str, str, Quantity]]:
    """Fill one setting's columns of one task into ``r``; returns their (name, type, quantity) in order."""
    columns = []
    longest_of_task = None
    for q in (q for q in qs.values if q.task == task):
        lengths = _lengths(ok, q, s)
        longest = lengths[-1] if lengths else None
        if q.kind == "log":
            at_tc = max((L for L in lengths if tc and L <= tc), default=None)
            name = f"{q.label} @ trained"
            _put(r, name, _cell(ok, q, s, at_tc, seed), at_tc, _significant(diffs.get(q), s, at_tc))
            columns.append((name, "trained", q))
        name = f"{q.label} @ longest"
        _put(r, name, _cell(ok, q, s, longest, seed), longest, _significant(diffs.get(q), s, longest))
        r[f"{name}_mixed"] = _significant(diffs.get(q), s, longest, "mixed")
        r[f"{name}_power"] = _power_note(diffs.get(q), s, longest)
        columns.append((name, "value", q))
        longest_of_task = longest_of_task or longest
    for q in (q for q in qs.reaches if q.task == task):
        found = {rule: _one(reach.get((q, rule)), s) for rule in rules_of(q.meaning)}
        if q.kind == "log":  # the ratio the perplexity reach rests on, before the reaches
            columns += _ratio_column(r, ok, q, s, found.get("threshold"), seed)
        for rule, one in found.items():
            name = reach_column(q, rule)
            r[name] = one["claim"] if one is not None else "–"
            r[f"{name}_length"] = one["effective_length"] if one is not None else pd.NA
            r[f"{name}_rule"] = one["rule"] if one is not None else ""
            columns.append((name, "reach", q))
    for q in (q for q in qs.references if q.task == task):
        ci = _cell(ok, q, s, longest_of_task, seed)
        r[q.label] = ci.estimate if ci else math.nan
        columns.append((q.label, "reference", q))
    return columns


def _one(e: pd.DataFrame | None, s: dict) -> pd.Series | None:
    hit = _of(e, s) if e is not None else pd.DataFrame()
    return hit.iloc[0] if len(hit) == 1 else None


def _ratio_column(
    r: dict, ok: pd.DataFrame, q: Quantity, s: dict, e: pd.Series | None, seed: int
) -> list[tuple[str, str, Quantity]]:
    """A perplexity's value at the longest tested length over its value at the trained context (paired t)."""
    name = f"{q.label} ratio"
    ci = None
    ref = last = None
    if e is not None and not pd.isna(e["reference_length"]) and e["longest_tested"] > e["reference_length"]:
        ref, last = int(e["reference_length"]), int(e["longest_tested"])
        rows_of = _of(select(ok, q.task, q.metric, units=True), s)
        ci = ratio_to(
            rows_of[rows_of["length"] == last], rows_of[rows_of["length"] == ref], q.metric, seed=seed
        )
    _put(r, name, ci, last, ref_length=ref)
    return [(name, "ratio", q)]


def _put(
    r: dict,
    name: str,
    ci: Any,
    length: int | None,
    significant: bool = False,
    *,
    ref_length: int | None = None,
) -> None:
    r[name] = ci.estimate if ci else math.nan
    r[f"{name}_lo"] = ci.lo if ci else math.nan
    r[f"{name}_hi"] = ci.hi if ci else math.nan
    r[f"{name}_n"] = ci.n if ci else pd.NA
    # rows behind the independent units (H1's Interval.rows; equal to n when every row is its own unit)
    r[f"{name}_rows"] = getattr(ci, "rows", None) or (ci.n if ci else pd.NA)
    r[f"{name}_length"] = length if length is not None else pd.NA
    r[f"{name}_significant"] = significant
    r[f"{name}_reference_length"] = ref_length if ref_length is not None else pd.NA


# -- the display: informative columns only ------------------------------------------------------------------
# Which columns go first when not all fit: each task's first value, then each task's first reach, then the
# rest in order (a value at the trained context and the ratio last: the longest length's value says more).
_PRIORITY = {"value": 0, "reach": 1, "reference": 2, "trained": 3, "ratio": 4}


def _display(
    ok: pd.DataFrame, numeric: pd.DataFrame, columns: list[tuple[str, str, Quantity]]
) -> tuple[pd.DataFrame, list[tuple[str, str]]]:
    """The display table and what it left out: [(column, why)]."""
    out = _index_columns(numeric)
    candidates: list[tuple[str, list[str], str, Quantity]] = []  # (label, cells, type, quantity)
    dropped: list[tuple[str, str]] = []
    folded, skipped = _fold_references(numeric, columns)
    for name, kind, q in columns:
        if kind == "reference" and name in skipped:
            continue  # shown in the label of the value it is the chance level of
        if kind == "reach":
            label, cells = name, [str(x) for x in numeric[name]]
        elif kind == "reference":
            label, cells = (
                name,
                [fmt_interval(v, math.nan, math.nan) if pd.notna(v) else "–" for v in numeric[name]],
            )
        elif numeric[f"{name}_length"].isna().all():
            dropped.append((name, "not computed"))
            continue
        else:
            label, cells = _interval_column(ok, numeric, name, kind, q)
            if (q.task, q.metric) in folded:
                label += f" (chance {folded[(q.task, q.metric)]})"
        why = _uninformative(cells, [c for c in candidates if c[3].task == q.task])
        if why == "not computed" and kind == "reach":
            reasons = [str(x) for x in numeric[f"{name}_rule"] if str(x).startswith("not computed: ")]
            why = reasons[0].removeprefix("not computed: ") if reasons else why
        elif why == "not established in any row":
            why += f": needs more {q.meaning.independent_unit}s per length"
        if why:
            dropped.append((label, why))
        else:
            candidates.append((label, cells, kind, q))
    room = MAX_COLUMNS - len(out.columns)
    tasks = measured_tasks(ok)
    first_of_task: set[tuple[str, str]] = set()
    ranked = []
    for i, (label, cells, kind, q) in enumerate(candidates):
        first = (q.task, kind) not in first_of_task
        first_of_task.add((q.task, kind))
        tier = _PRIORITY[kind] if first else 5 + _PRIORITY[kind]
        ranked.append((tier, tasks.index(q.task) if q.task in tasks else 0, i))
    keep = sorted(i for *_, i in sorted(ranked)[: max(room, 0)])
    for i, (label, cells, kind, q) in enumerate(candidates):
        if i in keep:
            out[label] = cells
        else:
            dropped.append((label, f"no room in {MAX_COLUMNS} columns: see the {q.task} section"))
    index = [c for c in ("model", "method", "factor", "options") if c in out.columns]
    return out.set_index(index), dropped


def _index_columns(numeric: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame(
        {"model": numeric["model"].map(short_model), "method": numeric["method"], "factor": numeric["factor"]}
    )
    if numeric["options"].nunique() > 1:
        out["options"] = numeric["options"].map(
            lambda o: ", ".join(f"{k}={v}" for k, v in json.loads(o).items()) if o and o != "{}" else ""
        )
    if out["model"].nunique() == 1:
        out = out.drop(columns="model")
    return out


def _uninformative(cells: list[str], earlier: list) -> str | None:
    """Why a column says nothing (None when it says something); ``earlier``: the same task's columns kept."""
    if all(c in EMPTY or c.startswith("not computed") for c in cells):
        return "not computed"
    if all(c.startswith("not established") or c in EMPTY for c in cells):
        return "not established in any row"
    if len(cells) > 1 and len({_bare(c) for c in cells}) == 1:  # a power note on some rows says nothing more
        return f"{_bare(cells[0])} in every row"
    for other, other_cells, *_ in earlier:
        if [_bare(c) for c in other_cells] == [_bare(c) for c in cells]:
            return f"the same as {other}"
    return None


def _bare(cell: str) -> str:
    for note in (" (80% power at", " (p cannot reach", " (no mark possible", " (no possible difference"):
        cell = cell.split(note)[0]
    return cell.removesuffix(f" {MIXED_MARK}").removesuffix(f" {SIGNIFICANT_MARK}")


def _fold_references(numeric: pd.DataFrame, columns: list) -> tuple[dict[tuple[str, str], str], set[str]]:
    """Chance levels that go into their value's label instead of a column of their own: {(task, metric):
    chance text} for values with a declared chance (a number, or a reference metric the same in every row),
    and the reference columns so folded."""
    folded, skipped = {}, set()
    by_metric = {(q.task, q.metric): name for name, kind, q in columns if kind == "reference"}
    for _, kind, q in columns:
        if kind != "value" or q.meaning is None:
            continue
        d = q.meaning
        if d.chance is not None:
            folded[(q.task, q.metric)] = f"{d.chance:g}"
        elif d.chance_metric and (q.task, d.chance_metric) in by_metric:
            ref_name = by_metric[(q.task, d.chance_metric)]
            ref = numeric[ref_name].dropna().round(3).unique()
            if len(ref) == 1:
                folded[(q.task, q.metric)] = f"{ref[0]:.3g}"
                skipped.add(ref_name)
    return folded, skipped


def n_text(n: Any, rows: Any, unit: str | None = None) -> str:
    """ "n=6", or "n=1 (6 rows)" when several rows share an independent unit."""
    if n is None or pd.isna(n):
        return ""
    text = f"n={int(n)}" + (f" {unit}" if unit else "")
    if rows is not None and not pd.isna(rows) and int(rows) > int(n):
        text += f" ({int(rows)} rows)"
    return text


def _interval_column(
    ok: pd.DataFrame, numeric: pd.DataFrame, name: str, kind: str, q: Quantity
) -> tuple[str, list[str]]:
    """The header (lengths in it when every setting shares them; the needle's distance where recorded) and
    the "value [lo, hi] n=N *" cells."""
    lengths = numeric[f"{name}_length"].dropna().unique()
    shared = len(lengths) == 1
    label = name
    if shared and kind == "ratio":
        refs = numeric[f"{name}_reference_length"].dropna().unique()
        reference = int(refs[0]) if len(refs) == 1 else "trained"
        label = f"{name.removesuffix(' ratio')} {int(lengths[0])} / {reference}"
    elif shared:
        label = name.replace("@ trained", f"@ {int(lengths[0])} (trained)").replace(
            "@ longest", f"@ {int(lengths[0])}"
        )
    if kind != "ratio":
        rows = ok[(ok["task"] == q.task) & (ok["metric"] == q.metric) & ok["length"].isin(lengths)]
        where = distance_text(rows)
        if where:
            label += f", {where}"
    cells = []
    for _, r in numeric.iterrows():
        if pd.isna(r[name]):
            cells.append("–")
            continue
        cell = fmt_interval(r[name], r[f"{name}_lo"], r[f"{name}_hi"])
        cell += " " + n_text(r[f"{name}_n"], r.get(f"{name}_rows"))
        if not shared:
            cell += f" @{int(r[f'{name}_length'])}"
        cell = cell.strip() + (f" {SIGNIFICANT_MARK}" if r[f"{name}_significant"] else "")
        mixed = r.get(f"{name}_mixed", False)
        cell += f" {MIXED_MARK}" if isinstance(mixed, (bool, np.bool_)) and mixed else ""
        power = r.get(f"{name}_power", "")
        cells.append(cell + (power if isinstance(power, str) else ""))
    return label, cells


def left_out(shown: pd.DataFrame) -> list[tuple[str, str]]:
    """[(column, why)] the display of :func:`summary` left out."""
    return list(shown.attrs.get("left_out", []))
