"""Process-wide state a patch changes is scoped to the patch (issue 23 items 3 and 4): every swap of a library
function, registry entry or environment switch is recorded on the handle (`Patch.global_changes`), listed by
`extend.inspect`, and restored by `undo()` — also when undo runs because of an exception, and only when the
last patch that needs a shared change lets go of it. The handle's public API is read-only, and a method whose
frequencies are malformed is refused with one line naming it."""

import os
import sys

import pytest
import torch
from ropebench import extend
from ropebench.extend import registry
from ropebench.extend.prefix_cache import FORCE_GQA, native_gqa
from ropebench.extend.scoped import Change
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

DCA = {"chunk_size": 60, "local_window": 4}  # chunks of 56 tokens: the 120 run here are remapped
REMAP_NAME = "ropebench_remap_sdpa"


def logits(model, n=120, seed=1):
    ids = torch.randint(3, 128, (1, n), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return model(ids).logits


def family_module(model):
    return sys.modules[type(model.base_model).__module__]


def names(handle) -> list[str]:
    return [change.name for change in handle.global_changes]


# ---- xpos: the family's apply_rotary_pos_emb ----
def test_xpos_leaves_a_plain_model_of_the_family_bit_identical_and_undo_restores_the_function(
    tiny_llama_factory,
):
    xposed, plain = tiny_llama_factory(seed=0), tiny_llama_factory(seed=1)
    assert next(plain.parameters()).dtype == torch.float32
    module = family_module(xposed)
    original = module.apply_rotary_pos_emb
    unpatched_xposed, unpatched_plain = logits(xposed), logits(plain)
    with extend.patched(xposed, "xpos", factor=2.0) as handle:
        assert module.apply_rotary_pos_emb is not original  # the swap is in place ...
        assert names(handle) == [f"{module.__name__}.apply_rotary_pos_emb"]  # ... and recorded
        assert not torch.equal(logits(xposed), unpatched_xposed)
        assert torch.equal(logits(plain), unpatched_plain)  # unpatched, same family module
        with extend.patched(plain, "plain"):
            assert torch.equal(logits(plain), unpatched_plain)  # patched with plain
    assert module.apply_rotary_pos_emb is original
    assert handle.global_changes == ()
    assert torch.equal(logits(xposed), unpatched_xposed)


def test_the_shared_wrapper_stays_until_the_last_xpos_patch_of_the_family_is_undone(tiny_llama_factory):
    a, b = tiny_llama_factory(seed=0), tiny_llama_factory(seed=1)
    module = family_module(a)
    original = module.apply_rotary_pos_emb
    first = extend.patch(a, "xpos", factor=2.0)
    second = extend.patch(b, "xpos", factor=2.0)
    b_xposed = logits(b)
    first.undo()
    assert module.apply_rotary_pos_emb is not original  # b still needs it
    assert torch.equal(logits(b), b_xposed)
    first.undo()  # idempotent: does not release b's hold a second time
    assert module.apply_rotary_pos_emb is not original
    second.undo()
    assert module.apply_rotary_pos_emb is original


def test_undo_reached_by_an_exception_restores_the_global_changes(tiny_llama_factory):
    model = tiny_llama_factory()
    module = family_module(model)
    original = module.apply_rotary_pos_emb
    with pytest.raises(RuntimeError, match="inside the block"), extend.patched(model, "xpos", factor=2.0):
        raise RuntimeError("inside the block")
    assert module.apply_rotary_pos_emb is original and extend.current(model) is None
    with pytest.raises(RuntimeError, match="inside the block"), extend.patched(model, "dca", **DCA):
        assert REMAP_NAME in ALL_ATTENTION_FUNCTIONS
        raise RuntimeError("inside the block")
    assert REMAP_NAME not in ALL_ATTENTION_FUNCTIONS and model.config._attn_implementation == "sdpa"


def test_undo_restores_every_change_when_one_restore_fails(tiny_llama_factory):
    model = tiny_llama_factory()
    module = family_module(model)
    original, ref = module.apply_rotary_pos_emb, logits(model)
    handle = extend.patch(model, "xpos", factor=2.0)

    def fail():
        raise RuntimeError("this restore fails")

    handle.record(Change("a failing change", "for the test", fail))
    with pytest.raises(RuntimeError, match="this restore fails"):
        handle.undo()
    assert module.apply_rotary_pos_emb is original  # recorded before the failing one: restored after it
    assert extend.current(model) is None and torch.equal(logits(model), ref)
    handle.undo()  # nothing left to do


# ---- position remapping: transformers' attention registries ----
def test_remap_registration_is_recorded_shared_and_removed_with_the_last_user(tiny_llama_factory):
    a, b = tiny_llama_factory(seed=0), tiny_llama_factory(seed=1)
    assert REMAP_NAME not in ALL_ATTENTION_FUNCTIONS
    first = extend.patch(a, "dca", **DCA)
    second = extend.patch(b, "dca", **DCA)
    assert any(REMAP_NAME in name for name in names(first))
    assert REMAP_NAME in ALL_ATTENTION_FUNCTIONS and REMAP_NAME in ALL_MASK_ATTENTION_FUNCTIONS
    b_remapped = logits(b)
    first.undo()
    assert a.config._attn_implementation == "sdpa"
    assert REMAP_NAME in ALL_ATTENTION_FUNCTIONS  # b still runs through it
    assert torch.equal(logits(b), b_remapped)
    second.undo()
    assert REMAP_NAME not in ALL_ATTENTION_FUNCTIONS and REMAP_NAME not in ALL_MASK_ATTENTION_FUNCTIONS


# ---- the prefix cache's SDPA switch (an environment variable transformers reads at every call) ----
def test_native_gqa_sets_the_variable_for_the_block_only_and_records_it_on_the_patch(
    monkeypatch, tiny_llama_factory
):
    monkeypatch.delenv(FORCE_GQA, raising=False)
    model = tiny_llama_factory()
    with extend.patched(model, "yarn", factor=2.0) as handle:
        assert handle.global_changes == ()
        with native_gqa(model):
            assert os.environ[FORCE_GQA] == "1"
            assert [FORCE_GQA in name for name in names(handle)] == [True]
            with native_gqa(model):  # nested: the inner exit leaves the outer's setting
                pass
            assert os.environ[FORCE_GQA] == "1"
        assert FORCE_GQA not in os.environ and handle.global_changes == ()
        with native_gqa(model):
            handle.undo()  # undo inside the block restores the variable too
            assert FORCE_GQA not in os.environ
    assert FORCE_GQA not in os.environ


def test_native_gqa_leaves_a_value_the_user_set(monkeypatch, tiny_llama_factory):
    monkeypatch.setenv(FORCE_GQA, "0")
    model = tiny_llama_factory()
    with extend.patched(model, "yarn", factor=2.0) as handle, native_gqa(model):
        assert os.environ[FORCE_GQA] == "0" and handle.global_changes == ()
    assert os.environ[FORCE_GQA] == "0"


# ---- inspect lists them ----
def test_inspect_names_the_global_changes_or_none(tiny_llama_factory):
    model = tiny_llama_factory()
    xpos_report = extend.inspect(model, "xpos", factor=2.0)
    assert "global changes" in xpos_report
    assert f"{family_module(model).__name__}.apply_rotary_pos_emb" in xpos_report
    assert "global changes (process-wide, restored by undo): none" in extend.inspect(
        model, "yarn", factor=2.0
    )
    assert REMAP_NAME in extend.inspect(model, "dca", **DCA)
    assert REMAP_NAME not in ALL_ATTENTION_FUNCTIONS and extend.current(model) is None


# ---- the handle's public API ----
def test_handle_is_read_only_and_reports_what_the_patch_installed(tiny_llama_factory):
    model = tiny_llama_factory()
    with extend.patched(model, "yarn", factor=2.0) as handle:
        with pytest.raises(AttributeError):
            handle.method = "pi"
        options = handle.options
        options["trained_context"] = 1
        assert handle.options["trained_context"] == 256  # a copy was changed, not the patch
        assert handle.layer_types == (None,) and handle.extended_layer_types == (None,)
        rotary = model.base_model.rotary_emb.rotary  # the model's own module, where the patch installs
        assert torch.equal(handle.frequencies().inv_freq, rotary.inv_freq)
        assert handle.scalings() == (rotary.attention_scaling, None)  # temperature="rotary": on cos/sin
        assert torch.equal(
            handle.loaded_frequencies(), extend.patching.rope_bases(model, rotary)[None].inv_freq
        )
    with pytest.raises(extend.ExtendError, match="undone"):
        handle.frequencies()


def test_dynamic_frequencies_are_computed_without_changing_the_next_forward(tiny_llama_factory):
    model = tiny_llama_factory()
    with extend.patched(model, "dynamic-yarn") as handle:
        before = logits(model, n=200)
        long = handle.frequencies(None, 4096).inv_freq
        short = handle.frequencies(None, 200).inv_freq
        assert not torch.equal(long, short)  # the length matters ...
        assert torch.equal(logits(model, n=200), before)  # ... and asking changed nothing


def test_logit_temperature_is_reported_as_the_attention_modules_apply_it(tiny_llama_factory):
    model = tiny_llama_factory()
    own = [m.scaling for m in model.modules() if isinstance(getattr(m, "scaling", None), float)]
    with extend.patched(model, "yarn", factor=4.0, temperature="logits") as handle:
        now = [m.scaling for m in model.modules() if isinstance(getattr(m, "scaling", None), float)]
        cos_sin, logit = handle.scalings()
        assert logit == pytest.approx(now[0] / own[0], rel=1e-12) and logit > 1
        assert cos_sin == model.base_model.rotary_emb.rotary.attention_scaling


# ---- a method's output is checked ----
@pytest.mark.parametrize(
    "name, broken, problem",
    [
        ("broken-length-test", lambda rope: rope.inv_freq[:-1], "shape"),
        ("broken-dtype-test", lambda rope: (rope.inv_freq * 1000).long(), "dtype"),
        ("broken-values-test", lambda rope: -rope.inv_freq, "finite and non-negative"),
        ("broken-nan-test", lambda rope: rope.inv_freq * float("nan"), "finite and non-negative"),
    ],
)
def test_a_method_with_malformed_frequencies_is_refused_naming_it(name, broken, problem, tiny_llama_factory):
    model = tiny_llama_factory()
    ref = logits(model)

    @extend.register(name)
    def method(rope, *, factor):
        return broken(rope), 1.0

    try:
        with pytest.raises(extend.ExtendError, match=problem) as caught:
            extend.patch(model, name, factor=2.0)
        message = str(caught.value)
        assert repr(name) in message and "\n" not in message
        assert "8 finite non-negative floats (16 rotary dims / 2)" in message  # head_dim 16: 8 pairs
    finally:
        registry._REGISTRY.pop(name, None)
    assert extend.current(model) is None and torch.equal(logits(model), ref)
