"""Strata: where a cell's unit rows sit at several needle positions (``depth``; for retrieval each position
is a distance from the question, the rows' ``distance``), a pooled difference can hide opposite effects — a
method that finds the far needle and loses the nearer ones. Comparisons are then also made per stratum, and a
pooled mark stands only where no stratum is significantly the other way (:func:`reconcile`).

A stratum is one needle position (length x depth): its rows' exact distances differ by a few tokens between
haystacks, so it is named by their median distance (:func:`with_distance`), as plots/by_distance does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STRATUM = "depth"


def has_strata(units: pd.DataFrame, keys: list[str]) -> bool:
    """True when some (``keys``) cell's unit rows sit at more than one ``depth``."""
    if STRATUM in keys or STRATUM not in units.columns:
        return False
    rows = units[units[STRATUM].notna()]
    if rows.empty:
        return False
    present = [k for k in keys if k in rows.columns]
    counts = rows.groupby(present, dropna=False)[STRATUM].nunique() if present else rows[STRATUM].nunique()
    return bool(np.any(np.asarray(counts) > 1))


def _side(estimate: float, null: float) -> int:
    return 0 if not np.isfinite(estimate) or estimate == null else (1 if estimate > null else -1)


def reconcile(pooled: pd.DataFrame, by: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The pooled comparisons with ``against`` (the strata significantly on the other side of the null from
    the pooled estimate) and ``mixed`` (any such): a pooled mark is withdrawn where one is (the headline
    then says where each setting wins and loses)."""
    pooled = pooled.copy()
    by = by[by[STRATUM].notna()]
    against = []
    for _, row in pooled.iterrows():
        hit = by
        for k in keys:
            if k in by.columns and k in row.index:
                hit = hit[hit[k].astype(str) == str(row[k])]
        null = float(row["how"] == "ratio")
        side = _side(row["estimate"], null)
        sig = hit[hit["significant"].astype(bool)]
        against.append(int(sum(_side(e, null) not in (0, side) for e in sig["estimate"])))
    pooled["against"] = against
    pooled["mixed"] = pooled["against"] > 0
    pooled["significant"] = pooled["significant"].astype(bool) & ~pooled["mixed"]
    return pooled


def with_distance(by: pd.DataFrame, units: pd.DataFrame) -> pd.DataFrame:
    """Per-stratum comparisons with ``distance``: the median distance (tokens from the needle to the
    question) of the stratum's unit rows, where they record one (else NaN)."""
    by = by[by[STRATUM].notna()].copy()
    if "distance" not in units.columns or units["distance"].isna().all():
        by["distance"] = np.nan
        return by
    rows = units[units["distance"].notna() & units[STRATUM].notna()]
    if "length" not in by.columns:
        median = rows.groupby(STRATUM)["distance"].median()
        by["distance"] = [float(median.get(depth, np.nan)) for depth in by[STRATUM]]
        return by
    median = rows.groupby(["length", STRATUM])["distance"].median()
    by["distance"] = [
        float(median.get((length, depth), np.nan)) for length, depth in zip(by["length"], by[STRATUM])
    ]
    return by
