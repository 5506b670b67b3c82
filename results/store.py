"""Durable storage of result rows: JSON lines appended atomically, plus a manifest per run.

Why JSON lines: a killed process can at worst leave one partial *last* line, which readers detect
and drop; every complete line is a finished measurement that is never lost. Never pickle.

Its size (~700 lines): the record schema, the checks that enforce it on every write and read, and the
atomic writers are one contract, kept in one place so that no writer can skip a check.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import uuid
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

from ropebench.extend.errors import RopebenchError
from ropebench.extend.owned_paths import APPENDED, OwnedDir, read_marker, sha256_of

# Column order of the tidy table (docs/CONTRACTS.md). `cluster` (text: rows that share one independent unit,
# e.g. the questions on one haystack), `distance` (tokens from the needle to the question) and `meaning` (the
# metric's declaration, results/meaning.py) are optional: rows written before them load with None, and so are
# `cell_seconds` (the cell's wall time, start to finish, on every row of the cell; `seconds` is the row's own)
# and `load_seconds` (the model load before the cell, on the first cell that load served, else 0).
# `written`, `session` and `cell_rows` are bookkeeping added by the writer: the first two decide which copy
# of a recomputed cell wins; `cell_rows` (how many rows of that cell the same write call holds) tells a
# complete cell from one cut short by a kill or a full disk.
SCHEMA: tuple[str, ...] = (
    "run",
    "cell",
    "model",
    "method",
    "factor",
    "options",
    "task",
    "corpus",
    "task_options",
    "length",
    "depth",
    "doc",
    "trial",
    "cluster",
    "distance",
    "metric",
    "value",
    "n",
    "seed",
    "seconds",
    "cell_seconds",
    "load_seconds",
    "status",
    "error",
    "meaning",
)
BOOKKEEPING: tuple[str, ...] = ("written", "session", "cell_rows")
JSON_COLUMNS = ("options", "task_options")
RECORDS_GLOB = "records*.jsonl"
# what RecordWriter writes; other files are not read
RECORDS_NAME = re.compile(r"^records(\.rank\d+)?\.jsonl$")
REPORT_INDEX = ".ropebench-report.json"  # the files a report wrote into its directory (ours to replace)


def setting_label(method: Any, factor: Any, baseline: str = "plain") -> str:
    """ "yarn ×2"; the baseline at factor 1 by its name alone (a missing factor: the method alone)."""
    try:
        value = float(factor)
    except (TypeError, ValueError):  # None, pd.NA, ""
        return str(method)
    if math.isnan(value) or (str(method) == baseline and value == 1.0):
        return str(method)
    return f"{method} ×{value:g}"


class ResultsError(RopebenchError):
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


def json_object(value: Any) -> dict:
    """A record column's JSON object (options, task_options) as a dict; {} for anything else (empty, not JSON,
    not an object). A dict is copied."""
    if isinstance(value, dict):
        return dict(value)
    try:
        parsed = json.loads(value) if isinstance(value, str) and value.strip() else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _json_default(obj: Any) -> Any:
    # numpy / torch scalars and arrays, paths, sets: turn into plain JSON values instead of failing.
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    return str(obj)  # a path, or anything else: its text


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
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)  # e.g. a full disk: no half-written temp file stays behind
        raise
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
    for dist in (
        "ropebench",
        "torch",
        "transformers",
        "datasets",
        "lm_eval",
        "accelerate",
        "pandas",
        "numpy",
        "seaborn",
    ):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def _git_commit(cwd: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """Commit of the working tree (read-only git calls); None outside a repo or without commits."""
    how = {"cwd": cwd, "capture_output": True, "text": True, "timeout": 10}
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], check=False, **how)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], check=False, **how)
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
        if isinstance(run_dir, bytes) or not isinstance(run_dir, (str, os.PathLike)):
            raise ResultsError(
                f"RecordWriter takes a run directory path (str or pathlib.Path), got {type(run_dir).__name__}"
                f" — e.g. results.RecordWriter('runs/mine')"
            )
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.run_dir.mkdir(parents=True, exist_ok=True)
        suffix = "" if rank is None else f".rank{int(rank)}"
        self.path = self.run_dir / f"records{suffix}.jsonl"
        self.manifest_path = self.run_dir / (
            "manifest.json" if not rank else f"manifest.rank{int(rank)}.json"
        )
        check_records_path(self.path)
        if read_marker(self.run_dir) is not None:  # a sweep's: its marker lists what this writes
            theory = "theory.json" if not rank else f"theory.rank{int(rank)}.json"  # results.reach's
            names = [self.path.name, self.manifest_path.name, theory]
            OwnedDir.open(self.run_dir, error=ResultsError).record(names, appended=True)
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
        warnings.warn(
            f"{self.path}: removed a partial last line ({size - keep} bytes) left by an interrupted write",
            ResultsWarning,
            stacklevel=3,
        )

    def write(self, records: Iterable[dict[str, Any]]) -> int:
        """Append ``records`` (dicts with the row schema); returns the number of rows written.

        Every row gets ``cell_rows``: how many rows of its cell this call writes. Readers count them back and
        drop a cell whose rows are not all on disk (a kill inside the write, a full disk), so such a cell is
        never taken for finished. On a write error (e.g. ENOSPC) the file is cut back to its size before the
        call, so no partial rows stay behind; the error is re-raised."""
        written = time.time_ns()
        rows = []
        for rec in records:
            if not isinstance(rec, dict):
                raise ResultsError(
                    f"a record must be a dict, got {type(rec).__name__} — pass a list of dicts"
                )
            rows.append(dict(rec))
        if not rows:
            return 0
        per_cell: dict[Any, int] = {}
        for row in rows:
            per_cell[row.get("cell")] = per_cell.get(row.get("cell"), 0) + 1
        lines = []
        for row in rows:
            for col in JSON_COLUMNS:
                if col in row:
                    row[col] = canonical_json(row[col])
            row["written"] = written
            row["session"] = self.session
            if row.get("cell") is not None:
                row["cell_rows"] = per_cell[row.get("cell")]
            lines.append(json.dumps(row, sort_keys=True, default=_json_default) + "\n")
        new_file = not self.path.exists()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                _write_all(fd, "".join(lines).encode("utf-8"))
                os.fsync(fd)
            except OSError:
                try:  # one writer per file (the sweep holds the run directory's lock): safe to cut back
                    os.ftruncate(fd, size)
                    os.fsync(fd)
                except OSError:
                    pass  # readers still drop the incomplete cell by its row count
                raise
        finally:
            os.close(fd)
        if new_file:
            _fsync_dir(self.run_dir)
        return len(lines)

    # -- manifest ---------------------------------------------------------------------------------
    def _read_manifest(self) -> dict[str, Any]:
        """The manifest this run wrote before ({} when there is none); a file by that name that is not a
        manifest of ropebench's is the user's and is never replaced."""
        if not os.path.lexists(self.manifest_path):
            return {}
        if owned_by_content(self.manifest_path) is not True:
            raise ResultsError(
                f"{self.manifest_path} exists and ropebench did not write it — move it away, or choose "
                f"another run directory (ropebench never replaces a file it did not write)"
            )
        return json.loads(self.manifest_path.read_text(encoding="utf-8"))

    def write_manifest(
        self,
        config: dict | None = None,
        seed: int | None = None,
        device: str | None = None,
        extra: dict | None = None,
    ) -> dict[str, Any]:
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
        atomic_write_text(
            self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True, default=_json_default) + "\n"
        )
        return manifest

    def finish(self) -> dict[str, Any]:
        """Record the end time in the manifest (creating a minimal one if none was written)."""
        manifest = self._read_manifest() or {
            "run": self.run_dir.name,
            "rank": self.rank,
            "start_time": None,
            "versions": _library_versions(),
        }
        manifest["end_time"] = _now_iso()
        atomic_write_text(
            self.manifest_path, json.dumps(manifest, indent=2, sort_keys=True, default=_json_default) + "\n"
        )
        return manifest

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


# -- reading ---------------------------------------------------------------------------------------
# The row schema a line must follow to be read (docs/results.md): a line that breaks it (a `cell` that is a
# list, a length that is a string, a foreign file's rows) is skipped and counted, never guessed at.
REQUIRED = ("task", "metric", "value")
_TEXT = ("run", "cell", "model", "method", "task", "corpus", "doc", "metric", "status", "error", "session")
_NUMBER = ("factor", "depth", "value", "seconds", "cell_seconds", "load_seconds")
_INTEGER = ("length", "trial", "distance", "n", "seed", "cell_rows")
_TEXT_OR_INTEGER = ("cluster",)  # an id: a plugin's integer id reads as its text


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def schema_problem(row: Any) -> str | None:
    """Why ``row`` (one parsed line) is not a record of the row schema, or None when it is one."""
    if not isinstance(row, dict):
        return f"not a JSON object but a {type(row).__name__}"
    missing = [k for k in REQUIRED if k not in row]
    if missing:
        return f"no {', '.join(missing)} key: not a ropebench record"
    for key, ok, expected in (
        (_TEXT, lambda v: isinstance(v, str), "a string"),
        (_NUMBER, _is_number, "a number"),
        (_INTEGER, lambda v: _is_number(v) and float(v).is_integer(), "an integer"),
        (JSON_COLUMNS, lambda v: isinstance(v, (str, dict)), "a JSON object or string"),
        (_TEXT_OR_INTEGER, lambda v: isinstance(v, str) or _is_number(v) and float(v).is_integer(), "an id"),
        (("meaning",), lambda v: isinstance(v, (str, dict)), "a JSON object or string"),
    ):
        for col in key:
            if row.get(col) is not None and not ok(row[col]):
                return f"{col} is {_kind(row[col])}, expected {expected}"
    return None


def _kind(v: Any) -> str:
    return "null" if v is None else f"a {type(v).__name__} ({json.dumps(v, default=str)[:40]})"


def _parse_line(raw: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(row, None) for a line of the row schema, else (None, why not)."""
    try:
        row = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, f"not JSON ({e})"
    except RecursionError:  # e.g. 200000 nested brackets: the parser gives up, the line is damaged
        return None, "nested too deeply to be a record"
    why = schema_problem(row)
    return (None, why) if why else (row, None)


def read_jsonl(path: str | os.PathLike, *, strict: bool = False) -> list[dict[str, Any]]:
    """Rows of one records file. A truncated last line (killed writer) is dropped with a
    :class:`ResultsWarning`; damaged lines (not JSON, or not of the row schema) are skipped and counted in one
    warning naming the first. When complete lines exist but none is a record (a foreign or wholly damaged
    file), ``strict=True`` raises a :class:`ResultsError` naming the file and its first line instead. Nothing
    is ever deleted."""
    path = Path(path)
    if not path.is_file():
        raise ResultsError(
            f"{path} is not a regular file — move it away (records files are written by the sweep)"
        )
    data = path.read_bytes()
    rows: list[dict[str, Any]] = []
    damaged: list[str] = []
    lines = data.split(b"\n")
    last_complete = len(lines) - 1  # the chunk after the final "\n" is partial (or empty)
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        if i == last_complete:
            warnings.warn(
                f"{path}:{i + 1}: dropped a truncated last line (no newline; the writer was interrupted)",
                ResultsWarning,
                stacklevel=2,
            )
            continue
        row, why = _parse_line(raw)
        if row is None:
            damaged.append(f"line {i + 1}: {why}")
        else:
            rows.append(row)
    if damaged and not rows and strict:
        raise ResultsError(
            f"no records in {path}: none of its {len(damaged)} lines is a ropebench record "
            f"({damaged[0]}) — point to a sweep's run directory, or move this file away"
        )
    if damaged:
        warnings.warn(
            f"{path}: skipped {len(damaged)} damaged line{'s' if len(damaged) > 1 else ''} "
            f"({damaged[0]}{', ...' if len(damaged) > 1 else ''})",
            ResultsWarning,
            stacklevel=2,
        )
    return rows


def record_files(run_dir: str | os.PathLike, recursive: bool = True) -> list[Path]:
    """``records.jsonl`` / ``records.rank{N}.jsonl`` in ``run_dir`` (all ranks), or below it when it holds
    several runs. Only the names RecordWriter writes: a user's ``records-notes.jsonl`` or a directory named
    like a records file is not read (pass such a file explicitly to read it)."""
    run_dir = Path(run_dir)

    def ours(p: Path) -> bool:
        return p.is_file() and bool(RECORDS_NAME.match(p.name))

    files = sorted(p for p in run_dir.glob(RECORDS_GLOB) if ours(p))
    if not files and recursive:
        files = sorted(p for p in run_dir.rglob(RECORDS_GLOB) if ours(p))
    return files


def _stamp(row: dict[str, Any]) -> int:
    """The row's ``written`` time as an integer; anything else (a hand-edited "yesterday") sorts first."""
    value = row.get("written")
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return 0


def complete_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop the rows of every cell whose write is not complete on disk: rows of one write call (same cell,
    session and ``written``) must number ``cell_rows``. Rows without ``cell_rows`` (older files, or rows of
    no cell) are kept. Each dropped cell is named in a :class:`ResultsWarning`."""
    counts = Counter(key for r in rows if (key := _write_call(r)) is not None)
    bad = set()
    for r in rows:
        key, expected = _write_call(r), r.get("cell_rows")
        if key is None or key in bad:
            continue
        if not isinstance(expected, int) or isinstance(expected, bool) or counts[key] != expected:
            bad.add(key)
            warnings.warn(
                f"cell {key[0]}: {counts[key]} of {expected} rows on disk (an interrupted write or a "
                f"full disk); these rows are dropped and a resumed sweep recomputes the cell",
                ResultsWarning,
                stacklevel=3,
            )
    if not bad:
        return rows
    return [r for r in rows if _write_call(r) not in bad]


def _write_call(row: dict[str, Any]) -> tuple[str, str, str] | None:
    """The write call a row came from (cell, session, written); None for a row without ``cell_rows``."""
    if row.get("cell") is None or "cell_rows" not in row:
        return None
    return (str(row["cell"]), str(row.get("session")), str(row.get("written")))


def latest_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Latest wins: for each ``cell`` keep only the rows of the writer session that wrote it last
    (a resume recomputed it), among complete writes (see :func:`complete_rows`). Rows without a cell are
    kept."""
    rows = complete_rows(rows)
    last: dict[str, tuple[int, str]] = {}
    for r in rows:
        cell = r.get("cell")
        if cell is None:
            continue
        key = (_stamp(r), str(r.get("session") or ""))
        if cell not in last or key > last[cell]:
            last[cell] = key
    return [r for r in rows if r.get("cell") is None or str(r.get("session") or "") == last[r["cell"]][1]]


def _first_line_is_ours(path: Path) -> bool:
    """The file's first line is a row RecordWriter wrote (it carries the writer's ``session`` bookkeeping)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
        row = json.loads(first)
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(row, dict) and isinstance(row.get("session"), str) and "written" in row


def is_ropebench_dir(path: str | os.PathLike) -> bool:
    """A directory ropebench made: it holds a valid marker (``.ropebench-owned.json``, see
    extend/owned_paths.py), or, made before the marker, files of ropebench's recognised by their content (see
    :func:`legacy_owned_files`). Only such a directory (or a new or empty one) is written into."""
    return read_marker(path) is not None or legacy_owned_files(Path(path)) is not None


_LOCK_TEXT = re.compile(r"^(pid \d+ on .*, since .* UTC\n)?$")  # what the sweep's RunLock writes


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def owned_by_content(path: Path) -> bool | None:
    """Whether a file the marker lists as "appended" is still ropebench's by its content (records whose first
    line RecordWriter wrote, a manifest naming ropebench's version, theory rows that parse); None for the
    sweep's lock file (left in place: it marks the run directory)."""
    if path.name.startswith(".ropebench") and path.name.endswith(".lock"):
        return None
    if not _regular(path):
        return False
    if RECORDS_NAME.match(path.name):
        return path.stat().st_size == 0 or _first_line_is_ours(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    if path.name.startswith("manifest"):
        versions = data.get("versions") if isinstance(data, dict) else None
        return isinstance(versions, dict) and "ropebench" in versions
    return path.name.startswith("theory")


def legacy_owned_files(path: Path) -> dict[str, str] | None:
    """A directory ropebench made before the marker, recognised only by files whose content is ropebench's
    (a file merely present, empty, unparsable or a symbolic link does not count): a sweep's lock file, a
    manifest RecordWriter wrote, records RecordWriter wrote, or an old report index
    (``.ropebench-report.json``) that parses. Returns those files (and what the old index lists, hashed as
    they are now) for the marker, or None when nothing is ropebench's."""
    files: dict[str, str] = {}
    for lock in path.glob(".ropebench*.lock"):
        try:
            if _regular(lock) and lock.stat().st_size < 4096 and _LOCK_TEXT.match(lock.read_text("utf-8")):
                files[lock.name] = APPENDED
        except (OSError, ValueError):
            continue
    for manifest in path.glob("manifest*.json"):
        try:
            data = json.loads(manifest.read_text(encoding="utf-8")) if _regular(manifest) else None
        except (OSError, ValueError, RecursionError):
            continue
        versions = data.get("versions") if isinstance(data, dict) else None
        if isinstance(versions, dict) and "ropebench" in versions:
            files[manifest.name] = APPENDED
    for f in path.glob(RECORDS_GLOB):
        if RECORDS_NAME.match(f.name) and _regular(f) and _first_line_is_ours(f):
            files[f.name] = APPENDED
    index = path / REPORT_INDEX
    try:
        listed = json.loads(index.read_text(encoding="utf-8")).get("files") if _regular(index) else None
    except (OSError, ValueError, AttributeError, RecursionError):
        listed = None
    if isinstance(listed, list):
        files[REPORT_INDEX] = sha256_of(index)
        for rel in listed:
            inside = isinstance(rel, str) and not Path(rel).is_absolute() and ".." not in Path(rel).parts
            linked = inside and any((path / p).is_symlink() for p in Path(rel).parents)
            if inside and not linked and _regular(path / rel):
                files[Path(rel).as_posix()] = sha256_of(path / rel)
    if not files:
        return None
    for log in path.glob("logs/*.log"):  # a failed cell's traceback, logs/<cell key>.log
        if re.match(r"^[0-9a-f]{16}\.log$", log.name) and _regular(log) and not log.parent.is_symlink():
            files[f"logs/{log.name}"] = sha256_of(log)
    for name in ("theory.json", *(p.name for p in path.glob("theory.rank*.json"))):
        if _regular(path / name):
            files.setdefault(name, APPENDED)
    return files


def check_path_text(path: str | os.PathLike, what: str) -> None:
    """A path whose name is not valid UTF-8 (bytes the file system allows) can not be written into manifests,
    records or reports: refuse it up front with one line instead of failing after the run."""
    text = os.fspath(path)
    try:
        (text.decode("utf-8") if isinstance(text, bytes) else text).encode("utf-8")
    except UnicodeError:
        shown = os.fsdecode(text).encode("utf-8", "backslashreplace").decode("utf-8")
        raise ResultsError(
            f"{what} {shown} is not valid UTF-8 — choose a directory name in UTF-8 (manifests, records and "
            f"reports store it as text)"
        ) from None


def check_records_path(path: Path) -> None:
    """A records file name that is taken by something else (a directory, a socket) can be neither read nor
    appended to: refuse with one line instead of skipping it (a resume would then fail writing, or recompute
    every cell)."""
    if path.exists() and not path.is_file():
        raise ResultsError(
            f"{path} is not a regular file (a directory?) — move it away, it is not a records file "
            f"ropebench wrote"
        )


def finished_cells(run_dir: str | os.PathLike) -> set[str]:
    """Cells whose latest complete rows include a status "ok" row (error rows and cells with rows missing
    do not count): the sweep skips these on resume. A missing or empty run directory has no finished cells.
    A records name that is not a file, or a records file of which no line is a record, raises ResultsError."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return set()
    for p in run_dir.iterdir():
        if RECORDS_NAME.match(p.name):
            check_records_path(p)
    rows: list[dict[str, Any]] = []
    for f in record_files(run_dir, recursive=False):
        rows.extend(read_jsonl(f, strict=True))
    return {
        str(r["cell"]) for r in latest_rows(rows) if r.get("cell") is not None and r.get("status") == "ok"
    }
