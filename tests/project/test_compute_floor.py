"""benchmarks/compute_floor.py and benchmarks/flops.py: the FLOP formulas by hand, the forwards counted on the
stand-in for a sweep config (read at run time, as the demo's), and the command's output."""

import pytest
import yaml
from ropebench.benchmarks import compute_floor, flops
from transformers import LlamaConfig

CONFIG = LlamaConfig(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
)


def test_flops_by_hand():
    # per token: 3 layers x 2 x (q, o: 64 x 64 each; k, v: 64 x 32 each; MLP 3 x 64 x 96)
    per_token = 3 * 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96)
    assert flops.linear_flops_per_token(CONFIG) == per_token
    assert flops.attention_pairs(4) == 10 and flops.attention_pairs(2, past=5) == 13
    # 4 x layers x heads x head_dim per pair
    assert flops.attention_flops(CONFIG, 4) == 4 * 3 * 4 * 16 * 10
    got = flops.forward_flops(CONFIG, 4, head_rows=1)
    assert got == {
        "linear": 4 * per_token,
        "attention": 4 * 3 * 4 * 16 * 10,
        "lm head": 2 * 64 * 100,
        "total": 4 * per_token + 4 * 3 * 4 * 16 * 10 + 2 * 64 * 100,
    }


def test_gemm_rate_is_measured():
    """A measurement, so only its sanity is testable: a positive finite time and rate."""
    import math

    rate = flops.gemm_rate(size=64, rounds=1)
    assert rate["seconds"] > 0 and math.isfinite(rate["flops_per_second"]) and rate["flops_per_second"] > 0


@pytest.fixture(scope="module")
def perplexity_config(tiny_model_dir, tmp_path_factory):
    """A sweep config like the demo's, perplexity only: plain and yarn x2 on the tiny model, one document."""
    path = tmp_path_factory.mktemp("floor") / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "methods": ["plain", "yarn"],
                "factors": [2],
                "dtype": "float32",
                "out": str(path.parent / "run"),
                "tasks": {"perplexity": {"lengths": [64, 128], "num_docs": 1}},
            }
        )
    )
    return path


def test_counts_one_forward_per_method_for_the_perplexity_curve(perplexity_config):
    """Perplexity runs one forward at the longest length per method and document (the whole curve from it):
    the counter sees exactly that, and the LM head scores every position but the first."""
    cfg, cells = compute_floor.demo_cells(str(perplexity_config))
    assert {(c.method, c.task) for c in cells} == {("plain", "perplexity"), ("yarn", "perplexity")}
    counted = compute_floor.count_forwards(cfg, cells)["tasks"]["perplexity"]
    assert counted["forwards"] == [(128, 0), (128, 0)]
    assert counted["head_rows"] == 2 * 127
    priced = compute_floor.price(CONFIG, {"perplexity": counted})["perplexity"]
    assert priced["total"] == 2 * flops.forward_flops(CONFIG, 128, head_rows=127)["total"]


def test_the_cells_are_the_sweeps_own(perplexity_config, capsys):
    """The cells are keyed as the sweep keys them (its --dry-run lists the keys), after the sweep's own
    checks: plain, listed with factors [2], runs once at factor 1 (or a run's plain cells never match)."""
    from ropebench.sweep_lib.cli import main

    assert main(["--config", str(perplexity_config), "--dry-run"]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines() if "  todo  " in line}
    cells = compute_floor.demo_cells(str(perplexity_config))[1]
    assert {c.key for c in cells} == listed and len(listed) == 2
    assert {(c.method, c.factor) for c in cells} == {("plain", 1.0), ("yarn", 2.0)}


def test_the_command_prints_the_floor_and_the_ratio(perplexity_config, capsys):
    assert (
        compute_floor.main(["--config", str(perplexity_config), "--demo-seconds", "10", "--gemm-size", "128"])
        == 0
    )
    out = capsys.readouterr().out
    assert "| perplexity | 2 | 256 |" in out
    assert "GFLOP/s" in out and "x its compute floor" in out


# -- --run-dir: the ratio from the cells' recorded wall times ----------------------------------------------
def write_run(path, cells, cell_seconds, *, keep=None):
    """A run of `cells` as the sweep writes it (scripts/sweep_lib/run.ok_rows): one perplexity row per cell
    whose own `seconds` is 0.01 (a row's part, as a retrieval question's continuation), with `cell_seconds`
    set per cell (None: a run from before cell timing) and a 2 s model load on the first cell."""
    from ropebench.results.store import RecordWriter
    from ropebench.sweep_lib.run import ok_rows

    w = RecordWriter(path)
    w.write_manifest(config={}, seed=0, device="cpu")
    for k, cell in enumerate(cells[:keep]):
        record = {"task": "perplexity", "length": 128, "metric": "loss", "value": 1.0, "n": 127}
        record["seconds"] = 0.01
        rows = ok_rows(cell, "timed", [record])
        if cell_seconds is not None:
            rows = [dict(r, cell_seconds=cell_seconds, load_seconds=2.0 if k == 0 else 0.0) for r in rows]
        w.write(rows)
    w.finish()
    return path


@pytest.fixture()
def floor_of_2_5_s(perplexity_config, tiny_model_dir, monkeypatch):
    """The GEMM rate set so that the config's floor is 2.5 s: its FLOPs (two forwards of 128 tokens scoring
    127 rows each, at the tiny model's config: test_counts_... checks the count) over 2.5 s."""
    from ropebench.extend.loading import load_config

    total = 2 * flops.forward_flops(load_config(str(tiny_model_dir)), 128, head_rows=127)["total"]
    rate = {"flops_per_second": total / 2.5, "dtype": "float32", "size": 128, "rounds": 1, "clock": "fixed"}
    monkeypatch.setattr(flops, "gemm_rate", lambda **_: rate)
    return compute_floor.demo_cells(str(perplexity_config))[1]


def exit_code_of(argv, capsys):
    """(exit code, stdout, stderr) of `ropebench bench compute-floor ARGV`."""
    from ropebench.benchmarks.errors import exit_code

    code = exit_code(compute_floor.main, argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def run_command(config, run_dir, capsys, *extra):
    return exit_code_of(["--config", str(config), "--per-core", "--run-dir", str(run_dir), *extra], capsys)


def test_run_dir_ratio_is_from_the_cell_times_not_the_rows_seconds(
    perplexity_config, floor_of_2_5_s, tmp_path, capsys
):
    """Two cells of 5 s each whose rows say 0.01 s: 10 s over the 2.5 s floor is 4.0x (the rows' seconds
    would give 0.008x)."""
    import json

    run = write_run(tmp_path / "run", floor_of_2_5_s, 5.0)
    code, out, err = run_command(perplexity_config, run, capsys, "--json", str(tmp_path / "floor.json"))
    assert (code, err) == (0, "")
    record = json.loads((tmp_path / "floor.json").read_text())  # --json: the same figures
    assert record["ratio"] == pytest.approx(4.0) and record["wall_seconds"] == 10.0
    assert record["tasks"]["perplexity"]["wall_seconds"] == 10.0 and record["load_seconds"] == 2.0
    assert record["tasks"]["perplexity"]["floor_seconds"] == pytest.approx(2.5)
    assert record["command"].startswith("ropebench bench compute-floor --config ")
    assert "The run's 2 cells took 10 s (their recorded wall times; model loading 2 s besides): 4.0x" in out
    assert "its compute floor (2.5 s)" in out
    # per task: the cells' wall against the task's floor (one task here: the whole run)
    assert "| wall / floor |" in out and "| **2.5** | **10** | **4.0x** |" in out


def test_a_ratio_below_1_is_refused_with_its_likely_cause(
    perplexity_config, floor_of_2_5_s, tmp_path, capsys
):
    import json

    run = write_run(tmp_path / "run", floor_of_2_5_s, 1.0)  # 2 s against a 2.5 s floor: impossible
    code, out, err = run_command(perplexity_config, run, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "2.0 s is below its compute floor 2.5 s (0.80x)" in err
    assert "likely cause: this CPU is busier" in err
    assert "x its compute floor" not in out
    manifest = run / "manifest.json"  # made on another machine: that is named
    manifest.write_text(json.dumps(dict(json.loads(manifest.read_text()), hostname="elsewhere-7")))
    code, _, err = run_command(perplexity_config, run, capsys)
    assert code == 2 and "the run was made on another machine (elsewhere-7)" in err
    code, _, err = exit_code_of(["--config", str(perplexity_config), "--demo-seconds", "2"], capsys)
    assert code == 2 and "2.0 s is below its compute floor 2.5 s" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("cell_seconds", "keep", "needle"),
    [
        (None, None, "predates cell timing: its records carry no cell_seconds"),
        (5.0, 1, "has 1 of the config's 2 cells finished (missing or failed: "),
    ],
    ids=["before-cell-timing", "partial-run"],
)
def test_runs_that_cannot_give_the_wall_are_refused_in_one_line(
    perplexity_config, floor_of_2_5_s, tmp_path, capsys, cell_seconds, keep, needle
):
    """Never a fallback to summing the rows' seconds: an old run is refused, so is one missing a cell."""
    run = write_run(tmp_path / "run", floor_of_2_5_s, cell_seconds, keep=keep)
    code, out, err = run_command(perplexity_config, run, capsys)
    assert code == 2 and err.count("\n") == 1 and needle in err
    assert out == ""  # refused before the forwards are counted
