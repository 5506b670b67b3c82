"""Smoke test of the benchmark harness: `ropebench bench run --quick` runs every figure on tiny lengths
and writes a report with every row; the "identical numbers" checks must hold. Nothing about time is
asserted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ROWS = [
    "Perplexity curve",
    "identical numbers",
    "Peak RSS of scoring",
    "whole process",
    "Same loss as `labels=`",
    "Overhead over a bare `model.model(ids)`",
    "Time vs a plain `model(ids).logits`",
    "Overhead over the bare forward + the LM head",
    "Rolling perplexity, sotu",
    "Rolling perplexity: peak RSS",
    "Passkey, one trial",
    "Demo sweep",
    "bf16 vs fp32, perplexity curve wall",
    "bf16 vs fp32, max relative change",
]


# Smaller than --quick's own sizes (which stay the smoke run a person starts by hand): every child still runs,
# on lengths where the identities hold just as well in float32. Most of its time is the 9 child processes'
# start (imports, model load); these sizes took a quarter off the run (both run side by side on a loaded
# 2-core CPU: 9.0 min against 11.9). The prefix-cache section needs a prompt longer than one sotu document
# (> 263 tokens) and at least two many-shot queries to share anything.
SMALLER = {
    "--lengths": ["256", "512"],
    "--window": ["128"],
    "--rolling-tokens": ["512"],
    "--passkey-length": ["256"],
    "--prefix-length": ["320"],
    "--prefix-queries": ["2"],
    "--prefix-zero-shot-queries": ["1"],
}


@pytest.mark.slow
def test_quick_benchmark_writes_every_row(tmp_path, tiny_model_dir):
    """In float32 whatever the CPU's default: identity (one forward == per-length passes, chunked loss ==
    labels=, the prefix cache's passkey answer == a plain generate's, shared prefixes == unshared scores) is
    a float32 property; bf16 (the run's other dtype) is compared with fp32 within its precision. On a tiny
    random Llama (`--model-dir`): what this proves is the harness (every child runs, every row is written,
    the checks are computed), and its 9 child processes (--quick runs the prefix-cache section's four parts
    in one: `orchestrate.prefix_groups`) then cost their start alone; the same identities
    on SmolLM2 are the tasks' own tests (e.g. test_one_pass_matches_per_length_on_smollm2)."""
    out = tmp_path / "BENCHMARKS.quick.md"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    sizes = [x for flag, values in SMALLER.items() for x in (flag, *values)]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "ropebench.benchmarks",
            "run",
            "--quick",
            "--out",
            str(out),
            "--demo-seconds",
            "150",
            "--dtype",
            "float32",
            "--model-dir",
            str(tiny_model_dir),
            *sizes,
        ],
        check=True,
        cwd=ROOT,
        env=env,
        timeout=1800,
    )
    text = out.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ")]
    for name in ROWS:
        assert any(name in line for line in table), f"missing row {name!r}"
    assert "ropebench bench run --quick" in text and "Machine:" in text and "Versions:" in text
    assert "2.5 min" in text  # the demo sweep seconds were read

    data = json.loads(out.with_suffix(".json").read_text())
    checks = data["checks"]
    assert data["args"]["dtype"] == "float32"
    # One forward == per-length passes, chunked loss == full-logits loss: to 1e-4 in float32 (float32 matmuls
    # also round differently at other row counts, far below that).
    assert checks["curve_max_dloss"] <= 1e-4, checks["curve_max_dloss"]
    assert checks["labels_max_dloss"] <= 1e-4, checks["labels_max_dloss"]
    assert (
        checks["passkey_same_prompt"] and checks["passkey_same_answer"]
    )  # the plain generate: same prompt, answer
    # bf16 vs fp32, one forward per repeat: each length's mean loss within bf16's unit roundoff (relative
    # 2^-8).
    import torch

    u = torch.finfo(torch.bfloat16).eps / 2
    for rep in data["runs"]:
        for length, loss in rep["onepass"]["loss"].items():
            assert abs(rep["otherdtype"]["loss"][length] - loss) <= u * abs(loss), (length, rep["otherdtype"])
    ppl_ours, ppl_lmeval, n_ours, n_lmeval = checks["rolling_ppl"]
    assert n_ours == n_lmeval  # both protocols score every token of the document
    assert abs(ppl_ours / ppl_lmeval - 1) < 0.1  # same text and window; only window starts differ
    for name in (
        "identical numbers",
        "Same loss as `labels=`",
        "Many-shot: same predictions",
        "Passkey: same prompts and same answers",
    ):
        line = next(line for line in table if name in line)
        assert line.rstrip().endswith("| yes |"), line
    assert data["args"]["lengths"] == [256, 512] and data["args"]["prefix_length"] == 320
    model_line = next(line for line in text.splitlines() if line.startswith("- Model:"))
    assert f"--model-dir {tiny_model_dir}" in model_line and "embedded" not in model_line  # not SmolLM2's


def test_a_model_dir_without_a_saved_model_is_one_line_before_anything_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "ropebench.benchmarks", "run", "--quick", "--model-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert "no config.json there" in line and "Traceback" not in done.stderr


def test_passkey_answer_is_compared_in_float32_only(synthetic_benchmark_run, benchmark_model_facts):
    """A bf16 run may give another greedy answer through the prefix cache than a plain generate (rounding at
    other row counts flips a near-tie): reported, not failed; the prompt must match in every dtype."""

    from ropebench.benchmarks import report

    for dtype, same_answer, same_prompt, passes in [
        ("float32", False, True, False),
        ("bfloat16", False, True, True),
        ("bfloat16", True, False, False),
        ("float32", True, True, True),
    ]:
        saved = synthetic_benchmark_run(benchmark_model_facts)
        saved["args"]["dtype"] = dtype
        for rep in saved["runs"]:
            rep["passkey"].update(same_answer=same_answer, same_prompt=same_prompt)
        _, checks = report.figure_rows(saved)
        assert checks["passkey_same"] is passes, (dtype, same_answer, same_prompt)
        assert checks["passkey_same_answer"] is same_answer
        text = report.render(saved, notes="n")
        assert f"same answer: {'yes' if same_answer else 'no'}" in text
