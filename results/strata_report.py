"""The report's words and table for stratified comparisons (results/strata.py): the headline line that says
where each setting wins and loses by the needle's distance, the per-distance table, and the power a claim
rests on (results/power.py)."""

from __future__ import annotations

import math

import pandas as pd

from .comparisons import MIXED_MARK, SIGNIFICANT_MARK, power_text
from .overview import Quantity, setting_label
from .stats import PAIRED_CLUSTERS, PAIRED_RATES, PAIRED_T, paired_power
from .strata import STRATUM
from .tables import fmt_interval, fmt_number

TESTS = {PAIRED_RATES: "McNemar", PAIRED_T: "paired t", PAIRED_CLUSTERS: "sign-flip"}


def power_phrase(rows: pd.DataFrame, short: bool = False) -> str:
    """ "power 0.91–0.97 at these sizes": the bounds of the tests' power for true differences the size of
    the claimed ones (the smallest lower and upper bound over ``rows``); "" where none is computable.
    ``short``: "power 0.91–0.97"."""
    bounds = [paired_power(r) for _, r in rows.iterrows()]
    bounds = [(lo, hi) for lo, hi in bounds if math.isfinite(lo) and math.isfinite(hi)]
    if not bounds:
        return ""
    lo, hi = min(b[0] for b in bounds), min(b[1] for b in bounds)
    size = "" if short else " at this size" if len(rows) == 1 else " at these sizes"
    if lo > 0.99:
        return f"power > 0.99{size}"
    if hi - lo < 0.005:
        return f"power {hi:.2f}{size}"
    if lo <= 0.0:  # an upper bound alone (McNemar): worth saying only where it is short of 1
        return f"power ≤ {hi:.2f}{size}" if hi < 0.995 else ""
    return f"power {lo:.2f}–{hi:.2f}{size}"


def positions(by: pd.DataFrame, long: bool = False) -> str:
    """What the strata are called: "distance" ("distance from the question") where the rows record one,
    else "depth"."""
    if "distance" in by.columns and by["distance"].notna().any():
        return "distance from the question" if long else "distance"
    return "depth"


def stratum_name(row: pd.Series) -> str:
    """ "~7796 tokens" (the stratum's median needle distance), or "depth 0.25" where none is recorded."""
    distance = row.get("distance")
    if distance is not None and not pd.isna(distance):
        return f"~{round(float(distance))} tokens"
    return f"depth {float(row[STRATUM]):g}"


def _setting(row: pd.Series, factors: dict) -> str:
    factor = row.get("factor")
    if factor is None or pd.isna(factor):
        factor = factors.get(str(row["method"]))
    return setting_label(row["method"], factor)


def where_line(
    q: Quantity, pooled: pd.DataFrame, by: pd.DataFrame, baseline: str, factors: dict
) -> str | None:
    """The headline sentence for a stratified quantity at the longest length where any stratum differs
    significantly from the baseline: per setting, the distances where it wins and where it loses (estimate
    and interval each), the tests' p and power; the pooled difference only named as withheld where the strata
    disagree. None when no stratum is significant."""
    sig = by[by["significant"].astype(bool) & (by["method"] != baseline)]
    if sig.empty or "length" not in sig.columns:
        return None
    L = sig["length"].max()
    at = sig[sig["length"] == L]
    ratio = at["how"].iloc[0] == "ratio"
    null = 1.0 if ratio else 0.0
    higher = q.meaning.direction != "lower"
    parts = []
    for _, group in at.groupby(["method", "factor"] if "factor" in at.columns else ["method"], sort=False):
        first = group.iloc[0]
        wins = group[(group["estimate"] > null) == higher] if q.meaning.direction else group
        losses = group.drop(wins.index) if q.meaning.direction else group.iloc[0:0]
        said = []
        for verb, side in (("beats", wins), ("trails", losses)):
            if side.empty:
                continue
            if q.meaning.direction is None:
                verb = "differs from"
            values = ", ".join(
                f"{stratum_name(r)}: {fmt_interval(r['estimate'], r['lo'], r['hi'])}"
                + (f" ({power})" if (power := power_phrase(side.loc[[i]], short=True)) else "")
                for i, r in side.sort_values("distance" if "distance" in side else STRATUM).iterrows()
            )
            said.append(f"{verb} {baseline} at {values}")
        parts.append(f"{_setting(first, factors)} " + " and ".join(said))
    ps = [float(p) for p in at["p"] if not pd.isna(p)]
    test = TESTS.get(at["interval"].iloc[0], at["interval"].iloc[0])
    p_text = f"{test} p ≤ {max(ps):.3f}" if ps else f"{at['interval'].iloc[0]} interval"
    unit = q.meaning.independent_unit
    ns = sorted({int(n) for n in at["n"]})
    n_text = f"n = {'–'.join(map(str, ns))} {unit}{'s' if ns[-1] != 1 else ''} per {positions(by)}"
    mixed = pooled[(pooled["length"] == L) & pooled.get("mixed", pd.Series(False, index=pooled.index))]
    pooled_text = f"; pooled over {positions(by)}s: no mark ({MIXED_MARK}), they disagree" * bool(len(mixed))
    what = "ratio" if ratio else "difference"
    return (
        f"{q.task} {q.metric} at {int(L)} tokens, by the needle's {positions(by, True)} ({what} to "
        f"{baseline} [95% interval], the test's power at that size): "
        + "; ".join(parts)
        + f" ({n_text}, {p_text}{pooled_text})."
    )


def per_distance_table(
    q: Quantity, by: pd.DataFrame, baseline: str, factors: dict
) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(display, numeric, caption) of the per-distance table: per setting, length and distance, the
    difference (ratio) to the baseline with its interval, n (independent units), the exact test's p, and the
    mark or what the test could have marked."""
    rows = by[by["method"] != baseline].copy()
    rows = rows.sort_values([c for c in ("method", "factor", "length", "distance", STRATUM) if c in rows])
    what = "ratio" if (rows["how"] == "ratio").any() else "difference"
    shown = pd.DataFrame(
        {
            "setting": [_setting(r, factors) for _, r in rows.iterrows()],
            "length": rows["length"].astype(int) if "length" in rows else "",
            positions(by): [stratum_name(r) for _, r in rows.iterrows()],
            f"{what} [95%]": [
                fmt_interval(r["estimate"], r["lo"], r["hi"])
                + (f" {SIGNIFICANT_MARK}" if r["significant"] else power_text(r))
                for _, r in rows.iterrows()
            ],
            "n": rows["n"].astype(int),
            "p": [fmt_number(p) if not pd.isna(p) else "–" for p in rows["p"]],
        }
    ).set_index(["setting", "length", positions(by)])
    unit = q.meaning.independent_unit
    caption = (
        f"{q.task}/{q.metric} by the needle's {positions(by, True)}: {what} to {baseline} on the same "
        f"{unit}s, per setting and {positions(by)} (a distance: the median of the position's questions); "
        f"n = {unit}s; p: the exact test's; {SIGNIFICANT_MARK} marked, else what the test could have marked"
    )
    numeric = rows.drop(columns=[c for c in ("cannot",) if c in rows.columns])
    return shown, numeric, caption


def detectable_note(quantities: list[Quantity], diffs: dict) -> str:
    """One sentence for a run where nothing is marked: per headline metric, at its longest length, the
    difference its test would mark with 80% power (or that nothing could be marked at that n)."""
    parts = []
    for q in quantities:
        d = diffs.get(q)
        if d is None or d.empty or "length" not in d.columns:
            continue
        d = d[~d["interval"].isin(["baseline", "no baseline cell"])]
        if d.empty:
            continue
        at = d[d["length"] == d["length"].max()]
        found = at["detectable"].dropna()
        n = int(at["n"].max())
        unit = f"{n} {q.meaning.independent_unit}{'s' if n != 1 else ''}"
        if len(found):
            lo, hi = float(found.min()), float(found.max())
            sign = "×/÷" if (at["how"] == "ratio").any() else "±"
            span = fmt_number(lo)
            span += "" if fmt_number(hi) == span else f"–{fmt_number(hi)}"
            parts.append(f"{q.task} {q.metric} {sign}{span} ({unit} at {int(at['length'].iloc[0])})")
        elif at["cannot"].astype(bool).any():
            parts.append(f"{q.task} {q.metric}: none at {unit} (the test cannot reach p < 0.05)")
    if not parts:
        return ""
    return "With 80% power this run's tests mark only differences of at least: " + "; ".join(parts) + "."
