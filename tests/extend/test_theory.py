"""RoPE theory against the papers' own numbers and independent computations (extend/theory.py)."""

import math

import numpy as np
import pytest
import torch
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from extend import theory


def criterion_holds(base: float, dim: int, context: int) -> bool:
    """Men et al. eq.: sum_{i<dim/2} cos(m base^(-2i/dim)) >= 0 for every m < context, all at once."""
    m = np.arange(context, dtype=np.float64)[:, None]
    i = np.arange(dim // 2, dtype=np.float64)[None, :]
    return bool((np.cos(m * base ** (-2 * i / dim)).sum(axis=1) >= 0).all())


@pytest.mark.parametrize("context, paper", [(1024, 4.3e3), (4096, 2.7e4), (8192, 8.4e4)])
def test_base_lower_bound_reproduces_the_paper_head_dim_128(context, paper):
    """Men et al. 2024 (arXiv:2405.14591), lower bound of the base per context length, head_dim 128."""
    bound = theory.base_lower_bound(128, context)
    assert abs(bound / paper - 1) < 0.02
    assert criterion_holds(bound, 128, context)


@pytest.mark.slow
def test_base_lower_bound_32k_is_about_the_paper_value():
    bound = theory.base_lower_bound(128, 32768)
    assert abs(bound / 6.4e5 - 1) < 0.03 and criterion_holds(bound, 128, 32768)


def test_base_lower_bound_head_dim_64_at_8k_is_above_smollm2_base():
    """SmolLM2 (head_dim 64, base 1e5, trained at 8192) is below the bound (about 3.2e5)."""
    bound = theory.base_lower_bound(64, 8192)
    assert abs(bound / 3.2e5 - 1) < 0.03 and bound > 1e5


def test_no_smaller_base_passes_just_below_the_bound():
    """The criterion is not monotone in the base, so check a fine independent scan just below the bound."""
    bound = theory.base_lower_bound(128, 4096)
    below = bound * np.exp(np.linspace(-0.02, -1e-5, 1500))
    assert not any(criterion_holds(b, 128, 4096) for b in below)


def test_men_reach_is_the_first_negative_distance():
    inv_freq = 1e5 ** (-np.arange(0, 64, 2) / 64)
    reach = theory.men_reach(inv_freq, 20000)
    sums = np.cos(np.arange(20000)[:, None] * inv_freq[None, :]).sum(axis=1)
    assert sums[reach] < 0 and (sums[:reach] >= 0).all()
    assert theory.men_reach(inv_freq, reach) == reach  # holds for every m below the limit


def test_critical_dimension_of_llama2_is_92():
    """Liu et al. 2024 (arXiv:2310.05209): Llama-2 (d=128, base 1e4, T=4096):
    2 ceil(64 log_1e4(4096/2pi)) = 92."""
    inv_freq = 1e4 ** (-np.arange(0, 128, 2) / 128)
    assert theory.critical_dimension(inv_freq, 4096) == 92
    for base, dim, t in ((5e5, 128, 8192), (1e5, 64, 8192), (1e6, 128, 32768)):
        closed = 2 * math.ceil(dim / 2 * math.log(t / (2 * math.pi)) / math.log(base))
        assert theory.critical_dimension(base ** (-np.arange(0, dim, 2) / dim), t) == closed


@pytest.mark.parametrize("theta, dim, context", [(1e5, 64, 8192), (1e4, 128, 4096), (5e5, 128, 8192)])
def test_yarn_ramp_matches_transformers_frequencies(theta, dim, context):
    """Pairs up to `low` keep their frequency in transformers' yarn, pairs from `high` are divided by s."""
    config = PreTrainedConfig(
        hidden_size=dim,
        num_attention_heads=1,
        head_dim=dim,
        max_position_embeddings=4 * context,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": theta,
            "factor": 4.0,
            "original_max_position_embeddings": context,
        },
    )
    yarn, _ = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    plain = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ratio = (yarn.double() / plain).numpy()
    low, high = theory.yarn_ramp(theta, dim, context)
    assert np.allclose(ratio[: low + 1], 1, rtol=1e-6)
    assert np.allclose(ratio[high:], 0.25, rtol=1e-6)
    assert ((ratio[low + 1 : high] < 1 - 1e-6) & (ratio[low + 1 : high] > 0.25 + 1e-6)).all()


def test_bad_dimension_is_refused():
    with pytest.raises(ValueError, match="even integer dim"):
        theory.base_lower_bound(63, 4096)


def test_a_dimension_that_no_base_can_serve_ends_with_inf():
    """dim 2 is cos(m) alone (negative at m = 2 for every base); the search must end, not loop."""
    assert theory.base_lower_bound(2, 256) == math.inf
    assert "none found" in theory.describe(np.array([1.0]), theta=1e4, dim=2, trained_context=256)


def test_describe_skips_the_bound_past_its_context_limit():
    """inspect runs unasked: a 128k context (Llama 3.1) must not start a search of many minutes."""
    inv_freq = 5e5 ** (-np.arange(0, 128, 2) / 128)
    line = theory.describe(inv_freq, theta=5e5, dim=128, trained_context=131072)
    assert "not computed above 32768" in line
