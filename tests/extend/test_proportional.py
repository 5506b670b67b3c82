"""p-RoPE as the method `proportional` (Barbero et al. 2024, arXiv:2410.06205; transformers' `proportional`
rope type, option `partial_rotary_factor` = p, factor s as transformers 5.x applies it: every rotating pair's
frequency / s): bit-equal (float32) to transformers' function and to the cos/sin of transformers' own p-RoPE
model at factors 1, 2 and 4, on a plain config and on Gemma 4's layer-typed one, equal to an independent
float64 formula, its option range and its factor axis, and patched models of every tested family that run,
match transformers' own p-RoPE model and undo exactly."""

import math

import pytest
import torch
import transformers as T
from ropebench import extend
from ropebench.extend.registry import RopeBase
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

THETA, HEAD_DIM, CONTEXT = 1e5, 64, 8192  # SmolLM2-135M's RoPE
FRACTIONS = [0.0, 0.25, 0.3, 0.5, 0.75, 1.0]  # 0.3: p d/2 = 9.6 pairs, not a whole number
FACTORS = [1.0, 2.0, 4.0]

# transformers' own p-RoPE (the reference these tests compare with) arrived in a 5.x release; on an older
# version in pyproject's range they skip, and the formula tests below still check the method.
needs_transformers_p_rope = pytest.mark.skipif(
    "proportional" not in ROPE_INIT_FUNCTIONS, reason="this transformers has no 'proportional' rope type"
)


def llama(rope_parameters: dict | None = None, seed: int = 0):
    config = T.LlamaConfig(
        vocab_size=128,
        hidden_size=2 * HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        rope_parameters=rope_parameters or {"rope_type": "default", "rope_theta": THETA},
    )
    torch.manual_seed(seed)
    return T.LlamaForCausalLM(config).eval()


MODEL = llama()


def gemma3(full_attention: dict, seed: int = 0):
    """A tiny Gemma3 (tested family, two layer types) with the given RoPE on its global layers."""
    config = T.Gemma3TextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=16,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_theta": 1e6, **full_attention},
        },
    )
    torch.manual_seed(seed)
    return T.Gemma3ForCausalLM(config).eval()


def patched_inv_freq(model, prefix: str = "", **options) -> torch.Tensor:
    with extend.patched(model, "proportional", **options):
        return getattr(model.base_model.rotary_emb.rotary, f"{prefix}inv_freq").clone()


def ref_inv_freq(theta: float, dim: int, p: float, factor: float = 1.0) -> torch.Tensor:
    """Barbero et al. 2024, p-RoPE: the model's theta_i = b^(-2i/d) on the first floor(p d/2) pairs (the
    highest frequencies), zero (no rotation, NoPE) on the others; transformers' factor s divides every
    rotating pair's frequency (positions m -> m/s on them). float64."""
    pairs = torch.arange(dim // 2, dtype=torch.float64)
    kept = math.floor(p * dim / 2)
    return torch.where(pairs < kept, theta ** (-2 * pairs / dim) / factor, torch.zeros_like(pairs))


# ---- against transformers' own function ----
def transformers_p_rope(p: float, factor: float) -> dict:
    params = {"rope_type": "proportional", "rope_theta": THETA, "partial_rotary_factor": p}
    return params if factor == 1.0 else dict(params, factor=factor)  # Gemma 4 ships none: 1


@needs_transformers_p_rope
@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("p", FRACTIONS)
def test_bit_equal_to_transformers_on_a_plain_config(p, factor):
    config = llama(transformers_p_rope(p, factor)).config
    hf, attention = ROPE_INIT_FUNCTIONS["proportional"](config, None)
    ours = patched_inv_freq(MODEL, factor=factor, partial_rotary_factor=p)
    assert ours.dtype == hf.dtype == torch.float32 and torch.equal(ours, hf), (p, factor)
    assert attention == 1.0


@needs_transformers_p_rope
@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("p", [0.25, 1.0])
def test_cos_sin_equal_transformers_own_p_rope_model(p, factor):
    """The acceptance test of issue 31: cos and sin of the patched model equal those of the same model built
    by transformers with `proportional` (and `factor`), at every position up to 32k (torch.equal)."""
    native = llama(transformers_p_rope(p, factor))
    x, positions = torch.zeros(1, dtype=torch.float32), torch.arange(0, 32768, 5)[None]
    ref_cos, ref_sin = native.base_model.rotary_emb(x, positions)
    with extend.patched(MODEL, "proportional", factor, partial_rotary_factor=p):
        cos, sin = MODEL.base_model.rotary_emb(x, positions)
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin), (p, factor)


@needs_transformers_p_rope
def test_bit_equal_to_transformers_on_gemma4s_layer_typed_config():
    """Gemma 4 ships `proportional` on its global layers (head_dim global_head_dim, p from its config)."""
    config = T.Gemma4TextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        layer_types=["sliding_attention", "full_attention"],
    )
    params = config.rope_parameters["full_attention"]
    assert params["rope_type"] == "proportional" and params["partial_rotary_factor"] < 1
    hf, _ = ROPE_INIT_FUNCTIONS["proportional"](config, None, layer_type="full_attention")
    theta, dim = params["rope_theta"], 32
    pretrained = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))  # Gemma 4's own
    rope = RopeBase(theta, dim, dim, 8192, pretrained)
    ours = extend.registry.get("proportional")(
        rope, 1.0, partial_rotary_factor=params["partial_rotary_factor"]
    )
    assert torch.equal(ours.inv_freq, hf) and ours.attention_factor == 1.0


@needs_transformers_p_rope
def test_a_patched_gemma3_is_transformers_own_p_rope_model():
    """Gemma3 (default RoPE) patched with p = 0.25 gives the logits of the same Gemma3 built by transformers
    with `proportional` on its global layers: the sliding layers keep their RoPE, the global ones match."""
    native = gemma3({"rope_type": "proportional", "partial_rotary_factor": 0.25})
    model = gemma3({"rope_type": "default"})
    model.load_state_dict(native.state_dict())
    ids = torch.randint(0, 128, (2, 100), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref, plain = native(ids).logits, model(ids).logits
        with extend.patched(model, "proportional", partial_rotary_factor=0.25) as handle:
            out = model(ids).logits
        assert torch.equal(model(ids).logits, plain)  # undone
    assert handle.options["layer_types"] == ["full_attention"] and torch.equal(out, ref)
    assert not torch.equal(out, plain)


@needs_transformers_p_rope
@pytest.mark.parametrize("factor", FACTORS)
def test_without_transformers_function_the_same_frequencies(monkeypatch, factor):
    """A transformers without `proportional` (it came with Gemma 4): the method's own formula, bit-equal."""
    expected = patched_inv_freq(MODEL, factor=factor, partial_rotary_factor=0.25)
    monkeypatch.delitem(ROPE_INIT_FUNCTIONS, "proportional")
    assert torch.equal(patched_inv_freq(MODEL, factor=factor, partial_rotary_factor=0.25), expected)


# ---- against the paper's formula ----
@pytest.mark.parametrize("factor", FACTORS + [8.0, 0.5])
@pytest.mark.parametrize("p", FRACTIONS)
def test_matches_the_papers_formula(p, factor):
    ours = patched_inv_freq(MODEL, factor=factor, partial_rotary_factor=p).double()
    ref = ref_inv_freq(THETA, HEAD_DIM, p, factor)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)
    assert torch.equal(ours == 0, ref == 0)  # exactly the NoPE pairs stop rotating


def test_the_stopped_pairs_carry_no_position_up_to_32k():
    """cos = 1 and sin = 0 on the NoPE pairs at every position (q.k there is position-free); the rotating
    pairs follow the float64 angle m theta_i within float32's phase rounding."""
    positions = torch.arange(0, 32768, 7)
    with extend.patched(MODEL, "proportional", partial_rotary_factor=0.25):
        cos, sin = MODEL.base_model.rotary_emb(torch.zeros(1), positions[None])
    half = HEAD_DIM // 2
    kept = math.floor(0.25 * HEAD_DIM / 2)
    cos, sin = cos[0].double(), sin[0].double()
    for part in (slice(kept, half), slice(half + kept, None)):
        assert torch.equal(cos[:, part], torch.ones_like(cos[:, part]))
        assert torch.equal(sin[:, part], torch.zeros_like(sin[:, part]))
    angle = positions.double()[:, None] * ref_inv_freq(THETA, HEAD_DIM, 0.25)[:kept]
    tolerance = 1e-6 + 2.0**-22 * angle.abs()
    assert ((cos[:, :kept] - angle.cos()).abs() <= tolerance).all()
    assert ((sin[:, :kept] - angle.sin()).abs() <= tolerance).all()


# ---- factor and option range ----
def test_the_factor_axis_is_swept_like_any_methods():
    """transformers' factor divides the rotating pairs' frequencies: a sweep runs every factor (uses_factor),
    each reaches factor x the trained context; x2 is x1 / 2 on the rotating pairs, the stopped ones stay 0;
    p = 1 (the default) at factor 1 is the model as loaded, at factor 2 `pi` x2."""
    method = extend.registry.get("proportional")
    assert method.factor_applies() and extend.describe("proportional")["uses_factor"]
    assert method.reach(4.0, CONTEXT) == 4 * CONTEXT
    x1, x2 = (patched_inv_freq(MODEL, factor=f, partial_rotary_factor=0.5) for f in (1.0, 2.0))
    kept = math.floor(0.5 * HEAD_DIM / 2)
    assert torch.equal(x2[:kept], x1[:kept] / 2) and not x2[kept:].any() and x1[:kept].all()
    assert extend.describe("proportional")["options"]["partial_rotary_factor"] == 1.0
    assert torch.equal(patched_inv_freq(MODEL), MODEL.base_model.rotary_emb.inv_freq)
    with extend.patched(MODEL, "pi", 2.0):
        pi = MODEL.base_model.rotary_emb.rotary.inv_freq.clone()
    assert torch.equal(patched_inv_freq(MODEL, factor=2.0), pi)


@pytest.mark.parametrize(
    "value, message",
    [
        (-0.25, "must be >= 0"),
        (1.5, "must be <= 1"),
        (float("nan"), "finite number"),
        ("0.5", "must be a number"),
        (True, "must be a number"),
    ],
)
def test_partial_rotary_factor_out_of_range_is_refused(value, message):
    with pytest.raises(extend.ExtendError, match=message) as error:
        extend.registry.check_method("proportional", 1.0, {"partial_rotary_factor": value})
    assert "partial_rotary_factor" in str(error.value)
    with pytest.raises(extend.ExtendError, match=message):
        extend.patch(MODEL, "proportional", partial_rotary_factor=value)
    assert extend.current(MODEL) is None


@pytest.mark.parametrize("value", [0, 0.0, 1, 1.0])
def test_the_range_ends_are_accepted(value):
    extend.registry.check_method("proportional", 1.0, {"partial_rotary_factor": value})


# ---- patched models ----
@pytest.mark.parametrize("family", sorted(extend.TESTED_FAMILIES))
def test_patched_model_runs_changes_and_undoes(family, family_model_factory):
    model = family_model_factory(family)
    ids = torch.randint(3, 128, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        with extend.patched(model, "proportional", partial_rotary_factor=1.0):
            assert torch.equal(model(ids).logits, ref), family  # every pair rotates: the model as loaded
        with extend.patched(model, "proportional", partial_rotary_factor=0.5):
            out = model(ids).logits
        assert torch.equal(model(ids).logits, ref), f"{family}: undo did not restore the model"
    assert torch.isfinite(out).all() and not torch.equal(out, ref), family


def test_inspect_reports_the_stopped_pairs():
    report = extend.inspect(MODEL, "proportional", partial_rotary_factor=0.25)
    stopped = HEAD_DIM // 2 - math.floor(0.25 * HEAD_DIM / 2)
    assert f"{stopped} of {HEAD_DIM // 2} frequency pairs differ" in report, report
