"""``effective_length``: how far each model x method x factor really reaches, claiming only tested lengths.

Rules (all read lengths in ascending order and stop at the first failure, so a lucky longer length after a
failure is never counted):
- 0/1 rates (passkey ``correct``): a length passes when the lower bound of its 95% Wilson interval is at or
  above ``threshold`` (default 0.8), or with ``rule="trained"`` (RULER's idea: the model's own score at its
  trained context is the bar) at or above the baseline method's lower bound at the trained context.
- perplexities (``ppl_tail``): a length passes when the value is within ``tolerance`` (default +10%) of the
  setting's own value at the trained context (the longest tested length not beyond it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from .stats import Interval, Paired, metric_kind, paired_interval
from .store import ResultsError
from .tables import IDENTITY, cell_interval, is_unit, select, unit_key

PREFERRED_METRICS = ("ppl_tail", "ppl", "correct", "accuracy", "exact_match")


def default_metric(df: pd.DataFrame, task: str) -> str:
    have = set(df.loc[df["task"] == task, "metric"].dropna())
    for m in PREFERRED_METRICS:
        if m in have:
            return m
    raise ResultsError(f"no metric for an effective length in task {task!r} (have: {', '.join(sorted(have))}) — "
                       f"pass metric=... naming a 0/1 rate or a perplexity")


def trained_context_of(rows: pd.DataFrame, given: int | Mapping[str, int] | None, model: Any) -> int | None:
    """The argument (an int, or a dict by model), else a ``trained_context`` recorded in task_options."""
    if isinstance(given, Mapping):
        given = given.get(model)
    if given:
        return int(given)
    found = set()
    for opts in rows["task_options"].dropna().unique():
        try:
            v = json.loads(opts).get("trained_context")
        except (json.JSONDecodeError, AttributeError):
            v = None
        if v:
            found.add(int(v))
    return found.pop() if len(found) == 1 else None


def claim(effective: float, first_failure: float, shortest: int) -> str:
    """What may be said: "≥ L" when the longest tested length passed (the true reach may be longer),
    "L" when a longer tested length failed, "< L" when already the shortest failed."""
    if pd.isna(effective):
        return f"< {shortest}" if not pd.isna(first_failure) else "–"
    return f"≥ {int(effective)}" if pd.isna(first_failure) else str(int(effective))


def ratio_to(at: pd.DataFrame, ref: pd.DataFrame, metric: str, *, seed: int = 0) -> Interval | Paired:
    """value(L) / value(reference length) of one setting: a paired bootstrap over the documents both lengths
    share when per-document rows exist, else the bare ratio of the cell estimates (no interval)."""
    ua, ub = at[is_unit(at) & at["value"].notna()], ref[is_unit(ref) & ref["value"].notna()]
    if len(ua) and len(ub):
        ua, ub = ua.assign(_key=unit_key(ua)), ub.assign(_key=unit_key(ub))  # the key holds no length: same doc
        m = ua.merge(ub[["_key", "value", "n"]], on="_key", suffixes=("", "_ref")).sort_values("_key")
        if len(m):
            return paired_interval("log", m["value"].to_numpy(float), m["value_ref"].to_numpy(float),
                                   m["n"].fillna(1).to_numpy(float), m["n_ref"].fillna(1).to_numpy(float),
                                   how="ratio", seed=seed)
    a, b = cell_interval(at, metric, seed=seed), cell_interval(ref, metric, seed=seed)
    return Interval(a.estimate / b.estimate, math.nan, math.nan, min(a.n, b.n), "none")


def check_rules(threshold: float, tolerance: float) -> None:
    """Bad rule parameters are a user error, not a silently empty column."""
    if not (isinstance(threshold, (int, float)) and 0 < threshold <= 1):
        raise ResultsError(f"threshold must be an accuracy in (0, 1], got {threshold!r} — e.g. threshold=0.8")
    if not (isinstance(tolerance, (int, float)) and 0 <= tolerance < 100):
        raise ResultsError(f"tolerance must be a fraction >= 0 (0.1 = +10%), got {tolerance!r} — e.g. tolerance=0.1")


def _no_reference(tc: int | None, metric: str) -> str:
    if not tc:
        return "not computed: trained context unknown (pass trained_context=...)"
    return f"not computed: no {metric} at a tested length ≤ the trained context {tc}"


def _first_failure(checks: dict[int, tuple[bool, Any]]) -> dict[str, Any]:
    """Walk the tested lengths upwards and stop at the first that fails: the effective length, the first
    failure, and the statistic (estimate / lo / hi / n) at each."""
    effective = first_failure = pd.NA
    for L in sorted(checks):
        if not checks[L][0]:
            first_failure = L
            break
        effective = L
    row = {"effective_length": effective, "first_failure": first_failure,
           "claim": claim(effective, first_failure, min(checks))}
    for prefix, L in (("at", effective), ("fail", first_failure)):
        s = None if pd.isna(L) else checks[L][1]
        row.update({f"{prefix}_value": s.estimate if s else math.nan, f"{prefix}_lo": s.lo if s else math.nan,
                    f"{prefix}_hi": s.hi if s else math.nan, f"{prefix}_n": s.n if s else pd.NA})
    return row


def effective_length(df: pd.DataFrame, task: str, metric: str | None = None, *, threshold: float = 0.8,
                     rule: str = "threshold", tolerance: float = 0.10, trained_context: int | Mapping | None = None,
                     baseline: str = "plain", seed: int = 0, **where: Any) -> pd.DataFrame:
    """One row per model x method x factor x options x corpus: ``effective_length`` (a tested length, or NA),
    ``claim`` ("≥ 16384", "8192", "< 2048"), ``rule``, ``reference_length`` / ``reference_value``,
    ``first_failure`` and, at the effective length and at the first failure, value / lo / hi / n
    (``at_*`` and ``fail_*`` columns: the accuracy and its Wilson interval, or the ratio to the reference
    and its paired bootstrap interval over documents when per-document rows exist).

    ``rule``: "threshold" (Wilson lower bound >= ``threshold``) or "trained" (>= the ``baseline`` method's
    Wilson lower bound at the trained context, RULER-style; the setting's own when the baseline did not run)
    for rates; perplexities use ``tolerance``. Rows: per model, the baseline first.
    ``trained_context``: an int or {model: int}; default: ``trained_context`` in the rows' task_options.
    """
    check_rules(threshold, tolerance)
    metric = metric or default_metric(df, task)
    if rule not in ("threshold", "trained"):
        raise ResultsError(f"unknown rule {rule!r} — use rule='threshold' or rule='trained'")
    sub = select(df, task, metric, units=True, **where)
    sub = sub[sub["length"].notna()]
    if sub.empty:
        raise ResultsError(f"no {task}/{metric} rows with a length — an effective length needs lengths")
    kind = metric_kind(metric, sub.loc[is_unit(sub), "value"].dropna().to_numpy(float) if is_unit(sub).any() else None)
    if kind == "mean":
        raise ResultsError(f"{task}/{metric} is neither a 0/1 rate nor a perplexity — pass metric=... naming one")
    setting_cols = list(IDENTITY)
    settings = sorted(sub.groupby(setting_cols, dropna=False, sort=True),
                      key=lambda kv: (str(kv[0][0]), kv[0][1] != baseline, tuple(map(str, kv[0]))))
    out = []
    for setting, s_rows in settings:
        info = dict(zip(setting_cols, setting))
        cells = {int(L): (g, cell_interval(g, metric, seed=seed)) for L, g in s_rows.groupby("length", sort=True)}
        tc = trained_context_of(df[df["model"] == info["model"]], trained_context, info["model"])
        row = {**info, "metric": metric, "effective_length": pd.NA, "claim": "–", "rule": "",
               "reference_length": pd.NA, "reference_value": math.nan, "longest_tested": max(cells),
               "first_failure": pd.NA, "trained_context": tc if tc else pd.NA,
               **{f"{p}_{k}": math.nan for p in ("at", "fail") for k in ("value", "lo", "hi")},
               "at_n": pd.NA, "fail_n": pd.NA}
        ref_len = max((L for L in cells if tc and L <= tc), default=None)
        if kind == "rate" and rule == "threshold":
            row["rule"] = f"Wilson lower bound ≥ {threshold:g}"
            checks = {L: (ci.lo >= threshold, ci) for L, (_, ci) in cells.items()}
        elif ref_len is None:
            out.append({**row, "rule": _no_reference(tc, metric)})
            continue
        elif kind == "rate":
            base = sub[(sub["method"] == baseline) & (sub["length"] == ref_len) & (sub["model"] == info["model"])
                       & (sub["corpus"].astype(str) == str(info["corpus"]))]
            who = baseline if len(base) else "own"
            # the bar is the reference's own lower bound: plain passes at its trained context by construction
            bar = cell_interval(base if len(base) else cells[ref_len][0], metric, seed=seed).lo
            row.update(reference_length=ref_len, reference_value=bar,
                       rule=f"Wilson lower bound ≥ {who}'s at {ref_len} ({bar:.3f})")
            checks = {L: (ci.lo >= bar, ci) for L, (_, ci) in cells.items()}
        else:
            ref_rows, ref_ci = cells[ref_len]
            row.update(reference_length=ref_len, reference_value=ref_ci.estimate,
                       rule=f"{metric} ≤ {1 + tolerance:g} × its value at {ref_len}")
            checks = {L: (ci.estimate / ref_ci.estimate <= 1 + tolerance, ratio_to(g, ref_rows, metric, seed=seed))
                      for L, (g, ci) in cells.items() if L >= ref_len}
        out.append({**row, **_first_failure(checks)})
    return pd.DataFrame(out)
