"""Issue 41.1: one rule for every path ropebench writes (extend/owned_paths.py). Each writer gets a user's
files planted in its target, beside it, behind a broken or foreign marker and behind a symbolic link, and
they must be byte-identical after the command, whether it succeeds or is refused.

No real model: synthetic records (tests/results/synthetic.py), the gpu check with every section skipped,
lm-eval refused before it loads anything, a fake pip for the wheel folder.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from ropebench import results
from ropebench.extend.errors import RopebenchError
from ropebench.extend.owned_paths import MARKER, OwnedDir, read_marker, safe_name
from ropebench.results.store import RecordWriter, ResultsError

USER = b"the user's own bytes\n"


def snapshot(*roots: Path) -> dict[str, bytes]:
    """Every file under the roots (links as their target text): what must not change."""
    seen = {}
    for root in roots:
        for p in sorted(root.rglob("*")):
            if p.is_symlink():
                seen[str(p)] = b"link -> " + os.fsencode(os.readlink(p))
            elif p.is_file():
                seen[str(p)] = p.read_bytes()
    return seen


def plant(d: Path, *names: str) -> None:
    for name in names:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(USER)


def marker_text(files: dict[str, str]) -> str:
    return json.dumps({"made_by": "ropebench", "files": files})


# Markers that must not count: empty, unparsable, someone else's, a folder, and a link to a valid one.
def broken_markers(tmp: Path) -> dict[str, Path]:
    valid = tmp / "valid-elsewhere"
    valid.mkdir(parents=True)
    (valid / MARKER).write_text(marker_text({"report.md": hashlib.sha256(USER).hexdigest()}))
    made = {}
    for kind in ("empty", "unparsable", "foreign", "folder", "symlink", "escaping"):
        d = tmp / f"marker-{kind}"
        d.mkdir()
        plant(d, "report.md", "tables/perplexity_ppl.md", "tokenizer.json", "gpu_check.json")
        m = d / MARKER
        if kind == "empty":
            m.write_text("")
        elif kind == "unparsable":
            m.write_text("{not json")
        elif kind == "foreign":
            m.write_text(json.dumps({"made_by": "someone else", "files": {}}))
        elif kind == "folder":
            m.mkdir()
        elif kind == "symlink":
            m.symlink_to(valid / MARKER)
        else:  # a list that names a path outside the folder
            m.write_text(marker_text({"../outside.md": hashlib.sha256(USER).hexdigest()}))
        made[kind] = d
    return made


# ---------------------------------------------------------------------------------------------- the guard
NASTY = ["../../etc/passwd", "a/b", "..", ".", "", "/abs", "x\\..\\y", ".hidden", "tab\tnew\nline", "é/ü"]


@pytest.mark.parametrize("text", NASTY)
def test_safe_name_stays_in_its_folder(text, tmp_path):
    name = safe_name(text)
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()
    assert "/" not in name and not name.startswith(".") and name not in ("", ".", "..")


def test_safe_name_keeps_plain_names_and_separates_different_texts():
    for plain in ("perplexity_ppl", "reach_passkey_accuracy_threshold", "loss_by_position_x-y=2.5"):
        assert safe_name(plain) == plain
    made = {safe_name(t) for t in ("a/b", "a_b", "a-b", "a b", "a:b")}
    assert len(made) == 5


def test_markers_that_do_not_count_leave_the_folder_the_users(tmp_path):
    for kind, d in broken_markers(tmp_path).items():
        before = snapshot(d, tmp_path / "valid-elsewhere")
        assert read_marker(d) is None, kind
        with pytest.raises(RopebenchError, match="non-empty directory ropebench did not make"):
            OwnedDir.open(d)
        assert snapshot(d, tmp_path / "valid-elsewhere") == before, kind


def test_a_file_changed_since_ropebench_wrote_it_is_kept_and_named(tmp_path):
    owned = OwnedDir.open(tmp_path / "o")
    owned.write_text("a.md", "ours\n")
    owned.write_text("sub/b.md", "ours too\n")
    assert read_marker(tmp_path / "o") == {
        "a.md": hashlib.sha256(b"ours\n").hexdigest(),
        "sub/b.md": hashlib.sha256(b"ours too\n").hexdigest(),
    }
    owned.write_text("a.md", "rewritten by ropebench\n")  # unchanged since: ours to replace
    (tmp_path / "o" / "a.md").write_bytes(USER)  # the user edits it
    with pytest.raises(RopebenchError, match=r"a\.md was changed since ropebench wrote it — kept"):
        OwnedDir.open(tmp_path / "o").write_text("a.md", "again")
    plant(tmp_path / "o", "mine.md", "sub/mine.md")
    removed, kept = OwnedDir.open(tmp_path / "o").remove_listed()
    assert removed == [tmp_path / "o" / "sub" / "b.md"] and kept == [tmp_path / "o" / "a.md"]
    assert snapshot(tmp_path / "o") == {
        str(tmp_path / "o" / n): USER for n in ("a.md", "mine.md", "sub/mine.md")
    } | {str(tmp_path / "o" / MARKER): (tmp_path / "o" / MARKER).read_bytes()}
    assert list(read_marker(tmp_path / "o")) == ["a.md"]  # still listed: still never replaced


@pytest.mark.parametrize("rel", ["../beside.md", "/tmp/abs.md", "sub/../../beside.md", "linked/x.md", MARKER])
def test_no_write_leaves_the_folder(rel, tmp_path):
    outside = tmp_path / "outside"
    plant(outside, "x.md")
    plant(tmp_path, "beside.md")
    d = tmp_path / "o"
    OwnedDir.open(d).write_text("ours.md", "ours")
    (d / "linked").symlink_to(outside)
    owned = OwnedDir.open(d)
    before = snapshot(tmp_path)
    with pytest.raises(RopebenchError):
        owned.write_text(rel, "x")
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------- report
@pytest.fixture(scope="module")
def run_dir(synthetic_records, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("owned") / "run"
    RecordWriter(d).write(synthetic_records("run", tasks=("perplexity",)))
    return d


def test_report_behind_broken_markers_and_links_changes_nothing(run_dir, tmp_path):
    for kind, d in broken_markers(tmp_path).items():
        before = snapshot(tmp_path)
        with pytest.raises(ResultsError, match="ropebench did not make"):
            results.report(run_dir, out=d)
        assert snapshot(tmp_path) == before, kind
    mine = tmp_path / "mine"
    plant(mine, "perplexity_ppl.md")
    out = tmp_path / "rep"
    results.report(run_dir, out=out)
    shutil.rmtree(out / "tables")
    (out / "tables").symlink_to(mine)  # a link out of the report's folder
    before = snapshot(tmp_path)
    with pytest.raises(ResultsError, match="tables is not a directory ropebench made"):
        results.report(run_dir, out=out)
    assert snapshot(tmp_path) == before


def test_a_copied_report_folder_keeps_the_users_annotations(run_dir, tmp_path):
    results.report(run_dir, out=tmp_path / "orig")
    shutil.copytree(tmp_path / "orig", tmp_path / "copy")  # marker included
    with open(tmp_path / "copy" / "report.md", "a") as f:
        f.write("\nMy notes: yarn looks good.\n")
    plant(tmp_path / "copy", "tables/my-table.md")
    before = snapshot(tmp_path / "copy")
    with pytest.raises(ResultsError, match=r"report\.md was changed since ropebench wrote it — kept"):
        results.report(run_dir, out=tmp_path / "copy")
    assert snapshot(tmp_path / "copy") == before
    results.report(run_dir, out=tmp_path / "orig")  # unchanged: its own files are replaced
    assert (tmp_path / "orig" / "report.md").read_text().startswith("# ropebench report")


def test_task_names_with_separators_write_only_inside_the_report(synthetic_records, tmp_path):
    rows = synthetic_records("evil", tasks=("perplexity",))
    for r in rows:
        r["task"] = "../../escaped/../x"
    run = tmp_path / "deep" / "er" / "run"
    RecordWriter(run).write(rows)
    plant(tmp_path, "escaped/x_ppl_vs_plain.md", "x_ppl.md", "deep/x_ppl.md")
    before = snapshot(tmp_path)
    results.report(run)
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before  # nothing of the user's changed
    new = [Path(k) for k in after if k not in before]
    assert new and all(run in p.parents for p in new)  # everything the report wrote is in the run folder
    assert all(p.parent.name in ("run", "tables", "plots") for p in new)


# ---------------------------------------------------------------------------------------------- --fresh
def test_fresh_removes_only_what_the_marker_lists(run_dir, tmp_path, synthetic_records):
    from ropebench.sweep_lib import rundir

    out = tmp_path / "o"
    RecordWriter(out).write(synthetic_records("o", tasks=("perplexity",)))
    results.report(out)
    # the user's own tables and plots, linked from report.md; one of ropebench's tables edited
    plant(out, "tables/mine.md", "tables/mine.csv", "tables/mine.tex", "plots/mine.png", "notes.md")
    with open(out / "report.md", "a") as f:
        f.write("\n[mine](tables/mine.md) ![mine](plots/mine.png)\n")
    edited = out / "tables" / "perplexity_ppl.md"
    edited.write_bytes(USER)
    keep = {
        k: v
        for k, v in snapshot(out).items()
        if "mine" in k or "notes" in k or k.endswith(("report.md", "perplexity_ppl.md"))
    }
    with pytest.warns(UserWarning, match=r"--fresh kept 2 file\(s\) .*perplexity_ppl\.md"):
        removed = rundir.fresh(out)
    after = snapshot(out)
    assert {k: after.get(k) for k in keep} == keep
    assert not (out / "records.jsonl").exists() and removed
    assert all(p.name not in ("mine.md", "notes.md", "report.md") for p in removed)


# ---------------------------------------------------------------------------------------------- sweep --out
@pytest.mark.parametrize("kind", ["empty", "unparsable", "foreign", "symlink"])
def test_sweep_out_behind_a_broken_marker_is_refused(kind, tmp_path, capsys):
    from ropebench import sweep_lib

    d = broken_markers(tmp_path)[kind]
    before = snapshot(tmp_path)
    argv = ["--model", "smollm2-135m", "--methods", "plain", "--tasks", "perplexity", "--lengths", "64"]
    assert sweep_lib.main([*argv, "--out", str(d), "--fresh", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ropebench did not make" in err[0]
    assert snapshot(tmp_path) == before


def test_sweep_take_marks_a_new_run_directory_and_discard_unmarks_it(tmp_path):
    from ropebench.sweep_lib import rundir

    plant(tmp_path, "beside.txt")
    out = tmp_path / "o"
    lock, created = rundir.take(out)
    assert created and read_marker(out) == {".ropebench.lock": "appended"}
    assert rundir.is_run_dir(out)
    rundir.discard(out, lock)
    assert not out.exists() and (tmp_path / "beside.txt").read_bytes() == USER


# ---------------------------------------------------------------------------------------------- bench gpu
def gpu(*args) -> int:
    from ropebench.benchmarks.errors import exit_code
    from ropebench.benchmarks.gpu_check import SECTIONS, main

    return exit_code(main, ["--cpu-sizes", "--skip", *SECTIONS, *args])


def test_bench_gpu_out_never_replaces_a_users_report(tmp_path, capsys):
    mine = tmp_path / "mine"
    plant(mine, "report.md")
    before = snapshot(tmp_path)
    assert gpu("--out", str(mine)) == 2
    assert "ropebench did not make" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
    for kind, d in broken_markers(tmp_path / "b").items():
        before = snapshot(tmp_path)
        assert gpu("--out", str(d)) == 2, kind
        assert snapshot(tmp_path) == before, kind
    out = tmp_path / "new"
    assert gpu("--out", str(out)) == 0  # success: a new folder, then again (its own files replaced)
    plant(out, "notes.md")
    assert gpu("--out", str(out)) == 0
    assert sorted(read_marker(out)) == ["gpu_check.json", "report.md"]
    assert (out / "notes.md").read_bytes() == USER and (mine / "report.md").read_bytes() == USER
    (out / "report.md").write_bytes(USER)  # the user annotates it: kept, the check refused
    assert gpu("--out", str(out)) == 2
    assert "changed since ropebench wrote it" in capsys.readouterr().err
    assert (out / "report.md").read_bytes() == USER


def test_save_tokenizer_never_replaces_a_users_tokenizer(tmp_path, capsys, monkeypatch):
    from ropebench.benchmarks import gpu_demo_grid

    class Tokenizer:  # what save_pretrained writes, without loading the embedded GGUF
        def save_pretrained(self, folder):
            Path(folder, "tokenizer.json").write_text('{"version": "1.0"}')
            Path(folder, "tokenizer_config.json").write_text("{}")

    monkeypatch.setattr(gpu_demo_grid, "smollm2_tokenizer", lambda *a: (Tokenizer(), "fake"))
    from ropebench.benchmarks.errors import exit_code
    from ropebench.benchmarks.gpu_check import main

    mine = tmp_path / "mine"
    plant(mine, "tokenizer.json")
    before = snapshot(tmp_path)
    assert exit_code(main, ["--save-tokenizer", str(mine)]) == 2
    assert snapshot(tmp_path) == before
    d = broken_markers(tmp_path / "b")["symlink"]
    before = snapshot(tmp_path)
    assert exit_code(main, ["--save-tokenizer", str(d)]) == 2
    assert snapshot(tmp_path) == before
    new = tmp_path / "tok"
    assert exit_code(main, ["--save-tokenizer", str(new)]) == 0
    assert sorted(read_marker(new)) == ["tokenizer.json", "tokenizer_config.json"]
    (new / "tokenizer.json").write_bytes(USER)
    assert exit_code(main, ["--save-tokenizer", str(new)]) == 2
    assert (new / "tokenizer.json").read_bytes() == USER
    assert not [p for p in new.iterdir() if p.name.startswith(".staging")]
    capsys.readouterr()


# ---------------------------------------------------------------------------------------------- wheels
def test_wheels_folder_removes_only_its_own_wheels(tmp_path, monkeypatch):
    from ropebench.benchmarks import wheels

    got = {"n": 0}

    def fake_pip(*args):
        got["n"] += 1
        folder = Path(args[args.index("-d") + 1])
        (folder / f"pkg-{got['n']}-py3-none-any.whl").write_bytes(b"wheel %d" % got["n"])

    monkeypatch.setattr(wheels, "pip", fake_pip)
    monkeypatch.setattr(wheels, "resolve", lambda requirements, constraints: {})
    monkeypatch.setattr(wheels, "pinned", lambda name, constraints, declared: f"{name}==1")
    mine = tmp_path / "mine"
    plant(mine, "my-1-py3-none-any.whl")
    before = snapshot(tmp_path)
    with pytest.raises(RopebenchError, match="ropebench did not make"):
        wheels.gather(mine, tmp_path / "constraints.txt")
    assert snapshot(tmp_path) == before
    out = tmp_path / "w"
    wheels.gather(out, tmp_path / "constraints.txt")
    plant(out, "my-2-py3-none-any.whl")
    wheels.gather(out, tmp_path / "constraints.txt")  # the first gather's wheel goes, the user's stays
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".whl") == [
        "my-2-py3-none-any.whl",
        "pkg-2-py3-none-any.whl",
    ]
    assert (out / "my-2-py3-none-any.whl").read_bytes() == USER


# ---------------------------------------------------------------------------------------------- lm-eval
def test_lm_eval_output_path_of_the_users_is_refused_before_the_model_loads(tmp_path):
    from ropebench.integrations.lm_eval.cli import owned_output

    mine = tmp_path / "mine"
    plant(mine, "results.json", "notes.md")
    broken = broken_markers(tmp_path / "b")
    before = snapshot(tmp_path)
    for path in (mine, mine / "results.json", *broken.values()):
        with pytest.raises(RopebenchError, match="ropebench did not make"):
            owned_output(argparse.Namespace(command="run", output_path=str(path)))
    assert snapshot(tmp_path) == before
    owned, found = owned_output(argparse.Namespace(command="run", output_path=str(tmp_path / "new")))
    plant(tmp_path / "new", "model/results_1.json")  # as lm-eval writes it
    owned.record(sorted(owned.existing() - found))
    assert list(read_marker(tmp_path / "new")) == ["model/results_1.json"]
    assert owned_output(argparse.Namespace(command="run", output_path=str(tmp_path / "new"))) is not None


def test_lm_eval_cli_refuses_a_users_output_folder_with_one_line(tmp_path, capsys):
    from ropebench.integrations.lm_eval import main

    mine = tmp_path / "mine"
    plant(mine, "notes.md")
    before = snapshot(tmp_path)
    argv = ["run", "--model", "hf", "--model_args", "pretrained=none", "--tasks", "x"]
    assert main([*argv, "--output_path", str(mine)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --output_path folder") and "ropebench did not make" in err[-1]
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------- the cache
def test_a_cache_folder_of_the_users_gets_no_snapshot_and_no_cache_file(tmp_path, monkeypatch):
    from ropebench.extend import loading
    from ropebench.extend.errors import ExtendError
    from ropebench.tasks import key_tokens

    mine = tmp_path / "mine"
    plant(mine, "cpu-dtype.json", "notes.md")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("ROPEBENCH_CACHE", str(mine))
    before = snapshot(tmp_path)
    with pytest.raises(ExtendError, match="cache folder .* ropebench did not make"):
        loading.gguf_snapshot(gguf)
    key_tokens._write_atomic(key_tokens.cache_dir() / "k.json", {"spans": []})  # not cached, no error
    assert snapshot(tmp_path) == before
    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path / "cache"))
    key_tokens._write_atomic(key_tokens.cache_dir() / "k.json", {"spans": []})
    assert read_marker(tmp_path / "cache") == {"key_tokens/k.json": "appended"}


# ----------------------------------------------------------------------------------------------- task export
def test_lm_eval_export_never_removes_a_users_task_file(tmp_path, monkeypatch):
    from ropebench.tasks import lm_eval_export
    from ropebench.tasks.errors import TaskError

    mine = tmp_path / "mine"
    plant(mine, "ropebench_passkey_1k.yaml")
    before = snapshot(tmp_path)
    with pytest.raises(TaskError, match="ropebench did not make"):
        lm_eval_export.export(mine)
    assert snapshot(tmp_path) == before
    tasks = {"ropebench_passkey_1k.yaml": "task: a\n", "ropebench_passkey_2k.yaml": "task: b\n"}
    monkeypatch.setattr(lm_eval_export, "render", lambda tokenizer, **options: dict(tasks))
    out = tmp_path / "tasks"
    lm_eval_export.export(out)
    plant(out, "ropebench_mine_4k.yaml")
    del tasks["ropebench_passkey_2k.yaml"]  # an export of fewer lengths: its own old file goes
    lm_eval_export.export(out)
    yamls = sorted(p.name for p in out.glob("*.yaml"))
    assert yamls == ["ropebench_mine_4k.yaml", "ropebench_passkey_1k.yaml"]
    assert (out / "ropebench_mine_4k.yaml").read_bytes() == USER


# ---------------------------------------------------------------------------------------------- the store
def test_the_store_never_replaces_a_manifest_of_the_users(tmp_path):
    run = tmp_path / "run"
    plant(run, "manifest.json")
    writer = RecordWriter(run)
    for write in (writer.write_manifest, writer.finish):
        with pytest.raises(ResultsError, match=r"manifest\.json exists and ropebench did not write it"):
            write()
    assert (run / "manifest.json").read_bytes() == USER
    ours = tmp_path / "ours"
    RecordWriter(ours).write_manifest(seed=1)
    RecordWriter(ours).finish()  # its own manifest: rewritten
    assert json.loads((ours / "manifest.json").read_text())["seed"] == 1


# ---------------------------------------------------------------------------------------------- bench --json
def test_bench_json_file_is_new_or_ropebenchs_unchanged(tmp_path, monkeypatch, capsys):
    from ropebench.benchmarks.errors import exit_code
    from ropebench.benchmarks.longppl_cost import main
    from ropebench.extend.owned_paths import check_loose_file, write_loose_file

    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path / "cache"))
    mine, target = tmp_path / "mine.json", tmp_path / "theirs.txt"
    mine.write_bytes(USER)
    target.write_bytes(USER)
    (tmp_path / "link.json").symlink_to(target)
    before = snapshot(tmp_path)
    for name in ("mine.json", "link.json"):  # refused before anything is measured: one line, exit 2
        assert exit_code(main, ["--json", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: --json") and "new file" in err[0]
    assert snapshot(tmp_path) == before
    out = tmp_path / "out.json"
    write_loose_file(out, '{"a": 1}', "--json")
    write_loose_file(out, '{"a": 2}', "--json")  # its own, unchanged: replaced
    assert json.loads(out.read_text()) == {"a": 2}
    out.write_bytes(USER)  # the user edits it: kept
    with pytest.raises(RopebenchError, match="exists and ropebench did not write it"):
        check_loose_file(out, "--json")
    assert out.read_bytes() == USER and not list(tmp_path.glob(MARKER))  # no marker in the user's folder


def test_bench_run_out_never_replaces_a_users_report(tmp_path, monkeypatch, capsys):
    from ropebench.benchmarks import orchestrate
    from ropebench.benchmarks.errors import exit_code
    from ropebench.benchmarks.run import main

    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path / "cache"))
    mine = tmp_path / "BENCHMARKS.md"
    mine.write_bytes(USER)
    before = snapshot(tmp_path)
    assert exit_code(main, ["--quick", "--out", str(mine)]) == 2  # refused before anything is measured
    assert "exists and ropebench did not write it" in capsys.readouterr().err
    assert snapshot(tmp_path) == before
    out = tmp_path / "new.md"
    orchestrate.atomic_write_text(out, "# ropebench benchmarks\n")
    orchestrate.atomic_write_text(out, "# ropebench benchmarks, again\n")  # its own: replaced
    with pytest.raises(RopebenchError, match="exists and ropebench did not write it"):
        orchestrate.atomic_write_text(mine, "x")
    assert mine.read_bytes() == USER


def test_measure_tasks_refuses_a_users_out_file_before_measuring(tmp_path):
    """scripts/measure_tasks.py writes its --out through the guard and checks it first, before hours of
    measuring: a user's file there is kept byte for byte, one `error:` line, exit 2."""
    import subprocess
    import sys

    mine = tmp_path / "notes.md"
    mine.write_bytes(b"the user's own notes\n")
    script = Path(__file__).resolve().parents[2] / "scripts" / "measure_tasks.py"
    done = subprocess.run(
        [sys.executable, str(script), "--out", str(mine)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "ROPEBENCH_CACHE": str(tmp_path / "cache")},
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().startswith(f"error: --out {mine} exists and ropebench did not write it")
    assert "\n" not in done.stderr.strip() and mine.read_bytes() == b"the user's own notes\n"
