"""``load``: stored records of one or many runs -> one tidy DataFrame with the documented schema;
``from_lm_eval``: the same for lm-eval results files alone."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .arguments import as_path, as_paths
from .lm_eval_import import lm_eval_rows
from .longppl import derive as derive_longppl
from .store import (
    BOOKKEEPING,
    JSON_COLUMNS,
    SCHEMA,
    ResultsError,
    canonical_json,
    latest_rows,
    read_jsonl,
    record_files,
)

# What every row a sweep writes carries besides the measurement: a records file without any of them is not
# a ropebench run (`check_identity`).
IDENTITY = ("model", "method", "length")
FLOAT_COLUMNS = ("factor", "depth", "value", "seconds", "cell_seconds", "load_seconds")
INT_COLUMNS = ("length", "trial", "distance", "n", "seed")
STR_COLUMNS = ("run", "cell", "model", "method", "task", "corpus", "doc", "metric", "status", "error")
ID_COLUMNS = ("cluster",)  # text ids; an integer id (a plugin's) reads as its digits, never "3.0"
MEANING = "meaning"  # the metric's declaration as canonical JSON text (results/meaning.py)
# The identity of one measured value: two rows equal on all of these are copies of the same number — the
# schema's columns up to the metric, less the two derived from them (a row's cluster and needle distance).
KEY_COLUMNS = tuple(c for c in SCHEMA[: SCHEMA.index("metric") + 1] if c not in ("cluster", "distance"))


def _as_paths(path_or_paths: Any) -> list[Path]:
    """The run directories given, each a str or path whose name is UTF-8 (records store it as text)."""
    return as_paths(path_or_paths, "run directory", "results.load('runs/demo')")


def _rows_of(path: Path) -> list[dict[str, Any]]:
    """Rows of one source with "latest wins" applied inside it (a resume writes into the same directory;
    different directories are different sweeps and never replace each other's rows)."""
    if not path.exists():
        raise ResultsError(
            f"run directory not found: {path} — check the path (a sweep's output directory "
            f"holds records*.jsonl)"
        )
    if path.is_dir() and path.suffix in (".jsonl", ".json"):
        raise ResultsError(
            f"{path} is a directory, not a records file — pass the run directory that holds "
            f"records*.jsonl (or a records .jsonl file)"
        )
    if path.is_file():
        if path.suffix == ".json":  # an lm-eval results file sits in the same tables
            return lm_eval_rows(path)
        files = [path]
        default_run = path.parent.name
    else:
        files = record_files(path)
        default_run = path.name
    if not files:
        raise ResultsError(
            f"no records in {path} — expected records*.jsonl there; run a sweep into this "
            f"directory first (or point to the right one)"
        )
    rows: list[dict[str, Any]] = []
    for f in files:
        found = read_jsonl(f, strict=True)  # a foreign file: one line naming it, not empty tables
        check_identity(f, found)
        for r in found:
            r.setdefault("run", default_run if f.parent == path or path.is_file() else f.parent.name)
            r["_source"] = str(f.parent)
            rows.append(r)
    return latest_rows_by_source(rows)


def check_identity(path: Path, rows: list[dict[str, Any]]) -> None:
    """A records file whose rows say what was measured but never on which model, with which method or at which
    length (e.g. only run/cell/task/metric/value) is not a ropebench run: its report would be near-empty
    tables. Refused with the missing fields named; a field one row carries is enough (an error row may have
    no length). lm-eval results files are read by `lm_eval_rows`, not here."""
    missing = [k for k in IDENTITY if not any(r.get(k) not in (None, "") for r in rows)]
    missing = [k for k in missing if k != "length" or not any("length" in r for r in rows)]
    if rows and missing:
        raise ResultsError(
            f"{path} is not a ropebench run: none of its {len(rows)} records carries {', '.join(missing)} "
            "(a sweep writes them on every row) — point to a sweep's run directory (an lm-eval results .json "
            "loads as it is)"
        )


def latest_rows_by_source(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_source: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_source.setdefault(r.get("_source", ""), []).append(r)
    return [r for group in by_source.values() for r in latest_rows(group)]


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Schema columns first (missing ones added as NA), documented dtypes, canonical JSON options."""
    df = df.copy()
    for col in SCHEMA:
        if col not in df.columns:
            df[col] = None
    for col in JSON_COLUMNS:
        df[col] = [canonical_json(v) for v in df[col]]
    for col in FLOAT_COLUMNS:
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    for col in INT_COLUMNS:
        num = pd.to_numeric(df[col], errors="coerce")
        try:
            df[col] = num.astype("Int64")
        except (TypeError, ValueError):  # a non-integer value: keep it rather than fail
            df[col] = num
    for col in STR_COLUMNS:
        df[col] = pd.Series([None if _isna(v) else str(v) for v in df[col]], index=df.index, dtype="object")
    for col in ID_COLUMNS:
        df[col] = pd.Series([_id_text(v) for v in df[col]], index=df.index, dtype="object")
    df[MEANING] = pd.Series([_meaning_text(v) for v in df[MEANING]], index=df.index, dtype="object")
    extras = sorted(
        c for c in df.columns if c not in SCHEMA and c not in BOOKKEEPING and not c.startswith("_")
    )
    tail = [c for c in ("written",) if c in df.columns]
    return df[list(SCHEMA) + extras + tail]


def _id_text(v: Any) -> str | None:
    if _isna(v):
        return None
    if isinstance(v, float) and v.is_integer():  # pandas widens an integer column holding None to floats
        return str(int(v))
    return str(v)


def _meaning_text(v: Any) -> str | None:
    """A declaration as canonical JSON text (sorted keys, compact), so rows of one metric compare equal; text
    that is not JSON is kept as it is (results.meaning reads it as no declaration)."""
    if isinstance(v, Mapping):
        return json.dumps(dict(v), sort_keys=True, separators=(",", ":"))
    if not isinstance(v, str) or not v.strip():
        return None
    try:
        parsed = json.loads(v)
    except json.JSONDecodeError:
        return v
    return json.dumps(parsed, sort_keys=True, separators=(",", ":")) if isinstance(parsed, dict) else v


def _isna(v: Any) -> bool:
    try:
        return v is None or bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def load(path_or_paths: str | os.PathLike | Iterable[str | os.PathLike]) -> pd.DataFrame:
    """One tidy DataFrame over one or many run directories (all ``records*.jsonl`` of all ranks).

    A path may also be a single ``.jsonl`` file or an lm-eval results ``.json``. When a cell was
    recomputed (resume), only its latest rows are kept. LongPPL's per-token losses (``longppl_token_losses``)
    become ``longppl`` and ``longppl_key_tokens`` rows, key tokens chosen from the compared settings
    (results/longppl.py). Raises :class:`ResultsError` for a missing
    directory or when there are no records.
    """
    paths = _as_paths(path_or_paths)
    rows = [r for p in paths for r in _rows_of(p)]
    if not rows:
        raise ResultsError(
            f"no records in {', '.join(map(str, paths))} — the records files are empty; "
            f"run (or resume) the sweep first"
        )
    df = pd.DataFrame.from_records(rows)
    if "written" in df.columns:
        df["written"] = pd.to_numeric(df["written"], errors="coerce")
    df = normalize(df)
    # Same measured value written twice (e.g. the same cell appended twice in one session): keep the last.
    df = df.loc[~df[list(KEY_COLUMNS)].astype(str).duplicated(keep="last")]
    # LongPPL of the default evaluator: key tokens chosen from the compared settings' per-token losses
    derived = derive_longppl(df)
    if derived is not df:
        df = normalize(derived)
    return df.reset_index(drop=True)


def from_lm_eval(
    path: str | os.PathLike,
    *,
    run: str | None = None,
    method: str | None = None,
    factor: float | None = None,
    length: int | None = None,
) -> pd.DataFrame:
    """An lm-eval results JSON (or a directory of them) as a DataFrame with the ropebench schema.

    method/factor/options are what the ``ropebench`` model recorded in the results config (the patch's
    resolved options, as the sweep records them); for other models (stock ``hf``) they come from
    ``config.model_args`` ("pretrained=...,method=yarn,factor=2"; no method means "plain" at factor 1, and
    model_args that are not loading arguments become the ``options``). ``method``/``factor`` given here win.
    ``metric`` is lm-eval's metric name (with ",filter" appended unless the filter is "none"), ``n`` the
    effective sample count, and the standard error goes to an extra ``stderr`` column. ``length`` comes
    from the task config's ``metadata.length`` when present, else the argument.
    """
    path = as_path(path, "lm-eval results", "results.from_lm_eval('lm_eval_out/results.json')")
    rows = lm_eval_rows(path, run=run, method=method, factor=factor, length=length)
    if not rows:
        raise ResultsError(f"no metric values in {path} — the lm-eval results section is empty")
    return normalize(pd.DataFrame.from_records(rows)).reset_index(drop=True)
