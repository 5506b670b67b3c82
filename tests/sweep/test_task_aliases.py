"""One task twice under different names (issue 31, item 5): `tasks: {retrieval-mk: {task: retrieval, ...},
retrieval-vt: {task: retrieval, ...}}` runs each entry as cells of its own, reported under its own name, with
the task it ran recorded in task_options; configs without such entries keep their cell keys."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from ropebench import sweep_lib
from ropebench.sweep_lib import checks
from ropebench.sweep_lib import grid as G
from ropebench.sweep_lib.cli import load_config, parser
from ropebench.sweep_lib.config import ConfigError
from ropebench.sweep_lib.printout import main_tables


def config(tmp_path: Path, text: str, model="m") -> str:
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text).replace("{model}", str(model)))
    return str(path)


def parse(argv):
    return load_config(parser().parse_args(argv))


def two(tmp_path, model="m", options="depths: [0.5], trials: 1, candidates: 2") -> str:
    """A config with two retrieval entries under names of their own."""
    return config(
        tmp_path,
        f"""\
        model: {{model}}
        methods: [plain]
        tasks:
          retrieval-mk: {{task: retrieval, variants: niah_multikey, lengths: [320], {options}}}
          retrieval-vt: {{task: retrieval, variants: vt, lengths: [640], {options}}}
        """,
        model,
    )


def test_entries_resolve_to_their_task_and_keep_their_names(tmp_path):
    cfg = parse(["--config", two(tmp_path)])
    assert list(cfg["tasks"]) == ["retrieval-mk", "retrieval-vt"]
    mk, vt = cfg["tasks"]["retrieval-mk"], cfg["tasks"]["retrieval-vt"]
    assert mk["task"] == vt["task"] == "retrieval" and "task" not in mk["options"]
    assert mk["options"]["variants"] == "niah_multikey" and vt["options"]["variants"] == "vt"
    checks.check_tasks(cfg)  # each entry's options against retrieval's declaration
    # the per-length default is the task's: a second passkey entry gets one cell per length too
    cfg = parse(
        [
            "--config",
            config(
                tmp_path,
                "model: m\nmethods: [plain]\nlengths: [64, 128]\n"
                "tasks: {passkey: {}, passkey-deep: {task: passkey, depths: [0.0]}}\n",
            ),
        ]
    )
    assert cfg["tasks"]["passkey-deep"]["per_length"] is True
    cells = G.build(dict(cfg, dtype="float32"))
    assert [(c.task, c.lengths) for c in cells] == [
        ("passkey", (64,)),
        ("passkey", (128,)),
        ("passkey-deep", (64,)),
        ("passkey-deep", (128,)),
    ]


def test_cells_name_the_entry_and_record_the_task(tmp_path):
    cfg = parse(["--config", two(tmp_path)])
    cells = G.build(dict(cfg, dtype="float32"), lambda task, option: task == "retrieval")
    assert [c.task for c in cells] == ["retrieval-mk", "retrieval-vt"] and len({c.key for c in cells}) == 2
    for cell in cells:
        assert cell.base_task == "retrieval" and cell.task_options["task"] == "retrieval"
        assert (
            cell.task_options["corpus"] == "sotu"
        )  # retrieval takes a corpus: asked of the task, not the name
        assert "task" not in cell.call_options() and cell.call_options()["trials"] == 1
        assert "retrieval-" in cell.label()


def test_cell_keys_of_entries_named_after_their_task_do_not_change(tmp_path):
    """A config without renamed entries keeps every key (earlier runs resume), `task: perplexity` included."""
    plain = parse(
        [
            "--config",
            config(
                tmp_path, "model: m\nmethods: [plain]\ntasks: {perplexity: {num_docs: 1, lengths: [64]}}\n"
            ),
        ]
    )
    named = parse(
        [
            "--config",
            config(
                tmp_path,
                "model: m\nmethods: [plain]\n"
                "tasks: {perplexity: {task: perplexity, num_docs: 1, lengths: [64]}}\n",
            ),
        ]
    )
    assert plain["tasks"] == named["tasks"] and "task" not in plain["tasks"]["perplexity"]
    for c in (plain, named):
        checks.check_methods(c)  # plain runs at factor 1
    a, b = (G.build(dict(c, dtype="float32")) for c in (plain, named))
    expected = G.make_cell(
        model="m",
        method="plain",
        factor=1.0,
        options={},
        task="perplexity",
        task_options={"num_docs": 1, "corpus": "sotu"},
        lengths=(64,),
        seed=0,
        dtype="float32",
    )
    assert [c.key for c in a] == [c.key for c in b] == [expected.key]
    assert a[0].call_options() == a[0].task_options and a[0].base_task == "perplexity"


def test_task_options_and_selection_name_entries(tmp_path):
    path = two(tmp_path)
    cfg = parse(["--config", path, "-t", "retrieval-mk.trials=4"])
    assert cfg["tasks"]["retrieval-mk"]["options"]["trials"] == 4
    assert cfg["tasks"]["retrieval-vt"]["options"]["trials"] == 1
    cfg = parse(["--config", path, "--tasks", "retrieval-vt", "-t", "retrieval-vt.candidates=3"])
    assert list(cfg["tasks"]) == ["retrieval-vt"]
    assert cfg["tasks"]["retrieval-vt"]["task"] == "retrieval"
    assert cfg["tasks"]["retrieval-vt"]["options"] == {
        "variants": "vt",
        "depths": [0.5],
        "trials": 1,
        "candidates": 3,
    }
    with pytest.raises(ConfigError, match="with a task of the grid — did you mean retrieval-"):
        parse(["--config", path, "-t", "retrieval.trials=4"])
    # the main tables: each entry's name with its task's tables
    tables = main_tables(cfg["tasks"])
    assert tables and {t for t, _, _ in tables} == {"retrieval-vt"}
    assert ("retrieval-vt", "answer_top1") in {(t, m) for t, m, _ in tables}


@pytest.mark.parametrize(
    ("tasks", "flags", "expect"),
    [
        ("{retrieval-mk: {variants: vt}}", (), "unknown task 'retrieval-mk' — did you mean retrieval? "),
        ("{mk: {task: retreival}}", (), "tasks.mk.task: unknown task 'retreival' — did you mean retrieval?"),
        ("{mk: {task: 3}}", (), "tasks.mk.task must be the name of a task, got 3"),
        ("{passkey: {task: retrieval}}", (), "tasks.passkey runs task 'retrieval' under the name of task"),
        ("{theory: {task: retrieval}}", (), "under the name of the theory rows"),
        ("{'a,b': {task: retrieval}}", (), "task entry name 'a,b' contains ','"),
        (
            "{mk: {task: retrieval, variants: vtt}}",
            (),
            "tasks.mk (task retrieval): retrieval option variants",
        ),
        ("{mk: {task: retrieval}}", ("--tasks", "mk", "vt-2"), "unknown task 'vt-2'"),
        ("{mk: {task: retrieval}}", ("-t", "mk.tials=2"), "unknown option 'tials'"),
    ],
)
def test_bad_entries_get_one_line_and_exit_2(tmp_path, tiny_model_dir, capsys, tasks, flags, expect):
    path = config(
        tmp_path, f"model: {{model}}\nmethods: [plain]\nlengths: [256]\ntasks: {tasks}\n", tiny_model_dir
    )
    out = tmp_path / "run"
    assert sweep_lib.main(["--config", path, "--out", str(out), "--quiet", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and " — " in err, err
    assert expect in err, err
    assert not out.exists()


def test_two_retrieval_entries_run_and_report_both(tmp_path, tiny_model_dir, capsys):
    """Acceptance (issue 31): a config with two retrieval entries under different names runs and reports
    both."""
    from ropebench import results

    out = tmp_path / "run"
    argv = ["--config", two(tmp_path, tiny_model_dir), "--out", str(out), "--quiet", "--device", "cpu"]
    assert sweep_lib.main(argv) == 0
    stdout = capsys.readouterr().out
    assert "all 2 cells finished" in stdout
    assert "retrieval-mk/answer_top1" in stdout and "retrieval-vt/answer_top1" in stdout
    df = results.load(out)
    ok = df[df["status"] == "ok"]
    assert set(ok["task"]) == {"retrieval-mk", "retrieval-vt"}
    for name in ("retrieval-mk", "retrieval-vt"):
        rows = ok[ok["task"] == name]
        options = [o if isinstance(o, dict) else json.loads(o) for o in rows["task_options"]]
        assert all(o["task"] == "retrieval" for o in options), options[0]
        top1 = rows[rows["metric"] == "answer_top1"]
        assert len(top1) and top1["meaning"].notna().all()  # retrieval's declaration, found by its task
        assert not results.table(df, name, "answer_top1").empty
    report = (out / "report.md").read_text()
    assert "retrieval-mk" in report and "retrieval-vt" in report
    # a rerun resumes: both cells are finished
    assert sweep_lib.main(argv) == 0 and "all 2 cells finished" in capsys.readouterr().out
    assert len(results.load(out)) == len(df)
