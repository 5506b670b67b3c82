"""Argument types of the results API, checked where a call enters it: a wrong type (a number for a path, a
list for a frame) raises `ResultsError` (a RopebenchError: one line `error: ...` in the CLIs), never a bare
TypeError or AttributeError from deep inside pandas or pathlib."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from .store import ResultsError, check_path_text


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def as_path(value: Any, what: str, example: str) -> Path:
    """`value` as a Path: a str or os.PathLike whose name is UTF-8 (records and reports store it as text)."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise ResultsError(
            f"{what} must be a path (str or pathlib.Path), got {type(value).__name__} {_shown(value)} — "
            f"e.g. {example}"
        )
    check_path_text(value, what)
    return Path(value)


def as_paths(value: Any, what: str, example: str) -> list[Path]:
    """One path or a non-empty iterable of them (not a mapping, not bytes), each as `as_path` takes it."""
    if isinstance(value, (str, os.PathLike)):
        value = [value]
    if not isinstance(value, Iterable) or isinstance(value, (bytes, Mapping)):
        raise ResultsError(
            f"{what} must be a path or a list of paths, got {type(value).__name__} {_shown(value)} — "
            f"e.g. {example}"
        )
    paths = [as_path(p, what, example) for p in value]
    if not paths:
        raise ResultsError(f"no {what} given — pass one or a list of them, e.g. {example}")
    return paths


def check_frame(value: Any, example: str) -> None:
    """`value` is a DataFrame (the records, or a table made from them)."""
    if not isinstance(value, pd.DataFrame):
        raise ResultsError(
            f"expected a DataFrame, got {type(value).__name__} {_shown(value)} — e.g. {example}"
        )
