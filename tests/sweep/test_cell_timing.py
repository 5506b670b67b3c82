"""The sweep records each cell's wall time (`cell_seconds`, start to finish, on every row of the cell) and the
model load apart (`load_seconds`, on the first cell the load served): scripts/sweep_lib/run.py."""

from __future__ import annotations

import time

import pytest
from ropebench import results, sweep_lib

SLEEP = 0.3  # the fake task sleeps this long per cell, while its rows say 0.0 seconds


@pytest.fixture()
def fake_task(monkeypatch, fake_task_plugin):
    """The fake task (tests/conftest.py FAKE_TASK) registered in this process, removed afterwards."""
    from ropebench import tasks

    monkeypatch.setitem(tasks.TASKS, "fake", None)
    exec(fake_task_plugin.read_text(), {})  # noqa: S102 - the tests' own plugin file
    monkeypatch.setenv("_FAKE_CALLS", "0")
    monkeypatch.setenv("FAKE_SLEEP", str(SLEEP))
    return tasks.TASKS["fake"]


def test_each_cell_records_its_wall_and_the_model_load_once(tmp_path, tiny_model_dir, fake_task, capsys):
    out = tmp_path / "run"
    argv = ["--model", str(tiny_model_dir), "--tasks", "fake", "--lengths", "16", "32", "--out", str(out)]
    start = time.perf_counter()
    assert sweep_lib.main([*argv, "--quiet", "--methods", "plain", "yarn", "--factors", "2"]) == 0
    whole = time.perf_counter() - start
    capsys.readouterr()
    frame = results.load(out)
    frame = frame[frame["task"] == "fake"]
    per_cell = frame.groupby("cell")
    assert per_cell.ngroups == 2
    assert (per_cell["cell_seconds"].nunique() == 1).all()  # one wall per cell, on each of its rows
    cells = frame.drop_duplicates("cell").sort_values("written")
    assert (frame["seconds"] == 0.0).all()  # the rows undercount: the task's own sleep is in none of them
    assert (cells["cell_seconds"] >= SLEEP).all()  # ... and in every cell's wall
    assert list(cells["load_seconds"] > 0) == [True, False]  # the load, on the first cell it served
    assert cells["cell_seconds"].sum() + cells["load_seconds"].sum() <= whole  # inside the sweep's wall
