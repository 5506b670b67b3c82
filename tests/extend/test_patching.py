"""Patching on tiny random models of many families: identity at factor 1, exact undo, independence,
xPos numerics and caching, and clear errors for bad input."""

import pytest
import torch
import transformers as T
from ropebench import extend

OPTIONS = {
    "longrope": lambda dim: {"short_factor": [1.0] * (dim // 2), "long_factor": [1.5] * (dim // 2)},
    # DCA is plain RoPE only within one chunk (chunk_size - local_window tokens): cover the 48 run here
    "dca": lambda dim: {"chunk_size": 60, "local_window": 4},
}


def rotary_dim(model):
    bases = extend.patching.rope_bases(model, model.base_model.rotary_emb)
    return next(iter(bases.values())).dim


def options_for(method, model):
    return OPTIONS[method](rotary_dim(model)) if method in OPTIONS else {}


def logits(model, n=48, seed=1):
    ids = torch.randint(3, 128, (2, n), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(ids).logits


def test_family_list_is_what_is_tested(family_configs, family_model_factory):
    assert sorted(family_configs) == sorted(extend.TESTED_FAMILIES)
    for family in family_configs:
        assert family_model_factory(family).config.model_type == family


@pytest.mark.parametrize("family", sorted(extend.TESTED_FAMILIES))
def test_factor_one_identity_and_undo(family, family_model_factory):
    model = family_model_factory(family)
    ref = logits(model)
    for method in extend.methods():
        opts = options_for(method, model)
        if method == "xpos":
            opts = {"scale_base": 1e30}  # decay 1 to float precision: only the rotation remains
        if method == "longrope":  # identity needs all-ones factors, long ones used only beyond the context
            opts = {"short_factor": [1.0] * (rotary_dim(model) // 2), "long_factor": opts["long_factor"]}
        if family == "gemma2" and method == "dca":  # DCA remaps at factor 1 too; Gemma2 soft-caps its logits
            with pytest.raises(extend.ExtendError, match="soft-capped"):
                extend.patch(model, method, factor=1.0, **opts)
            continue
        with extend.patched(model, method, factor=1.0, **opts):
            assert torch.equal(logits(model), ref), f"{family}/{method} at factor 1 changed the logits"
        assert torch.equal(logits(model), ref), f"{family}/{method}: undo did not restore the model"


@pytest.mark.parametrize("family", sorted(extend.TESTED_FAMILIES))
def test_extension_changes_logits_and_undo_restores(family, family_model_factory):
    model = family_model_factory(family)
    ref = logits(model, n=120)  # beyond the trained context of 64
    for method in ["pi", "ntk", "yarn", "dynamic-ntk", "dynamic-yarn", "llama3", "longrope", "xpos"]:
        with extend.patched(model, method, factor=4.0, **options_for(method, model)) as handle:
            out = logits(model, n=120)
            assert handle.active and extend.current(model) is handle
        assert torch.isfinite(out).all()
        assert not torch.equal(out, ref), f"{family}/{method} at factor 4 left the logits unchanged"
        assert torch.equal(logits(model, n=120), ref), f"{family}/{method}: undo did not restore the model"
        assert extend.current(model) is None


def test_plain_is_untouched_and_patch_handle_reports(tiny_llama_factory):
    model = tiny_llama_factory()
    ref = logits(model)
    handle = extend.patch(model, "plain", factor=3.0)
    assert (handle.method, handle.factor, handle.length_dependent) == ("plain", 3.0, False)
    assert torch.equal(logits(model), ref)
    handle.undo()
    handle.undo()  # idempotent
    with extend.patched(model, "dynamic-ntk", factor=2.0):
        assert extend.length_dependent(model)
    assert not extend.length_dependent(model)


def test_two_models_are_independent(tiny_llama_factory):
    a, b = tiny_llama_factory(seed=0), tiny_llama_factory(seed=0)
    ref = logits(b, n=200)
    with (
        extend.patched(a, "xpos", factor=2.0),
        extend.patched(a.__class__(a.config).eval(), "yarn", factor=2.0),
    ):
        assert torch.equal(logits(b, n=200), ref)  # same family module, unpatched model: untouched
        assert not torch.equal(logits(a, n=200), ref)


def test_native_scaled_model_follows_the_start_from_policy(tiny_llama_factory):
    """A model shipped with scaling (here Llama-3 style): by default every method, `plain` included, starts
    from the shipped RoPE (plain = the model as loaded; methods stack on it); start_from="pretrained" restarts
    from the pretrained RoPE. Recorded in options."""
    shipped = {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    model = tiny_llama_factory(rope_parameters=shipped)
    ref = logits(model)
    default = tiny_llama_factory(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    default.load_state_dict(model.state_dict())
    with extend.patched(model, "plain") as handle:
        assert torch.equal(logits(model), ref)
        assert handle.options == {
            "start_from": "shipped",
            "trained_context": 256,
            "base_theta": 10000.0,
            "shipped_rope": "llama3 x8",
            "temperature": "rotary",
        }  # 256: max_position_embeddings
    with extend.patched(model, "plain", start_from="pretrained") as handle:
        assert torch.equal(logits(model), logits(default))
        assert handle.options == {
            "start_from": "pretrained",
            "trained_context": 32,
            "base_theta": 10000.0,
            "shipped_rope": "llama3 x8",
            "temperature": "rotary",
        }
    with extend.patched(model, "pi", factor=1.0, start_from="pretrained"):
        assert torch.equal(logits(model), logits(default))
    with extend.patched(model, "pi", factor=2.0):  # stacked by default: shipped frequencies / 2
        stacked = logits(model)
    with extend.patched(default, "llama3", factor=8.0, original_max_position_embeddings=32):
        halved = default.base_model.rotary_emb.rotary.inv_freq.clone() / 2
    with extend.patched(model, "pi", factor=2.0, start_from="shipped"):
        torch.testing.assert_close(model.base_model.rotary_emb.rotary.inv_freq, halved, rtol=1e-6, atol=0)
        assert torch.equal(logits(model), stacked)
    assert torch.equal(logits(model), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_xpos_finite_at_32k_positions(dtype, tiny_llama_factory):
    model = tiny_llama_factory(max_position_embeddings=8192).to(dtype)
    ids = torch.randint(0, 128, (1, 16))
    positions = torch.arange(32768 - 16, 32768)[None]
    with extend.patched(model, "xpos", factor=1.0), torch.no_grad():
        out = model(ids, position_ids=positions).logits
        early = model(ids, position_ids=torch.arange(16)[None]).logits
    assert torch.isfinite(out).all() and torch.isfinite(early).all()


def test_xpos_generation_with_cache_matches_full_forward(tiny_llama_factory):
    """A given centre: cached steps equal a full forward. Logits O(10) (initializer_range 0.3), tolerance
    sqrt(float32 eps) of their scale (see tests/extend/test_transformers_api.py, which also covers the
    automatic centre)."""
    from ropebench.extend.forward import with_cache
    from transformers import DynamicCache

    model = tiny_llama_factory(max_position_embeddings=256, initializer_range=0.3)
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(3))
    cache = DynamicCache()
    with extend.patched(model, "xpos", factor=2.0, centre=100.0), torch.no_grad():
        full = model(ids).logits
        steps = [model(ids[:, :30], use_cache=True, **with_cache(model, cache)).logits]
        for t in range(30, 40):
            steps.append(model(ids[:, t : t + 1], use_cache=True, **with_cache(model, cache)).logits)
    atol = torch.finfo(torch.float32).eps ** 0.5 * float(full.abs().max())
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=atol, rtol=0)


def test_register_user_method_and_entry_point(monkeypatch, tiny_llama_factory):
    @extend.register("halve-test")
    def halve(rope, *, factor, strength: float = 1.0):
        """Test method: divide frequencies by factor**strength."""
        return rope.inv_freq / factor**strength, 1.0

    try:
        assert "halve-test" in extend.methods()
        assert extend.describe("halve-test")["options"]["strength"] == 1.0
        model = tiny_llama_factory()
        with extend.patched(model, "halve-test", factor=2.0, strength=1.0):
            a = logits(model)
        with extend.patched(model, "pi", factor=2.0):
            b = logits(model)
        torch.testing.assert_close(a, b)
        with pytest.raises(extend.ExtendError, match="already registered"):
            extend.register("halve-test")(halve)
        extend.register("halve-test", replace=True)(halve)
    finally:
        extend.registry._REGISTRY.pop("halve-test", None)

    class EntryPoint:
        name = "ep-test"

        @staticmethod
        def load():
            def ep_method(rope, *, factor):
                """From an installed package."""
                return rope.inv_freq, 1.0

            return ep_method

    monkeypatch.setattr(extend.registry, "_entry_points_loaded", False)
    monkeypatch.setattr(
        extend.registry, "entry_points", lambda group: [EntryPoint] if group == "ropebench.methods" else []
    )
    try:
        assert "ep-test" in extend.methods()
    finally:
        extend.registry._REGISTRY.pop("ep-test", None)


def test_the_default_policy_is_the_model_as_loaded(tiny_llama_factory):
    """One default everywhere: describe(), patch(), trained_context() and the shipped module agree on
    "shipped"."""
    import inspect

    assert extend.describe("plain")["options"]["start_from"] == "shipped" == extend.shipped.DEFAULT_START_FROM
    assert inspect.signature(extend.trained_context).parameters["start_from"].default == "shipped"
    with extend.patched(tiny_llama_factory(), "yarn", factor=2.0) as handle:
        assert handle.options["start_from"] == "shipped"


def test_describe_every_method():
    for name in extend.methods():
        info = extend.describe(name)
        assert info["doc"] and "original_max_position_embeddings" in info["options"]
    assert extend.describe("longrope")["required"] == ["long_factor", "short_factor"]
    assert extend.describe("yarn")["options"]["beta_fast"] == 32.0


# ---- bad input: each raises ExtendError with a message that says what to do ----
def _gpt2():
    return T.GPT2LMHeadModel(
        T.GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    ).eval()


BAD = [
    ("unknown method", lambda m: extend.patch(m, "yran", factor=2), "did you mean yarn"),
    ("factor zero", lambda m: extend.patch(m, "pi", factor=0), "> 0"),
    ("factor negative", lambda m: extend.patch(m, "pi", factor=-2), "> 0"),
    ("factor nan", lambda m: extend.patch(m, "yarn", factor=float("nan")), "finite"),
    ("factor inf", lambda m: extend.patch(m, "yarn", factor=float("inf")), "finite"),
    ("factor string", lambda m: extend.patch(m, "yarn", factor="2"), "must be a number"),
    ("factor bool", lambda m: extend.patch(m, "yarn", factor=True), "must be a number"),
    ("factor < 1 for extension", lambda m: extend.patch(m, "ntk", factor=0.5), ">= 1"),
    ("missing longrope factors", lambda m: extend.patch(m, "longrope", factor=2), "needs option"),
    (
        "wrong factor-list length",
        lambda m: extend.patch(m, "longrope", factor=2, short_factor=[1.0] * 3, long_factor=[1.0] * 8),
        "list of 8",
    ),
    (
        "non-positive list values",
        lambda m: extend.patch(m, "longrope", factor=2, short_factor=[0.0] * 8, long_factor=[1.0] * 8),
        "> 0",
    ),
    ("unknown option", lambda m: extend.patch(m, "yarn", factor=2, beta_fats=16), "valid options"),
    (
        "bad original context",
        lambda m: extend.patch(m, "yarn", factor=2, original_max_position_embeddings=-1),
        "positive integer",
    ),
    (
        "bad llama3 factors",
        lambda m: extend.patch(m, "llama3", factor=2, low_freq_factor=4, high_freq_factor=1),
        "high_freq_factor > low_freq_factor",
    ),
    (
        "bad xpos option",
        lambda m: extend.patch(m, "xpos", factor=1, scale_base=-1),
        "scale_base( of method 'xpos' must be)? > 0",
    ),
    ("xpos in fp16", lambda m: extend.patch(m.half(), "xpos", factor=1), "float32 or bfloat16"),
    ("non-RoPE model", lambda m: extend.patch(_gpt2(), "yarn", factor=2), "'gpt2' has no rotary"),
    ("unknown alias / missing path", lambda m: extend.load("./no/such/dir"), "not a model directory"),
    ("missing gguf", lambda m: extend.load("/nope/model.gguf"), "GGUF file not found"),
    ("bad dtype", lambda m: extend.load("smollm2-135m", dtype="float8"), "unknown dtype"),
    ("bad spec type", lambda m: extend.load(None), "model spec must be"),
]


@pytest.mark.parametrize("case,call,message", BAD, ids=[c[0] for c in BAD])
def test_bad_input_raises_clear_error(case, call, message, tiny_llama_factory):
    model = tiny_llama_factory()
    with pytest.raises(extend.ExtendError, match=message) as info:
        call(model)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)
    assert extend.current(model) is None  # nothing half-applied


def test_double_patch_is_an_error(tiny_llama_factory):
    model = tiny_llama_factory()
    with extend.patched(model, "yarn", factor=2), pytest.raises(extend.ExtendError, match="already patched"):
        extend.patch(model, "pi", factor=2)


def test_unsupported_family_is_named():
    config = T.Llama4TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        intermediate_size_mlp=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    model = T.Llama4ForCausalLM(config).eval()
    with pytest.raises(extend.ExtendError, match="not supported: llama4_text"):
        extend.patch(model, "yarn", factor=2)


def test_default_dtype_follows_the_device_and_native_bf16(monkeypatch, tmp_path):
    """bf16 on a GPU; on a CPU only with hardware bf16 and when measured faster (here: mocked as faster; the
    choice itself: tests/extend/test_cpu_dtype.py), else float32."""
    from ropebench.extend import loading

    monkeypatch.setenv("ROPEBENCH_CACHE", str(tmp_path))
    monkeypatch.delenv(loading.CPU_DTYPE_ENV, raising=False)
    monkeypatch.setattr(
        loading, "measure_bf16_speedup", lambda: {"gemm": 3.0, "attention": 1.0, "layer": 2.5}
    )
    assert loading.default_dtype("cuda") == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": True, "amx_bf16": False})
    assert loading.default_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": False, "amx_bf16": True})
    assert loading.default_dtype("cpu") == torch.bfloat16
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {"avx512_bf16": False})
    assert loading.default_dtype("cpu") == torch.float32
    assert loading.default_dtype("mps") == torch.float32
