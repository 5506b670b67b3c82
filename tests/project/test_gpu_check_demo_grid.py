"""The GPU check's demo-grid section in CPU mode (`ropebench bench gpu --cpu-sizes --skip <the others>`, as
CI runs it) and the pieces it is built from. A module of its own: xdist (`--dist loadscope`) runs a module
whole on one worker, so this run and test_gpu_check.py's other sections go to the two workers."""

import json
from pathlib import Path

from ropebench.benchmarks import gpu_check


def test_cpu_mode_runs_the_demo_grid_and_compares_its_tables(tmp_path):
    others = [x for x in gpu_check.SECTIONS if x != "demo-grid"]
    assert gpu_check.main(["--cpu-sizes", "--out", str(tmp_path), "--skip", *others]) == 0
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    report = (tmp_path / "report.md").read_text()
    grid = data["demo_grid"]
    runs = {r["name"]: r for r in grid["runs"]}
    assert list(runs) == ["cpu bf16 ref", "cpu fp32 ref", "cpu fp32 reference"]
    assert all(r["code"] == 0 and r["seconds"] > 0 for r in runs.values())
    # the demo's three tasks and methods: estimates, paired marks and reach verdicts were all compared
    counts = runs["cpu fp32 reference"]["counts"]
    assert counts["values"] >= 3 * 3 and counts["marks"] >= 2 and counts["reach"] >= 3
    assert {k.split("/")[0] for k in grid["grids"]["24"]["lengths"]} == {"perplexity", "retrieval", "passkey"}
    assert grid["grids"]["24"]["trained_context"] == 8192 // 24
    compared = {(c["run"], c["dtype"]): c for c in grid["comparisons"]}
    fp32 = compared["cpu fp32 ref", "float32"]
    bf16 = compared["cpu bf16 ref", "bfloat16"]
    # the same CPU twice in fp32: identical tables; bf16 against fp32: the same keys, values not identical
    assert fp32["ok"] and fp32["max_relative"] == 0.0 and fp32["values_within"] == counts["values"]
    assert fp32["marks_equal"] == fp32["marks"] == counts["marks"] and fp32["reach"] == counts["reach"]
    assert bf16["values"] == fp32["values"] and bf16["max_relative"] > 0
    assert bf16["tolerance"] == 4 * 2.0**-7 and fp32["tolerance"] == 256 * 2.0**-23
    assert "## The demo's grid: device vs CPU" in report
    assert "| cpu fp32 ref | cpu fp32 reference | 3.1e-05 (float32) |" in report
    assert "| cpu bf16 ref | cpu fp32 reference | 3.1e-02 (bfloat16) |" in report
    assert (tmp_path / "demo-grid" / "cpu-fp32-reference" / "records.jsonl").is_file()


def test_the_demo_grid_comparison_finds_each_kind_of_difference():
    from ropebench.benchmarks.gpu_demo_grid import compare

    def run(name, value, mark, claim):
        tables = {"values": {"ppl | length=8": value}, "marks": {"ppl | m": mark}, "reach": {"r | m": claim}}
        return {"name": name, "tables": tables}

    ref = run("ref", 10.0, True, "≥ 16")
    assert compare(run("same", 10.0 * (1 + 2e-5), True, "≥ 16"), ref, "float32")["ok"]
    off = compare(run("off", 10.0 * (1 + 1e-4), False, "8"), ref, "float32")
    assert not off["ok"] and off["values_within"] == 0 and off["marks_equal"] == 0 and off["reach_equal"] == 0
    assert len(off["mismatches"]) == 3
    assert compare(run("bf16", 10.0 * (1 + 1e-2), True, "≥ 16"), ref, "bfloat16")["ok"]


def test_the_demo_grid_scales_the_demos_lengths_and_context():
    from ropebench.benchmarks.gpu_demo_grid import grid, sweep_argv

    g = grid(4)
    assert g["trained_context"] == 2048
    assert g["lengths"] == {"perplexity": [512, 1024, 2048, 3072], "retrieval": [2048], "passkey": [2560]}
    argv = sweep_argv(Path("m"), Path("o"), device="cuda", dtype="bfloat16", g=g)
    assert "perplexity.lengths=[512,1024,2048,3072]" in argv and argv[argv.index("--dtype") + 1] == "bfloat16"
    assert not [
        a for a in sweep_argv(Path("m"), Path("o"), device="cuda", dtype="float32", g=grid(1)) if "=" in a
    ]
