"""The one rule every writer of ropebench follows (issue 41): a path is written only inside a directory
ropebench made, or a new or empty one, and never over a file ropebench did not write.

A directory is ropebench's when it holds a valid marker, ``.ropebench-owned.json``: a regular file (not a
symbolic link) whose JSON says ``"made_by": "ropebench"`` and lists the files ropebench wrote there with
their sha256. An empty, unparsable, foreign or symlinked marker does not count. A listed file whose content
no longer matches its hash was changed by the user since: it is kept, and the refusal (or --fresh) names it.
Files ropebench keeps appending to or rewriting (records, manifests, the sweep's lock) are listed as
``"appended"``: their owner checks their content. Names made from user text (task entries, model names,
variants) go through :func:`safe_name` first, so no write leaves the directory.

Standard library only: every layer imports this (results without torch). Errors are raised as the caller's
class (``error=``), so each layer keeps its own one-line error.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from .errors import RopebenchError

MARKER = ".ropebench-owned.json"
MADE_BY = "ropebench"
APPENDED = "appended"  # a file ropebench appends to or rewrites (its owner checks its content)
MARKER_LIMIT = 16 << 20  # a larger "marker" is no marker of ours
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


class WriteRefused(RopebenchError):
    """A write ropebench refuses: the path is the user's (one line: what, where, what to do)."""


def safe_name(text: object, *, limit: int = 120) -> str:
    """A file name made from user text that stays in its directory: characters outside [A-Za-z0-9._=+-]
    become '-', no leading dot (no '..', no hidden file), at most ``limit`` characters. A name that had to
    change gets a short hash of the original, so two different texts never share a file."""
    raw = str(text)
    name = _UNSAFE.sub("-", raw).strip("-").lstrip(".") or "x"
    if name != raw or len(name) > limit:
        digest = hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        name = f"{name[: limit - 9]}-{digest}"
    return name


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _check_rel(rel: str) -> bool:
    p = Path(rel)
    return bool(rel) and not p.is_absolute() and ".." not in p.parts and "\\" not in rel and p.parts != ()


def read_marker(root: str | os.PathLike) -> dict[str, str] | None:
    """The files the marker in ``root`` lists (relative path -> sha256 or "appended"); None when there is no
    valid marker (missing, a symbolic link, not a regular file, empty, unparsable, not ropebench's)."""
    path = Path(root) / MARKER
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or not 0 < st.st_size <= MARKER_LIMIT:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    files = data.get("files") if isinstance(data, dict) and data.get("made_by") == MADE_BY else None
    if not isinstance(files, dict):
        return None
    for rel, digest in files.items():
        valid = digest == APPENDED or (isinstance(digest, str) and _SHA256.match(digest))
        if not _check_rel(rel) or not valid:
            return None
    return dict(files)


@contextlib.contextmanager
def dir_lock(root: Path, *, shared: bool = False):
    """Serialise marker updates of processes writing into one directory (accelerate ranks, two reports): an
    flock on the directory itself, so no lock file is left behind. ``shared``: a reader's lock (it sees the
    directory before or after a marker update, never a half-made one). A directory that cannot be opened
    (no read permission) is not locked."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


class OwnedDir:
    """A directory ropebench may write into (see the module doc); :meth:`open` checks it, writes nothing."""

    def __init__(self, root: Path, files: dict[str, str], error: type[RopebenchError], what: str):
        self.root, self.files, self.error, self.what = root, files, error, what
        self.marked = read_marker(root) is not None

    @classmethod
    def open(
        cls,
        root: str | os.PathLike,
        what: str = "directory",
        *,
        error: type[RopebenchError] = WriteRefused,
        adopt: Callable[[Path], dict[str, str] | None] | None = None,
    ) -> OwnedDir:
        """Check ``root``: a new path, an empty directory, or one with a valid marker. ``adopt`` recognises a
        directory ropebench made before the marker existed (by the content of its own files) and returns
        the files it lists; anything else is the user's and raises ``error``."""
        root = Path(root)
        if root.is_symlink() or (root.exists() and not root.is_dir()):
            raise error(
                f"{what} {root} is not a directory ropebench made (a file or a symbolic link) — pass a new "
                f"or empty directory"
            )
        if not root.is_dir():
            return cls(root, {}, error, what)
        with dir_lock(root, shared=True):  # another process (a rank of this sweep) may be making the marker
            files = read_marker(root)
            if files is None:
                if not any(root.iterdir()):
                    files = {}
                elif adopt is not None and (found := adopt(root)) is not None:
                    files = found
                else:
                    raise error(
                        f"{what} {root} is a non-empty directory ropebench did not make (no valid {MARKER}) "
                        f"— pass a new or empty directory; ropebench never writes into other directories"
                    )
        return cls(root, files, error, what)

    # -- where a file goes ----------------------------------------------------------------------------------
    def path(self, rel: str | os.PathLike) -> Path:
        """``root/rel``, refused when rel leaves the directory or passes through a link or a file."""
        rel = Path(rel).as_posix()
        if not _check_rel(rel) or Path(rel).name == MARKER:
            raise self.error(f"{rel!r} is not a name inside {self.root} — ropebench writes only inside it")
        parent = self.root
        for part in Path(rel).parts[:-1]:
            parent = parent / part
            if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                raise self.error(
                    f"{parent} is not a directory ropebench made (a file or a symbolic link) — move it "
                    f"away, or pass another directory"
                )
        return self.root / rel

    def refusal(self, rel: str | os.PathLike) -> str | None:
        """Why ``rel`` may not be (re)written, or None: a file there must be listed and unchanged."""
        dest = self.path(rel)
        key = Path(rel).as_posix()
        if not os.path.lexists(dest):
            return None
        listed = self.files.get(key)
        if listed is None or dest.is_symlink() or not dest.is_file():
            return (
                f"{dest} exists and ropebench did not write it — move it away, or pass another "
                f"directory (ropebench never replaces a file it did not write)"
            )
        if listed != APPENDED and sha256_of(dest) != listed:
            return (
                f"{dest} was changed since ropebench wrote it — kept; move it away, or pass another "
                f"directory (ropebench never replaces a file you changed)"
            )
        return None

    def check(self, rels: Iterable[str | os.PathLike]) -> None:
        """Refuse (before anything is written) when any of ``rels`` may not be written."""
        for rel in rels:
            if (why := self.refusal(rel)) is not None:
                raise self.error(why)

    # -- writing --------------------------------------------------------------------------------------------
    def mkdir(self, rel: str | os.PathLike = ".") -> Path:
        target = self.root if str(rel) in ("", ".") else self.path(rel)
        target.mkdir(parents=True, exist_ok=True)
        return target

    def write_bytes(self, rel: str | os.PathLike, data: bytes) -> Path:
        """Write ``rel`` whole or not at all, and list it (with its hash) in the marker."""
        self.check([rel])
        dest = self.path(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(dest, data)
        self.record([rel])
        return dest

    def write_text(self, rel: str | os.PathLike, text: str) -> Path:
        return self.write_bytes(rel, text.encode("utf-8"))

    def place(self, rel: str | os.PathLike, src: Path) -> Path:
        """Move the finished file ``src`` (on the same file system) to ``rel``, and list it."""
        self.check([rel])
        dest = self.path(rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        # listed first: a kill before the move leaves our old file under a new hash, kept as "changed"
        self._update({Path(rel).as_posix(): sha256_of(src)})
        os.replace(src, dest)
        return dest

    @contextlib.contextmanager
    def staged(self):
        """A scratch folder inside the directory to write a set of files into (a library's save_pretrained,
        a report): on a clean exit they are checked all together (nothing moves if one may not be written)
        and moved in; the scratch folder goes either way, and so do the directories made for it when the
        write fails or is refused."""
        created = next((p for p in [*reversed(self.root.parents), self.root] if not p.exists()), None)
        self.root.mkdir(parents=True, exist_ok=True)
        stage = self.root / f".staging.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        stage.mkdir()
        done = False
        try:
            yield stage
            files = sorted(p.relative_to(stage) for p in stage.rglob("*") if p.is_file())
            self.check(files)
            for rel in files:
                self.place(rel, stage / rel)
            done = True
        finally:
            shutil.rmtree(stage, ignore_errors=True)
            if not done and created is not None:
                for d in [self.root, *self.root.parents]:  # only directories made here, and only when empty
                    try:
                        d.rmdir()
                    except OSError:
                        break
                    if d == created:
                        break

    def existing(self) -> set[str]:
        """The regular files under the directory now (for a library that writes on its own, e.g. lm-eval:
        what it added is :meth:`record`-ed afterwards)."""
        if not self.root.is_dir():
            return set()
        return {
            p.relative_to(self.root).as_posix()
            for p in self.root.rglob("*")
            if p.is_file() and not p.is_symlink() and p.name != MARKER
        }

    def record(self, rels: Iterable[str | os.PathLike], *, appended: bool = False) -> None:
        """List files ropebench just wrote (hashed now, or as "appended") in the marker."""
        keys = [Path(rel).as_posix() for rel in rels]
        self._update({key: APPENDED if appended else sha256_of(self.path(key)) for key in keys})

    def forget(self, rels: Iterable[str | os.PathLike]) -> None:
        """Drop files from the marker (removed by ropebench); the marker goes when it lists nothing."""
        self._update({Path(rel).as_posix(): None for rel in rels})

    def _update(self, changes: dict[str, str | None]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with dir_lock(self.root):
            on_disk = read_marker(self.root)
            files = dict(on_disk if on_disk is not None else self.files)
            for key, digest in changes.items():
                if digest is None:
                    files.pop(key, None)
                else:
                    files[key] = digest
            self.files = files
            if on_disk is not None and files == on_disk:
                return  # nothing new: the marker stays as it is (a refused sweep rewrites nothing)
            marker = self.root / MARKER
            if not files:
                if on_disk is not None:
                    marker.unlink(missing_ok=True)
                self.marked = False
                return
            body = {
                "made_by": MADE_BY,
                "about": "the files ropebench wrote in this directory (sha256, or 'appended'); "
                "ropebench writes only here, replaces only these unchanged, and --fresh removes only these",
                "files": dict(sorted(files.items())),
            }
            _atomic_write(marker, (json.dumps(body, indent=1) + "\n").encode("utf-8"))
            self.marked = True

    # -- removing (--fresh) ---------------------------------------------------------------------------------
    def remove_listed(
        self, owned: Callable[[Path], bool | None] | None = None, only: Iterable[str] | None = None
    ) -> tuple[list[Path], list[Path]]:
        """Remove the listed files that are unchanged (their hash), and the "appended" ones ``owned`` says are
        still ropebench's by content (True; None: leave it, e.g. a lock); returns (removed, kept: changed or
        no longer ropebench's). ``only``: just these of the listed files. Nothing unlisted is touched; a
        folder goes only when that emptied it."""
        removed: list[Path] = []
        kept: list[Path] = []
        gone: list[str] = []
        chosen = None if only is None else {Path(rel).as_posix() for rel in only}
        for key, digest in sorted(self.files.items()):
            if chosen is not None and key not in chosen:
                continue
            try:
                p = self.path(key)
            except RopebenchError:
                continue
            if not os.path.lexists(p):
                gone.append(key)  # already gone: dropped from the marker
                continue
            if p.is_symlink() or not p.is_file():
                kept.append(p)
                continue
            verdict = (sha256_of(p) == digest) if digest != APPENDED else (owned(p) if owned else False)
            if verdict is None:
                continue
            if not verdict:
                kept.append(p)
                continue
            p.unlink()
            removed.append(p)
            for d in list(p.relative_to(self.root).parents)[:-1]:  # its folders, innermost first
                with contextlib.suppress(OSError):
                    (self.root / d).rmdir()
        self.forget([*gone, *(p.relative_to(self.root) for p in removed)])
        return removed, kept


# What ropebench's caches put in ROPEBENCH_CACHE (default ~/.cache/ropebench): extend.loading's CPU dtype
# measurement, GGUF snapshots and their files' digests, tasks.key_tokens' spans; their writes' temp files.
CACHE_ENTRIES = re.compile(
    r"^(cpu-dtype\.(json|lock)|gguf(-digests\.json)?|key_tokens|loose-files\.json|\..+\.tmp)$"
)


def cache_root() -> Path:
    return Path(os.environ.get("ROPEBENCH_CACHE") or Path.home() / ".cache" / "ropebench")


def owned_cache(error: type[RopebenchError] = WriteRefused) -> OwnedDir:
    """The cache folder through the guard: new, empty, ropebench's (a valid marker), or a cache made before
    the marker (every entry one of the caches' own names); a folder of the user's (ROPEBENCH_CACHE pointed at
    it) raises ``error``."""

    def made_before(root: Path) -> dict[str, str] | None:
        return {} if all(CACHE_ENTRIES.match(p.name) for p in root.iterdir()) else None

    return OwnedDir.open(cache_root(), "cache folder (ROPEBENCH_CACHE)", error=error, adopt=made_before)


# A file the user names (`bench ... --json FILE`) may sit in a folder of theirs, which gets no marker (one
# would make the whole folder count as ropebench's): the sha256 of each such file ropebench wrote is kept in
# the cache folder instead, and the file is replaced only while it matches.
LOOSE_FILES = "loose-files.json"


def read_json(path: Path) -> dict[str, str]:
    """A cache's small JSON map of names to strings; {} when missing or unreadable (a cache is rebuilt)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def atomic_write_json(path: Path, data: dict[str, str]) -> None:
    _atomic_write(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def check_loose_file(path: str | os.PathLike, what: str, error: type[RopebenchError] = WriteRefused) -> None:
    """A file ``what`` names may be written when it is new, or replaced when ropebench wrote it there and it
    is unchanged since; never through a symbolic link, never over anything else."""
    path = Path(path).expanduser()
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise error(f"{what} {path} is a symbolic link or not a regular file — give the name of a new file")
    if path.exists():
        listed = read_json(owned_cache(error).root / LOOSE_FILES).get(str(path.resolve()))
        if listed is None or sha256_of(path) != listed:
            raise error(
                f"{what} {path} exists and ropebench did not write it (or it changed since) — give the name "
                f"of a new file; ropebench never replaces a file it did not write"
            )


def write_loose_file(
    path: str | os.PathLike, text: str, what: str, error: type[RopebenchError] = WriteRefused
) -> Path:
    """Write a file the user named (checked as :func:`check_loose_file`), whole or not at all, and keep its
    sha256 in the cache folder's list of such files."""
    check_loose_file(path, what, error)
    path = Path(path).expanduser()
    data = text.encode("utf-8")
    _atomic_write(path, data)
    cache = owned_cache(error)
    cache.mkdir()
    with dir_lock(cache.root):
        files = read_json(cache.root / LOOSE_FILES)
        files[str(path.resolve())] = hashlib.sha256(data).hexdigest()
        atomic_write_json(cache.root / LOOSE_FILES, files)
    cache.record([LOOSE_FILES], appended=True)
    return path
