"""Reliability of the sweep's storage, replayed for real (subprocesses, fake task, tiny random Llama):

- kill -9 inside the write of a multi-row cell (cut mid-line, and cut exactly at a line boundary);
- a full disk (ENOSPC) in the middle of a write, by a fault-injecting writer;
- two sweeps started at once on the same --out.

Each ends with 0 rows lost (every cell's rows, once, with the right values) and 0 finished cells computed
twice (the fake task logs every call). Nothing about time is asserted.

The sweeps that are killed, cut or raced run as processes of their own; the command that comes after them on
the same directory (a resume, a refused start) runs in the test's process (`sweep_lib.main`, what
`ropebench sweep` runs): it reads and writes the same files, without another interpreter importing torch and
transformers (~8 s of CPU each).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ropebench import sweep_lib

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "scripts" / "sweep.py"
PY = sys.executable

# Injected into results.store: on the N-th append to a records file, write part of the batch, then die
# (kill -9) or fail like a full disk. Manifest writes (atomic temp files) are left alone.
FAULT_PLUGIN = """
import errno, os, signal
from ropebench.results import store as store

_real = store._write_all
_count = [0]

def _faulty(fd, data):
    if not os.readlink(f"/proc/self/fd/{fd}").endswith(".jsonl"):
        return _real(fd, data)
    _count[0] += 1
    if _count[0] != int(os.environ["FAULT_AT"]):
        return _real(fd, data)
    mode = os.environ["FAULT_MODE"]
    lines = data.split(b"\\n")
    if mode == "kill-line":  # all but the last row, as whole lines: no partial line to give it away
        cut = len(b"\\n".join(lines[:-2])) + 1
    else:
        cut = len(lines[0]) + len(lines[1]) // 2 + 1  # one whole row and half of the next
    _real(fd, data[:cut])
    if mode == "enospc":
        raise OSError(errno.ENOSPC, "No space left on device")
    os.fsync(fd)
    os.kill(os.getpid(), signal.SIGKILL)

store._write_all = _faulty
"""

pytestmark = pytest.mark.slow  # end to end: a dozen sweep processes

LENGTHS = ["16", "32", "48"]  # three rows per cell
METHODS = ["plain", "pi", "ntk", "yarn", "xpos"]


@pytest.fixture(scope="module")
def plugins(tmp_path_factory, fake_task_plugin) -> tuple[Path, Path]:
    """The fake task's plugin and the fault injector's."""
    fault = tmp_path_factory.mktemp("plugins") / "fault.py"
    fault.write_text(FAULT_PLUGIN)
    return fake_task_plugin, fault


def sweep_args(model_dir: Path, out: Path, *more) -> list[str]:
    """The sweep's arguments (a process of its own: `[PY, SWEEP, *args, "--plugin", <fake task>]`)."""
    return [
        "--model",
        str(model_dir),
        "--tasks",
        "fake",
        "--lengths",
        *LENGTHS,
        "--methods",
        *METHODS,
        "--factors",
        "2",
        "--out",
        str(out),
        "--quiet",
        *more,
    ]


def sweep_process(model_dir: Path, out: Path, fake: Path, *more) -> list[str]:
    """The command of a sweep in a process of its own, with the fake task's plugin."""
    return [PY, str(SWEEP), *sweep_args(model_dir, out, "--plugin", str(fake), *more)]


def sweep_here(model_dir: Path, out: Path, capsys, monkeypatch, log: Path) -> tuple[int, str, str]:
    """The same sweep in this process (the `fake_task` fixture registers the task), its calls logged to `log`:
    (exit code, stdout, stderr)."""
    monkeypatch.setenv("FAKE_LOG", str(log))
    capsys.readouterr()
    code = sweep_lib.main(sweep_args(model_dir, out))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def rows_of(out: Path) -> list[dict]:
    """Whole rows on disk (a partial last line, without its newline, is not one)."""
    rows = []
    for f in sorted(out.glob("records*.jsonl")):
        rows += [json.loads(x) for x in f.read_text().split("\n")[:-1] if x.strip()]
    return rows


def check_complete(out: Path) -> None:
    """Every cell once, each with its three rows, values as the fake task computes them."""
    import warnings

    from ropebench import results

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropped partial cell is warned about; checked in the tests
        df = results.load(out)
    ok = df[df["status"] == "ok"]
    assert len(ok) == len(METHODS) * len(LENGTHS)
    assert ok.groupby("cell").size().eq(len(LENGTHS)).all() and ok["cell"].nunique() == len(METHODS)
    assert not ok[["cell", "length", "metric"]].duplicated().any()
    assert (ok["value"] == ok["factor"] * ok["length"]).all()


@pytest.mark.parametrize("mode", ["kill-mid", "kill-line", "enospc"])
def test_interrupted_write_loses_nothing_and_recomputes_only_that_cell(
    mode, tmp_path, tiny_model_dir, plugins, sweep_env, fake_task, capsys, monkeypatch
):
    fake, fault = plugins
    out, log = tmp_path / "run", tmp_path / "calls.log"
    first = subprocess.run(
        check=False,
        args=sweep_process(tiny_model_dir, out, fake, "--plugin", str(fault)),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=sweep_env(FAKE_LOG=log, FAULT_AT=3, FAULT_MODE=mode),
    )
    if mode == "enospc":  # one line, exit 1; the file is cut back to the two whole cells before the write
        assert first.returncode == 1, first.stderr
        assert (
            first.stderr.strip().splitlines()[-1].startswith("error: cannot write records")
            and "No space left on device" in first.stderr
            and "Traceback" not in first.stderr
        )
        assert len(rows_of(out)) == 2 * len(LENGTHS)
    else:  # two whole cells + one (kill-mid: and half a line) or two (kill-line) whole rows of the third
        assert first.returncode == -9, first.stderr
        assert len(rows_of(out)) == 2 * len(LENGTHS) + (1 if mode == "kill-mid" else 2)
    first_calls = calls(log)
    assert len(first_calls) == 3  # the third cell was computed; its write was cut

    from ropebench import results

    with pytest.warns(results.ResultsWarning) if mode != "enospc" else _nothing():
        assert len(results.finished_cells(out)) == 2  # the cut cell is not finished

    code, stdout, stderr = sweep_here(tiny_model_dir, out, capsys, monkeypatch, log)
    assert code == 0, stderr
    again = calls(log)[3:]
    assert len(again) == len(METHODS) - 2  # the cut cell and the two never started
    assert first_calls[2] in again and not set(again) & set(
        first_calls[:2]
    )  # no finished cell computed twice
    check_complete(out)
    assert "all 5 cells finished" in stdout


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_two_sweeps_on_one_directory(
    tmp_path, tiny_model_dir, plugins, sweep_env, fake_task, capsys, monkeypatch
):
    """Started together: one runs, the other is refused at once (exit 2, one line); 0 cells computed twice.
    The one that takes the lock holds its first cell until the other has exited (FAKE_WAIT_FOR), so the two
    overlap whichever starts faster."""
    fake, _ = plugins
    out, log, go = tmp_path / "run", tmp_path / "calls.log", tmp_path / "go"
    procs = [
        subprocess.Popen(
            sweep_process(tiny_model_dir, out, fake),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=sweep_env(FAKE_LOG=log, FAKE_WAIT_FOR=go),
        )
        for _ in range(2)
    ]
    try:
        deadline = time.monotonic() + 240  # a guard against a hang, not a timing assert
        while all(p.poll() is None for p in procs):
            assert time.monotonic() < deadline, "neither sweep ended"
            time.sleep(0.05)
    finally:
        go.touch()
    results_ = [(p.wait(timeout=300), *p.communicate(timeout=300)) for p in procs]
    codes = sorted(r[0] for r in results_)
    assert codes == [0, 2], results_
    refused = next(r for r in results_ if r[0] == 2)[2]
    assert (
        refused.strip().count("\n") == 0
        and "in use by another sweep" in refused
        and "Traceback" not in refused
    )
    assert len(calls(log)) == len(METHODS) and len(set(calls(log))) == len(METHODS)  # each cell once
    check_complete(out)
    # after the first finished, the same command resumes and has nothing left to do
    code, _, stderr = sweep_here(tiny_model_dir, out, capsys, monkeypatch, log)
    assert code == 0 and len(calls(log)) == len(METHODS), stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["resumed"]) == 1  # the refused sweep never touched the manifest


def test_second_sweep_started_later_is_refused_while_the_first_runs(
    tmp_path, tiny_model_dir, plugins, sweep_env, fake_task, capsys, monkeypatch
):
    fake, _ = plugins
    out, log, ready = tmp_path / "run", tmp_path / "calls.log", tmp_path / "ready"
    first = subprocess.Popen(
        sweep_process(tiny_model_dir, out, fake),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env=sweep_env(FAKE_LOG=log, FAKE_HANG_AT=2, FAKE_READY=ready),
    )
    try:
        deadline = time.time() + 240
        while not ready.exists():
            assert first.poll() is None and time.time() < deadline
            time.sleep(0.2)
        code, _, stderr = sweep_here(tiny_model_dir, out, capsys, monkeypatch, log)
        assert code == 2 and "in use by another sweep" in stderr
        assert f"pid {first.pid}" in stderr
    finally:
        first.kill()
        first.wait(timeout=30)
    # kill -9 released the lock: the next sweep resumes
    code, _, stderr = sweep_here(tiny_model_dir, out, capsys, monkeypatch, log)
    assert code == 0, stderr
    check_complete(out)
    assert len(calls(log)) == len(METHODS)  # the hanging cell never logged; each cell completed once
    assert not list(out.glob(".manifest*.tmp"))


# Orders two sweeps on a new --out with files, not sleeps: "late" checks the directory, then waits at its
# mkdir until "first" has made the directory and holds the lock; "first" then waits (lock held) until the test
# says go.
RACE_PLUGIN = """
import os, time
from pathlib import Path
from ropebench.sweep_lib import rundir

ROLE, SYNC = os.environ["RACE_ROLE"], Path(os.environ["RACE_SYNC"])
OUT = os.path.realpath(os.environ["RACE_OUT"])


def wait_for(name):
    deadline = time.monotonic() + 240  # a guard against a hang, not a timing assert
    while not (SYNC / name).exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"race plugin: {name} never appeared")
        time.sleep(0.05)


_mkdir = os.mkdir


def mkdir(path, *args, **kwargs):
    if os.path.realpath(path) == OUT:
        if ROLE == "late":
            (SYNC / "late-at-mkdir").touch()
            wait_for("first-locked")
        else:
            wait_for("late-at-mkdir")
    return _mkdir(path, *args, **kwargs)


os.mkdir = mkdir
if ROLE == "first":
    _acquire = rundir.RunLock.acquire

    def acquire(self):
        held = _acquire(self)
        (SYNC / "first-locked").touch()
        wait_for("go")
        return held

    rundir.RunLock.acquire = acquire
"""


def test_refused_sweep_on_a_new_directory_touches_nothing_of_the_running_one(
    tmp_path, tiny_model_dir, plugins, sweep_env, fake_task, capsys, monkeypatch
):
    """Two sweeps on a new --out, the second's mkdir delayed until the first holds the lock (the issue's 4 s
    delay, ordered by files): the refused one deletes nothing (the lock file stays), so a third sweep is
    refused too."""
    fake, _ = plugins
    race = tmp_path / "race.py"
    race.write_text(RACE_PLUGIN)
    out, log, sync = tmp_path / "run", tmp_path / "calls.log", tmp_path / "sync"
    sync.mkdir()

    def start(role):
        return subprocess.Popen(
            sweep_process(tiny_model_dir, out, fake, "--plugin", str(race)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=sweep_env(FAKE_LOG=log, RACE_ROLE=role, RACE_SYNC=sync, RACE_OUT=out),
        )

    late = start("late")
    first = start("first")
    try:
        late_err = late.communicate(timeout=300)[1]
        assert late.returncode == 2 and "in use by another sweep" in late_err, late_err
        assert late_err.strip().count("\n") == 0 and "Traceback" not in late_err
        assert (out / ".ropebench.lock").is_file()  # the holder's lock file is still there
        code, _, stderr = sweep_here(tiny_model_dir, out, capsys, monkeypatch, log)
        assert code == 2 and "in use by another sweep" in stderr, stderr
        (sync / "go").touch()
        first_err = first.communicate(timeout=300)[1]
        assert first.returncode == 0, first_err
    finally:
        (sync / "go").touch()
        for p in (late, first):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    check_complete(out)
    assert sorted(calls(log)) == sorted(set(calls(log))) and len(calls(log)) == len(METHODS)


# -- ranks of one accelerate launch taking a new --out together ---------------------------------------------
# (a CI run once lost rank 1: rank 0's stray-temp sweep removed rank 1's marker update in progress)


def test_a_marker_update_in_progress_is_not_swept_as_a_stray_temp(tmp_path):
    import os
    import threading

    from ropebench.extend.owned_paths import MARKER, dir_lock
    from ropebench.sweep_lib import rundir

    out = tmp_path / "run"
    lock, _ = rundir.take(out)
    pending = out / f".{MARKER}.{os.getpid()}.0123abcd.tmp"  # what a marker update writes before its rename
    with dir_lock(out):  # held by the update for the whole write-and-rename
        pending.write_text("{}")
        sweep = threading.Thread(target=rundir.clean_stray_temps, args=(out,))
        sweep.start()
        sweep.join(0.5)
        assert sweep.is_alive() and pending.exists()  # waits for the update instead of deleting its file
        pending.unlink()
    sweep.join(10)
    assert not sweep.is_alive()
    lock.release()


def test_the_run_directory_is_never_seen_half_made(tmp_path):
    import os
    import threading

    from ropebench.extend.owned_paths import MARKER, dir_lock
    from ropebench.sweep_lib import rundir

    out = tmp_path / "run"
    out.mkdir()
    seen = []
    with dir_lock(out):  # rank 0 between writing its first marker and renaming it into place
        (out / f".{MARKER}.{os.getpid()}.0123abcd.tmp").write_text("{}")
        check = threading.Thread(target=lambda: seen.append(_outcome(rundir.check_out, out)))
        check.start()
        check.join(0.5)
        assert check.is_alive()  # rank 1's check waits for the marker ...
        (out / f".{MARKER}.{os.getpid()}.0123abcd.tmp").unlink()
        (out / MARKER).write_text(
            json.dumps({"made_by": "ropebench", "files": {".ropebench.lock": "appended"}})
        )
    check.join(10)
    assert seen == ["ok"]  # ... and then finds the directory ropebench's


def _outcome(fn, *args):
    try:
        fn(*args)
        return "ok"
    except Exception as e:  # noqa: BLE001 - the test reports what was raised
        return f"{type(e).__name__}: {e}"


_RACE = """
import sys
from pathlib import Path
from ropebench.sweep_lib import rundir

base, rank, n, go = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
(base / f"ready{rank}").touch()  # imported: from here on it spins
while not go.exists():
    pass
fails = 0
for i in range(n):
    out = base / f"run{i}"
    try:
        rundir.check_out(out)
        lock, _ = rundir.take(out, rank or None)
        rundir.clean_stray_temps(out, rank or None)
        lock.release()
    except BaseException as e:
        fails += 1
        print(f"{i}: {type(e).__name__}: {e}", file=sys.stderr)
sys.exit(1 if fails else 0)
"""


def test_two_ranks_take_new_run_directories_together(tmp_path):
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [PY, "-c", _RACE, str(tmp_path), str(rank), "150", str(go)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing assert
    while not all((tmp_path / f"ready{rank}").exists() for rank in (0, 1)):  # both imported and spinning
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.05)
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
