"""Fixtures of the sweep, CLI and benchmark tests. The sweep as a subprocess (`sweep_cli`, `sweep_env`,
`fake_task_plugin`, `tiny_model_dir`) is in tests/conftest.py: tests/extend/ runs it too; the fake task in the
test's own process (`fake_task`) is here."""

import pytest

MB, GB = 1024**2, 1024**3
FACTS = {
    "name": "Tiny-Model.Q8",
    "hidden_size": 64,
    "vocab_size": 65536,
    "layers": 2,
    "parameters": 2_500_000,
    "trained_context": 1024,
}


def synthetic(facts=None) -> dict:
    """One float32 repeat at lengths 1000 and 2000, window 100 over a 300-token text."""
    onepass = {
        "seconds": 6.0,
        "model_seconds": 5.0,
        "loss": {"1000": 2.0, "2000": 1.5},
        "score_rss": 100 * MB,
        "peak_rss": 1 * GB,
    }
    if facts:
        onepass.update(model=facts, method="yarn", factor=2.0)
    run = {
        "onepass": onepass,
        "perlength": {
            "seconds": 8.0,
            "model_seconds": 7.0,
            "loss": {"1000": 2.0, "2000": 1.50005},
            "length_seconds": {"1000": 2.0, "2000": 5.0},
        },
        "labels": {"loss": {"2000": 1.50002}, "score_rss": 1000 * MB, "peak_rss": 2 * GB},
        "bare": {"ours_seconds": 10.3, "seconds": 10.0, "forward_seconds": 10.6, "head_seconds": 0.2},
        "otherdtype": {"seconds": 4.0, "loss": {"1000": 2.001, "2000": 1.5}},
        "rolling_ropebench": {
            "seconds": 8.0,
            "model_seconds": 7.2,
            "score_rss": 50 * MB,
            "doc": "1990-Bush",
            "text_tokens": 300,
            "tokens": 300,
            "nll_sum": 900.0,
        },
        "rolling_lmeval": {"seconds": 9.0, "score_rss": 200 * MB, "tokens": 300, "nll_sum": 900.0},
        "passkey": {
            "seconds": 3.0,
            "plain_seconds": 2.0,
            "prompt_tokens": 499,
            "same_prompt": True,
            "same_answer": True,
        },
    }
    args = {
        "quick": False,
        "lengths": [1000, 2000],
        "max_length": None,
        "repeats": 1,
        "window": 100,
        "rolling_tokens": 300,
        "passkey_length": 500,
        "dtype": "float32",
        "dtype_auto": False,
        "chunk": 50,
        "demo_seconds": 300,
        "model_dir": "/cache/gguf/Tiny-Model.Q8-123-456",
    }
    return {
        "date": "2026-01-01T00:00:00+00:00",
        "command": "python benchmarks/run.py",
        "machine": {
            "cpu": "Test CPU",
            "cores": 2,
            "ram": 8 * GB,
            "avx512_bf16": False,
            "os": "Linux",
            "load": [0.5, 0.25, 0.125],
        },
        "versions": {"python": "3.11"},
        "total_seconds": 600.0,
        "estimate_seconds": 540.0,
        "runs": [run],
        "args": args,
    }


@pytest.fixture
def fake_task(monkeypatch, fake_task_plugin):
    """The fake task (tests/conftest.py FAKE_TASK) registered in this process (and removed afterwards): a
    sweep run in the test's own process (`sweep_lib.main`) needs no --plugin."""
    from ropebench import tasks

    monkeypatch.setitem(tasks.TASKS, "fake", None)
    exec(fake_task_plugin.read_text(), {})  # noqa: S102 - the tests' own plugin file
    monkeypatch.setenv("_FAKE_CALLS", "0")  # restored (removed) after the test
    return tasks.TASKS["fake"]


@pytest.fixture
def benchmark_model_facts() -> dict:
    """The model facts a benchmark run saves (`model` in its `onepass` entry), for a made-up tiny model."""
    return FACTS


@pytest.fixture
def synthetic_benchmark_run():
    """`synthetic_benchmark_run(facts=None)`: a saved benchmark run (the JSON benchmarks/report.py renders),
    one float32 repeat at lengths 1000 and 2000, window 100 over a 300-token text; with `facts`, the model's
    facts as a newer run records them. Its figures are worked out by hand in test_benchmarks_report.py."""
    return synthetic
