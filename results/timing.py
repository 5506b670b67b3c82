"""The report's time section: where a sweep's time went, per task and setting (each group of cells), from the
cells' recorded wall times (`cell_seconds`, start to finish; `load_seconds`, the model loads outside them).
The rows' own `seconds` are never summed here: they are each row's part (a retrieval question's
continuation), so a haystack's prefill or most of a perplexity forward is in none of them."""

from __future__ import annotations

import pandas as pd

from .overview import setting_label, short_model
from .reach import THEORY_TASK

GROUP = ["model", "task", "method", "factor", "options"]


def cell_times(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell (the latest of each run's cell; theory rows left out) with its group's keys, status,
    `cell_seconds` and `load_seconds` (NaN where the cell predates cell timing)."""
    rows = df[(df["task"] != THEORY_TASK) & df["cell"].notna()]
    return rows.drop_duplicates(["run", "cell"], keep="last")[
        [*GROUP, "status", "cell_seconds", "load_seconds"]
    ].reset_index(drop=True)


def time_table(cells: pd.DataFrame) -> pd.DataFrame:
    """Seconds per task and setting: cells, failed cells, their summed wall, the mean per cell and the share
    of every timed cell's wall; ordered by time, longest first. Untimed cells (older rows) are counted
    apart."""
    timed = cells[cells["cell_seconds"].notna()]
    total = float(timed["cell_seconds"].sum())
    keys = cells[GROUP].astype(str)  # options are JSON text; NaN factors group as "nan", shown back as given
    out = []
    for index in keys.groupby(GROUP, sort=False).groups.values():
        group = cells.loc[index]
        seconds = group["cell_seconds"].dropna()
        first = group.iloc[0]
        out.append(
            {
                "model": short_model(first["model"]),
                "task": first["task"],
                "setting": setting_label(first["method"], first["factor"]),
                "options": first["options"],
                "cells": len(group),
                "failed": int((group["status"] == "error").sum()),
                "untimed": int(group["cell_seconds"].isna().sum()),
                "seconds": float(seconds.sum()),
                "per cell": float(seconds.mean()) if len(seconds) else float("nan"),
                "share": float(seconds.sum()) / total if total > 0 else float("nan"),
            }
        )
    table = pd.DataFrame(out)
    return table.sort_values("seconds", ascending=False, kind="stable").reset_index(drop=True)


def time_section(report, df: pd.DataFrame) -> None:
    """`## Time` in report.md (and tables/time.*): per task and setting, the cells' recorded wall; with the
    model loading apart. Runs from before cell timing get one line saying so (never the rows' seconds)."""
    cells = cell_times(df)
    if cells.empty:
        return
    report.md += ["## Time", ""]
    timed = cells["cell_seconds"].notna()
    if not timed.any():
        report.md += [
            (
                f"No cell of this run records its wall time (all {len(cells)} cells predate cell timing; the "
                "rows' own seconds leave out most of each cell's work, so they are not summed here)."
            ),
            "",
        ]
        return
    table = time_table(cells)
    load = float(cells["load_seconds"].fillna(0.0).sum())
    report.md += [
        f"The cells' recorded wall: {cells['cell_seconds'].sum():.1f} s over {int(timed.sum())} cells, model "
        f"loading {load:.1f} s besides"
        + (f"; {int((~timed).sum())} cells predate cell timing (not counted)" if not timed.all() else "")
        + ". Each cell's time runs from its start to its rows (the setting's patch and theory rows apart).",
        "",
    ]
    shown = table.copy()
    drop = [c for c in ("failed", "untimed") if not shown[c].any()]
    if shown["model"].nunique() == 1:
        drop.append("model")
    if not (shown.groupby(["model", "task", "setting"])["options"].nunique() > 1).any():
        drop.append("options")  # one patch per setting: its options add nothing here
    shown = shown.drop(columns=drop)
    shown["seconds"] = shown["seconds"].map(lambda v: f"{v:.1f}")
    shown["per cell"] = shown["per cell"].map(lambda v: "–" if pd.isna(v) else f"{v:.1f}")
    shown["share"] = shown["share"].map(lambda v: "–" if pd.isna(v) else f"{100 * v:.0f}%")
    index = [c for c in ("model", "task", "setting", "options") if c in shown.columns]
    report.add_table(
        "time",
        "Time per task and setting (the cells' recorded wall, seconds; longest first)",
        shown.set_index(index),
        table.set_index(["model", "task", "setting", "options"]),
    )
