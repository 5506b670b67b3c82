"""The run directory: is it ropebench's, one writer at a time (a lock), and --fresh deleting only what
ropebench wrote (what the directory's marker lists: extend/owned_paths.py, the rule every writer follows).

Policy for a second sweep on the same --out: it is refused (exit 2) while the first holds the lock. The lock
is an `fcntl.flock` on `.ropebench.lock` (`.ropebench.rank{N}.lock` per accelerate rank), so the kernel
releases it when the holder dies, even by kill -9: no stale lock to clean up. The lock file also marks the
directory as a ropebench run, from the moment the sweep creates it.
"""

from __future__ import annotations

import fcntl
import os
import platform
import re
import time
import warnings
from pathlib import Path

from ropebench.extend.errors import RopebenchError
from ropebench.extend.owned_paths import MARKER, OwnedDir, dir_lock

from .config import ConfigError

LOCK_NAME = ".ropebench.lock"


def lock_name(rank: int | None) -> str:
    return LOCK_NAME if not rank else f".ropebench.rank{int(rank)}.lock"


def open_run_dir(out: Path) -> OwnedDir:
    """The run directory as the guard sees it: new, empty, or ropebench's (a valid marker, or made before the
    marker: a sweep's lock, a manifest or records ropebench wrote); anything else raises ConfigError."""
    from ropebench.results.store import legacy_owned_files

    return OwnedDir.open(out, "--out", error=ConfigError, adopt=legacy_owned_files)


def is_run_dir(out: Path) -> bool:
    """A directory ropebench made: a valid marker, or (made before the marker) ropebench's own files."""
    from ropebench.results.store import is_ropebench_dir

    return out.is_dir() and not out.is_symlink() and is_ropebench_dir(out)


def check_out(out: Path) -> None:
    """Refuse a path that is a file, a non-empty directory ropebench did not make (its files are the user's: a
    sweep would mix records into them and --fresh would delete them), or a non-UTF-8 name."""
    from ropebench.results.store import check_path_text

    check_path_text(out, "--out")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a directory — choose a directory for the run")
    open_run_dir(out)


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
    # The marker first, then the lock file: a rank of this sweep checking the directory meanwhile sees it
    # empty or marked, never holding an unmarked lock file that is not yet ropebench's by its content.
    open_run_dir(out).record([lock_name(rank)], appended=True)
    return RunLock(out, rank).acquire(), created


def discard(out: Path, lock: RunLock, rank: int | None = None) -> None:
    """Undo a run directory this process made and that got no record (e.g. the model was rejected), while
    still holding its lock: remove only this process's own files (manifest, lock), then the directory if it is
    empty. Anything another process put there meanwhile stays, and so does the directory."""
    names = [f"manifest.rank{int(rank)}.json" if rank else "manifest.json", lock_name(rank)]
    for name in names:
        (out / name).unlink(missing_ok=True)
    suffix = f".rank{int(rank)}" if rank else ""
    listed = [*names, f"records{suffix}.jsonl", f"theory{suffix}.json"]  # what this process listed
    try:  # the marker forgets them (and goes when it lists nothing else)
        open_run_dir(out).forget([n for n in listed if not (out / n).exists()])
    except RopebenchError:
        pass
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
        else ["manifest.json", "theory.json", "report.md", MARKER]
    )
    stray = re.compile(rf"^\.({'|'.join(map(re.escape, names))})\.\d+\.[0-9a-f]{{8}}\.tmp$")
    removed = []
    with dir_lock(out):  # the marker's temp may be another rank's marker update in progress: wait it out
        for p in out.iterdir():
            if stray.match(p.name) and p.is_file():
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def fresh(out: Path) -> list[Path]:
    """Delete this run's previous results, and only what the run directory's marker lists (made before the
    marker: what ropebench's files are by their content): records, manifests, theory, the report's files,
    logs. A listed file changed since ropebench wrote it, or whose content is no longer ropebench's, is kept
    and named in one warning line; anything unlisted stays (and keeps its folder). Returns what it removed."""
    from ropebench.results.store import owned_by_content

    removed, kept = open_run_dir(out).remove_listed(owned_by_content)
    if kept:
        warnings.warn(
            f"--fresh kept {len(kept)} file(s) ropebench wrote that changed since (yours now): "
            f"{', '.join(str(p) for p in kept)}",
            stacklevel=2,
        )
    return removed
