"""``compare``: each setting against a baseline method on the same documents / prompts, with a paired
interval (paired t over documents; Newcombe's paired score interval for 0/1 outcomes) and a mark where the
difference is significant (see :class:`results.stats.Paired`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .stats import Paired, metric_kind, paired_interval, unpaired_rate_interval
from .store import ResultsError
from .tables import (
    _as_list,
    _auto_rows,
    _order_methods,
    cell_interval,
    fmt_interval,
    is_unit,
    select,
    unit_key,
)

SIGNIFICANT_MARK = "*"


def _units(rows: pd.DataFrame) -> pd.DataFrame:
    u = rows[is_unit(rows) & rows["value"].notna()]
    return u.assign(_key=unit_key(u)).drop_duplicates("_key", keep="last")


def _pair(rows: pd.DataFrame, base: pd.DataFrame, metric: str, how: str, seed: int) -> Paired:
    """One setting's cell against the baseline's cell: paired over shared units when both have per-unit rows,
    else (rates known only as totals) Newcombe's unpaired interval, else the bare contrast of the
    estimates."""
    ua, ub = _units(rows), _units(base)
    if len(ua) and len(ub):
        m = ua.merge(ub[["_key", "value", "n"]], on="_key", suffixes=("", "_base")).sort_values("_key")
        kind = metric_kind(
            metric, np.concatenate([m["value"].to_numpy(float), m["value_base"].to_numpy(float)])
        )
        wa = None if kind == "rate" else m["n"].fillna(1).to_numpy(float)
        wb = None if kind == "rate" else m["n_base"].fillna(1).to_numpy(float)
        return paired_interval(
            kind, m["value"].to_numpy(float), m["value_base"].to_numpy(float), wa, wb, how=how, seed=seed
        )
    a, b = cell_interval(rows, metric, seed=seed), cell_interval(base, metric, seed=seed)
    if how == "delta" and a.method == b.method == "wilson":
        return unpaired_rate_interval(a.estimate * a.n, a.n, b.estimate * b.n, b.n)
    with np.errstate(divide="ignore", invalid="ignore"):
        est = a.estimate / b.estimate if how == "ratio" else a.estimate - b.estimate
    return Paired(float(est), math.nan, math.nan, min(a.n, b.n), 0, "none", 1.0 if how == "ratio" else 0.0)


def paired_differences(
    df: pd.DataFrame,
    task: str,
    metric: str,
    baseline: str = "plain",
    *,
    rows: str | Sequence[str] = "method",
    cols: str | Sequence[str] | None = "length",
    how: str | None = None,
    seed: int = 0,
    **where: Any,
) -> pd.DataFrame:
    """Long form of :func:`compare`: one row per (rows x cols) cell with ``estimate`` (difference or ratio to
    the baseline), ``lo``/``hi`` (95%), ``n`` (pairs), ``informative`` (pairs that differ), ``interval``
    (how it was computed), ``p`` (the exact McNemar p-value for paired 0/1 outcomes, else NaN),
    ``significant`` (interval excludes 0 — 1 for ratios — with at least 6 differing pairs, and McNemar's
    p < 0.05 where it applies), ``how`` and ``baseline``. The baseline's own rows carry the null value and
    ``interval="baseline"``.
    """
    rows_l, cols_l = _as_list(rows), _as_list(cols)
    if "method" not in rows_l:
        raise ResultsError("compare needs 'method' in rows — call compare(..., rows='method')")
    sub = select(df, task, metric, units=True, **where)
    keys = _auto_rows(sub, rows_l, cols_l) + cols_l
    unit_values = sub.loc[is_unit(sub), "value"].dropna().to_numpy(float)
    how = how or (
        "ratio" if metric_kind(metric, unit_values if len(unit_values) else None) == "log" else "delta"
    )
    if how not in ("ratio", "delta"):
        raise ResultsError(f"unknown comparison {how!r} — use how='ratio' or how='delta'")
    groups = {k if isinstance(k, tuple) else (k,): g for k, g in sub.groupby(keys, dropna=False, sort=True)}
    frame = pd.DataFrame(list(groups), columns=keys)
    methods = list(dict.fromkeys(frame["method"]))
    if baseline not in methods:
        raise ResultsError(
            f"baseline method {baseline!r} not in the {task}/{metric} rows — available methods: "
            f"{', '.join(map(str, methods))}"
        )
    is_base = (frame["method"] == baseline).to_numpy()
    # Match each row to the baseline row with the same model/corpus/length...; factor and options only count
    # when the baseline itself ran with several (the usual baseline is "plain" at factor 1).
    match = [k for k in keys if k not in ("method", "factor", "options")]
    match += [k for k in ("factor", "options") if k in keys and frame.loc[is_base, k].nunique() > 1]
    lookup: dict[tuple, tuple] = {}
    for key in (k for k, b in zip(groups, is_base) if b):
        mk = tuple(str(key[keys.index(c)]) for c in match)
        if mk in lookup:
            raise ResultsError(
                f"baseline {baseline!r} has several rows for {dict(zip(match, mk))} — narrow it "
                f"with a filter such as factor=... or options=..."
            )
        lookup[mk] = key
    null = 1.0 if how == "ratio" else 0.0
    out = []
    for key, g in groups.items():
        base_key = lookup.get(tuple(str(key[keys.index(c)]) for c in match))
        if base_key == key:
            res = Paired(null, math.nan, math.nan, 0, 0, "baseline", null)
        elif base_key is None:
            res = Paired(math.nan, math.nan, math.nan, 0, 0, "no baseline cell", null)
        else:
            res = _pair(g, groups[base_key], metric, how, seed)
        out.append(
            {
                **dict(zip(keys, key)),
                "estimate": res.estimate,
                "lo": res.lo,
                "hi": res.hi,
                "n": res.n,
                "informative": res.informative,
                "interval": res.method,
                "p": res.p,
                "significant": res.significant,
                "how": how,
                "baseline": baseline,
            }
        )
    return pd.DataFrame(out)


def compare(
    df: pd.DataFrame,
    task: str,
    metric: str,
    baseline: str = "plain",
    *,
    rows: str | Sequence[str] = "method",
    cols: str | Sequence[str] | None = "length",
    how: str | None = None,
    with_ci: bool = False,
    seed: int = 0,
    digits: int | None = None,
    **where: Any,
) -> pd.DataFrame:
    """Each method relative to the ``baseline`` method on the same documents / prompts, per ``cols``.

    ``how``: "ratio" (value / baseline; the default for perplexities) or "delta" (value - baseline; the
    default otherwise). Numeric pivot by default (baseline rows 1.0 / 0). ``with_ci=True``: strings
    "estimate [lo, hi] n=pairs" over the shared units (a paired t on per-document log ratios for
    perplexities, from 3 pairs; Newcombe's paired score interval for 0/1 outcomes), ending in " *" when the
    interval excludes the null (0, or 1 for ratios), at least 6 pairs differ and, for 0/1 outcomes, the exact
    McNemar test gives p < 0.05; rates known only as totals get Newcombe's unpaired interval. See
    :func:`paired_differences` for the long form.
    """
    long = paired_differences(df, task, metric, baseline, rows=rows, cols=cols, how=how, seed=seed, **where)
    cols_l = _as_list(cols)
    keys = [
        c
        for c in long.columns
        if c
        not in ("estimate", "lo", "hi", "n", "informative", "interval", "p", "significant", "how", "baseline")
    ]
    rows_l = [k for k in keys if k not in cols_l]
    if with_ci:
        long["cell"] = [
            "baseline"
            if r.interval == "baseline"
            else fmt_interval(r.estimate, r.lo, r.hi, r.n if r.n else None, digits)
            + (f" {SIGNIFICANT_MARK}" if r.significant else "")
            for r in long.itertuples()
        ]
        value = "cell"
    else:
        value = "estimate"
    if cols_l:
        t = long.set_index(keys)[value].unstack(cols_l).sort_index(axis=1)
    else:
        t = long.set_index(rows_l)[[value]].rename(columns={value: metric})
    t = t.reindex(_order_methods(t.index, first=baseline))
    t.columns.name = cols_l[0] if len(cols_l) == 1 else t.columns.name
    return t
