"""``compare``: each setting against a baseline method on the same documents / prompts, with a paired
interval (paired t over documents; Newcombe's paired score interval for 0/1 outcomes; over clusters, with an
exact sign-flip test, where rows share an independent unit) and a mark where the difference is significant
(see :class:`results.stats.Paired`). A metric is treated as its declaration says (results/meaning.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from .meaning import Metric
from .stats import (
    MIN_INFORMATIVE_PAIRS,
    PAIRED_T,
    Paired,
    paired_clusters,
    paired_interval,
    unpaired_rate_interval,
)
from .store import ResultsError
from .strata import STRATUM, has_strata, reconcile, with_distance
from .tables import (
    _as_list,
    _auto_rows,
    _order_methods,
    cell_interval,
    copy_frame,
    fmt_interval,
    fmt_number,
    is_unit,
    meaning_for,
    remember,
    select,
    unit_key,
    unit_labels,
)

SIGNIFICANT_MARK = "*"
# a pooled difference with a stratum (needle distance) significantly the other way: no pooled mark
MIXED_MARK = "±"
# the long form's columns about power and strata (results/power.py, results/strata.py)
POWER_COLUMNS = ("detectable", "cannot", "se", "sd", "against", "mixed")
# the long form's columns taken from `Paired` under their own names, before ``interval`` (its ``method``)
_PAIRED_COLUMNS = ("estimate", "lo", "hi", "n", "rows", "informative")


def power_text(row: Any, digits: int | None = None) -> str:
    """What an unmarked comparison could have marked, for its cell: " (80% power at ±0.52)" (a ratio:
    " (80% power at ×/÷1.11)"), " (p cannot reach 0.05 at n=5)" where the exact test can not, " (no test)"
    where there is none, " (no possible difference has 80% power at n=6)" where even the largest would be
    marked less often; "" for the baseline."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    interval = get("interval")
    if interval in ("baseline", None):
        return ""
    detectable, cannot = get("detectable", math.nan), get("cannot", "") or ""
    if detectable == math.inf:
        return f" (no possible difference has 80% power at n={int(get('n'))})"
    if detectable is not None and not pd.isna(detectable):
        text = fmt_number(detectable) if digits is None else f"{detectable:.{digits}f}"
        return f" (80% power at {'×/÷' if get('how') == 'ratio' else '±'}{text})"
    if cannot:
        n = get("n")
        if interval == PAIRED_T:
            return f" (no mark possible at n={int(n)}: needs {MIN_INFORMATIVE_PAIRS})"
        return f" (p cannot reach 0.05 at n={int(n)})"
    if interval in ("none", "no baseline cell", "newcombe (unpaired)"):
        return " (no test)" if interval != "newcombe (unpaired)" else ""
    return ""


def _units(rows: pd.DataFrame) -> pd.DataFrame:
    u = rows[is_unit(rows) & rows["value"].notna()]
    u = u.assign(_key=unit_key(u)).drop_duplicates("_key", keep="last")
    return u.assign(_unit=unit_labels(u, u["_key"]))


def _stat_kind(meaning: Metric, values: np.ndarray) -> str:
    """The declared statistics' kind; a declared rate whose per-unit values are not all 0/1 (a plugin's
    per-unit fraction) is paired as a mean: McNemar's test counts 0/1 outcomes only."""
    kind = meaning.stat_kind
    return "mean" if kind == "rate" and not np.isin(values, (0.0, 1.0)).all() else kind


def _weights(kind: str, *counts: pd.Series) -> list[np.ndarray | None]:
    """Each side's per-unit weights (``n``: the tokens behind a row) for a mean; none for 0/1 outcomes."""
    return [None if kind == "rate" else n.fillna(1).to_numpy(float) for n in counts]


def paired_cells(
    rows: pd.DataFrame,
    base: pd.DataFrame,
    metric: str,
    how: str,
    *,
    seed: int = 0,
    meaning: Metric | None = None,
) -> Paired:
    """One setting's cell against another's (the baseline's) on the same units, as ``meaning`` says (default:
    the rows' declaration). Both with per-unit rows: paired over the shared units — by cluster id where rows
    share one (`results.stats.paired_clusters`: n = clusters, rows = questions), else row by row; only totals
    of a rate: Newcombe's unpaired interval; else the bare contrast of the estimates."""
    meaning = meaning or meaning_for(pd.concat([rows, base]), metric=metric)
    return _paired_cells(rows, base, _units(rows), _units(base), metric, how, seed, meaning)


def _paired_cells(
    rows: pd.DataFrame,
    base: pd.DataFrame,
    ua: pd.DataFrame,
    ub: pd.DataFrame,
    metric: str,
    how: str,
    seed: int,
    meaning: Metric,
) -> Paired:
    """`paired_cells` with the unit rows of both sides (`_units`) given: a baseline's serve every setting."""
    unit = meaning.independent_unit
    if len(ua) and len(ub):
        va, vb = ua["value"].to_numpy(float), ub["value"].to_numpy(float)
        kind = _stat_kind(meaning, np.concatenate([va, vb]))
        if ua["_unit"].duplicated().any() or ub["_unit"].duplicated().any():
            la, lb = ua["_unit"].to_numpy(object), ub["_unit"].to_numpy(object)
            weights = _weights(kind, ua["n"], ub["n"])
            return paired_clusters(kind, va, la, vb, lb, *weights, how=how, seed=seed, unit=unit)
        m = ua.merge(ub[["_key", "value", "n"]], on="_key", suffixes=("", "_base")).sort_values("_key")
        va, vb = m["value"].to_numpy(float), m["value_base"].to_numpy(float)
        return paired_interval(
            kind, va, vb, *_weights(kind, m["n"], m["n_base"]), how=how, seed=seed, unit=unit
        )
    a = cell_interval(rows, metric, seed=seed, meaning=meaning)
    b = cell_interval(base, metric, seed=seed, meaning=meaning)
    if how == "delta" and a.method == b.method == "wilson":
        return unpaired_rate_interval(a.estimate * a.n, a.n, b.estimate * b.n, b.n)
    with np.errstate(divide="ignore", invalid="ignore"):
        est = a.estimate / b.estimate if how == "ratio" else a.estimate - b.estimate
    null = 1.0 if how == "ratio" else 0.0
    return Paired(float(est), math.nan, math.nan, min(a.n, b.n), 0, "none", null, unit=unit)


def default_how(meaning: Metric) -> str:
    """Perplexities compare as ratios (a method's perplexity relative to the baseline's), all else as
    differences."""
    return "ratio" if meaning.kind == "perplexity" else "delta"


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
    the baseline), ``lo``/``hi`` (95%), ``n`` (pairs of independent units: clusters where rows share one),
    ``rows`` (paired rows behind them), ``unit`` (the declared independent unit), ``informative`` (pairs that
    differ), ``interval`` (how it was computed), ``p`` (the exact test's p-value: McNemar for paired 0/1
    outcomes, the sign-flip test over clusters; else NaN), ``significant`` (interval excludes 0 — 1 for
    ratios — with at least 6 differing pairs, and the exact test's p < 0.05 where there is one), ``how`` and
    ``baseline``. The baseline's own rows carry the null value and ``interval="baseline"``.

    Power (results/power.py): ``detectable`` (the true difference the test marks with 80% probability at this
    n and observed spread; for a ratio a factor >= 1; inf beyond any possible difference of two rates),
    ``cannot`` (why nothing could be marked at all, e.g. fewer than 6 clusters), ``se`` and ``sd`` (the
    contrasts' standard error and spread). Where the rows sit at several needle positions (``depth``), each
    is compared too (:func:`stratum_differences`): ``against`` counts the positions significantly on the
    other side of the null, and ``mixed`` (any such) withdraws the pooled ``significant``.
    """
    args = (task, metric, baseline, rows, cols, how, seed, where)
    return remember("paired_differences", df, args, lambda: _paired_differences(df, *args), copy_frame)


def _paired_differences(
    df: pd.DataFrame,
    task: str,
    metric: str,
    baseline: str,
    rows: str | Sequence[str],
    cols: str | Sequence[str] | None,
    how: str | None,
    seed: int,
    where: dict[str, Any],
) -> pd.DataFrame:
    rows_l, cols_l = _as_list(rows), _as_list(cols)
    if "method" not in rows_l:
        raise ResultsError("compare needs 'method' in rows — call compare(..., rows='method')")
    sub = select(df, task, metric, units=True, **where)
    keys = _auto_rows(sub, rows_l, cols_l) + cols_l
    meaning = meaning_for(sub, task, metric)
    how = how or default_how(meaning)
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
    base_units: dict[tuple, pd.DataFrame] = {}  # the baseline's unit rows, once per baseline cell
    for key, g in groups.items():
        base_key = lookup.get(tuple(str(key[keys.index(c)]) for c in match))
        if base_key == key:
            res = Paired(null, math.nan, math.nan, 0, 0, "baseline", null)
        elif base_key is None:
            res = Paired(math.nan, math.nan, math.nan, 0, 0, "no baseline cell", null)
        else:
            if base_key not in base_units:
                base_units[base_key] = _units(groups[base_key])
            base = groups[base_key]
            res = _paired_cells(g, base, _units(g), base_units[base_key], metric, how, seed, meaning)
        out.append(
            {
                **dict(zip(keys, key)),
                **{c: getattr(res, c) for c in _PAIRED_COLUMNS},
                "interval": res.method,
                "p": res.p,
                "significant": res.significant,
                "how": how,
                "baseline": baseline,
                **{c: getattr(res, c) for c in ("detectable", "cannot", "se", "sd")},
            }
        )
    frame = pd.DataFrame(out)
    if has_strata(sub[is_unit(sub)], keys):  # a pooled mark stands only where no stratum is the other way
        by = paired_differences(
            df, task, metric, baseline, rows=[*rows_l, STRATUM], cols=cols, how=how, seed=seed, **where
        )
        frame = reconcile(frame, by, keys)
    frame.attrs["unit"] = meaning.independent_unit  # the same for every row: stated once
    return frame


def stratum_differences(
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
) -> pd.DataFrame | None:
    """:func:`paired_differences` per stratum (needle position: ``depth``; results/strata.py), one row per
    setting x length x depth with ``distance`` (the stratum's median distance from the question, tokens);
    None when no cell's rows sit at several depths."""
    rows_l = _as_list(rows)
    sub = select(df, task, metric, units=True, **where)
    keys = _auto_rows(sub, rows_l, _as_list(cols)) + _as_list(cols)
    units = sub[is_unit(sub)]
    if not has_strata(units, keys):
        return None
    by = paired_differences(
        df, task, metric, baseline, rows=[*rows_l, STRATUM], cols=cols, how=how, seed=seed, **where
    )
    return with_distance(by, units)


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
    perplexities, from 3 pairs; Newcombe's paired score interval for 0/1 outcomes; where rows share a cluster,
    a t over the clusters' contrasts and "n=clusters (rows rows)"), ending in " *" when the interval excludes
    the null (0, or 1 for ratios), at least 6 pairs (clusters) differ and the exact test where there is one
    (McNemar for 0/1 outcomes, the sign-flip test over clusters) gives p < 0.05; rates known only as totals
    get Newcombe's unpaired interval. See
    :func:`paired_differences` for the long form.
    """
    long = paired_differences(df, task, metric, baseline, rows=rows, cols=cols, how=how, seed=seed, **where)
    cols_l = _as_list(cols)
    stats = (*_PAIRED_COLUMNS, "unit", "interval", "p", "significant", "how", "baseline", *POWER_COLUMNS)
    keys = [c for c in long.columns if c not in stats]
    rows_l = [k for k in keys if k not in cols_l]
    if with_ci:
        long["cell"] = [
            "baseline"
            if r.interval == "baseline"
            else fmt_interval(r.estimate, r.lo, r.hi, r.n if r.n else None, digits, r.rows)
            + (f" {SIGNIFICANT_MARK}" if r.significant else "")
            + (f" {MIXED_MARK}" if getattr(r, "mixed", False) else "")
            + ("" if r.significant or getattr(r, "mixed", False) else power_text(r._asdict(), digits))
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
