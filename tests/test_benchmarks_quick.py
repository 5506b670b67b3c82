"""Smoke test of the benchmark harness: `benchmarks/run.py --quick` runs every figure on tiny lengths and
writes a report with every row; the "identical numbers" checks must hold. Nothing about time is asserted."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

ROWS = [
    "Perplexity curve", "identical numbers", "Peak RSS of scoring", "whole process", "Same loss as `labels=`",
    "Overhead over a bare `model.model(ids)`", "Time vs a plain `model(ids).logits`",
    "Overhead over the bare forward + the LM head",
    "Rolling perplexity, sotu", "Rolling perplexity: peak RSS", "Passkey, one trial", "Demo sweep",
    "bf16 vs fp32, perplexity curve wall", "bf16 vs fp32, max relative change",
]


@pytest.mark.slow
@pytest.mark.real
def test_quick_benchmark_writes_every_row(tmp_path):
    out = tmp_path / "BENCHMARKS.quick.md"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--out", str(out),
                    "--demo-seconds", "150"], check=True, cwd=ROOT, env=env, timeout=1800)
    text = out.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ")]
    for name in ROWS:
        assert any(name in line for line in table), f"missing row {name!r}"
    assert "python benchmarks/run.py --quick" in text and "Machine:" in text and "Versions:" in text
    assert "2.5 min" in text  # the demo sweep seconds were read

    data = json.loads(out.with_suffix(".json").read_text())
    checks = data["checks"]
    # One forward == per-length passes, chunked loss == full-logits loss: to 1e-4 in float32; in bf16 (the default
    # on CPUs with native bf16) within one bf16 rounding, since bf16 matmuls may round differently at other row
    # counts (Intel AMX does).
    import torch

    tol = 1e-4 if data["args"]["dtype"] == "float32" else torch.finfo(torch.bfloat16).eps / 2
    assert checks["curve_max_dloss"] <= tol, checks["curve_max_dloss"]
    assert checks["labels_max_dloss"] <= tol, checks["labels_max_dloss"]
    assert checks["passkey_same"]  # the plain generate saw the same prompt and gave the same answer
    ppl_ours, ppl_lmeval, n_ours, n_lmeval = checks["rolling_ppl"]
    assert n_ours == n_lmeval  # both protocols score every token of the document
    assert abs(ppl_ours / ppl_lmeval - 1) < 0.1  # same text and window; only window starts differ
    for name in ("identical numbers", "Same loss as `labels=`"):
        line = next(line for line in table if name in line)
        assert line.rstrip().endswith("| yes |"), line
