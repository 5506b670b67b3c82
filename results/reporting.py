"""``report``: one markdown report over run directories — what the run shows first, then the evidence.

Writes ``<out>/report.md``, ``<out>/tables/*.{md,csv,tex}`` and ``<out>/plots/*.png``. report.md opens with a
headline (at most ``HEADLINE_LINES`` lines, from the significant paired differences and the established
reaches, each with its n in independent units and its p), then the summary (informative columns only, one
footnote line for the rest), the paired differences, the reach rules the grid supports, theory, one section
per task with its tables and plots, the legend, and the failed cells. Every treatment comes from the metrics'
declarations (:mod:`results.meaning`), never from their names or values.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from ropebench.extend.owned_paths import OwnedDir, read_marker, safe_name

from .arguments import as_path, as_paths
from .comparisons import MIXED_MARK, compare, paired_differences, stratum_differences
from .frame import load
from .longppl_report import longppl_lines
from .meaning import declarations, undeclared_note
from .overview import (
    MAX_COLUMNS,
    Quantities,
    Quantity,
    distance_text,
    left_out,
    legend_lines,
    measured_tasks,
    metrics_of,
    quantities,
    reach_column,
    setting_label,
    short_model,
    summary,
)
from .plots import (
    plot_by_distance,
    plot_loss_by_position,
    plot_metric,
    plot_passkey,
    plot_perplexity,
)
from .ranges import excluded_note, within_range
from .reach import (
    DEFAULT_BAR,
    NOLIMA_FRACTION,
    THEORY_TASK,
    bar_text,
    check_rules,
    check_trained_context,
    effective_length,
    load_theory,
    recorded_contexts,
    rules_of,
)
from .stats import (
    MIN_INFORMATIVE_PAIRS,
    MIN_T_UNITS,
    PAIRED_CLUSTERS,
    PAIRED_RATES,
    PAIRED_T,
    SKEW_T_ONE_SIDED_MISS,
    t975,
)
from .store import ResultsError, atomic_write_text, check_path_text, legacy_owned_files
from .strata_report import detectable_note, per_distance_table, power_phrase, where_line
from .tables import (
    IDENTITY,
    fmt_interval,
    fmt_number,
    is_unit,
    select,
    shared,
    table,
    to_csv,
    to_latex,
    to_markdown,
)
from .timing import time_section

HEADLINE_LINES = 5
BASELINE = "plain"


def _slug(*parts: Any) -> str:
    s = "_".join(str(p) for p in parts if p is not None and str(p) != "")
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", s).strip("-") or "x"


def _manifests(paths: list[Path]) -> list[dict[str, Any]]:
    out = []
    for p in paths:
        if not p.is_dir():
            continue
        for m in sorted(p.glob("manifest*.json")):
            try:
                out.append({"_path": str(m), **json.loads(m.read_text(encoding="utf-8"))})
            except (OSError, json.JSONDecodeError):
                continue
    return out


def _trained_context_for(
    model: str | None, given: int | None, manifests: list[dict], rows: pd.DataFrame
) -> int | None:
    """Argument first; else None when the model's rows record a trained context (the patch's resolved value:
    it follows ``-o original_max_position_embeddings``, per setting, so the rows decide); else the
    ``trained_context`` the sweep read from the model's config into a manifest (int, or dict by model)."""
    if given:
        return given
    if recorded_contexts(rows[rows["model"] == model]):
        return None
    for m in manifests:
        for section in (m.get("extra") or {}, m.get("config") or {}):
            tc = section.get("trained_context")
            if isinstance(tc, dict):
                tc = tc.get(model)
            if isinstance(tc, (int, float)) and tc > 0:
                return int(tc)
    return None


class _Report:
    def __init__(self, out: Path):
        self.out = out
        self.tables = out / "tables"
        self.plots = out / "plots"
        self.tables.mkdir(parents=True, exist_ok=True)
        self.plots.mkdir(parents=True, exist_ok=True)
        self.md: list[str] = []
        self.written: list[Path] = []

    def add_table(
        self, name: str, caption: str, shown: pd.DataFrame, numeric: pd.DataFrame | None = None
    ) -> None:
        """md/tex from the display table (may hold "mean [lo, hi]" strings), csv from the numeric one."""
        name = safe_name(name)  # task entries and metrics are user text: the file stays in tables/
        stem = self.tables / name
        to_markdown(shown, stem.with_suffix(".md"), caption=caption)
        to_latex(shown, stem.with_suffix(".tex"), caption=caption, label=f"tab:{name}")
        to_csv(numeric if numeric is not None else shown, stem.with_suffix(".csv"))
        self.written += [stem.with_suffix(s) for s in (".md", ".csv", ".tex")]
        self.md += [
            to_markdown(shown, caption=caption),
            f"<sub>[csv](tables/{name}.csv) · [tex](tables/{name}.tex)</sub>",
            "",
        ]

    def add_plot(self, name: str, title: str, fn, *args, **kwargs) -> None:
        name = safe_name(name)  # made from user text (task, model, corpus): the file stays in plots/
        path = self.plots / f"{name}.png"
        try:
            plot = fn(*args, path, **kwargs)
        except ResultsError as e:
            self.md += [f"_Plot {title} skipped: {e}_", ""]
            return
        self.written.append(plot.path)
        self.md += [f"![{title}](plots/{name}.png)", ""]


def _groups(sub: pd.DataFrame) -> Iterable[tuple[Any, Any]]:
    keys = sub[["model", "corpus"]].drop_duplicates().itertuples(index=False)
    return [(m if not pd.isna(m) else None, c if not pd.isna(c) else None) for m, c in keys]


def _where(model, corpus) -> dict:
    return {k: v for k, v in (("model", model), ("corpus", corpus)) if v is not None}


def _with_chance_row(t: pd.DataFrame, chance: pd.Series, name: str) -> pd.DataFrame:
    names = list(t.index.names)
    label = name if "chance" in name else f"{name} (chance)"  # a metric named chance says so itself
    key = tuple(label if n == "method" else "" for n in names)
    row = pd.DataFrame(
        [[fmt_number(chance.get(c)) if c in chance.index else "–" for c in t.columns]],
        columns=t.columns,
        index=pd.MultiIndex.from_tuples([key], names=names)
        if len(names) > 1
        else pd.Index([key[0]], name=names[0]),
    )
    return pd.concat([t, row])


# -- what the report computes once and every section reads ---------------------------------------------------
class _Evidence:
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
        self.reach: dict[tuple[Quantity, str], pd.DataFrame | str] = {}
        for q in self.qs.reaches:
            for rule in rules_of(q.meaning):
                try:
                    self.reach[(q, rule)] = effective_length(
                        ok,
                        q.task,
                        q.metric,
                        threshold=threshold,
                        tolerance=tolerance,
                        trained_context=tc,
                        rule=rule,
                        seed=seed,
                    )
                except ResultsError as e:
                    self.reach[(q, rule)] = str(e)


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


def _difference_line(ev: _Evidence, q: Quantity) -> str | None:
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
    test = {PAIRED_RATES: "McNemar", PAIRED_T: "paired t", PAIRED_CLUSTERS: "sign-flip"}.get(
        first["interval"], first["interval"]
    )
    if ps:
        p_text = f", {test} " + _fmt_p(max(ps)).replace("=", "≤" if len(ps) > 1 else "=")
    else:
        p_text = f", {first['interval']} interval excludes {1 if null else 0}"
    n = _units_text(first["n"], q.meaning.independent_unit)
    power = power_phrase(at_side)
    p_text += f", {power}" if power else ""
    return f"{who} {verb} {BASELINE} on {q.task} {q.metric} {where}: {values} (n = {n}{p_text}{rows_note})."


def _reach_line(ev: _Evidence, q: Quantity, rule: str) -> str | None:
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
    bar = _rule_short(q.kind, rule, ev.threshold, ev.tolerance)
    return f"{reach_column(q, rule)} ({bar}): {', '.join(claims)}{n}."


def _rule_short(kind: str, rule: str, threshold: float, tolerance: float) -> str:
    if kind == "log":
        whose = "its own" if rule == "threshold" else f"{BASELINE}'s"
        return f"ratio to {whose} value at the trained context ≤ {1 + tolerance:g}"
    return {
        "threshold": f"Wilson lower bound ≥ {bar_text(threshold, short=True)}",
        "short": f"≥ {NOLIMA_FRACTION:g} × own short-context rate",
        "trained": f"≥ {BASELINE}'s lower bound at the trained context",
    }[rule]


def _headline(ev: _Evidence) -> list[str]:
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


def _stratified_line(ev: _Evidence, q: Quantity) -> str | None:
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


# -- sections ------------------------------------------------------------------------------------------------
def _summary(r: _Report, ev: _Evidence) -> None:
    r.md += ["## Summary", ""]
    try:
        kw = {"trained_context": ev.tc, "threshold": ev.threshold, "tolerance": ev.tolerance, "seed": ev.seed}
        shown = summary(ev.ok, **kw)
        numeric = summary(ev.ok, with_ci=False, **kw)
    except ResultsError as e:
        r.md += [f"_No summary: {e}_", ""]
        return
    r.add_table(
        "summary",
        "One row per setting: value [95% interval] n (independent units), * = significant paired difference "
        f"to {BASELINE} (unmarked: the difference its test would mark with 80% power; {MIXED_MARK}: needle "
        "distances significantly apart, no pooled mark), reach = effective length (legend below)",
        shown,
        numeric,
    )
    dropped = left_out(shown)
    if dropped:
        r.md += ["Not in the summary: " + _footnote(dropped) + ".", ""]
    note = undeclared_note(declarations(ev.ok))
    if note:
        r.md += [note, ""]
    if ev.excluded:
        r.md += [ev.excluded, ""]


def _footnote(dropped: list[tuple[str, str]]) -> str:
    """The left-out columns grouped by why: "a, b (why); c (why)"; those that did not fit named once."""
    room = [c for c, why in dropped if why.startswith("no room")]
    parts = [f"{c} ({why})" for c, why in dropped if not why.startswith("no room")]
    if room:
        parts.append(f"{', '.join(room)} (no room in {MAX_COLUMNS} columns: in their task's section)")
    return "; ".join(parts)


def _differences(r: _Report, ev: _Evidence) -> None:
    r.md += [f"## Differences to {BASELINE} (paired, same documents / prompts)", ""]
    for q in ev.qs.values:
        if q not in ev.diffs:
            continue
        try:
            shown = compare(ev.ok, q.task, q.metric, BASELINE, with_ci=True, seed=ev.seed)
            numeric = compare(ev.ok, q.task, q.metric, BASELINE, seed=ev.seed)
        except ResultsError:
            continue
        better = {"higher": " — above 0 is better", "lower": " — below 0 is better"}.get(
            q.meaning.direction, ""
        )
        if q.kind == "log":
            better = better.replace("0", "1")
            caption = f"{q.task}/{q.metric}: ratio to {BASELINE} on the same units{better}"
        else:
            caption = f"{q.task}/{q.metric} minus {BASELINE} on the same units{better}"
        kinds = sorted(set(ev.diffs[q]["interval"]) - {"baseline"})
        unit = q.meaning.independent_unit
        where = distance_text(select(ev.ok, q.task, q.metric, units=True))
        caption += f"; {where}" if where else ""
        r.add_table(
            f"{q.task}_{q.metric}_vs_{BASELINE}",
            f"{caption}; n = {unit}s (independent units) [95% interval: {', '.join(kinds)}]; unmarked: the "
            "difference the test would mark with 80% power (legend)"
            + (f"; {MIXED_MARK}: needle positions disagree (table below)" if q in ev.strata else ""),
            shown,
            numeric,
        )
        if q in ev.strata:
            shown_by, numeric_by, caption_by = per_distance_table(q, ev.strata[q], BASELINE, ev.factors)
            r.add_table(f"{q.task}_{q.metric}_vs_{BASELINE}_by_distance", caption_by, shown_by, numeric_by)


def _reach(r: _Report, ev: _Evidence) -> set[tuple[str, str]]:
    """The reach tables the grid supports; one line for the others. Returns the (kind, rule) pairs shown."""
    r.md += ["## Effective context length", ""]
    shown_rules: set[tuple[str, str]] = set()
    unsupported = []
    for (q, rule), e in ev.reach.items():
        name = reach_column(q, rule)
        if isinstance(e, str):
            unsupported.append(f"{name}: {e}")
            continue
        claims = e["claim"].astype(str)
        if (claims == "–").all():
            unsupported.append(f"{name}: {e['rule'].iloc[0].removeprefix('not computed: ')}")
            continue
        if claims.str.startswith("not established").all() or (claims == "–").all():
            unsupported.append(
                f"{name}: not established in any setting "
                f"(needs more {q.meaning.independent_unit}s per length)"
            )
            continue
        _reach_table(r, q, rule, e, ev)
        shown_rules.add((q.kind, rule))
    if not shown_rules:
        r.md += ["No reach rule is supported by this grid.", ""]
    if unsupported:
        r.md += ["Not shown: " + "; ".join(unsupported) + ".", ""]
    return shown_rules


def _reach_table(r: _Report, q: Quantity, rule: str, e: pd.DataFrame, ev: _Evidence) -> None:
    unit = q.meaning.independent_unit
    caption = (
        f"{reach_column(q, rule)} ({q.task}/{q.metric}) — value [95% interval] n = {unit}s at the reach and "
        "where the walk stopped"
    )
    where = distance_text(select(ev.ok, q.task, q.metric, units=True))
    caption += f"; {where}" if where else ""
    shown = pd.DataFrame(
        {
            "model": e["model"].map(short_model),
            "method": e["method"],
            "factor": e["factor"],
            "reach": e["claim"],
            "at reach": [
                fmt_interval(v, lo, hi, n if not pd.isna(n) else None) if not pd.isna(v) else "–"
                for v, lo, hi, n in zip(e["at_value"], e["at_lo"], e["at_hi"], e["at_n"])
            ],
            "stopped at": [
                f"{int(x)} ({why})" if not pd.isna(x) else "–"
                for x, why in zip(e["stopped_at"], e["stopped"])
            ],
            "there": [
                fmt_interval(v, lo, hi, n if not pd.isna(n) else None) if not pd.isna(v) else "–"
                for v, lo, hi, n in zip(e["fail_value"], e["fail_lo"], e["fail_hi"], e["fail_n"])
            ],
            "rule": e["rule"],
        }
    )
    if shown["model"].nunique() == 1:
        shown = shown.drop(columns="model")
    if shown["rule"].nunique() == 1:  # the same bar for every setting: said in the caption
        caption += f"; bar: {shown['rule'].iloc[0]}"
        shown = shown.drop(columns="rule")
    shown = shown.set_index([c for c in ("model", "method", "factor") if c in shown.columns])
    r.add_table(f"reach_{q.task}_{q.metric}_{rule}", caption, shown, e)


def _theory(r: _Report, ok: pd.DataFrame) -> None:
    """The sweep's theory rows, one line per setting, each column labelled by its declaration's description;
    never in the summary, never compared."""
    rows = ok[ok["task"] == THEORY_TASK]
    if rows.empty:
        return
    meant = declarations(rows)
    keys = ["model", "method", "factor", "options"]
    latest = rows.drop_duplicates([*keys, "metric", "length"], keep="last")
    shown = pd.DataFrame(index=pd.MultiIndex.from_frame(latest[keys].drop_duplicates()))
    for metric in metrics_of(latest, THEORY_TASK):
        at = latest[latest["metric"] == metric]
        lengths = sorted(at["length"].dropna().unique())
        for L in lengths or [None]:
            part = at if L is None else at[at["length"] == L]
            label = meant[(THEORY_TASK, metric)].description or metric
            if len(lengths) > 1:
                label += f" @ {int(L)}"
            shown[label] = pd.Series(
                [_theory_value(v, o) for v, o in zip(part["value"], part["task_options"])],
                index=pd.MultiIndex.from_frame(part[keys]),
            )
    shown = shown.fillna("–").reset_index()
    shown["model"] = shown["model"].map(short_model)
    shown["method"] = [setting_label(m, f) for m, f in zip(shown["method"], shown["factor"])]
    several = len(shown) > 1  # with one setting every column is "the same": keep them in the table
    same = [c for c in shown.columns if c != "method" and several and shown[c].astype(str).nunique() == 1]
    note = [f"{c} = {shown[c].iloc[0]}" for c in same if c not in ("model", "factor", "options")]
    drop = [*same, *(c for c in ("factor", "options") if c not in same)]
    if not several:
        drop += [c for c in ("model",) if c not in drop]
    shown = shown.drop(columns=drop).set_index([c for c in ("model", "method") if c not in drop])
    r.md += ["## Theory (not measurements)", ""]
    r.add_table(
        "theory",
        "What RoPE theory says about each setting's frequencies as patched. Men et al. (2024, "
        "arXiv:2405.14591) bound the base a model needs when it is *trained* for a context: a bound for a "
        "base trained for that context, not a training-free prediction of what a patched model retrieves "
        "(≥: held up to the distance checked). Liu et al. (2024, arXiv:2310.05209): the extrapolation "
        "bound of the critical dimension fixed by pretraining",
        shown,
    )
    if note:
        r.md += ["The same for every setting: " + "; ".join(note) + ".", ""]


def _theory_value(value: Any, task_options: Any) -> str:
    """ "3616", "≥ 65536" when the value reached the limit it was checked to, "2.05e+05" for a large float."""
    if pd.isna(value):
        return "–"
    try:
        limit = json.loads(task_options).get("limit") if isinstance(task_options, str) else None
    except (ValueError, AttributeError):
        limit = None
    v = float(value)
    text = str(int(v)) if v == int(v) and abs(v) < 1e6 else f"{v:.3g}"
    return f"≥ {text}" if isinstance(limit, (int, float)) and v >= limit else text


def _task_section(r: _Report, ev: _Evidence, task: str) -> None:
    """A task's tables (headline metrics with intervals; detail metrics in tables/ only) and its plots, all
    from the declarations."""
    ok = ev.ok
    r.md += [f"## {task}", ""]
    shown = [q for q in [*ev.qs.values, *ev.qs.reaches] if q.task == task]
    shown = list(dict.fromkeys(shown))
    references = {q.metric: q for q in ev.qs.references if q.task == task}
    for q in shown:
        _metric_table(r, ok, q, references, ev.seed)
    _withheld_longppl(r, ok, task)
    r.md += longppl_lines(ok, task)  # evaluator, selection, settings, key-token counts, limits
    details = [q for q in ev.qs.details if q.task == task]
    for q in details:
        t = table(ok, task, q.metric)
        stem = r.tables / _slug(task, q.metric)
        to_markdown(t.map(fmt_number), stem.with_suffix(".md"))
        to_csv(t, stem.with_suffix(".csv"))
        r.written += [stem.with_suffix(".md"), stem.with_suffix(".csv")]
    if details:
        r.md += [
            "Details (tables/ only): "
            + ", ".join(f"[{q.metric}](tables/{_slug(task, q.metric)}.csv)" for q in details),
            "",
        ]
    for q in shown:
        _metric_plots(r, ev, q)
    for q in details:  # a metric declared by position (rows are bins; ``depth`` = a bin's start): by position
        if q.meaning.by_position and select(ok, task, q.metric)["depth"].notna().any():
            for model, corpus in _groups(select(ok, task, q.metric)):
                r.add_plot(
                    _slug("loss_by_position", task, short_model(model), short_model(corpus)),
                    f"{q.metric} by position, {short_model(model)}",
                    plot_loss_by_position,
                    ok,
                    task=task,
                    metric=q.metric,
                    trained_context=ev.tc.get(model),
                    **_where(model, corpus),
                )
            break


def _metric_table(r: _Report, ok: pd.DataFrame, q: Quantity, references: dict, seed: int) -> None:
    d = q.meaning
    better = {"higher": "higher is better", "lower": "lower is better"}.get(d.direction, "no direction")
    how = {
        "log": f"skew_t (results.stats.skew_t: skew-robust t on the log scale; each bound alone "
        f"{1 - SKEW_T_ONE_SIDED_MISS:.0%}), none below {MIN_T_UNITS}",
        "rate": "Wilson",
        "mean": f"t over units, none below {MIN_T_UNITS}",
    }[q.kind]
    caption = (
        f"{q.task}/{q.metric}: {d.description or q.metric} ({d.unit or 'value'}; {better}) by method and "
        f"length [95% interval: {how}], n = {d.independent_unit}s"
    )
    shown = table(ok, q.task, q.metric, with_ci=True, seed=seed)
    ref = references.get(d.chance_metric) if d.chance_metric else None
    if ref is not None:
        chance = select(ok, q.task, ref.metric).groupby("length")["value"].mean()
        shown = _with_chance_row(shown, chance, ref.metric)
        caption += f" (last row: {ref.metric})"
    dist = distance_text(select(ok, q.task, q.metric, units=True))
    if dist:
        caption += f"; {dist}"
    r.add_table(_slug(q.task, q.metric), caption, shown, table(ok, q.task, q.metric))


def _metric_plots(r: _Report, ev: _Evidence, q: Quantity) -> None:
    """Per model and corpus: perplexities vs length (log axis), rates with depths as a heatmap, any other
    metric vs length; and vs the needle's distance where the rows record one."""
    ok = ev.ok
    sub = select(ok, q.task, q.metric)
    by_distance = _has_distance(select(ok, q.task, q.metric, units=True))
    seeded = {"seed": ev.seed}
    for model, corpus in _groups(sub):
        # (file name part, title, plot function, its own arguments): one row per plot of this model/corpus
        if q.meaning.kind == "perplexity":
            tc = {"trained_context": ev.tc.get(model)}
            plots = [("", f"{q.metric} vs length", plot_perplexity, {**seeded, **tc})]
        elif q.kind == "rate" and sub["depth"].notna().any() and not _has_distance(sub):
            plots = [("heatmap", f"{q.task} {q.metric} by depth and length", plot_passkey, {})]
        else:
            plots = [("", f"{q.task} {q.metric} vs length", plot_metric, seeded)]
        if by_distance:
            plots.append(("by_distance", f"{q.task} {q.metric} by needle distance", plot_by_distance, seeded))
        tag = (short_model(model), short_model(corpus))
        for part, title, fn, kwargs in plots:
            r.add_plot(
                _slug(q.task, q.metric, part, *tag),
                f"{title}, {tag[0]}",
                fn,
                ok,
                task=q.task,
                metric=q.metric,
                **kwargs,
                **_where(model, corpus),
            )


def _has_distance(rows: pd.DataFrame) -> bool:
    return "distance" in rows.columns and rows["distance"].notna().any()


# LongPPL's key-token count (helper metric of the perplexity task, docs/tasks.md): LongPPL is written only
# where enough key tokens back it; the report says where it was withheld
KEY_TOKENS = "longppl_key_tokens"


def _withheld_longppl(r: _Report, ok: pd.DataFrame, task: str) -> None:
    rows = ok[(ok["task"] == task) & (ok["metric"] == KEY_TOKENS)]
    if rows.empty:
        return
    have = ok[(ok["task"] == task) & (ok["metric"] == "longppl")]
    lines = []
    for (method, factor, L), g in rows.groupby(["method", "factor", "length"], dropna=False, sort=True):
        written = have[(have["method"] == method) & (have["factor"] == factor) & (have["length"] == L)]
        if len(written):
            continue
        units = g[is_unit(g)]
        k = int((units if len(units) else g)["value"].sum())
        docs = len(units) if len(units) else int(g["n"].fillna(1).iloc[0])
        minimum = _recorded_option(g, ("min_key_tokens", "key_tokens_min"))
        bar = f" (below the minimum of {minimum})" if minimum else " (below the declared minimum)"
        documents = f"{docs} document{'s' if docs != 1 else ''}"
        who = setting_label(method, factor)
        lines.append(f"LongPPL withheld at {int(L)}: {k} key tokens in {documents}{bar}, for {who}.")
    r.md += [*lines, ""] if lines else []


def _recorded_option(rows: pd.DataFrame, names: tuple[str, ...]) -> Any:
    for text in rows["task_options"].dropna().unique() if "task_options" in rows.columns else []:
        try:
            opts = json.loads(text) if isinstance(text, str) else {}
        except ValueError:
            continue
        for source in (opts, opts.get("key_tokens") if isinstance(opts.get("key_tokens"), dict) else {}):
            for n in names:
                if isinstance(source.get(n), (int, float)):
                    return source[n]
    return None


def _legend(r: _Report, ev: _Evidence, rules: set[tuple[str, str]]) -> None:
    r.md += ["## Legend", ""]
    r.md += [f"- {line}" for line in legend_lines(rules, ev.threshold, ev.tolerance, BASELINE)]
    r.md += [""]


def _failures(df: pd.DataFrame) -> list[str]:
    bad = df[df["status"] == "error"]
    if bad.empty:
        return ["## Failed cells", "", "None.", ""]
    cols = ["run", "cell", "model", "method", "factor", "task", "length", "error"]
    cells = bad.drop_duplicates(subset=["run", "cell"])[cols].copy()
    cells["model"] = cells["model"].map(lambda m: short_model(m) if not pd.isna(m) else m)
    cells["factor"] = cells["factor"].map(lambda f: "" if pd.isna(f) else f"{f:g}")
    cells["error"] = cells["error"].fillna("").map(lambda s: s.splitlines()[0][:160] if s else "")
    t = cells.set_index(["run", "cell"])
    return [f"## Failed cells ({len(cells)})", "", to_markdown(t), ""]


def report(
    run_dirs: str | os.PathLike | Iterable[str | os.PathLike],
    out: str | os.PathLike | None = None,
    *,
    trained_context: int | None = None,
    threshold: float | str = DEFAULT_BAR,
    tolerance: float = 0.10,
    seed: int = 0,
) -> Path:
    """Write ``report.md`` + ``tables/`` + ``plots/`` for the runs; returns the path of report.md.

    ``out`` defaults to the first run directory. ``trained_context`` (the model's original context) draws
    the dashed line in perplexity plots and is the reference of the summary and the effective lengths;
    without it each setting's rows decide (the patch's resolved ``trained_context``, which follows
    ``original_max_position_embeddings``), and only for rows that record none the manifest's (the model
    config's). The report opens with a headline of at most five lines, then :func:`results.summary`, the
    paired differences to plain, the effective lengths the grid supports, theory, and per-task tables and
    plots with n and 95% intervals (closed-form: ``seed`` changes nothing). ``threshold``: the bar of the
    rates' "threshold" reach, an accuracy (default 0.8, an absolute bar in RULER's style) or "ruler" (RULER's
    own 0.856, Llama-2-7B's 4K average over its 13 tasks).
    """
    threshold = check_rules(threshold, tolerance)
    paths = as_paths(run_dirs, "run directory", "results.report('runs/demo')")
    if out is not None:
        out = as_path(out, "report directory", "results.report('runs/demo', out='reports/demo')")
    check_trained_context(trained_context)
    df = load(paths)  # bad records are named first; then where the report may go
    theory = load_theory(paths)  # the sweep's theory rows, kept beside the records
    if len(theory):
        df = pd.concat([df, theory], ignore_index=True)
    out = Path(out) if out is not None else (paths[0] if paths[0].is_dir() else paths[0].parent)
    owned = check_report_dir(out)
    with _staging(out) as staging, shared():  # each comparison computed once (memo.py)
        _write_report(_Report(staging), df, paths, trained_context, threshold, tolerance, seed)
        _commit(staging, out, owned)
    return out / "report.md"


def _write_report(
    r: _Report,
    df: pd.DataFrame,
    paths: list[Path],
    trained_context: int | None,
    threshold: float,
    tolerance: float,
    seed: int,
) -> None:
    manifests = _manifests(paths)
    ok = df[df["status"].isna() | (df["status"] == "ok")]
    tc = {m: _trained_context_for(m, trained_context, manifests, ok) for m in ok["model"].dropna().unique()}
    tc = {m: v for m, v in tc.items() if v}
    tasks = measured_tasks(ok)
    ev = _Evidence(ok, tc, seed, threshold, tolerance) if tasks else None
    r.md += ["# ropebench report", ""]
    if ev is not None:
        r.md += [*_headline(ev), ""]
    r.md += [
        f"Runs: {', '.join(sorted(map(str, df['run'].dropna().unique())))}  ",
        f"Models: {', '.join(sorted({short_model(m) for m in df['model'].dropna().unique()}))}  ",
        f"Rows: {len(df)} ({int((df['status'] == 'error').sum())} error rows)  ",
    ]
    for m in manifests:
        v = m.get("versions") or {}
        git = (m.get("git") or {}).get("commit")
        r.md.append(
            f"Manifest `{Path(m['_path']).parent.name}/{Path(m['_path']).name}`: "
            f"start {m.get('start_time')}, end {m.get('end_time')}, device {m.get('device')}, "
            f"seed {m.get('seed')}, torch {v.get('torch')}, transformers {v.get('transformers')}"
            + (f", commit {git[:10]}" if git else "")
            + "  "
        )
    r.md.append("")
    rules: set[tuple[str, str]] = set()
    if ev is not None:
        _summary(r, ev)
        _differences(r, ev)
        rules = _reach(r, ev)
        _theory(r, ok)
        for task in tasks:
            _task_section(r, ev, task)
        _legend(r, ev, rules)
    time_section(r, df)  # results/timing.py: the cells' recorded wall per task and setting
    r.md += _failures(df)
    atomic_write_text(r.out / "report.md", "\n".join(r.md))


# -- where the report is written: never over a file ropebench did not write ----------------------------------
def check_report_dir(out: Path) -> OwnedDir:
    """The report goes into a new or empty directory, or one ropebench made (a valid marker, or a run or
    report directory from before the marker: extend/owned_paths.py): like the sweep's --out and --fresh, it
    never writes into a directory of the user's. Writes nothing."""
    check_path_text(out, "report directory")
    return OwnedDir.open(out, "report directory", error=ResultsError, adopt=legacy_owned_files)


def report_files(out: Path) -> set[Path]:
    """Files in ``out`` ropebench wrote, as its marker lists them (or, made before the marker, as
    :func:`results.store.legacy_owned_files` finds them)."""
    files = read_marker(out)
    if files is None:
        files = legacy_owned_files(out) or {}
    return {out / rel for rel in files}


class _staging:
    """A scratch directory inside ``out`` the report is built in; removed on exit. A directory this creates
    for ``out`` (and its missing parents) is removed again when the report fails, so a refusal leaves
    nothing behind."""

    def __init__(self, out: Path):
        self.out = out
        self.created = next((p for p in [*reversed(out.parents), out] if not p.exists()), None)

    def __enter__(self) -> Path:
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / f".report.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        self.path.mkdir()
        return self.path

    def __exit__(self, exc_type, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        if exc_type is not None and self.created is not None:
            for d in [self.out, *self.out.parents]:  # only the directories made here, and only when empty
                try:
                    d.rmdir()
                except OSError:
                    break
                if d == self.created:
                    break


def _commit(staging: Path, out: Path, owned: OwnedDir | None = None) -> None:
    """Move the staged files into ``out`` — after checking that none of them replaces a file ropebench did not
    write or one changed since (then nothing is moved). Each file is listed in the marker (with its hash) as
    it is moved; report.md goes last, so it never links to a file not yet there."""
    owned = owned if owned is not None else check_report_dir(out)
    staged = sorted(p.relative_to(staging) for p in staging.rglob("*") if p.is_file())
    owned.check(staged)
    for rel in sorted(staged, key=lambda r: r == Path("report.md")):
        owned.place(rel, staging / rel)
