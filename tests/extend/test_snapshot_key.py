"""The GGUF snapshot cache is keyed by the file's content: a fresh install of the same file (a new mtime)
finds the snapshot made before instead of converting again into another 517 MB folder; a changed file does
not."""

import os

from ropebench.extend.loading import _snapshot_dir


def test_the_same_content_with_another_mtime_finds_the_same_snapshot(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "model.gguf", tmp_path / "b" / "model.gguf"
    for path in (a, b):
        path.parent.mkdir()
        path.write_bytes(b"GGUF" + bytes(range(256)) * 4096)
    os.utime(b, ns=(1_000_000_000, 1_000_000_000))  # installed at another time
    assert a.stat().st_mtime_ns != b.stat().st_mtime_ns
    assert _snapshot_dir(a) == _snapshot_dir(b)
    assert _snapshot_dir(a).parent == tmp_path / "cache" / "gguf"
    changed = tmp_path / "c" / "model.gguf"
    changed.parent.mkdir()
    changed.write_bytes(b"GGUF" + bytes(range(256)) * 4095 + bytes(256))  # same size, one block differs
    assert changed.stat().st_size == a.stat().st_size
    assert _snapshot_dir(changed) != _snapshot_dir(a)


def test_a_file_is_hashed_once_per_version_not_once_per_process(tmp_path, monkeypatch):
    """The digest is kept in the cache folder (gguf-digests.json), keyed by path, size, mtime, ctime: a new
    process (the in-process memo cleared) reads it back instead of hashing the whole file again; a new mtime
    hashes again and replaces the entry of that path."""
    from ropebench.extend import loading, owned_paths

    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 4096)
    first = _snapshot_dir(path)
    assert (tmp_path / "cache" / loading.DIGESTS).is_file()
    loading._content_digest.cache_clear()  # as a new process

    def refuse(_path):
        raise AssertionError("hashed again")

    monkeypatch.setattr(owned_paths, "sha256_of", refuse)
    assert _snapshot_dir(path) == first
    monkeypatch.undo()
    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path / "cache"))
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    loading._content_digest.cache_clear()
    assert _snapshot_dir(path) == first  # same content, same snapshot
    memo = owned_paths.read_json(tmp_path / "cache" / loading.DIGESTS)
    stat = path.stat()
    assert list(memo) == [f"{path.resolve()}|{stat.st_size}|1000000000|{stat.st_ctime_ns}"]
    assert owned_paths.owned_cache().root == tmp_path / "cache"  # the cache still passes the guard
