"""Pivot tables over the tidy frame (estimate, n, 95% interval per cell) and writers (md, csv, tex).

Tables never know which task made a row: they select by the ``task`` and ``metric`` columns only, and treat a
metric as its declaration says (the rows' ``meaning``, results/meaning.py; `meaning_for`), never by its name
or values. ``n`` counts independent units: rows that share a ``cluster`` (the questions on one haystack) are
one unit, and ``rows`` counts the rows behind them.

Its size (~680 lines): selection, the interval of one cell and the three writers (md, csv, tex) share one
model of a table cell; split, each piece would re-derive it.
"""

from __future__ import annotations

import contextvars
import math
import os
import re
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from .arguments import _shown, as_path, check_frame
from .meaning import Metric, declarations, fallback
from .ranges import out_of_range_mask, within_range
from .stats import Interval, t975, wilson
from .stats import cell_interval as stats_cell_interval
from .store import ResultsError

# Columns that identify *what* was measured. If one of them varies inside a table cell, averaging would
# mix different settings (e.g. yarn x2 with yarn x4), so it is added to the rows automatically.
IDENTITY = ("model", "method", "factor", "options", "corpus")
# A row with any of these set is one unit (a document, a prompt); rows with none set are aggregates.
UNIT_COLUMNS = ("doc", "depth", "trial")


# -- sharing what one report computes several times --------------------------------------------------------
# Inside `shared`, a selection, estimates, a paired comparison or an effective length asked for again on the
# same rows (the same frame, or one equal to it) with the same arguments is computed once and handed out as a
# copy. Outside it nothing is kept, so a caller that edits its frame between calls never reads a stale
# answer; the report and the summary open one scope around their own work.
T = TypeVar("T")


class _Memo:
    def __init__(self) -> None:
        self.frames: list[pd.DataFrame] = []  # kept alive: a token stays one frame's for the scope's life
        self.types: dict[int, list] = {}  # a kept frame's Python value types, per object column
        self.values: dict[tuple, Any] = {}

    def token(self, df: pd.DataFrame) -> int:
        """The same number for the same frame or one with equal content (index, columns, dtypes, attrs, and
        the Python types of object values: ``equals`` takes 1 for 1.0 and None for NaN, which print apart)."""
        for i, f in enumerate(self.frames):
            if f is df:
                return i
        mine = None
        for i, f in enumerate(self.frames):
            try:
                same = (
                    f.shape == df.shape
                    and f.columns.equals(df.columns)
                    and f.index.equals(df.index)
                    and f.dtypes.equals(df.dtypes)
                    and f.attrs == df.attrs
                    and f.equals(df)
                )
                if same:
                    if i not in self.types:
                        self.types[i] = _value_types(f)
                    mine = _value_types(df) if mine is None else mine
                    same = self.types[i] == mine
            except Exception:  # noqa: BLE001 - content that will not compare is simply not shared
                same = False
            if same:
                return i
        self.frames.append(df)
        return len(self.frames) - 1


def _value_types(df: pd.DataFrame) -> list:
    return [list(map(type, df.iloc[:, k].tolist())) for k, dtype in enumerate(df.dtypes) if dtype == object]


_SCOPE: contextvars.ContextVar[_Memo | None] = contextvars.ContextVar("ropebench_results_memo", default=None)


@contextmanager
def shared() -> Iterator[None]:
    """A scope in which `remember` keeps its answers (nested scopes share the outermost one)."""
    if _SCOPE.get() is not None:
        yield
        return
    reset = _SCOPE.set(_Memo())
    try:
        yield
    finally:
        _SCOPE.reset(reset)


def freeze(value: Any) -> Hashable:
    """A hashable stand-in for an argument (dicts and lists by their items; anything else by its repr)."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted((repr(k), freeze(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(freeze(v) for v in value))
    return (type(value).__name__, repr(value))


def remember(name: str, df: pd.DataFrame, args: Any, compute: Callable[[], T], copy: Callable[[T], T]) -> T:
    """``compute()``, or inside `shared` the answer an earlier call with the same ``name``, rows (``df``) and
    ``args`` got (a ``copy`` of it: callers may edit what they get). Errors are not kept."""
    memo = _SCOPE.get()
    if memo is None or not isinstance(df, pd.DataFrame):
        return compute()
    key = (name, memo.token(df), freeze(args))
    if key not in memo.values:
        memo.values[key] = compute()
    return copy(memo.values[key])


def copy_frame(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.copy(deep=True)  # attrs travel with it


def is_unit(rows: pd.DataFrame) -> pd.Series:
    """True for per-unit rows (a document, a prompt, a query), False for aggregated rows."""
    cols = list(UNIT_COLUMNS)
    missing = [c for c in cols if c not in rows.columns]
    if missing or rows.columns.duplicated().any():
        return rows[cols].notna().any(axis=1)  # the KeyError / the general case
    mask = np.zeros(len(rows), dtype=bool)
    for c in cols:
        mask |= rows[c].notna().to_numpy(dtype=bool)
    return pd.Series(mask, index=rows.index, dtype=bool)


def _scalars(column: pd.Series) -> list:
    """The column's values as the Python scalars iterating it yields (what ``itertuples`` hands out)."""
    values = column._values
    if isinstance(values, np.ndarray) and values.dtype.kind in "biufO":
        return values.tolist()  # the same objects ``ndarray.item`` gives, in one call
    return list(column)


def unit_key(rows: pd.DataFrame) -> pd.Series:
    """One string per unit row that names the same document / prompt in every setting (pairs them)."""
    cols = [*UNIT_COLUMNS, "seed"]
    if rows.columns.duplicated().any() or any(c not in rows.columns for c in cols):
        tuples = rows[cols].itertuples(index=False)  # the KeyError / the general case
    else:
        tuples = zip(*(_scalars(rows[c]) for c in cols))
    return pd.Series(["|".join(map(str, t)) for t in tuples], index=rows.index, dtype=object)


def unit_labels(rows: pd.DataFrame, keys: pd.Series | None = None) -> pd.Series:
    """The independent unit of each unit row: its ``cluster`` id when it has one (rows that share it are one
    unit, paired across settings by that id), else the row itself (its `unit_key`; ``keys`` when the caller
    has them already)."""
    keys = unit_key(rows) if keys is None else keys
    if "cluster" not in rows.columns:
        return "row:" + keys
    clusters = rows["cluster"]
    return pd.Series(
        [f"cluster:{c}" if pd.notna(c) else f"row:{k}" for c, k in zip(clusters, keys)],
        index=rows.index,
        dtype=object,
    )


def _one(rows: pd.DataFrame, column: str) -> str | None:
    values = rows[column].dropna().unique() if column in rows.columns else []
    return str(values[0]) if len(values) == 1 else None


def meaning_for(rows: pd.DataFrame, task: str | None = None, metric: str | None = None) -> Metric:
    """What a metric means, from its rows' declaration (``meaning``), else the explicit fallback
    (results.meaning.fallback). ``task``/``metric`` default to the rows' own when they hold one of each."""
    task = task if task is not None else _one(rows, "task")
    metric = metric if metric is not None else _one(rows, "metric")
    if len(rows) and "task" in rows.columns and "metric" in rows.columns:
        found = declarations(rows[(rows["task"] == task) & (rows["metric"] == metric)])
        if (task, metric) in found:
            return found[(task, metric)]
    return fallback(task, metric)


def out_of_range(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose value breaks its metric's declared range (lo/hi: a rate above 1, a perplexity below 1), so
    a report can flag them; empty when every value fits (or nothing is declared)."""
    if df is None or not len(df):
        return df.iloc[0:0] if isinstance(df, pd.DataFrame) else pd.DataFrame()
    return df[out_of_range_mask(df)]


def cell_interval(
    rows: pd.DataFrame, metric: str, *, seed: int = 0, meaning: Metric | None = None
) -> Interval:
    """Estimate, n and 95% interval of one table cell, treated as ``meaning`` says (default: the rows'
    declaration, `meaning_for`).

    Per-unit rows present: the cell statistic over units (perplexities token-weighted on the log scale) with a
    Wilson interval for 0/1 rates, a skew-robust t (stats.skew_t) for perplexities on the log scale, else a t
    interval over the units (none below 3 units); rows that share a ``cluster`` count as one unit
    (results.stats: Wilson at the effective number of clusters, t over the clusters' statistics). Only
    aggregated rows: a rate (accuracy over ``n`` queries) gets its Wilson interval from value x n; one other
    aggregate has no interval (n = its own ``n``); several (e.g. runs with different seeds) get a Student-t
    interval. A declared rate whose values leave [0, 1] gets no interval
    (`out_of_range` names those rows).
    """
    meaning = meaning or meaning_for(rows, metric=metric)
    kind, unit = meaning.stat_kind, meaning.independent_unit
    rows = rows[rows["value"].notna()]
    if kind == "rate" and not rows["value"].between(0.0, 1.0).all():
        return _no_interval(rows, unit)
    units = rows[is_unit(rows)]
    if len(units):
        units = units.assign(_key=unit_key(units)).sort_values("_key", kind="stable")
        values = units["value"].to_numpy(float)
        weights = None if kind == "rate" else units["n"].fillna(1).to_numpy(float)
        labels = unit_labels(units, units["_key"]).to_numpy(object)
        return stats_cell_interval(kind, values, weights, seed=seed, clusters=labels, unit=unit)
    values = rows["value"].to_numpy(float)
    if not len(values):
        return Interval(math.nan, math.nan, math.nan, 0, "none", 0, unit)
    if kind == "rate" and rows["n"].notna().all() and (rows["n"] >= 0).all():
        trials = float(rows["n"].sum())
        hits = float((rows["value"] * rows["n"]).sum())
        return Interval(hits / trials, *wilson(hits, trials), int(trials), "wilson", int(trials), unit)
    if len(values) == 1:
        return _no_interval(rows, unit)
    mean = float(values.mean())
    half = t975(len(values) - 1) * float(values.std(ddof=1)) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values), "t", len(values), unit)


def _no_interval(rows: pd.DataFrame, unit: str) -> Interval:
    """The plain mean of the values, no interval; n: one row's own ``n`` (an aggregate), else the rows."""
    values = rows["value"].to_numpy(float)
    if not len(values):
        return Interval(math.nan, math.nan, math.nan, 0, "none", 0, unit)
    n = rows["n"].iloc[0] if len(rows) == 1 else len(rows)
    n = 1 if pd.isna(n) else int(n)
    return Interval(float(values.mean()), math.nan, math.nan, n, "none", n, unit)


def _as_list(x: str | Sequence[str] | None) -> list[str]:
    """A column name or a list of them (rows=, cols=, by=) as a list."""
    if x is None:
        return []
    if isinstance(x, str):
        return [x]
    if not isinstance(x, (list, tuple)) or not all(isinstance(c, str) for c in x):
        raise ResultsError(
            f"rows, cols and by take a column name or a list of them, got {type(x).__name__} {_shown(x)} — "
            f"e.g. rows='method', cols=['length']"
        )
    return list(x)


def select(
    df: pd.DataFrame, task: str, metric: str, *, status_ok: bool = True, units: bool = False, **where: Any
) -> pd.DataFrame:
    """Rows of one task/metric (ok rows only), with optional equality filters ``column=value|[values]``.

    When both per-unit rows (per document, ...) and aggregated rows exist, only the aggregated ones are
    returned unless ``units=True`` (then all). Unknown task or metric -> :class:`ResultsError` listing the
    available ones.
    """
    return remember(
        "select",
        df,
        (task, metric, status_ok, units, where),
        lambda: _select(df, task, metric, status_ok=status_ok, units=units, **where),
        copy_frame,
    )


def _select(
    df: pd.DataFrame, task: str, metric: str, *, status_ok: bool, units: bool, **where: Any
) -> pd.DataFrame:
    if not isinstance(df, pd.DataFrame):
        raise ResultsError(
            f"expected the records as a DataFrame, got {type(df).__name__} — pass results.load(run_dir) "
            f"as the first argument, e.g. results.table(results.load('runs/demo'), 'passkey', 'correct')"
        )
    missing = [c for c in ("task", "metric", "value") if c not in df.columns]
    if missing:
        raise ResultsError(
            f"the frame lacks the column(s) {', '.join(missing)} — pass the frame that results.load(run_dir) "
            f"returns"
        )
    if len(df) == 0:
        raise ResultsError("no rows to tabulate — load a run directory with records first")
    tasks = sorted(df["task"].dropna().unique())
    if task not in tasks:
        raise ResultsError(f"unknown task {task!r} — available tasks: {', '.join(tasks) or '(none)'}")
    sub = df[df["task"] == task]
    if status_ok:
        sub = sub[sub["status"].isna() | (sub["status"] == "ok")]
    metrics = sorted(sub["metric"].dropna().unique())
    if metric not in metrics:
        raise ResultsError(
            f"unknown metric {metric!r} for task {task!r} — available metrics: "
            f"{', '.join(metrics) or '(none: every row failed)'}"
        )
    sub = sub[sub["metric"] == metric]
    if status_ok:  # a value outside its metric's declared range is no measurement (results/ranges.py)
        kept = within_range(sub)
        if len(sub) and not len(kept):
            raise ResultsError(
                f"every {task}/{metric} value ({len(sub)} rows) is outside the metric's declared range — "
                f"check the task that wrote them"
            )
        sub = kept
    for col, want in where.items():
        if want is None:
            continue
        if col not in sub.columns:
            raise ResultsError(
                f"unknown column {col!r} in filter — columns: {', '.join(map(str, df.columns))}"
            )
        wanted = list(want) if isinstance(want, (list, tuple, set)) else [want]
        sub = sub[sub[col].isin(wanted)]
        if sub.empty:
            have = sorted(df.loc[(df["task"] == task) & (df["metric"] == metric), col].dropna().unique())
            have = [_fmt_key(v) for v in have]
            raise ResultsError(f"no {task}/{metric} rows with {col}={want!r} — available: {', '.join(have)}")
    # Prefer aggregated rows (doc is None) when per-document rows exist too (e.g. perplexity over docs).
    if not units and sub["doc"].isna().any() and sub["doc"].notna().any():
        sub = sub[sub["doc"].isna()]
    return sub


def check_axes(
    df: pd.DataFrame, rows: Sequence[str], cols: Sequence[str], names: tuple[str, str] = ("rows", "cols")
) -> None:
    """Every row and column variable is a column of ``df``, and none is used twice (ResultsError, one line;
    ``names`` are what the caller calls them, e.g. the CLI's --rows/--cols)."""
    for name, keys in zip(names, (rows, cols)):
        for key in keys:
            if not isinstance(key, str) or key not in df.columns:
                have = ", ".join(str(c) for c in df.columns if c not in ("value", "error", "written"))
                raise ResultsError(f"{name} {key!r} is not a column of the records — use one of: {have}")
    both = [k for i, k in enumerate([*rows, *cols]) if k in [*rows, *cols][:i]]
    if both:
        raise ResultsError(
            f"{both[0]!r} is given twice as {names[0]}/{names[1]} — use each column once, e.g. "
            f"{names[0]} method and {names[1]} length"
        )


def _auto_rows(sub: pd.DataFrame, rows: list[str], cols: list[str]) -> list[str]:
    """Add identity columns that vary within a (rows x cols) cell so settings are never averaged together."""
    check_axes(sub, rows, cols)
    rows = list(rows)
    for col in IDENTITY:
        if col in rows or col in cols:
            continue
        keys = rows + cols
        varies = (
            (sub.groupby(keys, dropna=False)[col].nunique(dropna=False) > 1).any()
            if keys
            else sub[col].nunique(dropna=False) > 1
        )
        if varies:
            rows.append(col)
    return rows


def estimates(
    df: pd.DataFrame,
    task: str,
    metric: str,
    by: str | Sequence[str] = ("method", "length"),
    *,
    seed: int = 0,
    **where: Any,
) -> pd.DataFrame:
    """The estimates a table shows, in long form: one row per group of ``by`` (a table cell) with ``mean``
    (the estimate), ``n`` (independent units behind it: documents, trials, haystacks), ``rows`` (the rows
    behind them: questions, prompts), ``lo``/``hi`` (95% interval,
    see :func:`cell_interval`), ``half`` (half-width) and ``interval`` (how it was computed: wilson, t,
    wilson (clusters), t (clusters) or none). ``attrs["unit"]``: the declared independent unit."""
    return remember(
        "estimates",
        df,
        (task, metric, by, seed, where),
        lambda: _estimates(df, task, metric, by, seed=seed, **where),
        copy_frame,
    )


def _estimates(
    df: pd.DataFrame, task: str, metric: str, by: str | Sequence[str], *, seed: int, **where: Any
) -> pd.DataFrame:
    sub = select(df, task, metric, units=True, **where)
    by = _auto_rows(sub, _as_list(by), [])
    meaning = meaning_for(sub, task, metric)
    out = []
    for key, g in sub.groupby(by, dropna=False, sort=True):
        ci = cell_interval(g, metric, seed=seed, meaning=meaning)
        key = key if isinstance(key, tuple) else (key,)
        out.append(
            {
                **dict(zip(by, key)),
                "mean": ci.estimate,
                "n": ci.n,
                "rows": ci.rows,
                "lo": ci.lo,
                "hi": ci.hi,
                "half": (ci.hi - ci.lo) / 2,
                "interval": ci.method,
            }
        )
    frame = pd.DataFrame(out)
    frame.attrs["unit"] = meaning.independent_unit  # the same for every row: stated once
    return frame


def fmt_interval(
    estimate: float,
    lo: float,
    hi: float,
    n: int | None = None,
    digits: int | None = None,
    rows: int | None = None,
) -> str:
    """``"0.833 [0.437, 0.970] n=6"``: the estimate, its 95% interval (when there is one) and n (independent
    units); ``"... n=1 (6 rows)"`` when more rows share those units."""
    fmt = (lambda v: f"{v:.{digits}f}") if digits is not None else fmt_number
    s = fmt(estimate)
    if np.isfinite(lo) and np.isfinite(hi):
        s += f" [{fmt(lo)}, {fmt(hi)}]"
    if n is None or pd.isna(n):
        return s
    s = f"{s} n={int(n)}"
    return s if rows is None or pd.isna(rows) or int(rows) == int(n) else f"{s} ({int(rows)} rows)"


def _order_methods(index: pd.Index, first: str = "plain") -> pd.Index:
    # The baseline first, then alphabetical: the reader compares everything to the first row.
    if "method" not in (index.names or []):
        return index
    level = index.get_level_values("method")
    order = sorted(
        range(len(index)),
        key=lambda i: (
            level[i] != first,
            tuple(str(v) for v in (index[i] if isinstance(index[i], tuple) else (index[i],))),
        ),
    )
    return index[order]


def table(
    df: pd.DataFrame,
    task: str,
    metric: str,
    rows: str | Sequence[str] = "method",
    cols: str | Sequence[str] | None = "length",
    *,
    with_ci: bool = False,
    stat: str = "mean",
    digits: int | None = None,
    seed: int = 0,
    **where: Any,
) -> pd.DataFrame:
    """Pivot of ``metric`` for ``task``: ``rows`` x ``cols``, averaging over trials/docs/depths.

    ``stat`` picks the cell value: "mean" (default), "n" (independent units), "rows", "lo", "hi" or "half"
    (95% half-width). ``with_ci=True`` returns strings "mean [lo, hi] n=N" (no brackets where no interval
    exists; "n=1 (6 rows)" when rows share a cluster) ready to render: as the metric's declaration says,
    Wilson intervals for 0/1 rates, a t interval over documents / prompts otherwise (perplexities:
    skew-robust, on the log scale; from 3 units on). Columns such as factor/model/corpus are added to the rows
    when they vary, so different settings are never averaged together. ``where`` filters rows, e.g.
    ``corpus="sotu", factor=[1, 4]``.
    """
    rows_l, cols_l = _as_list(rows), _as_list(cols)
    sub = select(df, task, metric, **where)
    rows_l = _auto_rows(sub, rows_l, cols_l)
    if stat not in ("mean", "n", "rows", "lo", "hi", "half"):
        raise ResultsError(f"unknown stat {stat!r} — use mean, n, rows, lo, hi or half")
    s = estimates(df, task, metric, by=rows_l + cols_l, seed=seed, **where)
    if with_ci:
        s["cell"] = [
            fmt_interval(m, lo, hi, n, digits, r)
            for m, lo, hi, n, r in zip(s["mean"], s["lo"], s["hi"], s["n"], s["rows"])
        ]
        value = "cell"
    else:
        value = stat
    if cols_l:
        t = s.set_index(rows_l + cols_l)[value].unstack(cols_l)  # unstack keeps NA keys (pivot drops them)
        t = t.dropna(how="all").sort_index(axis=1)
    else:
        t = s.set_index(rows_l)[[value]].rename(columns={value: metric})
    if not with_ci and stat == "mean" and digits is not None:
        t = t.round(digits)
    t = t.reindex(_order_methods(t.index))
    t.columns.name = cols_l[0] if len(cols_l) == 1 else t.columns.name
    return t


# -- writers -----------------------------------------------------------------------------------------
def fmt_number(v: Any) -> str:
    """Compact, fixed-width-ish numbers: 3 decimals for rates/ratios, fewer for large perplexities."""
    if isinstance(v, str):
        return v
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or pd.isna(v):
        return "–" if v is None or pd.isna(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    a = abs(float(v))
    if a >= 1e5:
        return f"{v:.3g}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 10:
        return f"{v:.2f}"
    return f"{v:.3f}"


def _flat(t: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Header and string cells with the row index levels as leading columns."""
    names = [str(n) if n is not None else "" for n in (t.index.names or [None])]
    if isinstance(t.columns, pd.MultiIndex):
        cols = [" / ".join(fmt_number(c) for c in col) for col in t.columns]
    else:
        cols = [fmt_number(c) for c in t.columns]
    header = names + cols
    body = []
    for idx, row in zip(t.index, t.itertuples(index=False)):
        idx = idx if isinstance(idx, tuple) else (idx,)
        body.append([_fmt_key(i) for i in idx] + [fmt_number(v) for v in row])
    return header, body


def _fmt_key(v: Any) -> str:
    # Row labels: factors as 2 / 0.5 (not 2.000), missing as empty.
    if isinstance(v, (float, np.floating)):
        return "" if math.isnan(v) else f"{v:g}"
    return "" if v is None else str(v)


_NUM = r"(?:[-+]?[\d.]+(?:e[-+]?\d+)?|[-+]?inf|–|nan)"
# "0.833", "0.833 ± 0.2", "0.833 [0.437, 0.970] n=6 *", "≥ 10240": numbers, right-aligned
_NUMERIC_CELL = re.compile(
    rf"^\s*(?:baseline|(?:[<≥>]\s*)?{_NUM}?(?:\s*±\s*{_NUM})?(?:\s*\[{_NUM}, {_NUM}\])?"
    rf"(?:\s*n={_NUM}(?:\s*\(\d+ rows\))?)?"
    rf"\s*\*?)\s*$"
)


def _numeric_column(cells: list[str]) -> bool:
    return all(_NUMERIC_CELL.match(c) for c in cells)


def _check_table(t: Any, path: Any) -> None:
    """A table from `table`/`compare` (a DataFrame) and, when given, a path: ResultsError otherwise."""
    check_frame(t, "results.to_markdown(results.table(df, 'passkey', 'correct'), 'out.md')")
    if path is not None:
        as_path(path, "table file", "results.to_markdown(t, 'tables/passkey.md')")


def to_markdown(t: pd.DataFrame, path: str | os.PathLike | None = None, caption: str | None = None) -> str:
    """GitHub markdown table (numbers right-aligned); also written to ``path`` when given."""
    _check_table(t, path)
    header, body = _flat(t)
    nidx = len(t.index.names or [None])
    lines = []
    if caption:
        lines += [f"**{caption}**", ""]

    def esc(s: str) -> str:  # a pipe inside a cell would end it
        return s.replace("|", "\\|")

    lines.append("| " + " | ".join(esc(h) for h in header) + " |")
    right = [i >= nidx and _numeric_column([row[i] for row in body]) for i in range(len(header))]
    lines.append("|" + "|".join("---:" if r else ":---" for r in right) + "|")
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in body]
    text = "\n".join(lines) + "\n"
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


def to_csv(t: pd.DataFrame, path: str | os.PathLike | None = None) -> str:
    """CSV with full precision (for spreadsheets and re-analysis)."""
    _check_table(t, path)
    flat = t.copy()
    if isinstance(flat.columns, pd.MultiIndex):
        flat.columns = [" / ".join(map(str, c)) for c in flat.columns]
    text = flat.to_csv()
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


_LATEX_ESC = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "–": "--",
}


def _latex_escape(s: str) -> str:
    return "".join(_LATEX_ESC.get(ch, ch) for ch in s)


def to_latex(
    t: pd.DataFrame,
    path: str | os.PathLike | None = None,
    caption: str | None = None,
    label: str | None = None,
) -> str:
    """A booktabs ``table`` environment (needs ``\\usepackage{booktabs}``)."""
    _check_table(t, path)
    header, body = _flat(t)
    nidx = len(t.index.names or [None])
    spec = "".join(
        "r" if i >= nidx and _numeric_column([row[i] for row in body]) else "l" for i in range(len(header))
    )
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{_latex_escape(caption)}}}")
    if label:
        lines.append(rf"\label{{{label}}}")
    lines += [
        rf"\begin{{tabular}}{{{spec}}}",
        r"\toprule",
        " & ".join(_latex_escape(h) for h in header) + r" \\",
        r"\midrule",
    ]
    lines += [" & ".join(_latex_escape(c) for c in row) + r" \\" for row in body]
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    text = "\n".join(lines) + "\n"
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


def write_table(t: pd.DataFrame, stem: str | os.PathLike, caption: str | None = None) -> dict[str, Path]:
    """Write ``stem.md``, ``stem.csv`` and ``stem.tex``; returns the paths by format."""
    _check_table(t, stem)
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = {ext: stem.with_name(f"{stem.name}.{ext}") for ext in ("md", "csv", "tex")}
    to_markdown(t, paths["md"], caption=caption)
    to_csv(t, paths["csv"])
    to_latex(t, paths["tex"], caption=caption, label=f"tab:{stem.name}")
    return paths
