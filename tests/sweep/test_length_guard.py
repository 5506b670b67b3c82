"""Sweep guards from issue 12: a warning past factor x the trained context, out of memory as a per-cell error
naming the length, and the patch's resolved RoPE options (policy, base theta, trained context) in every
row."""

from ropebench import extend
from ropebench.sweep_lib import grid as G
from ropebench.sweep_lib import run as R


def test_length_warning_past_factor_times_trained_context():
    opts = {"trained_context": 32768}
    assert R.length_warning("yarn", 2.0, [32768, 65536], opts) is None
    warning = R.length_warning("yarn", 2.0, [65536, 100000], opts)
    assert "100000" in warning and "65536 tokens" in warning and "32768" in warning
    assert "65536," not in warning  # only the lengths beyond the limit are named
    assert "40000" in R.length_warning("plain", 4.0, [40000], opts)  # plain: factor is ignored
    assert R.length_warning("yarn", 2.0, [10**6], {}) is None  # unknown context: nothing to say


def test_out_of_memory_names_the_length():
    cpu = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 10737418240 bytes. Error code 12 (Cannot allocate memory)"
    )
    message = R.describe_error(cpu, (100000,))
    assert message.startswith("out of memory at length 100000 (RuntimeError)") and "\n" not in message
    assert "lengths up to 8192" in R.describe_error(RuntimeError("CUDA out of memory."), (4096, 8192))
    assert R.describe_error(ValueError("bad")) == "ValueError: bad"


def test_rows_record_the_patch_policy_theta_and_context(tiny_llama_factory):
    model = tiny_llama_factory(max_position_embeddings=128)
    cell = G.make_cell(
        model="m",
        method="yarn",
        factor=2.0,
        options={"beta_fast": 16},
        task="fake",
        task_options={},
        lengths=(16,),
        seed=0,
        dtype="float32",
    )
    record = {
        "task": "fake",
        "corpus": None,
        "length": 16,
        "metric": "score",
        "value": 1.0,
        "n": 1,
        "seconds": 0.0,
    }
    with extend.patched(model, "yarn", factor=2.0, beta_fast=16) as patch:
        rows = R.ok_rows(cell, "run", [record], dict(cell.options, **patch.options))
    assert rows[0]["options"] == {
        "beta_fast": 16,
        "start_from": "shipped",
        "trained_context": 128,
        "base_theta": 10000.0,
        "shipped_rope": "none",
        "temperature": "rotary",
    }
    assert R.ok_rows(cell, "run", [record])[0]["options"] == {"beta_fast": 16}
    with extend.patched(
        model, "yarn", factor=2.0, start_from="pretrained"
    ) as patch:  # the explicit choice too
        rows = R.ok_rows(cell, "run", [record], dict(cell.options, **patch.options))
    assert rows[0]["options"]["start_from"] == "pretrained"
