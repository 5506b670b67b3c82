"""Issue 25 A: ropebench never writes over a user's file, damaged or foreign records are named (never a
traceback, never deleted), and the results API raises its own one-line errors.

The CLI's one-line messages for the same inputs are in tests/project/test_bad_inputs.py (and
docs/bad-input.md); the race of two sweeps on a new --out is replayed in tests/sweep/test_reliability.py.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest
from ropebench import results
from ropebench.extend.errors import RopebenchError
from ropebench.results.store import RecordWriter, ResultsError, ResultsWarning, finished_cells, read_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def perplexity_run_dir(synthetic_records, tmp_path_factory) -> Path:
    """A run directory of synthetic perplexity records, no manifest."""
    d = tmp_path_factory.mktemp("run") / "run"
    RecordWriter(d).write(synthetic_records("run", tasks=("perplexity",)))
    return d


# ---------------------------------------------------------------------------------------------- report output
def test_report_refuses_a_directory_of_the_users_and_changes_nothing(perplexity_run_dir, tmp_path):
    mine = tmp_path / "mine"
    (mine / "tables").mkdir(parents=True)
    (mine / "report.md").write_text("my report")
    (mine / "tables" / "summary.md").write_text("my table")
    before = _snapshot(mine)
    with pytest.raises(ResultsError, match="non-empty directory ropebench did not make") as info:
        results.report(perplexity_run_dir, out=mine)
    assert "\n" not in str(info.value) and isinstance(info.value, RopebenchError)
    assert _snapshot(mine) == before and sorted(p.name for p in mine.iterdir()) == ["report.md", "tables"]


def test_report_refuses_to_replace_a_users_file_in_a_run_directory(synthetic_records, tmp_path):
    """A run directory is ropebench's, but a file in it with a name the report writes is the user's: refused,
    and nothing at all is written (no partial tables, no staging directory)."""
    d = tmp_path / "run"
    RecordWriter(d).write(synthetic_records("run", tasks=("perplexity",)))
    (d / "tables").mkdir()
    (d / "tables" / "perplexity_ppl.csv").write_text("mine")
    before = _snapshot(d)
    with pytest.raises(ResultsError, match=r"perplexity_ppl\.csv exists and ropebench did not write it"):
        results.report(d)
    assert _snapshot(d) == before
    assert sorted(p.name for p in d.iterdir()) == ["records.jsonl", "tables"]  # no staging directory left


def test_report_into_a_new_directory_then_again_replaces_only_its_own_files(perplexity_run_dir, tmp_path):
    out = tmp_path / "a" / "b" / "rep"
    path = results.report(perplexity_run_dir, out=out)
    assert path == out / "report.md" and path.read_text().startswith("# ropebench report")
    index = json.loads((out / ".ropebench-owned.json").read_text())["files"]  # the marker (owned_paths.py)
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {".ropebench-owned.json"}
    assert set(index) == written and "report.md" in written and any(f.startswith("plots/") for f in written)
    (out / "tables" / "notes.md").write_text("mine, with a name the report does not use")
    results.report(perplexity_run_dir, out=out)  # its own files are replaced
    assert (out / "tables" / "notes.md").read_text() == "mine, with a name the report does not use"
    assert not [p for p in out.iterdir() if p.name.startswith(".report.")]


def test_report_refused_in_a_new_directory_leaves_nothing(synthetic_records, tmp_path, monkeypatch):
    """When the report fails after making its directory (here: a plot fails), the directories it made go
    again."""
    from ropebench.results import report_output

    d = tmp_path / "run"
    RecordWriter(d).write(synthetic_records("run", tasks=("perplexity",)))

    def boom(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(report_output, "commit", boom)
    with pytest.raises(OSError):
        results.report(d, out=tmp_path / "new" / "rep")
    assert not (tmp_path / "new").exists()


def test_an_annotated_copy_of_a_report_is_never_replaced(perplexity_run_dir, tmp_path):
    """Ownership is decided by the marker file a report writes (.ropebench-owned.json), not by the first line
    of report.md: a user's annotated copy keeps "# ropebench report" and must survive untouched."""
    out = tmp_path / "mine"
    results.report(perplexity_run_dir, out=tmp_path / "orig")
    out.mkdir()
    annotated = (tmp_path / "orig" / "report.md").read_text() + "\nMy notes: ntk looks good.\n"
    (out / "report.md").write_text(annotated)
    with pytest.raises(results.ResultsError, match="ropebench did not make"):
        results.report(perplexity_run_dir, out=out)
    assert (out / "report.md").read_text() == annotated
    assert [p.name for p in out.iterdir()] == ["report.md"]


def test_a_directory_name_that_is_not_utf8_is_refused_up_front(perplexity_run_dir, tmp_path):
    bad = os.fsdecode(bytes(tmp_path) + b"/r\xff")
    with pytest.raises(results.ResultsError, match="not valid UTF-8"):
        results.report(perplexity_run_dir, out=bad)
    assert not os.path.exists(os.fsencode(bad))


# -------------------------------------------------------------------------------------------- damaged records
def _good(cell: str) -> dict:
    return {
        "run": "r",
        "cell": cell,
        "model": "m",
        "method": "plain",
        "factor": 1.0,
        "options": "{}",
        "task": "t",
        "corpus": "c",
        "task_options": "{}",
        "length": 64,
        "depth": None,
        "doc": None,
        "trial": None,
        "metric": "loss",
        "value": 2.5,
        "n": 10,
        "seed": 0,
        "seconds": 0.1,
        "status": "ok",
        "error": None,
    }


def test_damaged_lines_are_skipped_counted_and_named(tmp_path):
    lines = [
        json.dumps(_good("a")),
        json.dumps({**_good("b"), "cell": ["a", "list"]}),
        json.dumps({**_good("c"), "cell": {"a": "dict"}}),
        "[" * 200000 + "]" * 200000,
        json.dumps({**_good("d"), "length": "64"}),
        json.dumps({**_good("e"), "value": True}),
        json.dumps({"id": 7, "score": 0.5}),
        json.dumps(_good("f")),
    ]
    (tmp_path / "records.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.warns(ResultsWarning) as caught:
        rows = read_jsonl(tmp_path / "records.jsonl")
    assert [r["cell"] for r in rows] == ["a", "f"]
    message = str(caught[0].message)
    assert "skipped 6 damaged lines" in message and "line 2: cell is a list" in message
    with pytest.warns(ResultsWarning, match="skipped 6 damaged lines"):
        df = results.load(tmp_path)
    assert sorted(df["cell"]) == ["a", "f"] and (df["value"] == 2.5).all()
    with pytest.warns(ResultsWarning, match="skipped 6 damaged lines"):
        assert finished_cells(tmp_path) == {"a", "f"}


@pytest.mark.parametrize(
    "line, why",
    [
        (json.dumps({**_good("x"), "cell": [1, 2]}), "cell is a list"),
        ("[" * 200000 + "]" * 200000, "nested too deeply"),
        (json.dumps({"id": 1, "score": 0.5}), "no task, metric, value key"),
    ],
)
def test_a_file_with_no_record_is_refused_naming_file_and_line(tmp_path, line, why):
    (tmp_path / "records.jsonl").write_text(line + "\n")
    for call in (results.load, finished_cells):
        with pytest.raises(ResultsError, match=f"records.jsonl: none of its 1 lines .*line 1: {why}") as info:
            call(tmp_path)
        assert "\n" not in str(info.value)
    assert (tmp_path / "records.jsonl").read_text() == line + "\n"  # nothing is deleted


def test_records_name_taken_by_a_directory_is_refused_by_resume_and_writer(tmp_path):
    (tmp_path / "records.jsonl").mkdir()
    with pytest.raises(ResultsError, match="is not a regular file"):
        finished_cells(tmp_path)
    with pytest.raises(ResultsError, match="is not a regular file"):
        RecordWriter(tmp_path)
    assert (tmp_path / "records.jsonl").is_dir()


def test_sweep_dry_run_skips_damaged_lines_with_one_warning_line(tmp_path, capsys):
    from ropebench import sweep_lib

    out = tmp_path / "o"
    out.mkdir()
    (out / ".ropebench.lock").touch()
    (out / "records.jsonl").write_text(
        json.dumps(_good("a")) + "\n" + json.dumps({**_good("b"), "cell": [1]}) + "\n"
    )
    assert (
        sweep_lib.main(
            [
                "--model",
                "smollm2-135m",
                "--methods",
                "plain",
                "--tasks",
                "perplexity",
                "--lengths",
                "64",
                "--out",
                str(out),
                "--dry-run",
                "--quiet",
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert [x for x in err.splitlines() if "damaged" in x] == [
        (
            f"warning: {out / 'records.jsonl'}: skipped 1 damaged line "
            "(line 2: cell is a list ([1]), expected a string)"
        )
    ]


# ----------------------------------------------------------------------------------------- results API errors
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"rows": ["method", "nosuch"]},
            "rows 'nosuch' is not a column of the records — use one of: run, cell",
        ),
        ({"cols": "nosuch"}, "cols 'nosuch' is not a column"),
        ({"rows": "method", "cols": "method"}, "'method' is given twice as rows/cols"),
        ({"rows": ["method", "method"]}, "'method' is given twice"),
    ],
)
def test_table_axes_raise_results_errors(perplexity_run_dir, kwargs, match):
    """table, compare and paired_differences (all need method in rows, as given here) and summarize."""
    df = results.load(perplexity_run_dir)
    for call in (results.table, results.compare, results.paired_differences):
        with pytest.raises(ResultsError, match=match) as info:
            call(df, "perplexity", "ppl", **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(
        ResultsError, match="rows 'nosuch' is not a column"
    ):  # the call: was a KeyError
        results.table(df, "perplexity", "ppl", rows="nosuch")
    with pytest.raises(ResultsError, match="'length' is given twice"):
        results.estimates(df, "perplexity", "ppl", by=("length", "length"))


# ---------------------------------------------------------------------------------------------- sweep pieces
def test_config_keys_must_be_names_at_every_level(tmp_path):
    from ropebench.sweep_lib.config import ConfigError, read_yaml

    for text, key in (("1: x\n", "1"), ("options: {yarn: {2: 3}}\n", "2"), ("true: 3\n", "True")):
        (tmp_path / "c.yaml").write_text("model: smollm2-135m\n" + text)
        with pytest.raises(ConfigError, match=rf"c.yaml \(line \d+, column \d+\): key {key} is not a name"):
            read_yaml(tmp_path / "c.yaml")


def test_discard_removes_only_what_the_sweep_made(tmp_path):
    from ropebench.sweep_lib import rundir

    out = tmp_path / "o"
    lock, created = rundir.take(out)
    assert created and (out / ".ropebench.lock").is_file()
    (out / "manifest.json").write_text("{}")
    (out / "theirs.txt").write_text("someone else's")
    rundir.discard(out, lock)
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    # what is left is the user's alone (no marker): a later sweep is refused there, writing nothing
    with pytest.raises(rundir.ConfigError, match="ropebench did not make"):
        rundir.take(out)
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]


def test_report_index_is_deleted_by_fresh(synthetic_records, perplexity_run_dir, tmp_path):
    from ropebench.sweep_lib import rundir

    out = tmp_path / "o"
    RecordWriter(out).write(synthetic_records("o", tasks=("perplexity",)))
    results.report(out)
    (out / "notes.md").write_text("mine")
    rundir.fresh(out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.md"]


def test_warnings_during_a_test_are_not_printed_by_the_cli_formatter():
    """sweep_lib.main restores the warning display it replaced (it is a library call in these tests)."""
    from ropebench import sweep_lib

    shown = warnings.showwarning
    sweep_lib.main(["--lenghts", "5"])
    assert warnings.showwarning is shown
