"""scripts/sweep.py: config + CLI overrides, method facts deciding the factors, cell keys, failure isolation,
resume after kill -9, and an end-to-end run on a tiny random Llama (real perplexity task) that a 2-process
accelerate launch must reproduce. Bad input (exit 2, one line) is tests/project/test_bad_inputs.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from ropebench import sweep_lib
from ropebench.sweep_lib import checks, resolve
from ropebench.sweep_lib import config as C
from ropebench.sweep_lib import grid as G
from ropebench.sweep_lib import run as R
from ropebench.sweep_lib.cli import load_config, parser

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
SWEEP = SCRIPTS / "sweep.py"
PY = sys.executable


def records(run_dir) -> list[dict]:
    rows = []
    for f in sorted(Path(run_dir).glob("records*.jsonl")):
        if f.name.startswith("records-"):  # a user's file in the run directory, not ropebench's
            continue
        rows += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return rows


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def fake_args(model, out, *more):
    return [
        "--model",
        str(model),
        "--tasks",
        "fake",
        "--lengths",
        "16",
        "32",
        "--out",
        str(out),
        "--quiet",
        *more,
    ]


# ---------------------------------------------------------------------------------------------- config
def parse(argv):
    """The resolved config of a command line (shape and types; names are checked by `checks`)."""
    return load_config(parser().parse_args(argv))


def parse_methods(argv):
    """As parse, with the methods checked against the registry (which runs plain at factor 1 alone)."""
    cfg = parse(argv)
    checks.check_methods(cfg)
    return cfg


def test_yaml_config_and_cli_overrides(tmp_path):
    cfg_file = write(
        tmp_path / "c.yaml",
        """
        model: smollm2-135m
        methods: [plain, {method: yarn, factors: [4], options: {beta_fast: 16}}, pi]
        factors: [2]
        options: {pi: {}}
        tasks:
          perplexity: {lengths: [4096, 2048], num_docs: 2}
          passkey: {lengths: [8k], trials: 1}
        seed: 3
        out: runs/x
        """,
    )
    cfg = parse_methods(["--config", str(cfg_file)])
    assert cfg["model"] == ["smollm2-135m"]
    assert [(m["method"], m["factors"], m["options"]) for m in cfg["methods"]] == [
        ("plain", [1.0], {}),
        ("yarn", [4.0], {"beta_fast": 16}),
        ("pi", [2.0], {}),
    ]
    assert cfg["tasks"]["perplexity"] == {
        "lengths": [2048, 4096],
        "per_length": False,
        "options": {"num_docs": 2},
    }
    assert cfg["tasks"]["passkey"]["lengths"] == [8192] and cfg["tasks"]["passkey"]["per_length"] is True
    assert cfg["seed"] == 3 and cfg["out"] == str((Path.cwd() / "runs/x").resolve())

    cfg = parse_methods(
        [
            "--config",
            str(cfg_file),
            "--methods",
            "yarn,ntk",
            "--factors",
            "8",
            "--lengths",
            "1024",
            "--tasks",
            "perplexity",
            "--seed",
            "5",
            "--dtype",
            "bf16",
            "-o",
            "yarn.beta_slow=2",
            "-t",
            "perplexity.num_docs=1",
            "--corpus",
            "pg19",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert [(m["method"], m["factors"], m["options"]) for m in cfg["methods"]] == [
        ("yarn", [8.0], {"beta_fast": 16, "beta_slow": 2}),
        ("ntk", [8.0], {}),
    ]  # CLI factors win
    assert list(cfg["tasks"]) == ["perplexity"] and cfg["tasks"]["perplexity"]["lengths"] == [1024]
    assert cfg["tasks"]["perplexity"]["options"] == {"num_docs": 1}
    assert (cfg["seed"], cfg["dtype"], cfg["corpus"], cfg["out"]) == (
        5,
        "bfloat16",
        ["pg19"],
        str(tmp_path / "o"),
    )


def test_no_arguments_is_the_demo():
    cfg = parse([])
    demo = C.read_yaml(C.DEMO_CONFIG)
    assert cfg["config_file"] == str(C.DEMO_CONFIG)
    assert cfg["model"] == ["smollm2-135m"]
    assert [m["method"] for m in cfg["methods"]] == demo["methods"] and "plain" in demo["methods"]
    assert set(cfg["tasks"]) == set(demo["tasks"]) == {"perplexity", "passkey", "retrieval"}
    # perplexity across SmolLM2's trained context (8192), from 2k to 12k tokens, on several documents
    ppl = cfg["tasks"]["perplexity"]
    assert min(ppl["lengths"]) <= 2048 and max(ppl["lengths"]) >= 12288 and ppl["options"]["num_docs"] >= 2
    # retrieval across distance: >= 6 independent haystacks (the paired tests' units), needles at several
    # depths, each >= 4096 tokens before the question (depth d of L tokens: about (1 - d) L)
    retrieval = cfg["tasks"]["retrieval"]
    options = retrieval["options"]
    assert options["shared_haystack"] is True and options["haystacks"] >= 6
    assert len(options["depths"]) >= 2
    assert all((1 - d) * length >= 4096 for d in options["depths"] for length in retrieval["lengths"])
    assert min(cfg["tasks"]["passkey"]["lengths"]) > 8192  # passkey: past the trained context
    checks.check_registries(cfg)  # every name of the demo is valid (it raises otherwise) ...
    # ... and plain, whose factor does nothing (registry fact), runs once at factor 1
    factors = sorted(float(f) for f in demo["factors"])
    assert [m["factors"] for m in cfg["methods"]] == [
        [1.0] if m["method"] == "plain" else factors for m in cfg["methods"]
    ] and factors != [1.0]
    assert all(set(m) == {"method", "factors", "options"} for m in cfg["methods"])  # no bookkeeping left


def test_method_facts_decide_the_factors(tmp_path):
    """A method runs at factor 1 alone where the registry says the factor does nothing (plain) or must stay 1
    with its options (self-extend with group, rerope with leaky=False); the position-remapping methods
    otherwise take the grid's factors like the frequency methods."""
    conf = write(
        tmp_path / "c.yaml",
        """
        model: smollm2-135m
        methods: [plain, dca, self-extend, rerope, {method: self-extend, options: {group: 4}},
                  {method: rerope, options: {leaky: false}}]
        factors: [2, 4]
        tasks: [perplexity]
        lengths: [64]
        """,
    )
    cfg = parse_methods(["--config", str(conf)])
    assert [(m["method"], m["factors"]) for m in cfg["methods"]] == [
        ("plain", [1.0]),
        ("dca", [2.0, 4.0]),
        ("self-extend", [2.0, 4.0]),
        ("rerope", [2.0, 4.0]),
        ("self-extend", [1.0]),
        ("rerope", [1.0]),
    ]
    from ropebench import extend

    assert not extend.describe("plain")["uses_factor"] and extend.describe("dca")["uses_factor"]
    with pytest.raises(extend.ExtendError, match="only extends context"):  # the registry's own factor check
        parse_methods(["--config", str(conf), "--methods", "dca", "--factors", "0.5"])


def test_length_warning_follows_each_methods_reach():
    """The warning limit is the registry's reach: factor x the trained context, the trained context for plain,
    any length for dca and clipped rerope, and what the group covers for self-extend with a group."""
    context = {"trained_context": 128}
    assert R.length_warning("dca", 2.0, [10**6], context) is None
    assert R.length_warning("rerope", 1.0, [10**6], dict(context, leaky=False)) is None
    assert "256 tokens" in R.length_warning("rerope", 2.0, [300], context)
    grouped = dict(context, group=4, window=16)  # reach 4 x (128 - 16 + 16 // 4) = 464
    assert R.length_warning("self-extend", 1.0, [464], grouped) is None
    assert "464 tokens" in R.length_warning("self-extend", 1.0, [465], grouped)


def test_unknown_keys_get_the_closest_names(tmp_path):
    with pytest.raises(C.ConfigError, match="unknown key 'lenghts'.*did you mean lengths"):
        resolve.resolve({"model": "m", "methods": ["plain"], "tasks": ["perplexity"], "lenghts": [1]})
    with pytest.raises(C.ConfigError, match="unknown key 'factor' in methods\\[0\\].*factors"):
        resolve.resolve(
            {"model": "m", "methods": [{"method": "yarn", "factor": 2}], "tasks": ["x"], "lengths": [1]}
        )


# ---------------------------------------------------------------------------------------------- cells
def test_cell_keys_are_stable_and_complete():
    d = {
        "model": "m",
        "method": "yarn",
        "factor": 2,
        "options": {"b": 1, "a": 2},
        "task": "perplexity",
        "task_options": {"corpus": "sotu", "num_docs": 1},
        "lengths": (2048, 4096),
        "seed": 0,
        "dtype": "float32",
    }
    cell = G.make_cell(**d)
    expected = hashlib.sha256(
        json.dumps(
            {
                "dtype": "float32",
                "factor": 2.0,
                "lengths": [2048, 4096],
                "method": "yarn",
                "model": "m",
                "options": {"a": 2, "b": 1},
                "seed": 0,
                "task": "perplexity",
                "task_options": {"corpus": "sotu", "num_docs": 1},
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
    ).hexdigest()[:16]
    assert cell.key == expected and len(cell.key) == 16
    assert G.make_cell(**dict(d, options={"a": 2, "b": 1}, factor=2.0)).key == cell.key  # canonical
    changes = {
        "model": "m2",
        "method": "pi",
        "factor": 4,
        "options": {"a": 3},
        "task": "passkey",
        "task_options": {"corpus": "pg19"},
        "lengths": (2048,),
        "seed": 1,
        "dtype": "bfloat16",
    }
    for k, v in changes.items():
        assert G.make_cell(**dict(d, **{k: v})).key != cell.key, k


def test_grid_order_per_length_and_sharding():
    cfg = parse_methods(
        [
            "--model",
            "a",
            "b",
            "--methods",
            "plain",
            "yarn",
            "--factors",
            "2",
            "4",
            "--tasks",
            "perplexity",
            "passkey",
            "--lengths",
            "64",
            "128",
        ]
    )
    cells = G.build(dict(cfg, dtype="float32"))
    # model x (plain@1 + yarn@2,4) x (perplexity: one cell with both lengths + passkey: one per length)
    assert len(cells) == 2 * 3 * (1 + 2)
    assert [c.model for c in cells[:9]] == ["a"] * 9
    assert [(c.task, c.lengths) for c in cells[:3]] == [
        ("perplexity", (64, 128)),
        ("passkey", (64,)),
        ("passkey", (128,)),
    ]
    assert G.build(dict(cfg, dtype="float32")) == cells and len({c.key for c in cells}) == len(cells)
    shards = [G.shard(cells, r, 3) for r in range(3)]
    keys = [[c.key for c in s] for s in shards]
    assert sorted((k for ks in keys for k in ks), key=[c.key for c in cells].index) == [c.key for c in cells]
    assert not set(keys[0]) & set(keys[1]) and keys[1] == [c.key for c in cells[1::3]]


# ---------------------------------------------------------------------------------------------- machinery
def test_failure_isolation_records_errors_and_continues(
    tmp_path, tiny_model_dir, fake_task, monkeypatch, capsys
):
    monkeypatch.setenv("FAKE_FAIL_METHOD", "yarn")
    out = tmp_path / "run"
    rc = sweep_lib.main(fake_args(tiny_model_dir, out, "--methods", "plain", "yarn", "pi", "--factors", "2"))
    stdout = capsys.readouterr().out
    assert rc == 1
    rows = records(out)
    bad = [r for r in rows if r["status"] == "error"]
    assert len(bad) == 1 and bad[0]["method"] == "yarn" and bad[0]["metric"] == "error"
    assert "out of memory" in bad[0]["error"] and math.isnan(bad[0]["value"])
    assert {r["method"] for r in rows if r["status"] == "ok"} == {
        "plain",
        "pi",
    }  # the sweep went on after yarn
    assert "FAILED cells (1 of 3" in stdout and bad[0]["cell"] in stdout and "report: " in stdout
    assert (out / "logs" / f"{bad[0]['cell']}.log").read_text().count("RuntimeError") >= 1
    # a rerun retries only the failed cell; once it passes the exit code is 0
    monkeypatch.delenv("FAKE_FAIL_METHOD")
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_LOG", str(log))
    rc = sweep_lib.main(fake_args(tiny_model_dir, out, "--methods", "plain", "yarn", "pi", "--factors", "2"))
    assert (
        rc == 0 and log.read_text().split("\n")[0].startswith("yarn 2") and len(log.read_text().split()) == 3
    )
    assert "all 3 cells finished" in capsys.readouterr().out
    # --fresh starts over
    rc = sweep_lib.main(fake_args(tiny_model_dir, out, "--methods", "plain", "--fresh"))
    assert rc == 0 and {r["method"] for r in records(out)} == {"plain"} and not (out / "logs").exists()


def test_fresh_deletes_only_what_ropebench_wrote(tmp_path, tiny_model_dir, fake_task, capsys):
    out = tmp_path / "run"
    assert sweep_lib.main(fake_args(tiny_model_dir, out, "--methods", "plain", "pi", "--factors", "2")) == 0
    ours = {p.relative_to(out) for p in out.rglob("*") if p.is_file()}
    assert (
        Path("records.jsonl") in ours
        and Path("report.md") in ours
        and any(p.parts[0] == "tables" for p in ours)
    )
    mine = {
        "logs/lab-notebook.txt": "notes",
        "tables/budget.csv": "a,b",
        "plots/fig1.png": "png",
        "records-mine.jsonl": "{}",
        "notes.md": "x",
    }
    for name, text in mine.items():
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(text)
    (out / "logs" / "0123456789abcdef.log").write_text("a log's name, but not one ropebench wrote")
    stray = out / ".manifest.json.4242.deadbeef.tmp"  # an atomic write cut short by a kill
    stray.write_text("{")
    assert sweep_lib.main(fake_args(tiny_model_dir, out, "--methods", "plain", "--fresh")) == 0
    for name, text in mine.items():
        assert (out / name).read_text() == text, name  # the user's files survive --fresh
    # only what the run directory's marker lists goes (extend/owned_paths.py): a log's name is not enough
    assert (out / "logs" / "0123456789abcdef.log").read_text().startswith("a log's name")
    assert not stray.exists()
    assert {r["method"] for r in records(out)} == {"plain"}
    capsys.readouterr()


def test_stray_manifest_temp_is_cleaned_on_resume(tmp_path, tiny_model_dir, fake_task):
    out = tmp_path / "run"
    assert sweep_lib.main(fake_args(tiny_model_dir, out, "--methods", "plain")) == 0
    stray = out / ".manifest.json.4242.deadbeef.tmp"
    stray.write_text("{")
    assert sweep_lib.main(fake_args(tiny_model_dir, out, "--methods", "plain")) == 0
    assert not stray.exists() and json.loads((out / "manifest.json").read_text())["resumed"]


def test_resume_after_kill_9(
    tmp_path, tiny_model_dir, fake_task_plugin, sweep_env, fake_task, monkeypatch, capsys
):
    """kill -9 in mid-run, then the same command resumes: only the unfinished cells run. The killed sweep is a
    process of its own; the resume runs in this one (`sweep_lib.main`, the same files read and written,
    without another interpreter's ~8 s of imports)."""
    out, log, ready = tmp_path / "run", tmp_path / "calls.log", tmp_path / "ready"
    args = fake_args(
        tiny_model_dir,
        out,
        "--methods",
        "plain",
        "pi",
        "ntk",
        "yarn",
        "xpos",
        "--factors",
        "2",
        "4",
    )  # plain@1 + 4 methods x 2 factors = 9 cells, one per method x factor
    proc = subprocess.Popen(
        [PY, str(SWEEP), *args, "--plugin", str(fake_task_plugin)],
        env=sweep_env(FAKE_LOG=log, FAKE_HANG_AT=5, FAKE_READY=ready),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        while not ready.exists():
            assert proc.poll() is None, "the sweep ended before it reached the hanging cell"
            assert time.time() < deadline, "timed out waiting for the 5th cell"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGKILL)  # kill -9 in mid-run (the 5th cell is running)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = records(out)
    finished = {r["cell"] for r in before if r["status"] == "ok"}
    assert len(finished) == 4 and len(before) == 4 * 2
    first_calls = log.read_text().splitlines()
    assert len(first_calls) == 4
    with open(out / "records.jsonl", "a") as f:  # as if the kill had hit a write: a partial last line
        f.write('{"cell": "deadbeef", "status": "ok", "met')

    monkeypatch.setenv("FAKE_LOG", str(log))
    assert sweep_lib.main(args) == 0, capsys.readouterr().err
    second_calls = log.read_text().splitlines()[4:]
    assert len(second_calls) == 5 and not set(second_calls) & set(first_calls)  # no finished cell recomputed
    rows = [row for row in records(out) if row["status"] == "ok"]
    keys = [(row["cell"], row["length"], row["metric"]) for row in rows]
    assert len(keys) == len(set(keys)) == 9 * 2  # nothing lost, nothing duplicated
    assert len({row["cell"] for row in rows}) == 9 and "deadbeef" not in {row["cell"] for row in rows}
    assert all(row["value"] == row["factor"] * row["length"] for row in rows)


# ---------------------------------------------------------------------------------------------- end to end
E2E = [
    "--methods",
    "plain",
    "pi",
    "yarn",
    "dynamic-ntk",
    "--factors",
    "2",
    "--tasks",
    "perplexity",
    "passkey",
    "-t",
    "perplexity.lengths=[32,64,128,256]",
    "-t",
    "perplexity.num_docs=2",
    "-t",
    "passkey.lengths=[96,192]",
    "-t",
    "passkey.trials=1",
    "-t",
    "passkey.depths=[0.5]",
    "--quiet",
]


def accelerate_launch(*flags, timeout=400):
    accelerate = Path(PY).parent / "accelerate"
    return [
        str(accelerate),
        "launch",
        *flags,
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(_free_port()),
        str(SWEEP),
    ]


@pytest.fixture(scope="module")
def e2e_one(tiny_model_dir, tmp_path_factory, sweep_env):
    """One process. Launched as `accelerate launch --cpu --num_processes 2`, which (without an MPI hostfile)
    starts a single process: the sweep must then simply run every cell itself."""
    out = tmp_path_factory.mktemp("e2e") / "one"
    cmd = [
        *accelerate_launch("--cpu", "--num_processes", "2"),
        "--model",
        str(tiny_model_dir),
        "--out",
        str(out),
        *E2E,
    ]
    r = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=400, env=sweep_env(), cwd=ROOT
    )
    return out, r


def test_end_to_end_tiny_llama_real_suites(e2e_one):
    out, r = e2e_one
    assert r.returncode == 0, r.stderr
    assert (out / "records.jsonl").is_file() and not list(out.glob("records.rank*"))
    assert "perplexity (lower is better)" in r.stdout and "| plain |" in r.stdout
    assert f"report: {out / 'report.md'}" in r.stdout and (out / "report.md").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["methods"][0]["method"] == "plain" and manifest["extra"]["trained_context"]
    assert len(manifest["config"]["cells"]) == 4 * 3  # per method: perplexity + passkey x 2 lengths
    from ropebench import results

    df = results.load(out)
    assert set(df["status"]) == {"ok"}
    ppl = results.table(df, "perplexity", "ppl")
    assert list(ppl.columns) == [32, 64, 128, 256] and ppl.notna().all().all()
    assert set(ppl.index) == {"plain", "pi", "yarn", "dynamic-ntk"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_accelerate_two_processes_equal_one(e2e_one, tiny_model_dir, tmp_path, sweep_env):
    one, r1 = e2e_one
    assert r1.returncode == 0, r1.stderr
    out = tmp_path / "two"
    # On a CPU-only machine `--multi_gpu` is what makes accelerate start N processes (torchrun); the sweep
    # then joins a gloo group.
    cmd = [
        *accelerate_launch("--multi_gpu", "--num_processes", "2"),
        "--model",
        str(tiny_model_dir),
        "--out",
        str(out),
        *E2E,
    ]
    r2 = subprocess.run(
        cmd, check=False, capture_output=True, text=True, timeout=400, env=sweep_env(), cwd=ROOT
    )
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert (out / "records.rank0.jsonl").is_file() and (out / "records.rank1.jsonl").is_file()
    assert r2.stdout.count("report: ") == 1  # rank 0 reports once, after both ranks finished
    from ropebench import results

    a, b = results.load(one), results.load(out)
    for task, metric in (("perplexity", "ppl"), ("passkey", "correct")):
        ta, tb = results.table(a, task, metric), results.table(b, task, metric)
        assert ta.index.equals(tb.index) and ta.columns.equals(tb.columns)
        assert ((ta - tb).abs() <= 1e-6 * ta.abs().clip(lower=1)).all().all()
    assert sorted(a["cell"].unique()) == sorted(b["cell"].unique())


@pytest.mark.parametrize("name", ["demo.yaml", "demo-remap.yaml"])
def test_shipped_embedded_configs_resolve_to_their_grid(name, tmp_path, capsys):
    """The configs that run on the embedded model pass every check and list their cells (dry run: nothing
    runs); demo-remap adds the position-remapping methods to the demo's grid, DCA at factor 1."""
    cfg = SCRIPTS / "configs" / name
    assert sweep_lib.main(["--config", str(cfg), "--out", str(tmp_path / "o"), "--dry-run", "--quiet"]) == 0
    listed = capsys.readouterr().out
    cells = {tuple(line.split()[3:6]) for line in listed.splitlines() if "  todo  " in line}
    methods = [("plain", "x1"), ("ntk", "x2"), ("yarn", "x2")]
    if name == "demo-remap.yaml":
        methods += [("self-extend", "x2"), ("rerope", "x2"), ("dca", "x1")]
        tasks = ["perplexity", "passkey", "classification"]
    else:  # retrieval by distance on 6 haystacks; classification (at chance, showing nothing) left the demo
        tasks = ["perplexity", "passkey", "retrieval"]
    assert cells == {(m, f, t) for m, f in methods for t in tasks}
    assert not (tmp_path / "o").exists()


def test_a_run_outside_the_demo_takes_enough_documents_for_an_interval(tmp_path, capsys):
    """--model or --corpus without --config inherits the demo's grid, but not its num_docs: 1 (n = 1, no
    interval): each task's num_docs below the task's own default takes that default; -t TASK.num_docs and a
    --config file keep theirs; the grid printed first says so."""
    import inspect

    from ropebench import tasks
    from ropebench.sweep_lib.config import raise_demo_num_docs

    default = inspect.signature(tasks.perplexity.run).parameters["num_docs"].default
    assert C.read_yaml(C.DEMO_CONFIG)["tasks"]["perplexity"]["num_docs"] == 2 < default == 4
    args = parser().parse_args(["--model", "smollm2-135m", "--corpus", "sotu"])
    cfg = load_config(args)
    assert raise_demo_num_docs(cfg, args)["perplexity"] == [2, default]
    assert cfg["tasks"]["perplexity"]["options"]["num_docs"] == default
    args = parser().parse_args(["--corpus", "sotu", "-t", "perplexity.num_docs=2"])
    cfg = load_config(args)
    assert (
        "perplexity" not in raise_demo_num_docs(cfg, args)
        and cfg["tasks"]["perplexity"]["options"]["num_docs"] == 2
    )

    assert sweep_lib.main(["--model", "smollm2-135m", "--out", str(tmp_path / "o"), "--dry-run"]) == 0
    err = capsys.readouterr().err
    assert re.search(rf"perplexity: lengths \[.*\]; .*num_docs={default},", err)
    assert f"perplexity 2 -> {default}" in err
    # the demo itself (and a --config file) keep their own num_docs
    assert sweep_lib.main(["--out", str(tmp_path / "d"), "--dry-run"]) == 0
    assert "num_docs raised" not in capsys.readouterr().err
    assert (
        sweep_lib.main(
            [
                "--config",
                str(C.DEMO_CONFIG),
                "--model",
                "smollm2-135m",
                "--out",
                str(tmp_path / "c"),
                "--dry-run",
            ]
        )
        == 0
    )
    assert "num_docs raised" not in capsys.readouterr().err


def test_manifest_records_a_forced_trained_context(tmp_path, tiny_model_dir, fake_task):
    """Issue 32 item 6: with -o original_max_position_embeddings=N on every cell, the manifest's trained
    context is N (what the rows and the report use); the config's stays beside it."""
    out = tmp_path / "run"
    argv = fake_args(tiny_model_dir, out, "--methods", "plain", "-o", "original_max_position_embeddings=64")
    assert sweep_lib.main(argv) == 0
    extra = json.loads((out / "manifest.json").read_text())["extra"]
    model = next(iter(extra["trained_context"]))
    assert extra["trained_context"][model] == 64 and extra["config_trained_context"][model] == 128
