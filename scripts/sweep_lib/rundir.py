"""The run directory: is it ropebench's, one writer at a time (a lock), and --fresh deleting only what
ropebench wrote.

Policy for a second sweep on the same --out: it is refused (exit 2) while the first holds the lock. The lock
is an `fcntl.flock` on `.ropebench.lock` (`.ropebench.rank{N}.lock` per accelerate rank), so the kernel
releases it when the holder dies, even by kill -9: no stale lock to clean up. The lock file also marks the
directory as a ropebench run, from the moment the sweep creates it.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import shutil
import time
from pathlib import Path

from .config import ConfigError

LOCK_NAME = ".ropebench.lock"
# What ropebench writes into a run directory (the report's tables/plots are found through report.md's links).
OWN_FILE = re.compile(
    r"^(records(\.rank\d+)?\.jsonl|(manifest|theory)(\.rank\d+)?\.json|report\.md|"
    r"\.ropebench(\.rank\d+)?\.lock|\.(manifest|theory)(\.rank\d+)?\.json\.\d+\.[0-9a-f]{8}\.tmp|"
    r"\.write-test-.*)$"
)
LOG_FILE = re.compile(r"^[0-9a-f]{16}\.log$")  # logs/<cell key>.log
REPORT_LINK = re.compile(r"\((tables|plots)/([^()/\s]+)\.(md|csv|tex|png)\)")


def lock_name(rank: int | None) -> str:
    return LOCK_NAME if not rank else f".ropebench.rank{int(rank)}.lock"


def is_run_dir(out: Path) -> bool:
    """A directory a sweep wrote: it holds a ropebench lock file or a manifest results.RecordWriter wrote."""
    if any(out.glob(".ropebench*.lock")):
        return True
    for manifest in out.glob("manifest*.json"):
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "ropebench" in (data.get("versions") or {}):
            return True
    return False


def check_out(out: Path) -> None:
    """Refuse a path that is a file, a non-empty directory that is not a ropebench run (its files are the
    user's: a sweep would mix records into them and --fresh would delete them), or a non-UTF-8 name."""
    from ropebench.results.store import check_path_text

    check_path_text(out, "--out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory — choose a directory for the run")
    if out.is_dir() and any(out.iterdir()) and not is_run_dir(out):
        raise ConfigError(
            f"--out {out} is a non-empty directory that is not a ropebench run — choose a new or "
            f"empty directory (ropebench never writes into, or deletes, other files)"
        )


def check_records(out: Path, fresh: bool) -> None:
    """Records a resume would read and append to must be ropebench's: a records name that is a directory, or a
    records file of which no line is a record, refuses the sweep with one line (nothing is deleted); damaged
    lines among good ones are skipped with a warning."""
    if not out.is_dir():
        return
    from ropebench.results.store import RECORDS_NAME, check_records_path, finished_cells

    for p in out.iterdir():
        if RECORDS_NAME.match(p.name):
            check_records_path(p)
    if not fresh:
        finished_cells(out)


class RunLock:
    """An exclusive, non-blocking lock on the run directory (one per rank). `acquire` refuses with a
    ConfigError naming the holder; the kernel drops the lock when this process ends."""

    def __init__(self, out: Path, rank: int | None = None):
        self.path = out / lock_name(rank)
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # e.g. the directory was just removed by the sweep that made it
            raise ConfigError(
                f"cannot lock run directory {self.path.parent}: {e.strerror or e} — check that it "
                f"exists and is writable, then rerun"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(
                f"run directory {self.path.parent} is in use by another sweep ({holder}) — wait for "
                f"it to finish (then rerun to resume), or choose another --out"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            f"pid {os.getpid()} on {platform.node()}, since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC\n".encode(),
            0,
        )
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock; the file stays as the run marker
            self.fd = None


def take(out: Path, rank: int | None = None) -> tuple[RunLock, bool]:
    """Make the run directory and lock it: (the held lock, whether this process made the directory).

    `mkdir` without exist_ok is atomic, so of two sweeps started together exactly one makes the directory;
    either may then win the lock. The refused one raises having created or deleted nothing of the other's."""
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        out.mkdir()
        created = True
    except FileExistsError:
        created = False
    return RunLock(out, rank).acquire(), created


def discard(out: Path, lock: RunLock, rank: int | None = None) -> None:
    """Undo a run directory this process made and that got no record (e.g. the model was rejected), while
    still holding its lock: remove only this process's own files (manifest, lock), then the directory if it is
    empty. Anything another process put there meanwhile stays, and so does the directory."""
    for name in (f"manifest.rank{int(rank)}.json" if rank else "manifest.json", lock_name(rank)):
        (out / name).unlink(missing_ok=True)
    lock.release()
    for d in (out / "logs", out):
        try:
            d.rmdir()
        except OSError:
            pass


def clean_stray_temps(out: Path, rank: int | None = None) -> list[Path]:
    """Temp files of an atomic write that a kill interrupted (`.manifest.json.<pid>.<hex>.tmp`), of this
    rank's own files only (another rank may be writing its own right now)."""
    names = (
        [f"manifest.rank{int(rank)}.json", f"theory.rank{int(rank)}.json"]
        if rank
        else ["manifest.json", "theory.json", "report.md"]
    )
    stray = re.compile(rf"^\.({'|'.join(map(re.escape, names))})\.\d+\.[0-9a-f]{{8}}\.tmp$")
    removed = []
    for p in out.iterdir():
        if stray.match(p.name) and p.is_file():
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _report_links(out: Path) -> set[Path]:
    """The tables/plots report.md links to (a report from before the index, ``.ropebench-report.json``)."""
    report = out / "report.md"
    linked: set[Path] = set()
    if report.is_file():
        text = report.read_text(encoding="utf-8", errors="replace")
        for folder, stem, _ in REPORT_LINK.findall(text):
            suffixes = (".md", ".csv", ".tex") if folder == "tables" else (".png",)
            linked.update(out / folder / f"{stem}{s}" for s in suffixes)
    return linked


def fresh(out: Path) -> list[Path]:
    """Delete this run's previous results, and only files ropebench wrote: records, manifests, report.md, the
    tables/plots the report wrote (its index, or report.md's links), logs/<cell>.log. Anything else stays (and
    keeps its folder)."""
    from ropebench.results.reporting import report_files
    from ropebench.results.store import REPORT_INDEX

    removed: list[Path] = []
    linked = report_files(out) | _report_links(out) | {out / REPORT_INDEX}  # the report's index and links
    for p in sorted(linked):
        if p.is_file():
            p.unlink()
            removed.append(p)
    logs = out / "logs"
    if logs.is_dir():
        for p in logs.iterdir():
            if LOG_FILE.match(p.name) and p.is_file():
                p.unlink()
                removed.append(p)
    for p in out.iterdir():
        if p.is_file() and OWN_FILE.match(p.name) and not p.name.startswith(".ropebench"):
            p.unlink()
            removed.append(p)
    for folder in ("tables", "plots", "logs"):
        d = out / folder
        if d.is_dir() and not any(d.iterdir()):
            shutil.rmtree(d)
    return removed
