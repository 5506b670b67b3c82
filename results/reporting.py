"""``report``: one markdown report over run directories — tables inline, plots linked, failures listed.

Writes ``<out>/report.md``, ``<out>/tables/*.{md,csv,tex}`` and ``<out>/plots/*.png``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from .frame import load
from .plots import plot_classification, plot_passkey, plot_perplexity
from .store import ResultsError, atomic_write_text
from .tables import compare, fmt_number, select, table, to_csv, to_latex, to_markdown

KNOWN_ORDER = ("perplexity", "passkey", "classification")


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


def _trained_context_for(model: str | None, given: int | None, manifests: list[dict]) -> int | None:
    """Argument first, else ``trained_context`` recorded by the sweep in a manifest (int, or dict by model)."""
    if given:
        return given
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

    def add_table(self, name: str, caption: str, shown: pd.DataFrame, numeric: pd.DataFrame | None = None) -> None:
        """md/tex from the display table (may hold "mean ± ci" strings), csv from the numeric one."""
        stem = self.tables / name
        to_markdown(shown, stem.with_suffix(".md"), caption=caption)
        to_latex(shown, stem.with_suffix(".tex"), caption=caption, label=f"tab:{name}")
        to_csv(numeric if numeric is not None else shown, stem.with_suffix(".csv"))
        self.written += [stem.with_suffix(s) for s in (".md", ".csv", ".tex")]
        self.md += [to_markdown(shown, caption=caption),
                    f"<sub>[csv](tables/{name}.csv) · [tex](tables/{name}.tex)</sub>", ""]

    def add_plot(self, name: str, title: str, fn, *args, **kwargs) -> None:
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


def _with_chance_row(t: pd.DataFrame, chance: pd.Series) -> pd.DataFrame:
    names = list(t.index.names)
    key = tuple("chance (majority)" if n == "method" else "" for n in names)
    row = pd.DataFrame([[fmt_number(chance.get(c)) if c in chance.index else "–" for c in t.columns]],
                       columns=t.columns,
                       index=pd.MultiIndex.from_tuples([key], names=names) if len(names) > 1
                       else pd.Index([key[0]], name=names[0]))
    return pd.concat([t, row])


def _perplexity(r: _Report, ok: pd.DataFrame, tc: int | None, manifests: list[dict]) -> None:
    metrics = set(ok.loc[ok["task"] == "perplexity", "metric"])
    metric = "ppl" if "ppl" in metrics else min(metrics)
    r.md += ["## Perplexity", ""]
    t = table(ok, "perplexity", metric)
    r.add_table(f"perplexity_{metric}", f"Perplexity ({metric}) by method and length — lower is better",
                t.map(fmt_number), t)
    if "plain" in set(select(ok, "perplexity", metric)["method"]):
        c = compare(ok, "perplexity", metric, baseline="plain")
        r.add_table(f"perplexity_{metric}_vs_plain", "Perplexity ratio to plain (no extension) — below 1 is better",
                    c.map(fmt_number), c)
    if "ppl_tail" in metrics:
        tail = table(ok, "perplexity", "ppl_tail")
        r.add_table("perplexity_ppl_tail", "Perplexity of only the tokens between the previous length and this "
                    "one — lower is better; shows where a method breaks", tail.map(fmt_number), tail)
    for model, corpus in _groups(select(ok, "perplexity", metric)):
        r.add_plot(_slug("perplexity", model, corpus), f"perplexity vs length, {model}, {corpus}",
                   plot_perplexity, ok, metric=metric, trained_context=_trained_context_for(model, tc, manifests),
                   **_where(model, corpus))


def _passkey(r: _Report, ok: pd.DataFrame) -> None:
    r.md += ["## Passkey retrieval", ""]
    shown = table(ok, "passkey", "correct", with_ci=True)
    r.add_table("passkey_accuracy", "Passkey accuracy by method and length (mean over depths and trials, "
                "± half-width of the 95% Wilson interval)", shown, table(ok, "passkey", "correct"))
    for model, corpus in _groups(select(ok, "passkey", "correct")):
        r.add_plot(_slug("passkey", model, corpus), f"passkey heatmap, {model}, {corpus}", plot_passkey, ok,
                   **_where(model, corpus))


def _classification(r: _Report, ok: pd.DataFrame) -> None:
    r.md += ["## Long-document classification", ""]
    metrics = set(ok.loc[ok["task"] == "classification", "metric"])
    chance = None
    if "chance" in metrics:
        chance = select(ok, "classification", "chance").groupby("length")["value"].mean()
    for metric, caption in (("accuracy", "Classification accuracy by method and length"),
                            ("macro_f1", "Classification macro-F1 by method and length")):
        if metric not in metrics:
            continue
        shown = table(ok, "classification", metric, with_ci=True)
        numeric = table(ok, "classification", metric)
        if metric == "accuracy" and chance is not None:
            shown = _with_chance_row(shown, chance)
            caption += " (last row: majority-class chance)"
        r.add_table(f"classification_{metric}", caption, shown, numeric)
    if "accuracy" in metrics:
        for model, corpus in _groups(select(ok, "classification", "accuracy")):
            r.add_plot(_slug("classification", model, corpus), f"classification accuracy, {model}, {corpus}",
                       plot_classification, ok, **_where(model, corpus))


def _other(r: _Report, ok: pd.DataFrame, task: str) -> None:
    r.md += [f"## {task}", ""]
    for metric in sorted(ok.loc[ok["task"] == task, "metric"].dropna().unique()):
        sub = select(ok, task, metric)
        cols = "length" if sub["length"].notna().any() else None
        shown = table(ok, task, metric, cols=cols, with_ci=True)
        r.add_table(_slug(task, metric), f"{task}: {metric}", shown, table(ok, task, metric, cols=cols))


def _failures(df: pd.DataFrame) -> list[str]:
    bad = df[df["status"] == "error"]
    if bad.empty:
        return ["## Failed cells", "", "None.", ""]
    cols = ["run", "cell", "model", "method", "factor", "task", "length", "error"]
    cells = bad.drop_duplicates(subset=["run", "cell"])[cols].copy()
    cells["factor"] = cells["factor"].map(lambda f: "" if pd.isna(f) else f"{f:g}")
    cells["error"] = cells["error"].fillna("").map(lambda s: s.splitlines()[0][:160] if s else "")
    t = cells.set_index(["run", "cell"])
    return [f"## Failed cells ({len(cells)})", "", to_markdown(t), ""]


def report(run_dirs: str | os.PathLike | Iterable[str | os.PathLike], out: str | os.PathLike | None = None, *,
           trained_context: int | None = None) -> Path:
    """Write ``report.md`` + ``tables/`` + ``plots/`` for the runs; returns the path of report.md.

    ``out`` defaults to the first run directory. ``trained_context`` (the model's original context) draws
    the dashed line in perplexity plots; without it the value recorded by the sweep (task_options or
    manifest ``trained_context``) is used, and no line is drawn when unknown.
    """
    paths = [Path(run_dirs)] if isinstance(run_dirs, (str, os.PathLike)) else [Path(p) for p in run_dirs]
    df = load(paths)
    out = Path(out) if out is not None else (paths[0] if paths[0].is_dir() else paths[0].parent)
    r = _Report(out)
    manifests = _manifests(paths)
    ok = df[df["status"].isna() | (df["status"] == "ok")]
    r.md += ["# ropebench report", "",
             f"Runs: {', '.join(sorted(map(str, df['run'].dropna().unique())))}  ",
             f"Models: {', '.join(sorted(map(str, df['model'].dropna().unique())))}  ",
             f"Rows: {len(df)} ({int((df['status'] == 'error').sum())} error rows)  "]
    for m in manifests:
        v = m.get("versions") or {}
        git = (m.get("git") or {}).get("commit")
        r.md.append(f"Manifest `{Path(m['_path']).parent.name}/{Path(m['_path']).name}`: start {m.get('start_time')}, "
                    f"end {m.get('end_time')}, device {m.get('device')}, seed {m.get('seed')}, "
                    f"torch {v.get('torch')}, transformers {v.get('transformers')}"
                    + (f", commit {git[:10]}" if git else "") + "  ")
    r.md.append("")
    tasks = list(ok["task"].dropna().unique())
    ordered = [t for t in KNOWN_ORDER if t in tasks] + sorted(t for t in tasks if t not in KNOWN_ORDER)
    for task in ordered:
        if task == "perplexity":
            _perplexity(r, ok, trained_context, manifests)
        elif task == "passkey" and "correct" in set(ok.loc[ok["task"] == task, "metric"]):
            _passkey(r, ok)
        elif task == "classification":
            _classification(r, ok)
        else:
            _other(r, ok, task)
    r.md += _failures(df)
    report_path = out / "report.md"
    atomic_write_text(report_path, "\n".join(r.md))
    return report_path
