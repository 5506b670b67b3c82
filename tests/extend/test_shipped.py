"""Methods on what the model ships (issue 33 item 6).

- start_from="shipped" on a model that ships scaling: every wavelength-based rule (YaRN's ramp,
  ntk-parts, llama3's bands) counts the rotations of the frequencies the method starts from (the shipped
  ones), checked on Llama 3.1's real RoPE config against an independent float64 computation; methods with
  a per-pair factor (pi, ntk) multiply the shipped frequencies by it.
- A model that ships `proportional` (p-RoPE, Gemma 4 style): no method and no start rebuilds rotation on the
  pairs p-RoPE stopped; with start_from="pretrained" `plain` is the model as loaded when it ships no factor,
  and transformers' p-RoPE at factor 1 when it does.
"""

import math

import pytest
import torch
import transformers as T
from ropebench import extend
from ropebench.extend.registry import RopeBase
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

# Llama 3.1's published RoPE (config.json of meta-llama/Llama-3.1-8B): head_dim 128
LLAMA31 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
HEAD_DIM, SHIPPED_CONTEXT = 128, 131072


def llama31(seed: int = 0):
    """A tiny Llama with Llama 3.1's RoPE config (head_dim 128, max_position_embeddings 131072)."""
    config = T.LlamaConfig(
        vocab_size=128,
        hidden_size=2 * HEAD_DIM,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=SHIPPED_CONTEXT,
        rope_parameters=dict(LLAMA31),
    )
    torch.manual_seed(seed)
    return T.LlamaForCausalLM(config).eval()


MODEL = llama31()


def pretrained64() -> torch.Tensor:
    """theta_i = b^(-2i/d), float64."""
    return LLAMA31["rope_theta"] ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)


def llama3_64(inv_freq: torch.Tensor, factor: float, context: float, low: float, high: float) -> torch.Tensor:
    """Llama 3.1's scaling (Meta's reference `apply_scaling`), float64: wavelength > context/low: theta/s;
    < context/high: theta; between: (1 - g) theta/s + g theta, g = (context/wavelength - low)/(high - low)."""
    out = []
    for theta in inv_freq.tolist():
        wavelength = 2 * math.pi / theta if theta > 0 else math.inf
        if wavelength < context / high:
            out.append(theta)
        elif wavelength > context / low:
            out.append(theta / factor)
        else:
            g = (context / wavelength - low) / (high - low)
            out.append((1 - g) * theta / factor + g * theta)
    return torch.tensor(out, dtype=torch.float64)


def shipped64() -> torch.Tensor:
    """Llama 3.1's frequencies as it ships them (llama3 x8 over the pretraining context 8192), float64."""
    return llama3_64(pretrained64(), 8.0, 8192, 1.0, 4.0)


def yarn64(inv_freq: torch.Tensor, factor: float, context: float, beta_fast=32.0, beta_slow=1.0):
    """YaRN, Peng et al. 2023 eq. 17-18, float64: r = context / wavelength rotations in the trained context,
    gamma(r) = 0 below beta_slow, 1 above beta_fast, linear between;
    theta' = (1 - gamma) theta/s + gamma theta; attention sqrt(1/t) = 0.1 ln s + 1 (eq. 22)."""
    out = []
    for theta in inv_freq.tolist():
        r = context * theta / (2 * math.pi)
        gamma = 0.0 if r < beta_slow else 1.0 if r > beta_fast else (r - beta_slow) / (beta_fast - beta_slow)
        out.append((1 - gamma) * theta / factor + gamma * theta)
    return torch.tensor(out, dtype=torch.float64), 0.1 * math.log(factor) + 1


def patched_rope(model, method, factor, layer_type=None, **options):
    with extend.patched(model, method, factor, **options) as handle:
        rope = handle.frequencies(layer_type)
        return rope.inv_freq.double(), handle.scalings(layer_type)[0], handle.options


# ---- Llama 3.1: the method starts from the shipped frequencies ----
def test_the_independent_shipped_frequencies_are_the_models():
    """The reference's starting point: the tiny model's buffer is Llama 3.1's shipped RoPE."""
    loaded = MODEL.base_model.rotary_emb.inv_freq.double()
    torch.testing.assert_close(loaded, shipped64(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_yarn_on_llama31_ramps_over_the_shipped_wavelengths(factor):
    ours, scaling, options = patched_rope(MODEL, "yarn", factor)  # start_from="shipped", the default
    assert options["start_from"] == "shipped" and options["shipped_rope"] == "llama3 x8"
    assert options["trained_context"] == SHIPPED_CONTEXT
    ref, attention = yarn64(shipped64(), factor, SHIPPED_CONTEXT)
    torch.testing.assert_close(ours, ref, rtol=2e-6, atol=0)
    assert scaling == pytest.approx(attention, rel=1e-12)  # Llama 3.1 ships no temperature: 1 x yarn's
    # the old stacked form (yarn's ratio on the pretrained wavelengths, times the shipped frequencies) is not
    # this: the test tells them apart (18 of 64 pairs off by more than 1% at x2, up to 1.48x)
    stacked_ramp, _ = yarn64(pretrained64(), factor, SHIPPED_CONTEXT)
    stacked = shipped64() * stacked_ramp / pretrained64()
    assert int(((stacked / ref - 1).abs() > 0.01).sum()) >= 10


def test_yarn_x1_on_llama31_is_the_model_as_loaded():
    ids = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = MODEL(ids).logits
        for method in ("yarn", "ntk-parts", "llama3", "pi", "ntk"):
            with extend.patched(MODEL, method, 1.0):
                assert torch.equal(MODEL(ids).logits, ref), method


def test_ntk_parts_on_llama31_is_yarns_ramp_without_temperature():
    ours, scaling, _ = patched_rope(MODEL, "ntk-parts", 2.0, beta_fast=16.0, beta_slow=2.0)
    ref, _ = yarn64(shipped64(), 2.0, SHIPPED_CONTEXT, beta_fast=16.0, beta_slow=2.0)
    torch.testing.assert_close(ours, ref, rtol=2e-6, atol=0)
    assert scaling == 1.0


def test_llama3_on_llama31_bands_the_shipped_wavelengths():
    ours, _, _ = patched_rope(MODEL, "llama3", 2.0)
    ref = llama3_64(shipped64(), 2.0, SHIPPED_CONTEXT, 1.0, 4.0)
    torch.testing.assert_close(ours, ref, rtol=2e-6, atol=0)


@pytest.mark.parametrize(
    "method, ratio",
    [
        ("pi", lambda i, d, s: torch.full_like(i, 1 / s)),
        ("ntk", lambda i, d, s: s ** (-2 * i / (d - 2))),  # (b s^(d/(d-2)))^(-2i/d) / b^(-2i/d)
    ],
)
def test_per_pair_factors_multiply_the_shipped_frequencies(method, ratio):
    ours, _, _ = patched_rope(MODEL, method, 2.0)
    pairs = torch.arange(HEAD_DIM // 2, dtype=torch.float64)
    torch.testing.assert_close(ours, shipped64() * ratio(pairs, HEAD_DIM, 2.0), rtol=2e-6, atol=0)


def test_the_pretrained_start_is_unchanged_by_the_shipped_rule():
    """start_from="pretrained": yarn is transformers' yarn on theta's series at the pretraining context."""
    ours, _, options = patched_rope(MODEL, "yarn", 2.0, start_from="pretrained")
    assert options["trained_context"] == 8192
    config = T.LlamaConfig(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        max_position_embeddings=2 * 8192,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": LLAMA31["rope_theta"],
            "factor": 2.0,
            "original_max_position_embeddings": 8192,
        },
    )
    hf, _ = ROPE_INIT_FUNCTIONS["yarn"](config, None)
    assert torch.equal(ours.float(), hf)


def test_a_plugin_method_stacks_its_ratio_on_the_start():
    """A method that computes from theta (a plugin's default, on_frequencies False) gets theta's series; its
    per-pair ratio multiplies the frequencies the patch starts from (and keeps stopped pairs stopped)."""
    method = extend.registry.Method("third", lambda rope, factor: (rope.inv_freq / 3, 1.0))
    start = torch.tensor([1.0, 0.5, 0.0, 0.25])
    geometric = 16.0 ** -(torch.arange(0, 8, 2, dtype=torch.int64).float() / 8)
    out = method(RopeBase(16.0, 8, 8, 64, start, start="test"), 1.0)
    torch.testing.assert_close(out.inv_freq, start * (geometric / 3) / geometric)
    assert out.inv_freq[2] == 0


# ---- a model that ships p-RoPE (Gemma 4 style) ----
def gemma3(full_attention: dict, seed: int = 0):
    """A tiny Gemma3 with the given RoPE on its global layers (Gemma 4 ships `proportional` p = 0.25)."""
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


P_ROPE = {"rope_type": "proportional", "partial_rotary_factor": 0.25}
KEPT = int(0.25 * 16 // 2)  # pairs that rotate (transformers' count); pairs KEPT.. are stopped
needs_transformers_p_rope = pytest.mark.skipif(
    "proportional" not in ROPE_INIT_FUNCTIONS, reason="this transformers has no 'proportional' rope type"
)


@needs_transformers_p_rope
@pytest.mark.parametrize("start_from", ["pretrained", "shipped"])
@pytest.mark.parametrize(
    "method, factor",
    [
        ("plain", 1.0),
        ("pi", 2.0),
        ("ntk", 2.0),
        ("yarn", 2.0),
        ("ntk-parts", 4.0),
        ("llama3", 2.0),
        ("dynamic-ntk", 2.0),
        ("dynamic-yarn", 1.0),
        ("proportional", 2.0),
    ],
)
def test_no_method_rebuilds_rotation_on_the_stopped_pairs(method, factor, start_from):
    model = gemma3(P_ROPE)
    with extend.patched(model, method, factor, start_from=start_from) as handle:
        for seq_len in (64, 256):  # dynamic methods: within and beyond the trained context
            inv_freq = handle.frequencies("full_attention", seq_len).inv_freq
            assert not inv_freq[KEPT:].any(), (method, start_from, inv_freq)
            assert inv_freq[:KEPT].all()
        assert handle.options["shipped_rope"] == "proportional p=0.25"


@needs_transformers_p_rope
def test_a_p_rope_model_without_a_factor_is_its_own_pretrained_rope():
    """Gemma 4 ships p-RoPE with no factor: that is how it was pretrained, so start_from="pretrained" and
    "shipped" agree, and `plain` with either is the model as loaded (bit-identical logits)."""
    model = gemma3(P_ROPE)
    info = extend.shipped.shipped_ropes(model.config)["full_attention"]
    assert not info.scaled and info.p_rope == 0.25 and info.pretrained_start() == "proportional p=0.25"
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids).logits
        for start_from in ("pretrained", "shipped"):
            with extend.patched(model, "plain", start_from=start_from):
                assert torch.equal(model(ids).logits, ref), start_from
        with extend.patched(model, "yarn", 2.0, start_from="pretrained") as handle:
            yarn = model(ids).logits
            inv_freq = handle.frequencies("full_attention").inv_freq
    assert not torch.equal(yarn, ref) and torch.isfinite(yarn).all()
    # yarn's ramp on the rotating pairs (eq. 17-18 over their rotations in the trained context 64)
    theta = 1e6 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    theta[KEPT:] = 0
    torch.testing.assert_close(inv_freq.double(), yarn64(theta, 2.0, 64)[0], rtol=2e-6, atol=0)


@needs_transformers_p_rope
def test_a_p_rope_model_with_a_factor_restarts_from_p_rope_at_factor_one():
    """A model shipping p-RoPE x2: its pretrained RoPE is p-RoPE at factor 1 (transformers' own, bit-equal),
    never the full-rotation series; the shipped one is transformers' p-RoPE x2."""
    model = gemma3(dict(P_ROPE, factor=2.0))
    native = gemma3(P_ROPE)  # the same p-RoPE without the factor
    info = extend.shipped.shipped_ropes(model.config)["full_attention"]
    assert info.scaled and info.label() == "proportional p=0.25 x2"
    assert info.pretrained_context == 32  # max_position_embeddings 64 / factor 2, as for `linear`
    with extend.patched(model, "plain", start_from="pretrained") as handle:
        pretrained = handle.frequencies("full_attention").inv_freq
    assert torch.equal(pretrained, native.base_model.rotary_emb.full_attention_inv_freq)
    with extend.patched(model, "plain") as handle:
        shipped = handle.frequencies("full_attention").inv_freq
    assert torch.equal(shipped, model.base_model.rotary_emb.full_attention_inv_freq)
    assert torch.equal(shipped[:KEPT], pretrained[:KEPT] / 2) and not shipped[KEPT:].any()


@needs_transformers_p_rope
def test_a_long_p_rope_gemma3_keeps_its_context():
    """Gemma3's published pretraining context (32k) applies to a shipped scaling only: a p-RoPE Gemma3 at
    128k without a factor was trained at 128k."""
    config = gemma3(P_ROPE).config
    config.max_position_embeddings = 131072
    info = extend.shipped.shipped_ropes(config)["full_attention"]
    assert (info.pretrained_context, info.shipped_context) == (131072, 131072)


def test_dynamic_yarn_on_llama31_ramps_over_the_shipped_wavelengths():
    """dynamic-yarn's scale s = L'/L at L' = 2 x 131072: yarn x2 on the shipped frequencies."""
    with extend.patched(MODEL, "dynamic-yarn") as handle:
        ours = handle.frequencies(None, 2 * SHIPPED_CONTEXT).inv_freq.double()
        scaling = handle.scalings(None, 2 * SHIPPED_CONTEXT)[0]
        assert torch.equal(
            handle.frequencies(None, SHIPPED_CONTEXT).inv_freq, MODEL.base_model.rotary_emb.rotary.inv_freq
        )
    ref, attention = yarn64(shipped64(), 2.0, SHIPPED_CONTEXT)
    torch.testing.assert_close(ours, ref, rtol=2e-6, atol=0)
    assert scaling == pytest.approx(attention, rel=1e-12)


def test_p_rope_on_llama31_stops_the_slow_shipped_pairs():
    ours, _, _ = patched_rope(MODEL, "proportional", 2.0, partial_rotary_factor=0.25)
    ref = shipped64() / 2
    ref[int(0.25 * HEAD_DIM // 2) :] = 0
    torch.testing.assert_close(ours, ref, rtol=2e-6, atol=0)
