"""``effective_length``: how far each model x method x factor really reaches, claiming only tested lengths.

A length *passes* only when the bound of its 95% interval on the unfavourable side clears a real bar; it
*fails* only when the bound on the favourable side misses it (11/16, Wilson [0.444, 0.858], neither passes nor
fails a bar of 0.8); otherwise it is *not established*. Lengths are read in ascending order and the walk stops
at the first that does not pass, so a lucky longer length is never counted. Which metrics have a reach, and
under which rules, is what their declaration says (:class:`results.meaning.Metric` ``reach``; never guessed
from a name or the values). The rules themselves, their checks and words: results/reach_rules.py.

The trained context of a setting is the argument when given, else the one its rows record (the patch's
resolved ``trained_context`` in ``options``, which follows ``original_max_position_embeddings``), else a
``trained_context`` in ``task_options``.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from .comparisons import paired_cells
from .meaning import Metric, declarations
from .reach_rules import DEFAULT_BAR, FAIL, OPEN, PASS, RULES, Setting, check_rules, rule_names
from .stats import Interval, Paired
from .store import ResultsError, atomic_write_text, json_object
from .tables import IDENTITY, cell_interval, copy_frame, is_unit, remember, select

# Rows the sweep writes beside the tasks' (one per setting):
# what RoPE theory predicts from the patched frequencies
THEORY_TASK = "theory"
NOT_ESTABLISHED = "not established (n too small)"


def rules_of(meaning: Metric) -> list[str]:
    """The reach rules a declaration names that its kind supports, in ``RULES`` order."""
    return [r for r in rule_names(meaning.stat_kind) if r in meaning.reach]


def reach_metrics(df: pd.DataFrame, task: str) -> list[str]:
    """The metrics of ``task`` whose declaration names reach rules, in the order the rows first name them."""
    rows = df[(df["task"] == task) & (df["status"].isna() | (df["status"] == "ok"))]
    meant = declarations(rows)
    return [str(m) for m in dict.fromkeys(rows["metric"].dropna()) if rules_of(meant[(task, m)])]


def default_metric(df: pd.DataFrame, task: str) -> str:
    """The task's first metric with declared reach rules."""
    candidates = reach_metrics(df, task)
    if candidates:
        return candidates[0]
    have = sorted(set(df.loc[df["task"] == task, "metric"].dropna()))
    raise ResultsError(
        f"no metric of task {task!r} declares reach rules (have: {', '.join(have)}) — pass metric=... "
        f"naming one that does"
    )


def check_trained_context(given: Any) -> None:
    """A trained context given by hand is a positive int (or {model: positive int})."""
    values = given.values() if isinstance(given, Mapping) else [given]
    for v in values:
        if v is None and not isinstance(given, Mapping):
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or v != int(v):
            raise ResultsError(
                f"trained_context must be a positive number of tokens, got {v!r} — e.g. trained_context=8192"
            )


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _recorded(rows: pd.DataFrame, column: str) -> set[int]:
    if column not in rows.columns:
        return set()
    found = (json_object(text).get("trained_context") for text in rows[column].dropna().unique())
    return {int(v) for v in found if _is_number(v) and v > 0}


def recorded_contexts(rows: pd.DataFrame) -> set[int]:
    """Every trained context the rows record: the patch's resolved values in ``options`` (they follow
    ``original_max_position_embeddings`` and ``start_from``), else ``trained_context`` in task_options."""
    return _recorded(rows, "options") or _recorded(rows, "task_options")


def recorded_trained_context(rows: pd.DataFrame) -> int | None:
    """The one trained context the rows record (see :func:`recorded_contexts`);
    None when absent or ambiguous."""
    found = recorded_contexts(rows)
    return found.pop() if len(found) == 1 else None


def trained_context_of(rows: pd.DataFrame, given: int | Mapping[str, int] | None, model: Any) -> int | None:
    """The argument (an int, or a dict by model), else what the rows record (see
    :func:`recorded_trained_context`)."""
    if isinstance(given, Mapping):
        given = given.get(model)
    if given:
        return int(given)
    return recorded_trained_context(rows)


def claim(effective: float, first_failure: float, stopped: str | None, shortest: int) -> str:
    """What may be said: "≥ L" when L passed and no longer tested length failed (the true reach may be
    longer), "L" when a longer tested length failed, "< L" when already the shortest failed, and "not
    established (n too small)" when the shortest length neither passed nor failed (its interval straddles
    the bar)."""
    if pd.isna(effective):
        if not stopped:
            return "–"
        return NOT_ESTABLISHED if stopped == OPEN else f"< {shortest}"
    return f"≥ {int(effective)}" if pd.isna(first_failure) else str(int(effective))


def ratio_to(at: pd.DataFrame, ref: pd.DataFrame, metric: str, *, seed: int = 0) -> Interval | Paired:
    """value(L) / value(reference length) of one setting, paired over the units both lengths share
    (`comparisons.paired_cells`: per-document log ratios; rows sharing a cluster count once) when per-unit
    rows exist, else the bare ratio of the cell estimates (no interval)."""
    ua, ub = at[is_unit(at) & at["value"].notna()], ref[is_unit(ref) & ref["value"].notna()]
    if len(ua) and len(ub):  # unit keys hold no length: the same document at both lengths
        return paired_cells(ua, ub, metric, "ratio", seed=seed)
    a, b = cell_interval(at, metric, seed=seed), cell_interval(ref, metric, seed=seed)
    return Interval(a.estimate / b.estimate, math.nan, math.nan, min(a.n, b.n), "none")


def _walk(checks: dict[int, tuple[str, Any]]) -> dict[str, Any]:
    """Walk the tested lengths upwards and stop at the first that does not pass: the effective length, where
    and why the walk stopped, the first length beyond the reach that failed outright, and the statistic
    (estimate / lo / hi / n) at the reach and at the stop."""
    lengths = sorted(checks)
    effective = stopped_at = pd.NA
    stopped = None
    for L in lengths:
        if checks[L][0] != PASS:
            stopped_at, stopped = L, checks[L][0]
            break
        effective = L
    failures = [L for L in lengths if checks[L][0] == FAIL and (pd.isna(stopped_at) or L >= stopped_at)]
    first_failure = failures[0] if failures else pd.NA
    row = {
        "effective_length": effective,
        "first_failure": first_failure,
        "stopped_at": stopped_at,
        "stopped": stopped or "",
        "claim": claim(effective, first_failure, stopped, lengths[0]),
    }
    for prefix, L in (("at", effective), ("fail", stopped_at)):
        s = None if pd.isna(L) else checks[L][1]
        row.update(
            {
                f"{prefix}_value": s.estimate if s else math.nan,
                f"{prefix}_lo": s.lo if s else math.nan,
                f"{prefix}_hi": s.hi if s else math.nan,
                f"{prefix}_n": s.n if s else pd.NA,
            }
        )
    return row


def effective_length(
    df: pd.DataFrame,
    task: str,
    metric: str | None = None,
    *,
    threshold: float | str = DEFAULT_BAR,
    rule: str = "threshold",
    tolerance: float = 0.10,
    trained_context: int | Mapping | None = None,
    baseline: str = "plain",
    seed: int = 0,
    short_length: int | None = None,
    **where: Any,
) -> pd.DataFrame:
    """One row per model x method x factor x options x corpus: ``effective_length`` (a tested length, or NA),
    ``claim`` ("≥ 16384", "8192", "< 2048", "not established (n too small)"), ``rule`` (the bar, in words),
    ``reference_length`` / ``reference_value``, ``stopped_at`` / ``stopped`` (the first length that did not
    pass, and whether it "failed" or was "not established"), ``first_failure`` (the first length from there on
    that failed: it makes the claim "L" rather than "≥ L") and, at the effective length and where the walk
    stopped, value / lo / hi / n (``at_*`` and ``fail_*`` columns: the accuracy and its Wilson interval, or
    the ratio to the reference and its paired t interval over documents).

    ``rule``: "threshold" (Wilson lower bound >= ``threshold``: an absolute bar, RULER-style; default 0.8,
    ``threshold="ruler"`` for RULER's own 0.856), "short" (>= 0.85 x the
    setting's own rate at its shortest tested length: NoLiMa) or "trained" (>= the ``baseline`` method's
    Wilson lower bound at the trained context, when that is >= ``MIN_BAR``; the setting's own when the
    baseline did not run) for rates; perplexities use ``tolerance`` on the upper bound of the ratio to their
    own ("threshold") or the baseline's ("trained") value at the trained context. ``predicted_reach``: what
    Men et al.'s criterion allows for the setting's patched frequencies (the sweep's ``theory`` rows; NA
    without them), ``predicted_limit`` the longest distance it was checked to (a ``predicted_reach`` equal to
    it means "at least").
    Rows: per model, the baseline first. ``trained_context``: an int or {model: int}; default: what the rows
    record (see the module doc). ``short_length``: the longest length NoLiMa's base may be taken at, at most
    ``SHORT_CAP`` (2048; default: min(a quarter of the trained context, 2048) — NoLiMa's bases are 250-1K).

    Which rules apply is the metric's declaration (``meaning``; see :mod:`results.meaning`): a metric that
    declares no reach, or not this rule, is a ResultsError.
    """
    args = (task, metric, threshold, rule, tolerance, trained_context, baseline, seed, short_length, where)
    return remember("effective_length", df, args, lambda: _effective_length(df, *args), copy_frame)


def _effective_length(  # effective_length's arguments in its order (their types: there)
    df, task, metric, threshold, rule, tolerance, trained_context, baseline, seed, short_length, where
) -> pd.DataFrame:
    threshold = check_rules(threshold, tolerance, short_length)
    check_trained_context(trained_context)
    metric = metric or default_metric(df, task)
    if rule not in rule_names():
        raise ResultsError(f"unknown rule {rule!r} — use one of: {', '.join(rule_names())}")
    sub = select(df, task, metric, units=True, **where)
    sub = sub[sub["length"].notna()]
    if sub.empty:
        raise ResultsError(f"no {task}/{metric} rows with a length — an effective length needs lengths")
    meaning = declarations(sub)[(task, metric)]
    kind = meaning.stat_kind
    if not rules_of(meaning):
        raise ResultsError(
            f"{task}/{metric} declares no reach rules (a {meaning.kind}"
            + ("" if meaning.declared else ", undeclared")
            + ") — pass metric=... naming a metric that declares some"
        )
    if rule not in rules_of(meaning):
        raise ResultsError(
            f"{task}/{metric} does not declare rule {rule!r} — use one of: {', '.join(rules_of(meaning))}"
        )
    predicted = predicted_reach(df)
    # what a rule measures with (results/reach_rules.py imports no statistics)
    interval, ratio = (partial(f, metric=metric, seed=seed) for f in (cell_interval, ratio_to))
    setting_cols = list(IDENTITY)
    settings = sorted(
        sub.groupby(setting_cols, dropna=False, sort=True),
        key=lambda kv: (str(kv[0][0]), kv[0][1] != baseline, tuple(map(str, kv[0]))),
    )
    out = []
    for setting, s_rows in settings:
        info = dict(zip(setting_cols, setting))
        cells = {int(L): (g, interval(g)) for L, g in s_rows.groupby("length", sort=True)}
        tc = trained_context_of(setting_rows(df, info), trained_context, info["model"])
        ref_len = max((L for L in cells if tc and L <= tc), default=None)
        row = {
            **info,
            "metric": metric,
            "rule_name": rule,
            "effective_length": pd.NA,
            "claim": "–",
            "rule": "",
            "reference_length": pd.NA,
            "reference_value": math.nan,
            "longest_tested": max(cells),
            "first_failure": pd.NA,
            "stopped_at": pd.NA,
            "stopped": "",
            "trained_context": tc if tc else pd.NA,
            **{f"{p}_{k}": math.nan for p in ("at", "fail") for k in ("value", "lo", "hi")},
            "at_n": pd.NA,
            "fail_n": pd.NA,
        }
        seen = (info, cells, sub, metric, tc, ref_len, threshold, tolerance, baseline, interval, ratio)
        v = RULES[(kind, rule)].check(Setting(*seen, short_length))
        row.update(
            rule=v.rule,
            reference_length=v.reference_length if v.reference_length else pd.NA,
            reference_value=v.reference_value,
            **predicted_for(predicted, info),
        )
        out.append({**row, **_walk(v.checks)} if v.checks else row)
    return pd.DataFrame(out)


# -- what theory predicts (rows the sweep records with task "theory"; see scripts/sweep_lib/run.py) ----------
PREDICTED_KEYS = ("model", "method", "factor", "options")
# The sweep keeps its theory rows beside the records, not in them (a records file holds one cell per write,
# which resume and the write-safety checks count on): theory.json, theory.rank{N}.json under accelerate.
THEORY_FILE = re.compile(r"^theory(\.rank\d+)?\.json$")


def theory_path(run_dir: str | os.PathLike, rank: int | None = None) -> Path:
    return Path(run_dir) / ("theory.json" if not rank else f"theory.rank{int(rank)}.json")


def record_theory(run_dir: str | os.PathLike, rows: list[dict], rank: int | None = None) -> None:
    """Add one setting's theory rows (all of one ``cell``) to the run's theory file, replacing that cell's
    earlier ones; written whole or not at all."""
    path = theory_path(run_dir, rank)
    cells = _read_theory_file(path)
    cells[str(rows[0]["cell"])] = rows
    atomic_write_text(path, json.dumps(cells, sort_keys=True, default=str) + "\n")


def _read_theory_file(path: Path) -> dict[str, list]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}  # absent or damaged: theory is context, never a reason to refuse a report
    return {k: v for k, v in data.items() if isinstance(v, list)} if isinstance(data, dict) else {}


def load_theory(paths: str | os.PathLike | list) -> pd.DataFrame:
    """The theory rows the sweep recorded in these run directories (empty when none), in the row schema: add
    them to ``results.load(...)``'s frame and the summary and reach tables show the predicted reach."""
    from .frame import normalize

    dirs = [Path(paths)] if isinstance(paths, (str, os.PathLike)) else [Path(p) for p in paths]
    rows = [
        r
        for d in dirs
        if d.is_dir()
        for f in sorted(d.iterdir())
        if THEORY_FILE.match(f.name)
        for cell in _read_theory_file(f).values()
        for r in cell
        if isinstance(r, dict)
    ]
    return normalize(pd.DataFrame(rows)) if rows else pd.DataFrame()


def predicted_reach(df: pd.DataFrame) -> pd.DataFrame:
    """One row per setting with theory rows: ``predicted_reach`` (Men et al.'s ``men_reach`` of the patched
    frequencies: the first distance where sum_i cos(m theta_i) < 0) and ``predicted_limit`` (the longest
    distance checked; the reach equals it when the criterion held throughout)."""
    rows = df[
        (df["task"] == THEORY_TASK)
        & (df["metric"] == "men_reach")
        & df["value"].notna()
        & (df["status"].isna() | (df["status"] == "ok"))
    ]
    out = []
    for key, g in rows.groupby(list(PREDICTED_KEYS), dropna=False, sort=False):
        limit = _recorded_number(g["task_options"].iloc[-1], "limit")
        out.append(
            {
                **dict(zip(PREDICTED_KEYS, key)),
                "predicted_reach": int(g["value"].iloc[-1]),
                "predicted_limit": limit if limit else pd.NA,
            }
        )
    return pd.DataFrame(out, columns=[*PREDICTED_KEYS, "predicted_reach", "predicted_limit"])


def _recorded_number(text: Any, key: str) -> int | None:
    v = json_object(text).get(key)
    return int(v) if _is_number(v) else None


def predicted_for(predicted: pd.DataFrame, info: dict) -> dict[str, Any]:
    """The predicted reach of one setting (NA when the sweep recorded none)."""
    hit = predicted
    for k in PREDICTED_KEYS:
        hit = hit[hit[k].astype(str) == str(info[k])]
    columns = ("predicted_reach", "predicted_limit")
    return {c: pd.NA if hit.empty else hit[c].iloc[0] for c in columns}


def setting_rows(df: pd.DataFrame, info: dict) -> pd.DataFrame:
    """Every row of one model x method x factor x options (any task): where its trained context is recorded;
    the model's rows when the setting's own record none (e.g. a trained_context only in another task's
    options)."""
    model_rows = df[df["model"].astype(str) == str(info["model"])]
    mask = pd.Series(True, index=model_rows.index)
    for k in ("method", "factor", "options"):
        mask &= model_rows[k].astype(str) == str(info[k])
    own = model_rows[mask]
    return own if recorded_trained_context(own) else model_rows
