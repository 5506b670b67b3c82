"""Values outside their metric's declared range are no measurement: they are left out, and counted.

A task declares each metric's range (`Metric.lo` / `Metric.hi`, results/meaning.py: a rate in [0, 1], a
perplexity >= 1). A value outside it (a 0/1 rate of 1.5, a perplexity of 0.3) says the task or the records
are wrong, so no table, comparison, plot or reach reads it: `within_range` drops such rows where ok rows are
selected (`tables.select`, `overview.ok_rows`), and `excluded_note` gives the one line the report shows
with their count.
"""

from __future__ import annotations

import pandas as pd

from .meaning import declarations


def out_of_range_mask(df: pd.DataFrame) -> pd.Series:
    """True for each row whose value breaks its metric's declared range (missing values fit)."""
    bad = pd.Series(False, index=df.index)
    if not len(df) or not {"task", "metric", "value"} <= set(df.columns):
        return bad
    for (task, metric), meaning in declarations(df).items():
        if meaning.lo is None and meaning.hi is None:
            continue
        mine = (df["task"] == task) & (df["metric"] == metric) & df["value"].notna()
        values = pd.to_numeric(df.loc[mine, "value"], errors="coerce").astype(float)
        low = values < meaning.lo if meaning.lo is not None else False
        high = values > meaning.hi if meaning.hi is not None else False
        bad.loc[mine] = low | high
    return bad


def within_range(df: pd.DataFrame) -> pd.DataFrame:
    """`df` without the rows whose value breaks its metric's declared range."""
    bad = out_of_range_mask(df)
    return df[~bad] if bad.any() else df


def excluded_note(df: pd.DataFrame) -> str | None:
    """One line naming the values left out as out of range, with their count per metric (None: none)."""
    bad = df[out_of_range_mask(df)]
    if not len(bad):
        return None
    meant = declarations(bad)
    parts = []
    for (task, metric), g in bad.groupby(["task", "metric"], sort=True):
        m = meant[(task, metric)]
        lo = "-inf" if m.lo is None else f"{m.lo:g}"
        hi = "inf" if m.hi is None else f"{m.hi:g}"
        vals = ", ".join(f"{v:g}" for v in sorted(set(g["value"].astype(float)))[:3])
        parts.append(f"{task}/{metric} {len(g)} row{'s' if len(g) != 1 else ''} ({vals}; range [{lo}, {hi}])")
    return (
        f"Left out of every table, comparison and reach: {len(bad)} value{'s' if len(bad) != 1 else ''} "
        f"outside the metric's declared range — {'; '.join(parts)}; check the task that wrote them."
    )
