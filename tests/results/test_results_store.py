"""Store and load: round trip, crash tolerance, resume (latest wins), several ranks and runs."""

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
import pytest
from ropebench import results
from ropebench.results.store import RecordWriter, ResultsWarning, finished_cells, read_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _rec(cell="c1", value=1.0, status="ok", **kw):
    r = {
        "run": "r",
        "cell": cell,
        "model": "m",
        "method": "yarn",
        "factor": 2,
        "options": {"beta_fast": 32, "a": 1},
        "task": "passkey",
        "corpus": "filler",
        "task_options": {"trials": 2},
        "length": 1024,
        "depth": 0.5,
        "doc": None,
        "trial": 0,
        "metric": "correct",
        "value": value,
        "n": 1,
        "seed": 0,
        "seconds": 0.1,
        "status": status,
        "error": None,
    }
    r.update(kw)
    return r


def test_round_trip_schema_and_dtypes(synthetic_records, tmp_path):
    w = RecordWriter(tmp_path / "run")
    recs = synthetic_records("run", tasks=("passkey",), lengths=(1024, 2048))
    assert w.write(recs) == len(recs)
    df = results.load(tmp_path / "run")
    assert list(df.columns[: len(results.SCHEMA)]) == list(results.SCHEMA)
    assert len(df) == len(recs)
    assert str(df["length"].dtype) == "Int64" and df["factor"].dtype == "float64"
    # every value survives unchanged, in order
    assert df["value"].tolist() == [r["value"] for r in recs]
    assert df["depth"].tolist() == [r["depth"] for r in recs]
    assert df["trial"].tolist() == [r["trial"] for r in recs]
    # options are canonical JSON strings (sorted keys) that parse back to the original dict
    assert set(df["options"]) == {"{}", '{"beta_fast":32}'}
    assert json.loads(df.loc[0, "task_options"]) == recs[0]["task_options"]


def test_lines_are_whole_sorted_json(tmp_path):
    w = RecordWriter(tmp_path, rank=1)
    w.write([_rec(), _rec(cell="c2")])
    raw = (tmp_path / "records.rank1.jsonl").read_text()
    assert raw.endswith("\n") and raw.count("\n") == 2
    for line in raw.splitlines():
        keys = list(json.loads(line))
        assert keys == sorted(keys)
        assert {"written", "session"} <= set(keys)
    assert json.loads(raw.splitlines()[0])["options"] == '{"a":1,"beta_fast":32}'


def test_missing_columns_become_na(tmp_path):
    row = {
        "task": "t",
        "metric": "m",
        "value": 2.0,
        "cell": "x",
        "model": "m",
        "method": "plain",
        "length": None,
    }
    RecordWriter(tmp_path).write([row])
    df = results.load(tmp_path)
    assert set(results.SCHEMA) <= set(df.columns)
    assert df.loc[0, "run"] == tmp_path.name  # run defaults to the directory name
    assert pd.isna(df.loc[0, "length"]) and df.loc[0, "options"] == "{}"


def test_truncated_last_line_is_dropped_with_warning(tmp_path):
    w = RecordWriter(tmp_path)
    w.write([_rec(cell="a"), _rec(cell="b")])
    with open(tmp_path / "records.jsonl", "ab") as f:  # a writer killed mid-line
        f.write(json.dumps(_rec(cell="c")).encode()[:37])
    with pytest.warns(ResultsWarning, match="truncated last line"):
        df = results.load(tmp_path)
    assert sorted(df["cell"]) == ["a", "b"]
    with pytest.warns(ResultsWarning):
        assert finished_cells(tmp_path) == {"a", "b"}
    # the next writer (a resume) cuts the partial line off, so its rows start on a fresh line
    with pytest.warns(ResultsWarning, match="partial last line"):
        w2 = RecordWriter(tmp_path)
    w2.write([_rec(cell="c")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        df = results.load(tmp_path)
    assert sorted(df["cell"]) == ["a", "b", "c"]


def test_damaged_middle_line_is_skipped(tmp_path):
    p = tmp_path / "records.jsonl"
    p.write_text(json.dumps(_rec(cell="a")) + "\n{not json\n" + json.dumps(_rec(cell="b")) + "\n")
    with pytest.warns(ResultsWarning, match="damaged line"):
        rows = read_jsonl(p)
    assert [r["cell"] for r in rows] == ["a", "b"]


def test_killed_writer_leaves_only_whole_rows(tmp_path):
    """A real SIGKILL during a stream of writes: every row on disk is complete."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[2])\n"
        "from ropebench.results.store import RecordWriter\n"
        "w = RecordWriter(sys.argv[1])\n"
        "i = 0\n"
        "while True:\n"
        "    w.write([{'cell': f'c{i}', 'task': 't', 'metric': 'm', 'value': float(i), 'status': 'ok',"
        " 'model': 'm', 'method': 'plain', 'length': 64, 'pad': 'x' * 5000} for _ in range(3)]); i += 1\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(ROOT)])
    try:
        deadline = time.time() + 60
        p = tmp_path / "records.jsonl"
        while time.time() < deadline and (not p.exists() or p.stat().st_size < 200_000):
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResultsWarning)  # the last line may be cut
        df = results.load(tmp_path)
    assert len(df) >= 3
    assert (df["pad"].str.len() == 5000).all()
    counts = df.groupby("cell").size()
    assert (counts == 1).all()  # key-identical copies within one batch collapse to one row


def test_resume_latest_cell_wins(tmp_path):
    first = RecordWriter(tmp_path)
    first.write(
        [
            _rec(cell="c1", value=0.0, trial=0),
            _rec(cell="c1", value=0.0, trial=1),
            _rec(cell="c2", status="error", value=None, metric=None, error="OOM"),
        ]
    )
    time.sleep(0.01)
    resumed = RecordWriter(tmp_path)  # a resume is a new writer session
    resumed.write([_rec(cell="c1", value=1.0, trial=0)])  # recomputed with only one trial this time
    resumed.write([_rec(cell="c2", value=1.0)])
    df = results.load(tmp_path)
    c1 = df[df["cell"] == "c1"]
    assert c1["value"].tolist() == [1.0] and c1["trial"].tolist() == [0]  # old rows of c1 all dropped
    c2 = df[df["cell"] == "c2"]
    assert c2["status"].tolist() == ["ok"]
    assert finished_cells(tmp_path) == {"c1", "c2"}


def test_rows_split_over_writes_in_one_session_are_kept(tmp_path):
    w = RecordWriter(tmp_path)
    for t in range(3):  # a sweep that writes one row per call
        w.write([_rec(cell="c1", trial=t)])
    assert results.load(tmp_path)["trial"].tolist() == [0, 1, 2]


def test_finished_cells_ignores_errors_and_missing_dir(tmp_path):
    assert finished_cells(tmp_path / "nope") == set()
    w = RecordWriter(tmp_path)
    w.write([_rec(cell="ok1"), _rec(cell="bad", status="error", error="boom")])
    assert finished_cells(tmp_path) == {"ok1"}


def test_ranks_and_several_runs_merge(tmp_path):
    RecordWriter(tmp_path / "a", rank=0).write([_rec(run="a", cell="x")])
    RecordWriter(tmp_path / "a", rank=1).write([_rec(run="a", cell="y")])
    RecordWriter(tmp_path / "b").write([_rec(run="b", cell="x")])  # same cell id in another sweep: kept
    df = results.load([tmp_path / "a", tmp_path / "b"])
    assert sorted(zip(df["run"], df["cell"])) == [("a", "x"), ("a", "y"), ("b", "x")]
    # a parent directory holding several runs also works
    assert len(results.load(tmp_path)) == 3


def test_manifest(tmp_path):
    w = RecordWriter(tmp_path)
    m = w.write_manifest(config={"methods": ["yarn"]}, seed=3, device="cpu", extra={"trained_context": 8192})
    on_disk = json.loads((tmp_path / "manifest.json").read_text())
    assert on_disk["config"] == {"methods": ["yarn"]} and on_disk["seed"] == 3 and on_disk["device"] == "cpu"
    assert on_disk["versions"]["pandas"] == pd.__version__ and on_disk["versions"]["python"]
    assert "torch" in on_disk["versions"] and "lm_eval" in on_disk["versions"]
    assert on_disk["start_time"] == m["start_time"] and on_disk["end_time"] is None
    assert "git" in on_disk
    w.finish()
    done = json.loads((tmp_path / "manifest.json").read_text())
    assert done["end_time"] and done["start_time"] == m["start_time"]
    # resume keeps the first start time and notes the new one
    again = RecordWriter(tmp_path).write_manifest(config={}, seed=3)
    assert again["start_time"] == m["start_time"] and len(again["resumed"]) == 1
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))
    RecordWriter(tmp_path, rank=2).write_manifest(seed=3)
    assert (tmp_path / "manifest.rank2.json").exists()


def test_load_errors(tmp_path):
    with pytest.raises(results.ResultsError, match="not found"):
        results.load(tmp_path / "missing")
    with pytest.raises(results.ResultsError, match="no records"):
        results.load(tmp_path)
    (tmp_path / "records.jsonl").write_text("")
    with pytest.raises(results.ResultsError, match="no records"):
        results.load(tmp_path)
    with pytest.raises(results.ResultsError):
        results.load([])


def test_numpy_values_serialize(tmp_path):
    np = pytest.importorskip("numpy")
    RecordWriter(tmp_path).write(
        [_rec(value=np.float32(0.5), length=np.int64(2048), options={"x": np.float64(1.5)})]
    )
    df = results.load(tmp_path)
    assert df.loc[0, "value"] == 0.5 and df.loc[0, "length"] == 2048 and df.loc[0, "options"] == '{"x":1.5}'


def test_cell_cut_at_a_line_boundary_is_not_finished(tmp_path):
    """Whole lines, but not all of the cell's rows (a kill between two lines of one write): the cell is not
    finished, its rows are dropped on load, and rows written again by a resume count."""
    w = RecordWriter(tmp_path)
    w.write([_rec(cell="a", trial=t) for t in range(3)])
    w.write([_rec(cell="b", trial=t) for t in range(3)])
    p = tmp_path / "records.jsonl"
    lines = p.read_text().splitlines(keepends=True)
    p.write_text("".join(lines[:-1]))  # b lost its last row, on a line boundary
    with pytest.warns(ResultsWarning, match="cell b: 2 of 3 rows on disk"):
        assert finished_cells(tmp_path) == {"a"}
    with pytest.warns(ResultsWarning, match="cell b: 2 of 3"):
        df = results.load(tmp_path)
    assert set(df["cell"]) == {"a"} and "cell_rows" not in df.columns  # bookkeeping is not a data column
    RecordWriter(tmp_path).write([_rec(cell="b", trial=t) for t in range(3)])  # the resume recomputes b
    with pytest.warns(ResultsWarning, match="cell b: 2 of 3"):  # the old partial copy is still named
        df = results.load(tmp_path)
    assert sorted(df.groupby("cell").size().items()) == [("a", 3), ("b", 3)]


def test_full_disk_cuts_the_write_back(tmp_path, monkeypatch):
    """ENOSPC in the middle of a write (a fault-injecting writer): the file is cut back to where it was, the
    error reaches the caller, and the next write appends cleanly."""
    import errno

    from ropebench.results import store

    w = RecordWriter(tmp_path)
    w.write([_rec(cell="a")])
    p = tmp_path / "records.jsonl"
    before = p.read_bytes()
    real = store._write_all

    def full_disk(fd, data):
        real(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_write_all", full_disk)
    with pytest.raises(OSError, match="No space left"):
        w.write([_rec(cell="b", trial=t) for t in range(4)])
    assert p.read_bytes() == before
    monkeypatch.setattr(store, "_write_all", real)
    w.write([_rec(cell="b", trial=t) for t in range(4)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing damaged, nothing dropped
        df = results.load(tmp_path)
    assert sorted(df.groupby("cell").size().items()) == [("a", 1), ("b", 4)]


def test_full_disk_leaves_no_manifest_temp(tmp_path, monkeypatch):
    import errno

    from ropebench.results import store

    def full_disk(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    RecordWriter(tmp_path).write_manifest(seed=1)
    before = (tmp_path / "manifest.json").read_text()
    monkeypatch.setattr(store, "_write_all", full_disk)
    with pytest.raises(OSError, match="No space left"):
        RecordWriter(tmp_path).write_manifest(seed=2)
    assert (tmp_path / "manifest.json").read_text() == before and not list(tmp_path.glob(".*.tmp"))
