"""Standard pictures (seaborn, PNG): perplexity vs length, passkey heatmaps, classification accuracy, any
declared metric vs length (:func:`plot_metric`) and vs the needle's distance from the question
(:func:`plot_by_distance`). What a plot draws (log axis, direction, chance line) comes from the metric's
declaration (:mod:`results.meaning`), never from its name.

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

from .longppl_report import annotate_key_counts
from .meaning import meaning_of
from .overview import short_model
from .reach import trained_context_of
from .stats import SKEW_T_ONE_SIDED_MISS
from .store import ResultsError
from .tables import cell_interval, select


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
        raise ResultsError(
            f"{what}: rows from several {col}s ({', '.join(map(str, vals))}) — pass {col}=... "
            f"to plot one at a time"
        )
    return vals[0] if len(vals) else None


def _factors(sub: pd.DataFrame) -> str:
    f = sorted(sub["factor"].dropna().unique())
    if not f:
        return "factor ?"
    return ("factor " if len(f) == 1 else "factors ") + ", ".join(f"{x:g}" for x in f)


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


def _n_range(data: pd.DataFrame) -> str:
    n = sorted({int(x) for x in data["n"].dropna()})
    return "n ?" if not n else (f"n={n[0]}" if len(n) == 1 else f"n={n[0]}–{n[-1]}")


def _klabel(x: int) -> str:
    return f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x)


def _points(
    df: pd.DataFrame, task: str, metric: str, sub: pd.DataFrame, seed: int = 0, **where: Any
) -> pd.DataFrame:
    """One point per (method x factor label, length): the cell estimate (as in the tables) with ``lo``/``hi``
    (its 95% interval: t over documents, Wilson for rates) and ``n``."""
    rows = select(df, task, metric, units=True, **where)
    rows = rows[rows["length"].notna() & rows["model"].isin(sub["model"].unique())].copy()
    rows["label"] = _label_series(rows)
    keys = ["label", "method", "factor", "length"]
    out = [
        {**dict(zip(keys, key)), "length": int(key[3]), **_interval(g, metric, seed)}
        for key, g in rows.groupby(keys, dropna=False)
    ]
    return pd.DataFrame(out)


def _interval(g: pd.DataFrame, metric: str, seed: int) -> dict[str, Any]:
    """A drawn point's ``value`` (the cell estimate) and ``lo``/``hi``/``n`` (see `tables.cell_interval`)."""
    ci = cell_interval(g, metric, seed=seed)
    return {"value": ci.estimate, "lo": ci.lo, "hi": ci.hi, "n": ci.n}


def _has_band(data: pd.DataFrame) -> bool:
    return bool((data["lo"].notna() & data["hi"].notna()).any()) if len(data) else False


def _lines(ax, data: pd.DataFrame, x: str, y: str, *, width: float, marker: float) -> list[str]:
    """One line per setting (plain first), markers, no seaborn interval; the settings' order."""
    order = sorted(data["label"].unique(), key=lambda s: (not s.startswith("plain"), s))
    sns.lineplot(
        data=data,
        x=x,
        y=y,
        hue="label",
        hue_order=order,
        style="label",
        style_order=order,
        markers=True,
        dashes=False,
        ax=ax,
        errorbar=None,
        linewidth=width,
        markersize=marker,
    )
    return order


def _line_plot(ax, data: pd.DataFrame, y: str) -> None:
    order = _lines(ax, data, "length", y, width=1.8, marker=7)
    # the 95% interval of every point as a band in the line's colour (absent where there is none)
    colours = {line.get_label(): line.get_color() for line in ax.get_lines()}
    handles, labels = ax.get_legend_handles_labels()
    colours.update({lab: h.get_color() for h, lab in zip(handles, labels) if hasattr(h, "get_color")})
    for label in order:
        d = data[data["label"] == label].sort_values("length")
        d = d[d["lo"].notna() & d["hi"].notna()]
        if len(d):
            ax.fill_between(d["length"], d["lo"], d["hi"], color=colours.get(label), alpha=0.15, linewidth=0)


def plot_perplexity(
    df: pd.DataFrame,
    path: str | os.PathLike,
    *,
    metric: str = "ppl",
    task: str = "perplexity",
    trained_context: int | None = None,
    seed: int = 0,
    **where: Any,
) -> Plot:
    """Perplexity vs length, one line per method (x factor), log y, dashed line at the trained context; the
    band is the 95% skew-robust t interval (stats.skew_t) over documents on the log scale (none below 3
    documents)."""
    sub = _subset(df, task, metric, "plot_perplexity", **where)
    model = _single(sub, "model", "plot_perplexity")
    corpus = _single(sub, "corpus", "plot_perplexity")
    data = _points(df, task, metric, sub, seed, **where)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    _line_plot(ax, data, "value")
    ax.set_yscale("log")
    # Plain numbers (10, 20, 50, 100 ...) read better than 10^1, 10^2 on a perplexity axis.
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    _length_axis(ax, data["length"])
    # the argument, else the rows' own (patch options, then task_options); unknown or several: no line,
    # no guess
    ctx = trained_context_of(sub, trained_context, model)
    if ctx:
        ax.axvline(ctx, color="0.3", linestyle="--", linewidth=1.2, label=f"trained context ({_klabel(ctx)})")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel(f"{metric} (log scale, lower is better)")
    n = _n_range(data)
    # promise a band only when one is drawn (none below 3 documents)
    # the legend's name for it (skew_t) and what each edge alone holds (its bounds' misses are not even)
    band = (
        f", band: skew_t 95% (each edge alone {1 - SKEW_T_ONE_SIDED_MISS:.0%})"
        if _has_band(data)
        else ", no band (too few documents for an interval)"
    )
    ax.set_title(
        f"{metric} vs length — {short_model(model)}\ncorpus: {short_model(corpus)} · {_factors(sub)} · "
        f"{n} documents{band}"
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(title=None, fontsize=9)
    fig.tight_layout()
    return Plot(_save(fig, path), data, fig)


def plot_passkey(
    df: pd.DataFrame, path: str | os.PathLike, *, metric: str = "correct", task: str = "passkey", **where: Any
) -> Plot:
    """Passkey retrieval heatmaps: depth (rows) x length (columns), % correct, one panel per method."""
    sub = _subset(df, task, metric, "plot_passkey", **where)
    sub = sub[sub["depth"].notna()]
    if sub.empty:
        raise ResultsError(f"plot_passkey: no {task}/{metric} rows with a depth — nothing to plot")
    model = _single(sub, "model", "plot_passkey")
    corpus = _single(sub, "corpus", "plot_passkey")
    data = (
        sub.groupby(["label", "depth", "length"], dropna=False)["value"]
        .agg(["mean", "size", "sum"])
        .reset_index()
    )
    data["percent"] = 100.0 * data["mean"]
    data["count"] = [f"{int(k)}/{int(n)}" for k, n in zip(data["sum"], data["size"])]
    labels = sorted(data["label"].unique(), key=lambda s: (not s.startswith("plain"), s))
    ncols = 2 if len(labels) == 4 else min(3, len(labels))
    nrows = math.ceil(len(labels) / ncols)
    nlen = data["length"].nunique()
    # Heights in inches: panels, a gap between rows for the x label and the next row's title, a band on top
    # for the suptitle (fractions of the height would shrink with few depths and make the titles collide).
    panel_h, gap, top, bottom = 0.45 * data["depth"].nunique() + 0.5, 1.05, 1.2, 0.75
    height = nrows * panel_h + (nrows - 1) * gap + top + bottom
    fig = Figure(figsize=(max(3.2, 0.75 * nlen + 1.6) * ncols + 0.8, height))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    cax = fig.add_axes((0.92, 0.15, 0.015, 0.7))
    for i, (ax, label) in enumerate(zip(axes, labels)):
        panel = data[data["label"] == label]
        grid = panel.pivot(index="depth", columns="length", values="percent").sort_index().sort_index(axis=1)
        counts = panel.pivot(index="depth", columns="length", values="count").reindex_like(grid).fillna("")
        # cells show correct/trials: 1/1 and 10/10 are both 100%, but not the same evidence
        sns.heatmap(
            grid,
            ax=ax,
            vmin=0,
            vmax=100,
            cmap="RdYlGn",
            annot=counts.to_numpy(),
            fmt="",
            cbar=i == 0,
            cbar_ax=cax if i == 0 else None,
            cbar_kws={"label": "% correct"},
            linewidths=0.5,
            annot_kws={"fontsize": 9},
        )
        ax.set_title(label)
        ax.set_xticklabels([_klabel(int(x)) for x in grid.columns], rotation=0)
        ax.set_yticklabels([f"{100 * d:.0f}%" for d in grid.index], rotation=0)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("passkey depth" if i % ncols == 0 else "")
    for ax in axes[len(labels) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"{task} {metric} (correct / trials, colour: %) — {short_model(model)}\n"
        f"haystack: {short_model(corpus)} · {_factors(sub)}",
        y=1 - 0.1 / height,
    )
    fig.subplots_adjust(
        left=0.1, right=0.9, top=1 - top / height, bottom=bottom / height, wspace=0.25, hspace=gap / panel_h
    )
    return Plot(_save(fig, path), data, fig)


def plot_classification(
    df: pd.DataFrame,
    path: str | os.PathLike,
    *,
    metric: str = "accuracy",
    task: str = "classification",
    chance_metric: str = "chance",
    seed: int = 0,
    **where: Any,
) -> Plot:
    """Classification accuracy vs length per method with its 95% (Wilson) interval as a band, and the chance
    (majority-class) rate dashed."""
    sub = _subset(df, task, metric, "plot_classification", **where)
    model = _single(sub, "model", "plot_classification")
    corpus = _single(sub, "corpus", "plot_classification")
    data = _points(df, task, metric, sub, seed, **where)
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
        style = {"color": "0.3", "linestyle": "--", "linewidth": 1.2, "label": "chance (majority)"}
        if chance.nunique() == 1 or len(chance) == 1:
            ax.axhline(float(chance.iloc[0]), **style)
        else:
            ax.plot(chance.index.astype(int), chance.to_numpy(), **style)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("document length (tokens)")
    ax.set_ylabel(f"{metric} (higher is better)")
    ax.set_title(
        f"Classification {metric} vs length — {short_model(model)}\n"
        f"corpus: {short_model(corpus)} · {_factors(sub)} · "
        f"{_n_range(data)} queries, band: 95% interval"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(title=None, fontsize=9)
    fig.tight_layout()
    return Plot(_save(fig, path), data, fig, extra={"chance": None if chance is None else chance.to_dict()})


def _bin_centres(g: pd.DataFrame) -> pd.Series:
    """Mean position of each loss bin: a bin runs from its start (depth) to the next bin's start, the last one
    to the length of the pass."""
    starts = sorted(g["depth"].unique())
    ends = dict(zip(starts, starts[1:] + [float(g["length"].max())]))
    return g["depth"].map(lambda s: (s + ends[s] - 1) / 2)


def plot_loss_by_position(
    df: pd.DataFrame,
    path: str | os.PathLike,
    *,
    metric: str = "loss_bin",
    task: str = "perplexity",
    trained_context: int | None = None,
    **where: Any,
) -> Plot:
    """Mean loss by token position (half-octave bins, log x) per method, from the one pass at the largest
    length, with the fitted a·p^-b + c (fitted within the trained context) drawn dashed over every position:
    past the trained context the fit is what the method would give if it kept its in-context shape, so a break
    shows as points leaving the dashed line."""
    sub = _subset(df, task, metric, "plot_loss_by_position", **where)
    sub = sub[sub["depth"].notna()].copy()
    if sub.empty:
        raise ResultsError(
            f"plot_loss_by_position: no {task}/{metric} rows with a depth (bin start) — run "
            f"perplexity with loss_by_position=true"
        )
    model = _single(sub, "model", "plot_loss_by_position")
    corpus = _single(sub, "corpus", "plot_loss_by_position")
    parts = []
    for _, g in sub.groupby(["label", "length"], dropna=False):
        g = (
            g.groupby(["label", "method", "factor", "length", "depth"], dropna=False)
            .agg(value=("value", "mean"), n=("n", "sum"))
            .reset_index()
        )
        parts.append(g.assign(position=_bin_centres(g)))
    data = pd.concat(parts, ignore_index=True)
    fits = _loss_fits(df, task, sub, **where)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    _lines(ax, data, "position", "value", width=1.5, marker=5)
    colours = {line.get_label(): line.get_color() for line in ax.get_lines()}
    x = np.geomspace(max(1.0, data["position"].min()), data["position"].max(), 200)
    for label, (a, b, c) in fits.items():
        if label in colours:
            ax.plot(x, a * x**-b + c, color=colours[label], linestyle="--", linewidth=1.0, alpha=0.8)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))  # 1, 2, ..., 8192 rather than 2^13
    ctx = trained_context_of(sub, trained_context, model)
    if ctx:
        ax.axvline(ctx, color="0.3", linestyle=":", linewidth=1.2, label=f"trained context ({_klabel(ctx)})")
    ax.set_xlabel("token position (log scale; half-octave bins)")
    ax.set_ylabel("mean loss (nats/token, lower is better)")
    drawn = any(label in colours for label in fits)
    fitted = (
        "dashed: a·p^-b + c fitted within the trained context"
        if drawn
        else "no a·p^-b + c fit (too few documents or bins to support one)"
    )
    ax.set_title(
        f"Loss by position — {short_model(model)}\ncorpus: {short_model(corpus)} · {_factors(sub)} · {fitted}"
    )
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(title=None, fontsize=9)
    fig.tight_layout()
    return Plot(_save(fig, path), data, fig, extra={"fits": fits})


def _loss_fits(df: pd.DataFrame, task: str, sub: pd.DataFrame, **where: Any) -> dict:
    """label -> (a, b, c) from the loss_fit_a/b/c rows of the plotted models (absent: no dashed line)."""
    try:
        rows = pd.concat([select(df, task, f"loss_fit_{k}", **where).assign(param=k) for k in "abc"])
    except ResultsError:
        return {}
    rows = rows[rows["model"].isin(sub["model"].unique())].copy()
    rows["label"] = _label_series(rows)
    out = {}
    for label, g in rows.groupby("label"):
        params = g.groupby("param")["value"].mean()
        if set(params.index) == set("abc"):
            out[label] = (float(params["a"]), float(params["b"]), float(params["c"]))
    return out


def _direction_text(meaning) -> str:
    return {"higher": ", higher is better", "lower": ", lower is better"}.get(meaning.direction, "")


def _chance_level(df: pd.DataFrame, task: str, meaning, **where: Any) -> pd.Series | None:
    """The declared chance level by length: a number, or a reference metric of the same task."""
    if meaning.chance is not None:
        return pd.Series({0: float(meaning.chance)})
    if not meaning.chance_metric:
        return None
    try:
        ch = select(df, task, meaning.chance_metric, **where)
    except ResultsError:
        return None
    return ch.groupby("length")["value"].mean().sort_index() if len(ch) else None


def plot_metric(
    df: pd.DataFrame, path: str | os.PathLike, *, task: str, metric: str, seed: int = 0, **where: Any
) -> Plot:
    """Any declared metric vs length, one line per method (x factor), its 95% interval as a band where there
    is one, the chance level dashed where declared; a log axis for perplexities."""
    sub = _subset(df, task, metric, "plot_metric", **where)
    model = _single(sub, "model", "plot_metric")
    corpus = _single(sub, "corpus", "plot_metric")
    meaning = meaning_of(sub, task, metric)
    data = _points(df, task, metric, sub, seed, **where)
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    _line_plot(ax, data, "value")
    annotate_key_counts(ax, df, data, task, metric)  # LongPPL: the key tokens behind each point
    if meaning.kind == "perplexity":
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
    _length_axis(ax, data["length"])
    chance = _finish_metric_axes(
        ax,
        df,
        sub,
        data,
        task=task,
        metric=metric,
        meaning=meaning,
        model=model,
        corpus=corpus,
        x="length (tokens)",
        what="vs length",
        detail=f"{_n_range(data)} {meaning.independent_unit}s",
        where=where,
    )
    return Plot(_save(fig, path), data, fig, extra={"chance": chance})


def _finish_metric_axes(
    ax,
    df: pd.DataFrame,
    sub: pd.DataFrame,
    data: pd.DataFrame,
    *,
    task: str,
    metric: str,
    meaning,
    model: Any,
    corpus: Any,
    x: str,
    what: str,
    detail: str,
    where: dict,
) -> dict | None:
    """What :func:`plot_metric` and :func:`plot_by_distance` draw alike: the declared chance level dashed,
    the axis labels (the y label with the metric's unit and direction), the title (task, metric, ``what``,
    model, corpus, factors, ``detail``, and a band only where one is drawn), grid and legend. ``where``: the
    plot's row filters. Returns the chance level by length (None when none is declared)."""
    chance = _chance_level(df, task, meaning, **where)
    if chance is not None and len(chance):
        ax.axhline(float(chance.mean()), color="0.3", linestyle="--", linewidth=1.2, label="chance")
    ax.set_xlabel(x)
    ax.set_ylabel(f"{metric} ({meaning.unit or 'value'}{_direction_text(meaning)})")
    band = ", band: 95% interval" if _has_band(data) else ""
    ax.set_title(
        f"{task}: {metric} {what} — {short_model(model)}\n"
        + (f"corpus: {short_model(corpus)} · " if corpus is not None else "")
        + f"{_factors(sub)} · {detail}{band}"
    )
    ax.grid(True, alpha=0.3)
    ax.legend(title=None, fontsize=9)
    ax.figure.tight_layout()
    return None if chance is None else chance.to_dict()


def plot_by_distance(
    df: pd.DataFrame, path: str | os.PathLike, *, task: str, metric: str, seed: int = 0, **where: Any
) -> Plot:
    """A metric vs the needle's distance from the question (the rows' ``distance``, tokens), one line per
    method (x factor), one point per needle position (length x depth) at its questions' median distance; its
    95% interval (over independent units) as a band where there is one."""
    sub = _subset(df, task, metric, "plot_by_distance", **where)
    if "distance" not in sub.columns or sub["distance"].isna().all():
        raise ResultsError(f"plot_by_distance: no {task}/{metric} rows record a distance — nothing to plot")
    model = _single(sub, "model", "plot_by_distance")
    corpus = _single(sub, "corpus", "plot_by_distance")
    meaning = meaning_of(sub, task, metric)
    rows = select(df, task, metric, units=True, **where)
    rows = rows[rows["distance"].notna() & rows["model"].isin(sub["model"].unique())].copy()
    rows["label"] = _label_series(rows)
    # One point per needle position (length x depth), at the median distance of its questions: the exact
    # distance differs by a few tokens between haystacks (one point per exact value scatters the line).
    rows["_place"] = rows["depth"].where(rows["depth"].notna(), rows["distance"])
    out = [
        {"label": label, "distance": round(float(g["distance"].median())), **_interval(g, metric, seed)}
        for (label, _, _), g in rows.groupby(["label", "length", "_place"], dropna=False)
    ]
    data = pd.DataFrame(out).rename(columns={"distance": "length"})
    fig = Figure(figsize=(7.5, 4.8))
    ax = fig.add_subplot()
    _line_plot(ax, data, "value")
    data = data.rename(columns={"length": "distance"})
    _length_axis(ax, data["distance"])
    lengths = sorted({int(x) for x in rows["length"].dropna()})
    pooled = (
        f"at {lengths[0]} tokens"
        if len(lengths) == 1
        else f"one point per length x depth, {lengths[0]}–{lengths[-1]}"
    )
    chance = _finish_metric_axes(
        ax,
        df,
        sub,
        data,
        task=task,
        metric=metric,
        meaning=meaning,
        model=model,
        corpus=corpus,
        x="needle distance from the question (tokens)",
        what="by needle distance",
        detail=pooled,
        where=where,
    )
    return Plot(_save(fig, path), data, fig, extra={"chance": chance})
