"""``summary``: one row per setting (model x method x factor x options) — the table a report opens with.

Per setting: perplexity at the trained context and at the longest length, the tail-perplexity ratio
between them, the effective lengths (perplexity, passkey), passkey and classification accuracy at the
longest length with chance — each with n and its 95% interval; " *" marks a value whose paired
difference to the baseline method at that length is significant (see :func:`results.compare`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .comparisons import SIGNIFICANT_MARK, paired_differences
from .reach import check_rules, effective_length, ratio_to, setting_rows, trained_context_of
from .stats import Interval
from .store import ResultsError
from .tables import cell_interval, fmt_interval, select

SETTING = ("model", "method", "factor", "options")


def short_model(model: Any) -> str:
    """A model label for tables and plots: the last path part of a local path (not /tmp/.../tiny-llama),
    a hub id or alias unchanged."""
    s = str(model)
    return Path(s).name or s if s.startswith(("/", "~", ".")) or "\\" in s else s


def _tasks_with(df: pd.DataFrame, task: str, metric: str) -> bool:
    return bool(((df["task"] == task) & (df["metric"] == metric)).any())


def _of(frame: pd.DataFrame, setting: dict) -> pd.DataFrame:
    mask = pd.Series(True, index=frame.index)
    for k, v in setting.items():
        if k in frame.columns:
            mask &= frame[k].astype(str) == str(v)
    return frame[mask]


def _cell(df: pd.DataFrame, task: str, metric: str, setting: dict, length: int | None, seed: int) -> Interval | None:
    if length is None or not _tasks_with(df, task, metric):
        return None
    rows = _of(select(df, task, metric, units=True), setting)
    rows = rows[rows["length"] == length]
    return cell_interval(rows, metric, seed=seed) if len(rows) else None


def _significant(long: pd.DataFrame | None, setting: dict, length: int | None) -> bool:
    if long is None or length is None:
        return False
    hit = _of(long, {k: v for k, v in setting.items() if k in long.columns})
    hit = hit[hit["length"] == length]
    return bool(len(hit) and hit["significant"].any())


def _lengths(df: pd.DataFrame, task: str, metric: str, setting: dict) -> list[int]:
    if not _tasks_with(df, task, metric):
        return []
    rows = _of(select(df, task, metric), setting)
    return sorted(int(x) for x in rows["length"].dropna().unique())


def summary(df: pd.DataFrame, *, trained_context: int | Mapping[str, int] | None = None, threshold: float = 0.8,
            tolerance: float = 0.10, baseline: str = "plain", seed: int = 0, with_ci: bool = True) -> pd.DataFrame:
    """One row per setting. ``with_ci=True`` (default): display strings "value [lo, hi] n=N" (columns named
    with the lengths when every setting shares them); ``with_ci=False``: numeric columns ``<name>``,
    ``<name>_lo``, ``<name>_hi``, ``<name>_n``, ``<name>_length`` for every quantity.

    ``trained_context``: an int or {model: int}; else what each setting's rows record (the patch's resolved
    ``trained_context`` in options, else task_options); perplexity at the trained context uses the longest
    tested length not beyond it. Effective lengths as in :func:`results.effective_length` (passkey: Wilson
    lower bound >= ``threshold``; perplexity: the upper bound of the ppl_tail ratio to its value at the trained
    context within ``tolerance``).
    """
    check_rules(threshold, tolerance)
    ok = df[df["status"].isna() | (df["status"] == "ok")]
    if ok.empty:
        raise ResultsError("no successful rows to summarise — load a run directory with finished cells")
    settings = ok[list(SETTING)].drop_duplicates().sort_values(list(SETTING), key=lambda c: c.astype(str))
    settings = sorted((dict(zip(SETTING, s)) for s in settings.itertuples(index=False)),
                      key=lambda s: (str(s["model"]), s["method"] != baseline, str(s["method"]), str(s["factor"])))
    reach = {}
    for task, metric in (("perplexity", None), ("passkey", None)):
        if (ok["task"] == task).any():
            try:
                reach[task] = effective_length(ok, task, metric, threshold=threshold, tolerance=tolerance,
                                               trained_context=trained_context, baseline=baseline, seed=seed)
            except ResultsError:
                pass
    diffs = {}
    for task, metric in (("perplexity", "ppl"), ("passkey", "correct"), ("classification", "accuracy")):
        if _tasks_with(ok, task, metric):
            try:
                diffs[task] = paired_differences(ok, task, metric, baseline, seed=seed)
            except ResultsError:  # e.g. no baseline rows: nothing is marked
                diffs[task] = None
    rows = []
    for s in settings:
        tc = trained_context_of(setting_rows(ok, s), trained_context, s["model"])  # the rows' own, per setting
        r: dict[str, Any] = {"model": s["model"], "method": s["method"], "factor": s["factor"], "options": s["options"]}
        ppl_lengths = _lengths(ok, "perplexity", "ppl", s)
        at_tc = max((L for L in ppl_lengths if tc and L <= tc), default=None)
        longest = ppl_lengths[-1] if ppl_lengths else None
        _put(r, "ppl @ trained", _cell(ok, "perplexity", "ppl", s, at_tc, seed), at_tc)
        _put(r, "ppl @ longest", _cell(ok, "perplexity", "ppl", s, longest, seed), longest,
             _significant(diffs.get("perplexity"), s, longest))
        for task, name in (("perplexity", "ppl reach"), ("passkey", "passkey reach")):
            e = reach.get(task)
            hit = _of(e, s) if e is not None else pd.DataFrame()
            if len(hit) == 1:
                h = hit.iloc[0]
                r[name], r[f"{name}_length"] = h["claim"], h["effective_length"]
                ref, last = h["reference_length"], h["longest_tested"]
                if task == "perplexity" and not pd.isna(ref) and last > ref:
                    rows_of = _of(select(ok, task, h["metric"], units=True), s)
                    ci = ratio_to(rows_of[rows_of["length"] == last], rows_of[rows_of["length"] == ref], h["metric"],
                                  seed=seed)
                    _put(r, "tail ppl ratio", ci, int(last), ref_length=int(ref))
            else:
                r[name], r[f"{name}_length"] = "–", pd.NA
        pk = _lengths(ok, "passkey", "correct", s)
        L = pk[-1] if pk else None
        _put(r, "passkey @ longest", _cell(ok, "passkey", "correct", s, L, seed), L,
             _significant(diffs.get("passkey"), s, L))
        cl = _lengths(ok, "classification", "accuracy", s)
        L = cl[-1] if cl else None
        _put(r, "classification @ longest", _cell(ok, "classification", "accuracy", s, L, seed), L,
             _significant(diffs.get("classification"), s, L))
        chance = _cell(ok, "classification", "chance", s, L, seed)
        r["chance"] = chance.estimate if chance else math.nan
        rows.append(r)
    numeric = pd.DataFrame(rows)
    return _display(numeric) if with_ci else numeric


def _put(r: dict, name: str, ci: Interval | None, length: int | None, significant: bool = False, *,
         ref_length: int | None = None) -> None:
    r[name] = ci.estimate if ci else math.nan
    r[f"{name}_lo"] = ci.lo if ci else math.nan
    r[f"{name}_hi"] = ci.hi if ci else math.nan
    r[f"{name}_n"] = ci.n if ci else pd.NA
    r[f"{name}_length"] = length if length is not None else pd.NA
    r[f"{name}_significant"] = significant
    if ref_length is not None:
        r[f"{name}_reference_length"] = ref_length


QUANTITIES = ("ppl @ trained", "ppl @ longest", "tail ppl ratio", "ppl reach", "passkey @ longest",
              "passkey reach", "classification @ longest")


def _display(numeric: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"model": numeric["model"].map(short_model), "method": numeric["method"],
                        "factor": numeric["factor"]})
    if numeric["options"].nunique() > 1:
        out["options"] = numeric["options"].map(lambda o: ", ".join(f"{k}={v}" for k, v in json.loads(o).items())
                                                if o and o != "{}" else "")
    if out["model"].nunique() == 1:
        out = out.drop(columns="model")
    for q in QUANTITIES:
        if q not in numeric.columns or numeric[f"{q}_length"].isna().all() and q not in ("ppl reach", "passkey reach"):
            continue
        if q.endswith("reach"):
            if (numeric[q] == "–").all():
                continue
            out[q] = numeric[q]
            continue
        lengths = numeric[f"{q}_length"].dropna().unique()
        shared = len(lengths) == 1
        label = q.replace("trained", f"{int(lengths[0])} (trained)").replace("longest", str(int(lengths[0]))) \
            if shared else q
        if q == "tail ppl ratio" and shared:
            refs = numeric[f"{q}_reference_length"].dropna().unique()
            label = f"ppl_tail {int(lengths[0])} / {int(refs[0]) if len(refs) == 1 else 'trained'}"
        cells = []
        for _, r in numeric.iterrows():
            if pd.isna(r[q]):
                cells.append("–")
                continue
            n = None if pd.isna(r[f"{q}_n"]) else r[f"{q}_n"]
            s = fmt_interval(r[q], r[f"{q}_lo"], r[f"{q}_hi"], n)
            if not shared:
                s += f" @{int(r[f'{q}_length'])}"
            cells.append(s + (f" {SIGNIFICANT_MARK}" if r[f"{q}_significant"] else ""))
        out[label] = cells
        if q == "classification @ longest" and numeric["chance"].notna().any():
            out["chance"] = numeric["chance"]
    return out.set_index([c for c in ("model", "method", "factor", "options") if c in out.columns])
