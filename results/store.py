"""Durable storage of result rows: JSON lines appended atomically, plus a manifest per run.

Why JSON lines: a killed process can at worst leave one partial *last* line, which readers detect
and drop; every complete line is a finished measurement that is never lost. Never pickle.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

# Column order of the tidy table (docs/CONTRACTS.md). `written` and `session` are bookkeeping added by
# the writer: they decide which copy of a recomputed cell wins.
SCHEMA: tuple[str, ...] = (
    "run", "cell", "model", "method", "factor", "options", "task", "corpus", "task_options",
    "length", "depth", "doc", "trial", "metric", "value", "n", "seed", "seconds", "status", "error",
)
BOOKKEEPING: tuple[str, ...] = ("written", "session")
JSON_COLUMNS = ("options", "task_options")
RECORDS_GLOB = "records*.jsonl"


class ResultsError(ValueError):
    """A user error in the results layer; the message says what is wrong and what to do."""


class ResultsWarning(UserWarning):
    """Recoverable damage in stored results (e.g. a truncated last line after a kill)."""


def canonical_json(value: Any) -> str:
    """Options as one canonical string (sorted keys, compact) so equal options compare equal."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        value = {}
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError:
            return value  # not JSON: keep the user's string rather than lose it
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_json_default)


def _json_default(obj: Any) -> Any:
    # numpy / torch scalars and arrays, paths, sets: turn into plain JSON values instead of failing.
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


def _now_iso() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(path: Path) -> None:
    # Make the file's directory entry durable too (new file / rename); not possible on every OS.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write a whole file or nothing: temp file in the same directory, fsync, os.replace."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, text.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _library_versions() -> dict[str, str | None]:
    # importlib.metadata reads versions without importing the (heavy) libraries.
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("ropebench", "torch", "transformers", "datasets", "lm_eval", "accelerate", "pandas",
                 "numpy", "seaborn"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def _git_commit(cwd: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """Commit of the working tree (read-only git calls); None outside a repo or without commits."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10, check=False)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=10, check=False)
        return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


class RecordWriter:
    """Appends result rows to ``<run_dir>/records.jsonl`` (``records.rank{N}.jsonl`` for rank N > 0 ...).

    Each call to :meth:`write` appends all its rows with one ``os.write`` on an ``O_APPEND`` descriptor
    followed by ``fsync``: after a crash a batch is either on disk as whole lines or (at worst) leaves one
    partial last line, which readers drop with a warning.
    """

    def __init__(self, run_dir: str | os.PathLike, rank: int | None = None):
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.run_dir.mkdir(parents=True, exist_ok=True)
        suffix = "" if rank is None else f".rank{int(rank)}"
        self.path = self.run_dir / f"records{suffix}.jsonl"
        self.manifest_path = self.run_dir / ("manifest.json" if not rank else f"manifest.rank{int(rank)}.json")
        # One id per writer instance: a resume creates a new writer, so rows of a recomputed cell
        # from the newest session replace the older ones on load.
        self.session = f"{time.time_ns():x}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self._repair_tail()

    def _repair_tail(self) -> None:
        """A previous process killed mid-write may have left a partial last line: cut it off so the
        next append starts on a fresh line (the partial row was never a finished measurement)."""
        if not self.path.exists():
            return
        with open(self.path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            block = 1 << 16
            pos = size
            keep = 0
            while pos > 0:
                start = max(0, pos - block)
                f.seek(start)
                chunk = f.read(pos - start)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                pos = start
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        warnings.warn(f"{self.path}: removed a partial last line ({size - keep} bytes) left by an "
                      f"interrupted write", ResultsWarning, stacklevel=3)

    def write(self, records: Iterable[dict[str, Any]]) -> int:
        """Append ``records`` (dicts with the row schema); returns the number of rows written."""
        written = time.time_ns()
        lines = []
        for rec in records:
            if not isinstance(rec, dict):
                raise ResultsError(f"a record must be a dict, got {type(rec).__name__} — pass a list of dicts")
            row = dict(rec)
            for col in JSON_COLUMNS:
                if col in row:
                    row[col] = canonical_json(row[col])
            row["written"] = written
            row["session"] = self.session
            lines.append(json.dumps(row, sort_keys=True, default=_json_default) + "\n")
        if not lines:
            return 0
        new_file = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _write_all(fd, "".join(lines).encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        if new_file:
            _fsync_dir(self.run_dir)
        return len(lines)

    # -- manifest ---------------------------------------------------------------------------------
    def _read_manifest(self) -> dict[str, Any]:
        try:
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            return {}

    def write_manifest(self, config: dict | None = None, seed: int | None = None, device: str | None = None,
                       extra: dict | None = None) -> dict[str, Any]:
        """Write ``manifest.json`` (config, seed, device, library versions, git commit, start time).

        On a resume the first start time is kept and the new one is appended to ``resumed``.
        """
        old = self._read_manifest()
        now = _now_iso()
        manifest: dict[str, Any] = {
            "run": self.run_dir.name,
            "rank": self.rank,
            "config": config or {},
            "seed": seed,
            "device": device,
            "versions": _library_versions(),
            "platform": platform.platform(),
            "hostname": platform.node(),
            "argv": list(sys.argv),
            "git": _git_commit(),
            "start_time": old.get("start_time", now),
            "end_time": None,
            "resumed": list(old.get("resumed", [])) + ([now] if old else []),
            "extra": extra or {},
        }
        atomic_write_text(self.manifest_path,
                          json.dumps(manifest, indent=2, sort_keys=True, default=_json_default) + "\n")
        return manifest

    def finish(self) -> dict[str, Any]:
        """Record the end time in the manifest (creating a minimal one if none was written)."""
        manifest = self._read_manifest() or {"run": self.run_dir.name, "rank": self.rank,
                                             "start_time": None, "versions": _library_versions()}
        manifest["end_time"] = _now_iso()
        atomic_write_text(self.manifest_path,
                          json.dumps(manifest, indent=2, sort_keys=True, default=_json_default) + "\n")
        return manifest

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


# -- reading ---------------------------------------------------------------------------------------
def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of one records file. A truncated last line (killed writer) or a damaged line is dropped
    with a :class:`ResultsWarning`; reading never fails on damage."""
    path = Path(path)
    data = path.read_bytes()
    rows: list[dict[str, Any]] = []
    lines = data.split(b"\n")
    last_complete = len(lines) - 1  # the chunk after the final "\n" is partial (or empty)
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        where = f"{path}:{i + 1}"
        if i == last_complete:
            warnings.warn(f"{where}: dropped a truncated last line (no newline; the writer was "
                          f"interrupted)", ResultsWarning, stacklevel=2)
            continue
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            warnings.warn(f"{where}: dropped a damaged line ({e})", ResultsWarning, stacklevel=2)
            continue
        if not isinstance(row, dict):
            warnings.warn(f"{where}: dropped a line that is not a JSON object", ResultsWarning, stacklevel=2)
            continue
        rows.append(row)
    return rows


def record_files(run_dir: str | os.PathLike, recursive: bool = True) -> list[Path]:
    """``records*.jsonl`` in ``run_dir`` (all ranks), or below it when it holds several runs."""
    run_dir = Path(run_dir)
    files = sorted(run_dir.glob(RECORDS_GLOB))
    if not files and recursive:
        files = sorted(run_dir.rglob(RECORDS_GLOB))
    return files


def latest_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Latest wins: for each ``cell`` keep only the rows of the writer session that wrote it last
    (a resume recomputed it). Rows without a cell are kept."""
    last: dict[str, tuple[int, str]] = {}
    for r in rows:
        cell = r.get("cell")
        if cell is None:
            continue
        key = (int(r.get("written") or 0), str(r.get("session") or ""))
        if cell not in last or key > last[cell]:
            last[cell] = key
    return [r for r in rows if r.get("cell") is None
            or str(r.get("session") or "") == last[r["cell"]][1]]


def finished_cells(run_dir: str | os.PathLike) -> set[str]:
    """Cells whose latest rows include a status "ok" row (error rows do not count): the sweep skips
    these on resume. A missing or empty run directory has no finished cells."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return set()
    rows: list[dict[str, Any]] = []
    for f in record_files(run_dir, recursive=False):
        rows.extend(read_jsonl(f))
    return {str(r["cell"]) for r in latest_rows(rows) if r.get("cell") is not None and r.get("status") == "ok"}
