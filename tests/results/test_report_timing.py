"""The report's time section (results/timing.py): per task and setting, the cells' recorded wall
(`cell_seconds`), model loading apart (`load_seconds`), never the rows' own `seconds`."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
import pytest
from ropebench import results
from ropebench.results.store import RecordWriter

SETTINGS = (("plain", 1.0, {}), ("yarn", 2.0, {}))


def timed_rows(rows):
    """The rows with made-up cell times: the k-th cell (in order of appearance) took 10 (k + 1) s; the first
    cell carries a model load of 3 s. Returns (rows, {cell: seconds})."""
    order = list(dict.fromkeys(r["cell"] for r in rows))
    wall = {cell: 10.0 * (k + 1) for k, cell in enumerate(order)}
    out = [
        {**r, "cell_seconds": wall[r["cell"]], "load_seconds": 3.0 if r["cell"] == order[0] else 0.0}
        for r in rows
    ]
    return out, wall


def write_run(path, rows):
    w = RecordWriter(path)
    w.write_manifest(config={"grid": "synthetic"}, seed=0, device="cpu")
    w.write(rows)
    w.finish()
    return path


@pytest.fixture(scope="module")
def small_records(synthetic):
    return synthetic.synthetic_records(
        "timed", settings=SETTINGS, tasks=("perplexity", "passkey"), lengths=(1024, 2048), docs=1, trials=1
    )


def test_time_per_task_and_setting_is_the_cells_wall(small_records, tmp_path):
    rows, wall = timed_rows(small_records)
    expected, cells = {}, {}  # (task, method, factor) -> summed cell wall, cell count: by hand from the rows
    for cell, seconds in wall.items():
        first = next(r for r in rows if r["cell"] == cell)
        key = (first["task"], first["method"], first["factor"])
        expected[key] = expected.get(key, 0.0) + seconds
        cells[key] = cells.get(key, 0) + 1
    row_seconds = sum(r["seconds"] for r in rows)
    assert row_seconds != sum(wall.values())  # the rows' seconds tell another (smaller) story
    d = write_run(tmp_path / "run", rows)
    md = results.report(d).read_text()
    assert "## Time" in md
    assert f"The cells' recorded wall: {sum(wall.values()):.1f} s over {len(wall)} cells" in md
    assert "model loading 3.0 s besides" in md
    table = pd.read_csv(d / "tables" / "time.csv")
    labels = {("plain", 1.0): "plain", ("yarn", 2.0): "yarn ×2"}
    got = {(t, s): v for t, s, v in zip(table["task"], table["setting"], table["seconds"])}
    assert got == {(task, labels[(m, f)]): v for (task, m, f), v in expected.items()}
    assert list(table["seconds"]) == sorted(table["seconds"], reverse=True)  # longest first
    assert table["share"].sum() == pytest.approx(1.0)
    assert {(t, s): n for t, s, n in zip(table["task"], table["setting"], table["cells"])} == {
        (task, labels[(m, f)]): cells[(task, m, f)] for (task, m, f) in expected
    }


def test_a_run_before_cell_timing_says_so_and_sums_no_row_seconds(small_records, tmp_path):
    d = write_run(tmp_path / "old", small_records)
    md = results.report(d).read_text()
    section = md.split("## Time", 1)[1].split("\n## ", 1)[0]
    assert "predate cell timing" in section and " s over " not in section
    assert not (d / "tables" / "time.csv").exists()
