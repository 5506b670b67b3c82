"""Standard pictures (seaborn, PNG): perplexity vs length, passkey heatmaps, classification accuracy.

Figures are built with ``matplotlib.figure.Figure`` + the Agg canvas, never pyplot, so plotting changes
no global backend state and works headless. Each function returns a :class:`Plot` holding the rows that
were drawn (``data``), so tests and users can check exactly what is behind the axes.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, LogLocator, NullFormatter, NullLocator, StrMethodFormatter

from .store import ResultsError
from .tables import select


@dataclass
class Plot:
    path: Path
    data: pd.DataFrame  # one row per drawn point / heatmap cell
    figure: Figure
    extra: dict = field(default_factory=dict)  # e.g. the chance line of a classification plot


def _label_series(sub: pd.DataFrame) -> pd.Series:
    """Legend label per row: the method, plus the factor/options when they distinguish settings."""
    multi_factor = sub.groupby("method")["factor"].nunique().gt(1).any() or sub["factor"].nunique() > 1
    multi_opts = sub.groupby(["method", "factor"], dropna=False)["options"].nunique().gt(1).any()

    def label(r) -> str:
        s = str(r["method"])
        if multi_factor and not pd.isna(r["factor"]):
            s += f" ×{r['factor']:g}"
        if multi_opts and r["options"] not in ("{}", None):
            opts = json.loads(r["options"])
            s += " (" + ", ".join(f"{k}={v}" for k, v in opts.items()) + ")"
        return s

    return sub.apply(label, axis=1) if len(sub) else pd.Series([], dtype=object)


def _single(sub: pd.DataFrame, col: str, what: str) -> Any:
    vals = sub[col].dropna().unique()
    if len(vals) > 1:
        raise ResultsError(f"{what}: rows from several {col}s ({', '.join(map(str, vals))}) — pass {col}=... "
                           f"to plot one at a time")
    return vals[0] if len(vals) else None


def _factors(sub: pd.DataFrame) -> str:
    f = sorted(sub["factor"].dropna().unique())
    if not f:
        return "factor ?"
    return ("factor " if len(f) == 1 else "factors ") + ", ".join(f"{x:g}" for x in f)


def _trained_context(sub: pd.DataFrame, given: int | None) -> int | None:
    """The model's trained context: the argument, else a ``trained_context`` in task_options; else unknown
    (then no line is drawn rather than a guessed one)."""
    if given:
        return int(given)
    found = set()
    for opts in sub["task_options"].dropna().unique():
        try:
            v = json.loads(opts).get("trained_context")
        except (json.JSONDecodeError, AttributeError):
            v = None
        if v:
            found.add(int(v))
    return found.pop() if len(found) == 1 else None


def _subset(df: pd.DataFrame, task: str, metric: str, what: str, **where: Any) -> pd.DataFrame:
    sub = select(df, task, metric, **where)
    sub = sub[sub["length"].notna()].copy()
    if sub.empty:
        raise ResultsError(f"{what}: no {task}/{metric} rows with a length — nothing to plot")
    sub["label"] = _label_series(sub)
    return sub


def _save(fig: Figure, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


def _length_axis(ax, lengths) -> None:
    # Lengths usually double (1k, 2k, 4k ...): a log2 axis spaces them evenly; label with the real values.
    lengths = sorted({int(x) for x in lengths})
    if len(lengths) > 1 and lengths[0] > 0 and lengths[-1] / lengths[0] >= 4:
        ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(lengths))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([_klabel(x) for x in lengths], rotation=0 if len(lengths) <= 8 else 45)


def _klabel(x: int) -> str:
    return f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x)


def _means_by_length(sub: pd.DataFrame) -> pd.DataFrame:
    """One point per (method x factor label, length): the mean over documents / trials behind it."""
    return (sub.groupby(["label", "method", "factor", "length"], dropna=False)["value"].mean()
            .reset_index().astype({"length": "int64"}))


def _line_plot(ax, data: pd.DataFrame, y: str) -> None:
    order = sorted(data["label"].unique(), key=lambda s: (not s.startswith("plain"), s))
    sns.lineplot(data=data, x="length", y=y, hue="label", hue_order=order, style="label", style_order=order,
                 markers=True, dashes=False, ax=ax, errorbar=None, linewidth=1.8, markersize=7)


def plot_perplexity(df: pd.DataFrame, path: str | os.PathLike, *, metric: str = "ppl", task: str = "perplexity",
                    trained_context: int | None = None, **where: Any) -> Plot:
    """Perplexity vs length, one line per method (x factor), log y, dashed line at the trained context."""
    sub = _subset(df, task, metric, "plot_perplexity", **where)
    model = _single(sub, "model", "plot_perplexity")
    corpus = _single(sub, "corpus", "plot_perplexity")
    data = _means_by_length(sub)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    _line_plot(ax, data, "value")
    ax.set_yscale("log")
    # Plain numbers (10, 20, 50, 100 ...) read better than 10^1, 10^2 on a perplexity axis.
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    _length_axis(ax, data["length"])
    ctx = _trained_context(sub, trained_context)
    if ctx:
        ax.axvline(ctx, color="0.3", linestyle="--", linewidth=1.2, label=f"trained context ({_klabel(ctx)})")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel(f"{metric} (log scale, lower is better)")
    ax.set_title(f"Perplexity vs length — {model}\ncorpus: {corpus} · {_factors(sub)}")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(title=None, fontsize=9)
    fig.tight_layout()
    return Plot(_save(fig, path), data, fig)


def plot_passkey(df: pd.DataFrame, path: str | os.PathLike, *, metric: str = "correct", task: str = "passkey",
                 **where: Any) -> Plot:
    """Passkey retrieval heatmaps: depth (rows) x length (columns), % correct, one panel per method."""
    sub = _subset(df, task, metric, "plot_passkey", **where)
    sub = sub[sub["depth"].notna()]
    if sub.empty:
        raise ResultsError(f"plot_passkey: no {task}/{metric} rows with a depth — nothing to plot")
    model = _single(sub, "model", "plot_passkey")
    corpus = _single(sub, "corpus", "plot_passkey")
    data = sub.groupby(["label", "depth", "length"], dropna=False)["value"].agg(["mean", "size"]).reset_index()
    data["percent"] = 100.0 * data["mean"]
    labels = sorted(data["label"].unique(), key=lambda s: (not s.startswith("plain"), s))
    ncols = 2 if len(labels) == 4 else min(3, len(labels))
    nrows = math.ceil(len(labels) / ncols)
    nlen = data["length"].nunique()
    fig = Figure(figsize=(max(3.2, 0.75 * nlen + 1.6) * ncols + 0.8, (0.45 * data["depth"].nunique() + 1.6) * nrows))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    cax = fig.add_axes((0.92, 0.15, 0.015, 0.7))
    for i, (ax, label) in enumerate(zip(axes, labels)):
        grid = (data[data["label"] == label].pivot(index="depth", columns="length", values="percent")
                .sort_index().sort_index(axis=1))
        sns.heatmap(grid, ax=ax, vmin=0, vmax=100, cmap="RdYlGn", annot=True, fmt=".0f", cbar=i == 0,
                    cbar_ax=cax if i == 0 else None, cbar_kws={"label": "% correct"}, linewidths=0.5,
                    annot_kws={"fontsize": 9})
        ax.set_title(label)
        ax.set_xticklabels([_klabel(int(x)) for x in grid.columns], rotation=0)
        ax.set_yticklabels([f"{100 * d:.0f}%" for d in grid.index], rotation=0)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("passkey depth" if i % ncols == 0 else "")
    for ax in axes[len(labels):]:
        ax.set_visible(False)
    fig.suptitle(f"Passkey retrieval (% correct) — {model}\nhaystack: {corpus} · {_factors(sub)}")
    fig.subplots_adjust(left=0.1, right=0.9, top=0.78 if nrows == 1 else 0.86, bottom=0.12, wspace=0.25,
                        hspace=0.6)
    return Plot(_save(fig, path), data, fig)


def plot_classification(df: pd.DataFrame, path: str | os.PathLike, *, metric: str = "accuracy",
                        task: str = "classification", chance_metric: str = "chance", **where: Any) -> Plot:
    """Classification accuracy vs length per method, with the chance (majority-class) rate dashed."""
    sub = _subset(df, task, metric, "plot_classification", **where)
    model = _single(sub, "model", "plot_classification")
    corpus = _single(sub, "corpus", "plot_classification")
    data = _means_by_length(sub)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    _line_plot(ax, data, "value")
    _length_axis(ax, data["length"])
    chance = None
    try:
        ch = select(df, task, chance_metric, **where)
        ch = ch[ch["model"] == model] if model is not None else ch
        chance = ch.groupby("length")["value"].mean().sort_index()
    except ResultsError:
        pass
    if chance is not None and len(chance):
        if chance.nunique() == 1 or len(chance) == 1:
            ax.axhline(float(chance.iloc[0]), color="0.3", linestyle="--", linewidth=1.2, label="chance (majority)")
        else:
            ax.plot(chance.index.astype(int), chance.to_numpy(), color="0.3", linestyle="--", linewidth=1.2,
                    label="chance (majority)")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel(f"{metric} (higher is better)")
    ax.set_title(f"Classification {metric} vs length — {model}\ncorpus: {corpus} · {_factors(sub)}")
    ax.grid(True, alpha=0.3)
    ax.legend(title=None, fontsize=9)
    fig.tight_layout()
    return Plot(_save(fig, path), data, fig, extra={"chance": None if chance is None else chance.to_dict()})
