"""``summary``: one row per setting (model x method x factor x options) — the table a report opens with.

Table-driven: the columns come from the tasks and metrics present in the rows and the metric table
(:data:`results.stats.METRICS`, defaults by kind for any other metric), so a new task's metrics show up with
no edit here. Per task, for each headline metric: its value at the longest tested length (perplexity-like
metrics also at the trained context) with n and its 95% interval, " *" where the paired difference to the
baseline at that length is significant (see :func:`results.compare`); for each metric with a pass/fail bar,
its effective length under every rule that applies (:data:`results.reach.RULE_NAMES`); reference rates
(chance) beside the values; and, where the sweep recorded it, the reach Men et al.'s criterion predicts from
the patched frequencies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .comparisons import SIGNIFICANT_MARK, paired_differences
from .reach import (
    MIN_BAR,
    NOLIMA_FRACTION,
    THEORY_TASK,
    check_rules,
    effective_length,
    predicted_claim,
    predicted_for,
    predicted_reach,
    ratio_to,
    reach_metrics,
    rules_for,
    setting_rows,
    trained_context_of,
)
from .stats import Interval, metric_spec
from .store import ResultsError
from .tables import cell_interval, fmt_interval, is_unit, select

SETTING = ("model", "method", "factor", "options")
# Tasks the project ships come first, in this order; any other task follows alphabetically.
TASK_ORDER = ("perplexity", "passkey", "classification")
PREDICTED = "predicted reach (Men et al.)"


def short_model(model: Any) -> str:
    """A model label for tables and plots: the last path part of a local path (not /tmp/.../tiny-llama),
    a hub id or alias unchanged."""
    s = str(model)
    return Path(s).name or s if s.startswith(("/", "~", ".")) or "\\" in s else s


def measured_tasks(df: pd.DataFrame) -> list[str]:
    """The tasks in the rows (not the sweep's theory rows): the shipped ones first, then alphabetically."""
    tasks = {str(t) for t in df["task"].dropna().unique()} - {THEORY_TASK}
    return [t for t in TASK_ORDER if t in tasks] + sorted(tasks - set(TASK_ORDER))


@dataclass(frozen=True)
class Quantity:
    """One task/metric as the summary shows it; ``label`` names its columns
    ("ppl", "passkey", "retrieval rank1")."""

    task: str
    metric: str
    kind: str
    label: str


@dataclass
class Quantities:
    values: list[Quantity]  # headline values: "@ longest" (log metrics also "@ trained"), paired mark
    reaches: list[Quantity]  # metrics with a pass/fail bar: one reach per applicable rule
    references: list[Quantity]  # shown beside their task's values (chance)


def quantities(df: pd.DataFrame) -> Quantities:
    """What the summary, the paired differences and the reach tables show,
    from the rows and the metric table."""
    ok = df[df["status"].isna() | (df["status"] == "ok")]
    out = Quantities([], [], [])
    for task in measured_tasks(ok):
        rows = ok[ok["task"] == task]
        specs = {
            str(m): metric_spec(m, g.loc[is_unit(g), "value"].dropna().to_numpy(float))
            for m, g in rows.groupby("metric", sort=True)
        }
        with_bar = reach_metrics(ok, task)
        headline = [m for m, s in specs.items() if s.headline and not s.reference]
        named = {m for m in [*headline, *with_bar] if specs[m].kind != "log"}
        out.values += [
            Quantity(task, m, specs[m].kind, _label(task, m, specs[m].kind, named))
            for m in _ordered(headline)
        ]
        out.reaches += [
            Quantity(task, m, specs[m].kind, _label(task, m, specs[m].kind, named)) for m in with_bar
        ]
        out.references += [Quantity(task, m, s.kind, m) for m, s in specs.items() if s.reference]
    return out


def _label(task: str, metric: str, kind: str, named: set[str]) -> str:
    """Perplexities by their own name ("ppl", "ppl_tail"); a task with one other metric by the task
    ("passkey"), with several by task and metric ("retrieval rank1")."""
    if kind == "log":
        return metric
    return task if len(named) == 1 else f"{task} {metric}"


def _ordered(metrics: list[str]) -> list[str]:
    from .reach import PREFERRED_METRICS

    rank = {m: i for i, m in enumerate(PREFERRED_METRICS)}
    return sorted(metrics, key=lambda m: (rank.get(m, len(rank)), m))


def reach_column(q: Quantity, rule: str) -> str:
    """``"passkey reach"`` (the threshold rule), ``"passkey reach (short)"``,
    ``"passkey reach (trained)"``."""
    return f"{q.label} reach" + ("" if rule == "threshold" else f" ({rule})")


def rules_caption(threshold: float = 0.8, tolerance: float = 0.10, baseline: str = "plain") -> str:
    """The bars behind the reach columns, in words (summary captions and the sweep's printout)."""
    return (
        f"reach = longest tested length whose 95% interval clears the bar (≥: no longer tested length "
        f"failed; <: the shortest already failed; not established: the interval straddles the bar). 0/1 "
        f"rates — reach: Wilson lower bound ≥ {threshold:g} (absolute, RULER); reach (short): "
        f"≥ {NOLIMA_FRACTION:g} × the setting's own rate at its shortest tested length (NoLiMa; that rate's "
        f"lower bound ≥ {MIN_BAR:g}); reach (trained): ≥ {baseline}'s Wilson lower bound at the trained "
        f"context, when that is ≥ {MIN_BAR:g}. Perplexities — reach: upper bound of the paired ratio to the "
        f"setting's own value at the trained context ≤ {1 + tolerance:g}; reach (trained): the same against "
        f"{baseline}'s value. {PREDICTED}: the first distance where Σ cos(m θ_i) < 0 for the patched "
        f"frequencies (≥: held up to the distance checked)"
    )


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


def _significant(long: pd.DataFrame | None, setting: dict, length: int | None) -> bool:
    if long is None or length is None:
        return False
    hit = _of(long, {k: v for k, v in setting.items() if k in long.columns})
    hit = hit[hit["length"] == length]
    return bool(len(hit) and hit["significant"].any())


def _lengths(df: pd.DataFrame, q: Quantity, setting: dict) -> list[int]:
    rows = _of(select(df, q.task, q.metric), setting)
    return sorted(int(x) for x in rows["length"].dropna().unique())


def _settings(ok: pd.DataFrame, baseline: str) -> list[dict]:
    rows = ok[ok["task"] != THEORY_TASK]
    settings = rows[list(SETTING)].drop_duplicates()
    return sorted(
        (dict(zip(SETTING, s)) for s in settings.itertuples(index=False)),
        key=lambda s: (
            str(s["model"]),
            s["method"] != baseline,
            str(s["method"]),
            str(s["factor"]),
            str(s["options"]),
        ),
    )


def summary(
    df: pd.DataFrame,
    *,
    trained_context: int | Mapping[str, int] | None = None,
    threshold: float = 0.8,
    tolerance: float = 0.10,
    baseline: str = "plain",
    seed: int = 0,
    with_ci: bool = True,
) -> pd.DataFrame:
    """One row per setting. ``with_ci=True`` (default): display strings "value [lo, hi] n=N" (columns named
    with the lengths when every setting shares them); ``with_ci=False``: numeric columns ``<name>``,
    ``<name>_lo``, ``<name>_hi``, ``<name>_n``, ``<name>_length`` for every value, ``<name>`` (the claim),
    ``<name>_length`` and ``<name>_rule`` (the bar in words) for every reach.

    The columns follow the rows (see the module doc): ``<label> @ longest`` per headline metric
    (perplexity-like ones also ``<label> @ trained``: the longest tested length not beyond the trained
    context), ``<label> ratio`` (a perplexity's value at the longest length over the trained context's),
    ``<label> reach`` / ``reach (short)`` / ``reach (trained)`` (see :func:`rules_caption` and
    :func:`results.effective_length`), the reference rates (``chance``) and ``predicted reach (Men et al.)``
    when the sweep recorded theory rows.

    ``trained_context``: an int or {model: int}; else what each setting's rows record (the patch's resolved
    ``trained_context`` in options, else task_options).
    """
    check_rules(threshold, tolerance)
    ok = df[df["status"].isna() | (df["status"] == "ok")]
    if ok[ok["task"] != THEORY_TASK].empty:
        raise ResultsError("no successful rows to summarise — load a run directory with finished cells")
    qs = quantities(ok)
    reach = {}
    for q in qs.reaches:
        for rule in rules_for(q.kind):
            try:
                reach[(q, rule)] = effective_length(
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
            except ResultsError:
                pass
    diffs = {}
    for q in qs.values:
        try:
            diffs[q] = paired_differences(ok, q.task, q.metric, baseline, seed=seed)
        except ResultsError:  # e.g. no baseline rows: nothing is marked
            diffs[q] = None
    predicted = predicted_reach(ok)
    columns: list[tuple[str, str]] = []  # (name, type) in display order
    rows = []
    for s in _settings(ok, baseline):
        tc = trained_context_of(
            setting_rows(ok, s), trained_context, s["model"]
        )  # the rows' own, per setting
        r: dict[str, Any] = dict(s)
        columns = []
        for task in measured_tasks(ok):
            columns += _task_columns(r, ok, qs, task, s, tc, reach, diffs, seed)
        if not predicted.empty:
            p = predicted_for(predicted, s)
            r[PREDICTED], r[f"{PREDICTED}_limit"] = p["predicted_reach"], p["predicted_limit"]
            columns.append((PREDICTED, "predicted"))
        rows.append(r)
    numeric = pd.DataFrame(rows)
    return _display(numeric, columns) if with_ci else numeric


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
) -> list[tuple[str, str]]:
    """Fill one setting's columns of one task into ``r``; returns their (name, type) in display order."""
    columns = []
    longest_of_task = None
    for q in (q for q in qs.values if q.task == task):
        lengths = _lengths(ok, q, s)
        longest = lengths[-1] if lengths else None
        if q.kind == "log":
            at_tc = max((L for L in lengths if tc and L <= tc), default=None)
            _put(
                r,
                f"{q.label} @ trained",
                _cell(ok, q, s, at_tc, seed),
                at_tc,
                _significant(diffs.get(q), s, at_tc),
            )
            columns.append((f"{q.label} @ trained", "value"))
        _put(
            r,
            f"{q.label} @ longest",
            _cell(ok, q, s, longest, seed),
            longest,
            _significant(diffs.get(q), s, longest),
        )
        columns.append((f"{q.label} @ longest", "value"))
        longest_of_task = longest_of_task or longest
    for q in (q for q in qs.reaches if q.task == task):
        found = {rule: _one(reach.get((q, rule)), s) for rule in rules_for(q.kind)}
        if q.kind == "log":  # the ratio the perplexity reach rests on, before the reaches
            columns += _ratio_column(r, ok, q, s, found.get("threshold"), seed)
        for rule, one in found.items():
            name = reach_column(q, rule)
            r[name] = one["claim"] if one is not None else "–"
            r[f"{name}_length"] = one["effective_length"] if one is not None else pd.NA
            r[f"{name}_rule"] = one["rule"] if one is not None else ""
            columns.append((name, "reach"))
    for q in (q for q in qs.references if q.task == task):
        ci = _cell(ok, q, s, longest_of_task, seed)
        r[q.label] = ci.estimate if ci else math.nan
        columns.append((q.label, "reference"))
    return columns


def _one(e: pd.DataFrame | None, s: dict) -> pd.Series | None:
    hit = _of(e, s) if e is not None else pd.DataFrame()
    return hit.iloc[0] if len(hit) == 1 else None


def _ratio_column(
    r: dict, ok: pd.DataFrame, q: Quantity, s: dict, e: pd.Series | None, seed: int
) -> list[tuple[str, str]]:
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
    return [(name, "ratio")]


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
    r[f"{name}_length"] = length if length is not None else pd.NA
    r[f"{name}_significant"] = significant
    r[f"{name}_reference_length"] = ref_length if ref_length is not None else pd.NA


def _display(numeric: pd.DataFrame, columns: list[tuple[str, str]]) -> pd.DataFrame:
    out = pd.DataFrame(
        {"model": numeric["model"].map(short_model), "method": numeric["method"], "factor": numeric["factor"]}
    )
    if numeric["options"].nunique() > 1:
        out["options"] = numeric["options"].map(
            lambda o: ", ".join(f"{k}={v}" for k, v in json.loads(o).items()) if o and o != "{}" else ""
        )
    if out["model"].nunique() == 1:
        out = out.drop(columns="model")
    for name, kind in columns:
        if kind == "reach":
            if not (numeric[name] == "–").all():
                out[name] = numeric[name]
        elif kind == "reference":
            if numeric[name].notna().any():
                out[name] = numeric[name]
        elif kind == "predicted":
            if numeric[name].notna().any():
                out[name] = [
                    predicted_claim(v, lim) for v, lim in zip(numeric[name], numeric[f"{name}_limit"])
                ]
        elif not numeric[f"{name}_length"].isna().all():
            label, cells = _interval_column(numeric, name, kind)
            out[label] = cells
    return out.set_index([c for c in ("model", "method", "factor", "options") if c in out.columns])


def _interval_column(numeric: pd.DataFrame, name: str, kind: str) -> tuple[str, list[str]]:
    """The header (lengths in it when every setting shares them) and the "value [lo, hi] n=N *" cells."""
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
    cells = []
    for _, r in numeric.iterrows():
        if pd.isna(r[name]):
            cells.append("–")
            continue
        n = None if pd.isna(r[f"{name}_n"]) else r[f"{name}_n"]
        cell = fmt_interval(r[name], r[f"{name}_lo"], r[f"{name}_hi"], n)
        if not shared:
            cell += f" @{int(r[f'{name}_length'])}"
        cells.append(cell + (f" {SIGNIFICANT_MARK}" if r[f"{name}_significant"] else ""))
    return label, cells
