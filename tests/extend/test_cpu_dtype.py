"""The CPU default dtype is the faster one: bf16 only where a measured micro-benchmark says so (cached per CPU
model, flags and torch version), fp32 on CPUs without native bf16, an env var or an explicit dtype overrides
it; the sweep records the choice and its reason in the manifest. The benchmark is mocked: nothing about time
is asserted."""

import json
import subprocess
import sys

import pytest
import torch
from ropebench.extend import loading

# fp32-time / bf16-time ratios, as benchmarks/cpu_dtype.py measured them (benchmarks/BENCHMARKS.md)
INTEL_AVX512_BF16_NO_AMX = {"gemm": 0.58, "attention": 0.5, "layer": 0.56}
AMD_EPYC_AVX512_BF16 = {"gemm": 3.1, "attention": 1.0, "layer": 2.6}


@pytest.fixture
def cpu(monkeypatch, tmp_path):
    """A CPU with native bf16, a private cache, no override, and a benchmark that counts its calls."""
    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(loading.CPU_DTYPE_ENV, raising=False)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True, "amx_bf16": False})
    state = {"calls": 0, "speedup": AMD_EPYC_AVX512_BF16}

    def measure(*args, **kwargs):
        state["calls"] += 1
        return dict(state["speedup"])

    monkeypatch.setattr(loading, "measure_bf16_speedup", measure)
    return state


@pytest.mark.parametrize(
    "speedup,expected",
    [
        (INTEL_AVX512_BF16_NO_AMX, torch.float32),  # the Xeon: bf16 slower on both
        (AMD_EPYC_AVX512_BF16, torch.bfloat16),  # this AMD EPYC: GEMMs 3x, attention on par
        ({"gemm": 3.0, "attention": 0.6, "layer": 1.9}, torch.float32),  # long contexts are mostly attention
        ({"gemm": 1.1, "attention": 1.05, "layer": 1.09}, torch.float32),  # not measurably faster
    ],
)
def test_choice_from_measured_speed(speedup, expected):
    choice = loading.choose_cpu_dtype(speedup)
    assert choice.dtype == expected
    assert f"decoder layer {speedup['layer']:.2f}x" in choice.reason
    assert choice.reason.endswith(str(expected).removeprefix("torch."))


def test_measured_once_per_cpu_and_cached(cpu, tmp_path, monkeypatch):
    first = loading.default_dtype("cpu")
    assert first == torch.bfloat16 and cpu["calls"] == 1
    cpu["speedup"] = INTEL_AVX512_BF16_NO_AMX  # a cached machine is not measured again
    assert loading.dtype_choice("cpu").dtype == torch.bfloat16 and cpu["calls"] == 1
    assert "cached in" in loading.dtype_choice("cpu").reason
    cache = json.loads((tmp_path / loading.CPU_DTYPE_CACHE).read_text())
    ((key, entry),) = cache.items()
    assert key.startswith(loading.cpu_key()) and entry["speedup"] == AMD_EPYC_AVX512_BF16
    monkeypatch.setattr(loading, "cpu_key", lambda: "Intel Xeon | flags 0 | torch x")  # another CPU kind
    assert loading.default_dtype("cpu") == torch.float32 and cpu["calls"] == 2


def test_a_damaged_cache_is_measured_again(cpu, tmp_path):
    (tmp_path / loading.CPU_DTYPE_CACHE).write_text(
        json.dumps({f"{loading.cpu_key()} | {loading.BENCH_TOKENS} tokens": {"speedup": {"gemm": "fast"}}})
    )
    assert loading.default_dtype("cpu") == torch.bfloat16 and cpu["calls"] == 1
    (tmp_path / loading.CPU_DTYPE_CACHE).write_text("{not json")
    assert loading.default_dtype("cpu") == torch.bfloat16 and cpu["calls"] == 2


def test_key_names_the_cpu_flags_and_torch():
    key = loading.cpu_key()
    assert f"torch {torch.__version__}" in key and "| flags " in key


def test_no_native_bf16_is_float32_without_measuring(cpu, monkeypatch):
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": False, "amx_bf16": False})
    choice = loading.dtype_choice("cpu")
    assert choice.dtype == torch.float32 and "without native bf16" in choice.reason and cpu["calls"] == 0


def test_env_and_explicit_dtype_override(cpu, monkeypatch):
    monkeypatch.setenv(loading.CPU_DTYPE_ENV, "float32")
    choice = loading.dtype_choice("cpu")
    assert choice.dtype == torch.float32 and loading.CPU_DTYPE_ENV in choice.reason and cpu["calls"] == 0
    monkeypatch.setenv(loading.CPU_DTYPE_ENV, "bf16")
    assert loading.default_dtype("cpu") == torch.bfloat16
    monkeypatch.setenv(loading.CPU_DTYPE_ENV, "float8")
    with pytest.raises(loading.ExtendError, match="unknown dtype"):
        loading.default_dtype("cpu")
    monkeypatch.setenv(loading.CPU_DTYPE_ENV, "float16")
    with pytest.raises(loading.ExtendError, match="use float32 or bfloat16"):
        loading.default_dtype("cpu")
    assert cpu["calls"] == 0


def test_other_devices(cpu):
    assert loading.dtype_choice("cuda").dtype == torch.bfloat16
    assert loading.default_dtype("mps") == torch.float32 and cpu["calls"] == 0


def test_benchmark_returns_the_three_ratios():
    """The real micro-benchmark on tiny shapes: finite positive ratios (their values are this CPU's
    business)."""
    speedup = loading.measure_bf16_speedup(tokens=16, rounds=1)
    assert set(speedup) == {"gemm", "attention", "layer"}
    assert all(0 < v < float("inf") for v in speedup.values())


# `ropebench sweep` twice in one process (as scripts/sweep.py runs it; the imports, most of a sweep's time,
# once): the CPU default forced by the environment, then the dtype given as a flag
TWO_SWEEPS = f"""
import os, sys
from ropebench.cli import main
*args, env_out, flag_out = sys.argv[1:]
os.environ["{loading.CPU_DTYPE_ENV}"] = "float32"
first = main(["sweep", *args, "--out", env_out])
del os.environ["{loading.CPU_DTYPE_ENV}"]
sys.exit(first or main(["sweep", *args, "--out", flag_out, "--dtype", "float32"]))
"""


@pytest.fixture(scope="module")
def manifests(tmp_path_factory, sweep_env, tiny_model_dir, fake_task_plugin):
    tmp = tmp_path_factory.mktemp("dtype")
    args = ["--model", tiny_model_dir, "--methods", "plain", "--tasks", "fake", "--lengths", "8"]
    args += ["--plugin", fake_task_plugin, "--quiet", tmp / "env", tmp / "flag"]
    r = subprocess.run(
        [sys.executable, "-c", TWO_SWEEPS, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=sweep_env(ROPEBENCH_CACHE=tmp / "cache"),
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return {run: json.loads((tmp / run / "manifest.json").read_text())["config"] for run in ("env", "flag")}


@pytest.mark.parametrize(
    "run, reason", [("env", f"{loading.CPU_DTYPE_ENV}=float32"), ("flag", "given (--dtype")]
)
def test_sweep_manifest_records_dtype_and_reason(manifests, run, reason):
    config = manifests[run]
    assert config["dtype"] == "float32" and config["dtype_reason"].startswith(reason), config["dtype_reason"]
