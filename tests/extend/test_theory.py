"""RoPE theory against the papers' own numbers and independent computations (extend/theory.py)."""

import math

import numpy as np
import pytest
import torch
from ropebench.extend import theory
from transformers import PreTrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


def failing_distance(base: float, dim: int, context: int, guesses=()) -> int | None:
    """A distance m < context where Men et al.'s sum_{i<dim/2} cos(m base^(-2i/dim)) is negative (the
    distances in `guesses` tried first, then every m < context at once), or None."""
    freq = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    for m in (np.array(guesses, dtype=np.float64), np.arange(context, dtype=np.float64)):
        negative = np.flatnonzero(np.cos(m[:, None] * freq).sum(axis=1) < 0)
        if negative.size:
            return int(m[negative[0]])
    return None


def criterion_holds(base: float, dim: int, context: int) -> bool:
    """Men et al.'s criterion: the sum is >= 0 at every distance m < context."""
    return failing_distance(base, dim, context) is None


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
    """The criterion is not monotone in the base, so check a fine independent scan just below the bound: each
    base has a distance where the sum is negative (neighbouring bases fail at the same few distances: those
    are tried first, and only a base that passes them all is checked at every distance)."""
    bound = theory.base_lower_bound(128, 4096)
    failed = []
    for b in bound * np.exp(np.linspace(-0.02, -1e-5, 1500)):
        m = failing_distance(b, 128, 4096, failed)
        assert m is not None, f"base {b!r} below the bound {bound!r} passes"
        if m not in failed:
            failed.append(m)


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


# ---- theory for a patched setting (issue 33 item 5) ----
SMOL_THETA, SMOL_DIM, SMOL_CONTEXT = 1e5, 64, 8192  # SmolLM2-135M's RoPE


def smollm2_rope():
    """A tiny Llama with SmolLM2-135M's RoPE: base 1e5, head_dim 64, trained on 8192."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=2 * SMOL_DIM,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=SMOL_CONTEXT,
        rope_parameters={"rope_type": "default", "rope_theta": SMOL_THETA},
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def test_critical_dimension_of_smollm2_is_40():
    """Liu et al.: the dims whose period 2 pi b^(2i/d) is at most T; counted here in closed form,
    i <= (d/2) log_b(T / 2 pi): 20 pairs, 40 dims."""
    pairs = math.floor(SMOL_DIM / 2 * math.log(SMOL_CONTEXT / (2 * math.pi)) / math.log(SMOL_THETA)) + 1
    inv_freq = SMOL_THETA ** -(np.arange(0, SMOL_DIM, 2) / SMOL_DIM)
    assert 2 * pairs == 40 == theory.critical_dimension(inv_freq, SMOL_CONTEXT)


def test_extrapolation_bound_of_ntk_x2_on_smollm2():
    """Liu et al.'s T_extra = 2 pi beta^(d_crit/d) with beta the setting's base: ntk x2 turns b into
    b 2^(d/(d-2)) = 2.05e5, so T_extra = 13104 tokens (issue 33); plain's own is 2 pi b^(40/64) = 8379."""
    beta = SMOL_THETA * 2 ** (SMOL_DIM / (SMOL_DIM - 2))
    patched = beta ** -(np.arange(0, SMOL_DIM, 2) / SMOL_DIM)
    assert theory.effective_base(patched, 40) == pytest.approx(beta, rel=1e-12)
    assert f"{beta:.3g}" == "2.05e+05"
    assert round(theory.extrapolation_bound(patched, 40)) == 13104 == round(2 * math.pi * beta ** (40 / 64))
    plain = SMOL_THETA ** -(np.arange(0, SMOL_DIM, 2) / SMOL_DIM)
    assert theory.effective_base(plain, 40) == pytest.approx(SMOL_THETA, rel=1e-12)
    assert round(theory.extrapolation_bound(plain, 40)) == round(2 * math.pi * SMOL_THETA**0.625) == 8379


def test_extrapolation_bound_edges():
    assert theory.extrapolation_bound(np.array([1.0, 0.0]), 2) == math.inf  # the next pair is stopped
    assert theory.extrapolation_bound(np.array([1.0, 0.5]), 4) == math.inf  # every pair critical
    assert math.isnan(theory.effective_base(np.array([1.0, 0.5]), 0))


def test_the_sweeps_theory_rows_for_a_patched_setting():
    """The sweep's rows: d_crit and the base bound are the model's (the same for every setting), T_extra and
    the effective base the setting's; every row carries its declaration, whose description is the label."""
    from ropebench import extend
    from ropebench.results.meaning import BUILT_IN
    from ropebench.sweep_lib import run as R

    model = smollm2_rope()
    rows = {}
    for method in ("plain", "ntk", "pi"):
        with extend.patched(model, method, 2.0) as handle:
            rows[method] = {r["metric"]: r for r in R.theory_records(model, handle, longest=SMOL_CONTEXT)}
    ntk = rows["ntk"]
    assert set(ntk) == {
        "men_reach",
        "critical_dimension",
        "effective_base",
        "extrapolation_bound",
        "base_lower_bound",
    }
    assert round(ntk["extrapolation_bound"]["value"]) == 13104
    assert ntk["effective_base"]["value"] == pytest.approx(SMOL_THETA * 2 ** (64 / 62), rel=1e-5)
    for metric in ("critical_dimension", "base_lower_bound"):  # properties of the model
        assert {rows[m][metric]["value"] for m in rows} == {ntk[metric]["value"]}, metric
    assert ntk["critical_dimension"]["value"] == 40 and ntk["base_lower_bound"]["length"] == SMOL_CONTEXT
    assert rows["plain"]["effective_base"]["value"] == pytest.approx(SMOL_THETA, rel=1e-6)
    # pi x2: every frequency / 2, so the pair past d_crit turns twice as slowly
    assert rows["pi"]["extrapolation_bound"]["value"] == pytest.approx(
        2 * rows["plain"]["extrapolation_bound"]["value"], rel=1e-6
    )
    # every theory metric is declared (the sweep's ok_rows attaches these to the rows)
    labels = {m: BUILT_IN[(R.THEORY_TASK, m)].description for m in ntk}
    assert labels["extrapolation_bound"] == "extrapolation bound T_extra (Liu et al.), tokens"
    assert "fixed by pretraining" in labels["critical_dimension"]
    assert "trained for" in labels["base_lower_bound"] and "Men et al." in labels["base_lower_bound"]


def test_inspect_shows_the_patched_settings_theory():
    from ropebench import extend

    report = extend.inspect(smollm2_rope(), "ntk", 2.0)
    model_line, ntk_line = [line for line in report.splitlines() if "theory:" in line]
    assert "d_crit (Liu et al., fixed by pretraining at 8192) 40 of 64" in ntk_line
    assert "effective base 2.05e+05" in ntk_line and "= 13104 tokens" in ntk_line
    assert "lower bound on the base" not in ntk_line  # a property of the model: on the model's line only
    assert "lower bound on the base of a model trained for 8192 (Men et al.)" in model_line
