"""What the report computes once and every section reads (``Evidence``: the quantities, paired differences to
the baseline, per-distance differences and reach verdicts), and the headline drawn from it: at most
``HEADLINE_LINES`` lines, each with its n in independent units and its p (results/reporting.py writes the
report)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from .comparisons import paired_differences, stratum_differences
from .overview import (
    Quantities,
    Quantity,
    distance_text,
    quantities,
    reach_column,
    reaches,
    setting_label,
)
from .ranges import excluded_note, within_range
from .reach_rules import RULES, caption
from .stats import (
    MIN_INFORMATIVE_PAIRS,
    PAIRED_T,
    t975,
)
from .store import ResultsError
from .strata_report import TESTS, detectable_note, power_phrase, where_line
from .tables import (
    IDENTITY,
    fmt_interval,
    is_unit,
    select,
)

HEADLINE_LINES = 5
BASELINE = "plain"


class Evidence:
    """The quantities, paired differences to the baseline and reach verdicts of the run."""

    def __init__(self, ok: pd.DataFrame, tc: dict, seed: int, threshold: float, tolerance: float):
        self.excluded = excluded_note(ok)  # values outside their declared range: counted, then left out
        ok = within_range(ok)
        self.ok, self.tc, self.seed = ok, tc, seed
        self.threshold, self.tolerance = threshold, tolerance
        self.qs: Quantities = quantities(ok)
        self.diffs: dict[Quantity, pd.DataFrame] = {}
        self.strata: dict[Quantity, pd.DataFrame] = {}  # per needle distance, where rows sit at several
        for q in self.qs.values:
            try:
                self.diffs[q] = paired_differences(ok, q.task, q.metric, BASELINE, seed=seed)
                by = stratum_differences(ok, q.task, q.metric, BASELINE, seed=seed)
            except ResultsError:  # no baseline rows for this task: no differences
                continue
            if by is not None:
                self.strata[q] = by
        # a method's factor where one method ran at one factor (comparisons by method alone carry none)
        one = ok.groupby("method")["factor"].nunique(dropna=False) == 1 if len(ok) else pd.Series(dtype=bool)
        self.factors = {str(m): ok.loc[ok["method"] == m, "factor"].iloc[0] for m in one[one].index}
        self.reach = reaches(ok, self.qs, tc, threshold, tolerance, BASELINE, seed)


def _p_value(row: pd.Series) -> float:
    """The test's p: McNemar's where recorded; for a paired t, two-sided from its interval (t on n - 1
    degrees of freedom; on the log scale for a ratio)."""
    p = row.get("p")
    if p is not None and not pd.isna(p):
        return float(p)
    if row.get("interval") != PAIRED_T:
        return math.nan
    n, est, lo, hi = row.get("n"), row["estimate"], row["lo"], row["hi"]
    if pd.isna(n) or int(n) < 2 or not (math.isfinite(lo) and math.isfinite(hi)):
        return math.nan
    ratio = row.get("how") == "ratio"
    if ratio and not (lo > 0 and hi > 0 and est > 0):
        return math.nan
    centre, half = (math.log(est), math.log(hi / lo) / 2) if ratio else (est, (hi - lo) / 2)
    if half <= 0:
        return math.nan
    from scipy.stats import t as student

    se = half / t975(int(n) - 1)
    return float(2 * student.sf(abs(centre) / se, int(n) - 1))


def _fmt_p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}" if p < 0.1 else f"p = {p:.2f}"


def _units_text(n: Any, unit: str) -> str:
    """n in independent units: "6 trials", "1 haystack"."""
    n = int(n)
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _setting_rows(ok: pd.DataFrame, q: Quantity, row: pd.Series) -> pd.DataFrame:
    """The unit rows of the cell a paired-difference row describes."""
    rows = select(ok, q.task, q.metric, units=True)
    for col in [*IDENTITY, "length"]:
        if col in row.index and col in rows.columns and not pd.isna(row[col]):
            rows = rows[rows[col].astype(str) == str(row[col])]
    return rows[is_unit(rows)]


def _setting_name(ok: pd.DataFrame, q: Quantity, row: pd.Series) -> str:
    """ "yarn ×2": the factor from the row, else from the cell's rows (a comparison by method alone)."""
    factor = row.get("factor")
    if factor is None or pd.isna(factor):
        rows = _setting_rows(ok, q, row)
        factor = rows["factor"].iloc[0] if len(rows) else None
    return setting_label(row["method"], factor)


def _count(rows: pd.DataFrame) -> str:
    """ "k/N": the rows with outcome 1 of the cell's N rows."""
    return f"{int(rows['value'].sum())}/{len(rows)}"


def _difference_line(ev: Evidence, q: Quantity) -> str | None:
    """The longest length where settings differ significantly from the baseline, in one sentence."""
    d = ev.diffs.get(q)
    if d is None or d.empty:
        return None
    sig = d[d["significant"] & (d["method"] != BASELINE)]
    if sig.empty:
        return None
    L = sig["length"].max()
    at = sig[sig["length"] == L]
    null = at["how"].iloc[0] == "ratio"
    better = (at["estimate"] < (1.0 if null else 0.0)) == (q.meaning.direction == "lower")
    if q.meaning.direction is None:
        verb, at_side = "differ from", at
    else:
        side = at[better] if better.any() else at[~better]
        verb, at_side = ("beat" if better.any() else "trail"), side
    names = [_setting_name(ev.ok, q, r) for _, r in at_side.iterrows()]
    who = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    first = at_side.iloc[0]
    base_row = first.copy()
    base_row["method"], base_row["factor"] = BASELINE, pd.NA
    dist = distance_text(_setting_rows(ev.ok, q, first))
    where = f"at {int(L)} tokens" + (f" with the {dist}" if dist else "")
    counts = [_setting_rows(ev.ok, q, r) for _, r in at_side.iterrows()]
    rows = first.get("rows")
    # rows share independent units (questions on a haystack): n counts the units, never the rows
    clustered = rows is not None and not pd.isna(rows) and int(rows) > int(first["n"])
    rows_note = ""
    if q.kind == "rate" and all(len(c) for c in counts):  # 0/1 outcomes per unit: k/N on each side
        base = _setting_rows(ev.ok, q, base_row.drop(labels=["factor", "options"], errors="ignore"))
        values = " and ".join(_count(c) for c in counts) + f" vs {_count(base[base['method'] == BASELINE])}"
        values += " rows" if clustered else ""  # then k/N counts rows, not the units n counts
    else:
        rows_note = f"; {int(rows)} rows on them" if clustered else ""
        what = "ratio" if null else "difference"
        values = "; ".join(
            f"{what} {fmt_interval(r['estimate'], r['lo'], r['hi'])}" for _, r in at_side.head(2).iterrows()
        )
    ps = [p for p in (_p_value(r) for _, r in at_side.iterrows()) if math.isfinite(p)]
    test = TESTS.get(first["interval"], first["interval"])
    if ps:
        p_text = f", {test} " + _fmt_p(max(ps)).replace("=", "≤" if len(ps) > 1 else "=")
    else:
        p_text = f", {first['interval']} interval excludes {1 if null else 0}"
    n = _units_text(first["n"], q.meaning.independent_unit)
    power = power_phrase(at_side)
    p_text += f", {power}" if power else ""
    return f"{who} {verb} {BASELINE} on {q.task} {q.metric} {where}: {values} (n = {n}{p_text}{rows_note})."


def _reach_line(ev: Evidence, q: Quantity, rule: str) -> str | None:
    e = ev.reach.get((q, rule))
    if not isinstance(e, pd.DataFrame) or e["effective_length"].notna().sum() == 0:
        return None
    claims = [
        f"{setting_label(r['method'], r['factor'])} {r['claim']}"
        for _, r in e.iterrows()
        if r["claim"] not in ("–",) and not str(r["claim"]).startswith("not established")
    ]
    est = e[e["effective_length"].notna()].iloc[0]
    n = (
        ""
        if pd.isna(est["at_n"])
        else f" (n = {_units_text(est['at_n'], q.meaning.independent_unit)} per length)"
    )
    bar = caption(RULES[(q.kind, rule)], ev.threshold, ev.tolerance, BASELINE, short=True)
    return f"{reach_column(q, rule)} ({bar}): {', '.join(claims)}{n}."


def headline(ev: Evidence) -> list[str]:
    """At most ``HEADLINE_LINES`` lines: the significant differences first, then the established reaches;
    or one line saying nothing is, and what the run would need."""
    diffs = [line for q in ev.qs.values if (line := _stratified_line(ev, q) or _difference_line(ev, q))]
    reaches = [line for (q, rule) in ev.reach if (line := _reach_line(ev, q, rule))]
    lines = diffs[:3] + reaches[:2]  # the differences first; the reaches fill in
    lines = (lines + diffs[3:] + reaches[2:])[:HEADLINE_LINES]
    if lines:
        return [f"- {line}" for line in lines]
    most = max((int(d["informative"].max()) for d in ev.diffs.values() if len(d)), default=0)
    could = detectable_note(ev.qs.values, ev.diffs)
    return [
        (
            f"Nothing is significant and no reach is established: a paired difference needs at least "
            f"{MIN_INFORMATIVE_PAIRS} independent units that differ between the settings (this run has at "
            f"most {most}); more documents, trials or haystacks per length would decide it."
            + (f" {could}" if could else "")
        )
    ]


def _stratified_line(ev: Evidence, q: Quantity) -> str | None:
    """Where rows sit at several needle distances and the pooled difference may not stand for them (a
    distance significantly the other way, or only single distances significant): where each setting wins and
    loses (results/strata.py). None: the pooled line speaks for every distance."""
    by, pooled = ev.strata.get(q), ev.diffs.get(q)
    if by is None or pooled is None:
        return None
    mixed = pooled["mixed"].astype(bool).any() if "mixed" in pooled.columns else False
    if not mixed and pooled["significant"].astype(bool).any():
        return None
    return where_line(q, pooled, by, BASELINE, ev.factors)
