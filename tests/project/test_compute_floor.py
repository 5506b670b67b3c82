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


def test_the_command_prints_the_floor_and_the_ratio(perplexity_config, capsys):
    assert (
        compute_floor.main(["--config", str(perplexity_config), "--demo-seconds", "10", "--gemm-size", "128"])
        == 0
    )
    out = capsys.readouterr().out
    assert "| perplexity | 2 | 256 |" in out
    assert "GFLOP/s" in out and "x its compute floor" in out
