"""Right on every model family: tiny random models built from the RoPE parts of real checkpoints' published
configs (sizes shrunk; theta, head_dim, rotary fraction, scaling, window, layer types and contexts kept).
Per layer type: the frequencies against an independent float64 reference, the trained context, whether the
RoPE depends on length, factor-1 identity, and finite logits at positions up to 131072. Plus the
partial-rotary temperature, the shipped-scaling policy, fixed_length in cached generation and the xPos
range."""

import math

import pytest
import torch
import transformers as T
from ropebench import extend
from ropebench.extend.forward import with_cache

# Phi-3-vision-128k-instruct's published longrope lists (the Phi-3-mini-128k backbone, head_dim 96: 48 pairs).
PHI3_LONG = [
    1.03,
    1.05,
    1.05,
    1.08,
    1.23,
    1.23,
    1.3,
    1.45,
    1.6,
    1.65,
    1.9,
    2.86,
    3.69,
    5.42,
    5.49,
    5.49,
    9.09,
    11.58,
    15.66,
    15.77,
    15.79,
    18.36,
    21.99,
    23.08,
    30.01,
    32.35,
    32.59,
    35.56,
    39.95,
    53.84,
    56.2,
    57.95,
    59.29,
    59.77,
    59.92,
    61.19,
    61.96,
    62.5,
    63.37,
    63.48,
    63.48,
    63.66,
    63.85,
    64.08,
    64.76,
    64.8,
    64.81,
    64.81,
]
PHI3_SHORT = (
    [1.05, 1.05, 1.05, 1.1, 1.1, 1.1, 1.25, 1.25, 1.4, 1.45, 1.55, 1.85, 1.9]
    + [2.0] * 19
    + [2.1, 2.1, 2.2, 2.35, 2.35, 2.35, 2.35, 2.4, 2.4, 2.65, 2.7, 2.9, 2.95, 3.05, 3.05, 3.05]
)
GEMMA3_TYPES = ["sliding_attention", "full_attention"]  # 1B/4B use 5 sliding : 1 global; 2 layers keep both

# name -> (config class, model class, config kwargs, expectations). Expectations: per layer type (None for one
# type) its (theta, rotary dims); the pretrained and shipped contexts; shipped length dependence.
CHECKPOINTS = {
    "gemma3-1b": (
        T.Gemma3TextConfig,
        T.Gemma3ForCausalLM,
        {
            "head_dim": 256,
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "hidden_size": 64,
            "query_pre_attn_scalar": 256,
            "sliding_window": 512,
            "max_position_embeddings": 32768,
            "layer_types": GEMMA3_TYPES,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            },
        },
        {"types": {"sliding_attention": (1e4, 256), "full_attention": (1e6, 256)}, "L": (32768, 32768)},
    ),
    "gemma3-4b-linear8": (
        T.Gemma3TextConfig,
        T.Gemma3ForCausalLM,
        {
            "head_dim": 256,
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "hidden_size": 64,
            "query_pre_attn_scalar": 256,
            "sliding_window": 1024,
            "max_position_embeddings": 131072,
            "layer_types": GEMMA3_TYPES,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            },
        },
        # Gemma 3 report (arXiv:2503.19786): pretrained on 32K, scaled to 128K with linear x8 on global layers
        {"types": {"sliding_attention": (1e4, 256), "full_attention": (1e6, 256)}, "L": (32768, 131072)},
    ),
    "llama-3.1-8b": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        {
            "head_dim": 128,
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "hidden_size": 128,
            "max_position_embeddings": 131072,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        {"types": {None: (5e5, 128)}, "L": (8192, 131072)},
    ),
    "llama-3.2-1b": (
        T.LlamaConfig,
        T.LlamaForCausalLM,
        {  # llama3 x32 from 8192, published reach 131072
            "head_dim": 64,
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "hidden_size": 64,
            "max_position_embeddings": 131072,
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 32.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        },
        {"types": {None: (5e5, 64)}, "L": (8192, 131072)},
    ),
    "qwen2.5-7b-yarn": (
        T.Qwen2Config,
        T.Qwen2ForCausalLM,
        {
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "hidden_size": 128,
            "max_position_embeddings": 32768,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 1e6,
                "factor": 4.0,
                "original_max_position_embeddings": 32768,
            },
        },
        {"types": {None: (1e6, 128)}, "L": (32768, 131072)},
    ),
    "phi3-mini-128k": (
        T.Phi3Config,
        T.Phi3ForCausalLM,
        {
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "hidden_size": 192,
            "max_position_embeddings": 131072,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": PHI3_SHORT,
                "long_factor": PHI3_LONG,
                "original_max_position_embeddings": 4096,
            },
        },
        {"types": {None: (1e4, 96)}, "L": (4096, 131072), "length_dependent": True},
    ),
    "phi-2": (
        T.PhiConfig,
        T.PhiForCausalLM,
        {
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "hidden_size": 80,
            "max_position_embeddings": 2048,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.4},
        },
        {"types": {None: (1e4, 32)}, "L": (2048, 2048)},
    ),
    "pythia-rotary-0.25": (
        T.GPTNeoXConfig,
        T.GPTNeoXForCausalLM,
        {
            "num_attention_heads": 1,
            "hidden_size": 128,
            "max_position_embeddings": 2048,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        },
        {"types": {None: (1e4, 32)}, "L": (2048, 2048)},
    ),
    "command-r-interleaved": (
        T.CohereConfig,
        T.CohereForCausalLM,
        {
            "num_attention_heads": 1,
            "num_key_value_heads": 1,
            "hidden_size": 128,
            "max_position_embeddings": 131072,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 8e6},
        },
        {"types": {None: (8e6, 128)}, "L": (131072, 131072)},
    ),
}
_BUILT = {}


def build(name):
    if name not in _BUILT:
        config_cls, model_cls, kwargs, _ = CHECKPOINTS[name]
        torch.manual_seed(0)
        config = config_cls(vocab_size=128, intermediate_size=64, num_hidden_layers=2, **kwargs)
        _BUILT[name] = model_cls(config).eval()
    return _BUILT[name]


def logits(model, positions=None, n=24, seed=1):
    ids = torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(ids, position_ids=positions).logits


# ---- independent float64 references (from the papers' formulas) ----
def ref_base(theta, dim):
    return theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def ref_yarn(theta, dim, context, s, beta_fast=32.0, beta_slow=1.0):
    """YaRN eq. 17-18: interpolate pairs making < beta_slow rotations in L, keep those making > beta_fast."""
    base = ref_base(theta, dim)
    pair = torch.arange(dim // 2, dtype=torch.float64)

    def rotations(r):
        return dim * math.log(context / (r * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(rotations(beta_fast)), 0), min(math.ceil(rotations(beta_slow)), dim - 1)
    keep = 1 - ((pair - low) / max(high - low, 1e-3)).clamp(0, 1)
    return base * keep + base / s * (1 - keep), 0.1 * math.log(s) + 1


def installed(model):
    """Layer type -> (inv_freq, attention scaling) the patched rotary module now holds."""
    rotary = model.base_model.rotary_emb.rotary
    types = rotary.layer_types if isinstance(rotary.rope_type, dict) else [None]
    out = {}
    for lt in types:
        prefix = f"{lt}_" if lt else ""
        out[lt] = (
            getattr(rotary, f"{prefix}inv_freq").double(),
            getattr(rotary, f"{prefix}attention_scaling"),
        )
    return out


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_trained_context_and_length_dependence(name):
    model = build(name)
    expect = CHECKPOINTS[name][3]
    assert extend.trained_context(model, "pretrained") == expect["L"][0]
    assert extend.trained_context(model) == extend.trained_context(model, "shipped") == expect["L"][1]
    assert extend.length_dependent(model) is expect.get("length_dependent", False)
    with extend.patched(
        model, "plain", start_from="pretrained"
    ):  # the pretrained RoPE: never length-dependent
        assert not extend.length_dependent(model)
    with extend.patched(model, "plain") as handle:  # default: the model as loaded
        assert extend.length_dependent(model) is expect.get("length_dependent", False)
    assert handle.options["start_from"] == "shipped" and handle.options["trained_context"] == expect["L"][1]
    with extend.patched(model, "dynamic-yarn", factor=2.0):
        assert extend.length_dependent(model)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_yarn_frequencies_per_layer_type(name):
    """yarn x2 from the pretrained base: layers whose span can exceed L get YaRN at that L, the others
    (Gemma3's sliding layers, window < L) keep their pretrained frequencies without temperature."""
    model = build(name)
    expect = CHECKPOINTS[name][3]
    context = expect["L"][0]
    with extend.patched(model, "yarn", factor=2.0, start_from="pretrained") as handle:
        got = installed(model)
        attention = {
            id(m): m.scaling for m in model.modules() if isinstance(getattr(m, "scaling", None), float)
        }
    assert handle.options["trained_context"] == context
    for lt, (theta, dim) in expect["types"].items():
        inv, scaling = got[lt]
        if lt == "sliding_attention":
            torch.testing.assert_close(inv, ref_base(theta, dim), rtol=1e-6, atol=0)
            assert scaling == 1.0
            continue
        ref_inv, ref_t = ref_yarn(theta, dim, context, 2.0)
        torch.testing.assert_close(inv, ref_inv, rtol=1e-6, atol=0)
        partial = dim < model.config.hidden_size // model.config.num_attention_heads
        assert abs(scaling - (1.0 if partial else ref_t)) < 1e-6  # partial rotary: on the logits instead
        if partial:
            assert handle.options["temperature"] == "logits"
            head_dim = model.config.hidden_size // model.config.num_attention_heads
            assert all(abs(v - head_dim**-0.5 * ref_t**2) < 1e-9 for v in attention.values())
    expected_types = ["full_attention"] if "gemma3" in name else None
    assert handle.options.get("layer_types") == expected_types


def test_gemma3_layer_types_can_be_chosen():
    model = build("gemma3-1b")
    with extend.patched(
        model, "pi", factor=4.0, layer_types=["sliding_attention", "full_attention"]
    ) as handle:
        got = installed(model)
    assert handle.options["layer_types"] == ["full_attention", "sliding_attention"]
    torch.testing.assert_close(got["sliding_attention"][0], ref_base(1e4, 256) / 4, rtol=1e-6, atol=0)
    torch.testing.assert_close(got["full_attention"][0], ref_base(1e6, 256) / 4, rtol=1e-6, atol=0)
    with pytest.raises(extend.ExtendError, match="layer_types must be"):
        extend.patch(model, "pi", factor=2.0, layer_types=["global"])


def test_shipped_linear_gemma3_policy():
    """Gemma3 4B ships linear x8 on its global layers only: pretrained L = 32K (published); stacking pi x2 on
    what ships divides the shipped (already / 8) global frequencies by 2 and leaves the sliding ones."""
    model = build("gemma3-4b-linear8")
    with extend.patched(model, "pi", factor=2.0, start_from="shipped") as handle:
        got = installed(model)
    assert handle.options["shipped_rope"] == "linear x8" and handle.options["trained_context"] == 131072
    torch.testing.assert_close(got["full_attention"][0], ref_base(1e6, 256) / 16, rtol=1e-6, atol=0)
    torch.testing.assert_close(got["sliding_attention"][0], ref_base(1e4, 256), rtol=1e-6, atol=0)
    with extend.patched(model, "plain", start_from="pretrained") as handle:
        got = installed(model)
    assert handle.options["base_theta"] == 1e6 and handle.options["trained_context"] == 32768
    torch.testing.assert_close(got["full_attention"][0], ref_base(1e6, 256), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_factor_one_identity(name):
    """Each formula at factor 1 equals `plain` on the same base; `plain` with start_from="shipped" is the
    model."""
    model = build(name)
    ref = logits(model)
    with extend.patched(model, "plain", start_from="shipped"):
        assert torch.equal(logits(model), ref)
    for start_from in ("pretrained", "shipped"):
        with extend.patched(model, "plain", start_from=start_from):
            plain = logits(model)
        for method in ["pi", "ntk", "ntk-parts", "yarn", "llama3"]:
            with extend.patched(model, method, factor=1.0, start_from=start_from):
                assert torch.equal(logits(model), plain), f"{name}/{method}/{start_from}"
    assert torch.equal(logits(model), ref)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_default_plain_is_the_model_as_loaded(name):
    """The baseline is the model as loaded: `plain` with the default start_from is bit-identical to the
    unpatched model, within the pretraining context and beyond it (Phi-3's long factors), and records it."""
    model = build(name)
    pretrained = CHECKPOINTS[name][3]["L"][0]
    far = torch.arange(pretrained + 100, pretrained + 124)[None]  # past the pretraining context
    ref, ref_far = logits(model), logits(model, far)
    with extend.patched(model, "plain") as handle:
        assert torch.equal(logits(model), ref) and torch.equal(logits(model, far), ref_far), name
    assert handle.options["start_from"] == "shipped"
    with extend.patched(model, "plain", start_from="pretrained") as handle:
        assert handle.options["start_from"] == "pretrained"  # the explicit option is recorded too


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen2.5-7b-yarn", "gemma3-4b-linear8"])
def test_methods_stack_on_the_shipped_rope_by_default(name):
    """Default start_from: yarn x2 starts from the model's own shipped frequencies, its ramp (eq. 17-18)
    counting their rotations in the context the shipped scaling reaches (issue 33), and its temperature
    multiplies the shipped one."""
    model = build(name)
    expect = CHECKPOINTS[name][3]
    lt = "full_attention" if "gemma3" in name else None
    theta, dim = expect["types"][lt]
    rotary = model.base_model.rotary_emb
    prefix = f"{lt}_" if lt else ""
    own = (
        getattr(rotary, f"{prefix}original_inv_freq").double().clone()
    )  # what transformers built: as shipped
    own_scaling = float(getattr(rotary, f"{prefix}attention_scaling"))
    with extend.patched(model, "yarn", factor=2.0) as handle:
        inv, scaling = installed(model)[lt]
    _, ref_t = ref_yarn(theta, dim, expect["L"][1], 2.0)
    assert handle.options["trained_context"] == expect["L"][1]
    gamma = ((expect["L"][1] * own / (2 * math.pi) - 1.0) / (32.0 - 1.0)).clamp(0, 1)  # r = L / wavelength
    torch.testing.assert_close(inv, (1 - gamma) * own / 2.0 + gamma * own, rtol=1e-5, atol=0)
    assert abs(scaling - own_scaling * ref_t) < 1e-6


def _sliding_only_gemma3():
    torch.manual_seed(0)
    config = T.Gemma3TextConfig(
        vocab_size=128,
        intermediate_size=64,
        num_hidden_layers=2,
        head_dim=16,
        num_attention_heads=1,
        num_key_value_heads=1,
        hidden_size=64,
        sliding_window=16,
        max_position_embeddings=64,
        layer_types=["sliding_attention"] * 2,
    )
    return T.Gemma3ForCausalLM(config).eval()


def test_gemma3_without_global_layers_patches_the_types_present():
    """transformers builds rotary buffers only for the layer types in config.layer_types: a Gemma3 with
    sliding layers only has no full_attention_inv_freq, so only the sliding type is patched."""
    model = _sliding_only_gemma3()
    ref = logits(model, n=40)
    with extend.patched(model, "yarn", factor=2.0) as handle:  # window 16 < 64: nothing to extend
        assert torch.equal(logits(model, n=40), ref)
    assert handle.options["layer_types"] == []
    with extend.patched(model, "pi", factor=4.0, layer_types=["sliding_attention"]):
        got = installed(model)
    torch.testing.assert_close(got["sliding_attention"][0], ref_base(1e4, 16) / 4, rtol=1e-6, atol=0)
    with pytest.raises(extend.ExtendError, match="layer_types must be"):
        extend.patch(model, "pi", factor=2.0, layer_types=["full_attention"])
    assert "full_attention" not in extend.inspect(model)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_finite_logits_up_to_131072(name):
    model = build(name)
    positions = torch.arange(131072 - 24, 131072)[None]
    for method, factor in [
        ("plain", 1.0),
        ("yarn", 4.0),
        ("dynamic-ntk", 4.0),
        ("dynamic-yarn", 4.0),
        ("xpos", 4.0),
    ]:
        with extend.patched(model, method, factor=factor):
            assert torch.isfinite(logits(model, positions)).all(), f"{name}/{method}"
    assert torch.isfinite(logits(model, positions)).all()


# ---- partial rotary: the temperature on every logit (paper) or on cos/sin (transformers) ----
@pytest.mark.parametrize("name", ["phi-2", "pythia-rotary-0.25"])
def test_partial_rotary_temperature_both_ways(name):
    """YaRN x4 = NTK-by-parts frequencies + temperature. "logits" must equal NTK-by-parts with every attention
    logit multiplied by (0.1 ln 4 + 1)^2; "rotary" puts it on cos/sin, so only the rotary dims get it."""
    model = build(name)
    t2 = (0.1 * math.log(4.0) + 1) ** 2
    with extend.patched(model, "yarn", factor=4.0) as handle:
        uniform = logits(model, n=40)
    assert handle.options["temperature"] == "logits"
    modules = [m for m in model.modules() if isinstance(getattr(m, "scaling", None), float)]
    own = [m.scaling for m in modules]
    with extend.patched(model, "ntk-parts", factor=4.0):
        for m, s in zip(modules, own):
            m.scaling = s * t2
        try:
            reference = logits(model, n=40)
        finally:
            for m, s in zip(modules, own):
                m.scaling = s
    torch.testing.assert_close(uniform, reference, rtol=1e-5, atol=1e-5)
    with extend.patched(model, "yarn", factor=4.0, temperature="rotary"):
        rotary_only = logits(model, n=40)
        cos, sin = model.base_model.rotary_emb(torch.zeros(1), torch.arange(4)[None])
    torch.testing.assert_close(
        (cos**2 + sin**2).double(), torch.full_like(cos, t2).double(), rtol=1e-5, atol=0
    )
    assert not torch.allclose(rotary_only, uniform, atol=1e-4)
    assert [m.scaling for m in modules] == own  # undo restored the attention scaling


# ---- fixed_length: one set of frequencies for a whole cached call ----
def _cached_steps(model, ids, prompt):
    """Logits of the prompt in one forward, then of one token at a time continuing the same KV cache."""
    cache = T.DynamicCache(config=model.config)
    pieces = [ids[:, :prompt], *ids[:, prompt:].split(1, dim=1)]
    with torch.no_grad():
        return torch.cat([model(p, use_cache=True, **with_cache(model, cache)).logits for p in pieces], 1)


@pytest.mark.parametrize(
    "case",
    ["dynamic-ntk", "dynamic-yarn", "longrope", "shipped-longrope-unpatched", "shipped-dynamic-unpatched"],
)
def test_fixed_length_cached_generation_equals_full_forward(case, tiny_llama_factory):
    """float32: a prompt within the trained context, then cached one-token steps past it, inside
    fixed_length(total) equals one full forward of the total (whose own length is that total)."""

    if case == "shipped-longrope-unpatched":
        model, opts = build("phi3-mini-128k"), None
        total, prompt = 4096 + 40, 4096 - 8
    elif case == "shipped-dynamic-unpatched":
        model, opts = (
            tiny_llama_factory(
                max_position_embeddings=64,
                rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
            ),
            None,
        )
        total, prompt = 120, 40
    else:
        model = tiny_llama_factory(max_position_embeddings=64)
        opts = (
            {"short_factor": [1.0] * 8, "long_factor": [3.0 + i for i in range(8)]}
            if case == "longrope"
            else {}
        )
        total, prompt = 120, 40  # the prompt alone stays within the trained context of 64
    ids = torch.randint(3, 128, (1, total), generator=torch.Generator().manual_seed(5))
    with contextlib_patch(model, case, opts):
        with torch.no_grad():
            full = model(ids).logits
        with extend.fixed_length(model, total):
            cached = _cached_steps(model, ids, prompt)
        drifting = _cached_steps(
            model, ids, prompt
        )  # without: the prompt's keys keep the prompt's frequencies
        assert extend.length_dependent(model)
    torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(drifting, full, rtol=1e-4, atol=1e-4)
    assert extend.current(model) is None or opts is not None
    with (
        pytest.raises(extend.ExtendError, match="beyond extend.fixed_length"),
        contextlib_patch(model, case, opts),
        extend.fixed_length(model, total - 1),
        torch.no_grad(),
    ):
        model(ids)


def contextlib_patch(model, case, opts):
    import contextlib

    if opts is None:
        return contextlib.nullcontext()
    return extend.patched(model, case, factor=2.0, **opts)


def test_fixed_length_is_a_no_op_for_length_independent_models():
    model = build("llama-3.1-8b")
    ref = logits(model)
    with extend.fixed_length(model, 100):
        assert extend.current(model) is None and torch.equal(logits(model), ref)
    with pytest.raises(extend.ExtendError, match="positive integer"), extend.fixed_length(model, 0):
        pass


# ---- xPos range ----
def test_xpos_range_is_finite_or_a_clear_error(tiny_llama_factory):

    model = tiny_llama_factory(max_position_embeddings=8192)
    ids = torch.randint(0, 128, (1, 8))
    limit = extend.xpos.max_offset(torch.tensor([0.4 / 1.4]), 512.0)  # zeta_min = gamma / (1 + gamma)
    with extend.patched(model, "xpos", factor=1.0), torch.no_grad():
        for start in (45000, 65535 - 8, 131072 - 8):  # far from the trained context: centred on the span
            assert torch.isfinite(model(ids, position_ids=torch.arange(start, start + 8)[None]).logits).all()
        wide = torch.tensor([[0, 1, 2, 3, 4, 5, 6, int(2 * limit) + 10]])
        with pytest.raises(
            extend.ExtendError, match=f"at most {int(limit)} apart"
        ):  # masked pairs, one forward
            model(ids, position_ids=wide)
        with (
            extend.fixed_length(model, int(2 * limit) + 10),
            pytest.raises(extend.ExtendError, match="at most"),
        ):
            model(ids)  # the whole call's span is fixed and too wide: refused before any step runs


def test_xpos_default_centre_keeps_cached_generation_consistent(tiny_llama_factory):

    model = tiny_llama_factory(max_position_embeddings=256)
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(3))
    with extend.patched(model, "xpos", factor=2.0):
        with torch.no_grad():
            full = model(ids).logits
        cached = _cached_steps(model, ids, 30)  # the prompt's centre is kept for the cached steps
        with extend.fixed_length(model, 40):
            fixed = _cached_steps(model, ids, 30)
    torch.testing.assert_close(cached, full, atol=1e-4, rtol=0)
    torch.testing.assert_close(fixed, full, atol=1e-4, rtol=0)


# ---- inspector ----
def test_inspect_shows_layer_types_and_what_a_method_changes(tmp_path, capsys):
    model = build("gemma3-4b-linear8")
    text = extend.inspect(model)
    assert "full_attention: rotary dims 256 of head_dim 256, theta 1e+06, shipped linear x8" in text
    assert "sliding_attention" in text and "window 1024" in text and "32768 pretrained" in text
    text = extend.inspect(model, "yarn", factor=2.0)
    assert "full_attention: extended" in text and "sliding_attention: kept; 0 of 128" in text
    assert extend.current(model) is None

    from ropebench.extend.__main__ import main

    model.config.save_pretrained(tmp_path)
    assert (
        main(
            [
                "inspect",
                str(tmp_path),
                "--method",
                "dynamic-yarn",
                "--factor",
                "4",
                "-o",
                "start_from=shipped",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        "start_from=shipped" in out
        and "trained_context=131072" in out
        and "depend on the sequence length" in out
    )
    assert main(["inspect", str(tmp_path), "--method", "yran"]) == 2
    assert "did you mean yarn" in capsys.readouterr().err
    assert main(["inspect", str(tmp_path / "missing")]) == 2
