"""Following transformers' API across versions (issue 24, item 3): transformers 5.24 renamed the KV-cache
keyword `past_key_values` to `cache` (the old name still works there, with a FutureWarning per call).
ropebench passes a cache under the installed version's name (`extend.forward.with_cache`), xPos keeps its
centre for a forward that continues a cache whichever name brought it, and xPos stays finite (or raises
ExtendError) under every attention implementation."""

import warnings

import pytest
import torch
import transformers
from packaging.version import Version
from ropebench import extend
from ropebench.extend.forward import body, with_cache
from transformers import DynamicCache, GenerationConfig

# Float32 rounding vs a real error: a logit is a chain of a few hundred float32 multiply-adds here (hidden 64,
# 2 layers, <= 42 keys), so honest rounding (cached vs full forward: other blocking of the same sums) moves it
# by about sqrt(n) * eps ~ 1e-6 of the logits' scale (n * eps ~ 1e-4 at the very worst). sqrt(eps) = 3.5e-4 of
# that scale sits between the two and far below a wrong centre's error (q.k of every cached key off by
# zeta^(dc/sb), percents of the scale here; ~5 on SmolLM2's logits).
ROUNDING = torch.finfo(torch.float32).eps ** 0.5


@pytest.fixture
def loud_model_factory(tiny_llama_factory):
    """`loud_model_factory(seed=0, **overrides)`: a tiny Llama whose logits are O(10) (initializer_range 0.3,
    not 0.02: a random model with the default has logits ~0.5, where every error looks small)."""

    def loud_model(seed=0, **overrides):
        return tiny_llama_factory(max_position_embeddings=256, seed=seed, initializer_range=0.3, **overrides)

    return loud_model


def tolerance(reference: torch.Tensor) -> float:
    return ROUNDING * float(reference.abs().max())


# ---- the cache keyword ----
def test_with_cache_uses_the_installed_transformers_keyword(tiny_llama_factory):
    model = tiny_llama_factory()
    expected = "cache" if Version(transformers.__version__) >= Version("5.24.0.dev0") else "past_key_values"
    cache = DynamicCache()
    assert with_cache(model, cache) == {expected: cache}
    assert with_cache(body(model), cache) == {expected: cache}


def _deprecations(caught) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, (FutureWarning, DeprecationWarning))
        and ("past_key_values" in str(w.message) or "cache" in str(w.message))
    ]


def test_cached_paths_print_no_deprecation_warning(tok, tiny_llama_factory):
    """The prefix cache (prefill, continuation scores) and the passkey task's generate pass their cache under
    the installed name: no FutureWarning about `past_key_values` on either transformers version."""
    from ropebench.extend.prefix_cache import PrefixCache
    from ropebench.tasks import passkey
    from ropebench.tasks.scoring import continuation_logprobs

    model = tiny_llama_factory(vocab_size=len(tok), max_position_embeddings=1024)
    ids = tok("The grass is green. The sky is blue. " * 8, add_special_tokens=False)["input_ids"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache = PrefixCache(model, min_shared=4)
        cache.prefill(ids[:40])
        cache.prefill(ids[:60])  # continues the cached 40 tokens
        continuation_logprobs(model, ids[:50], [ids[50:53], ids[53:55]], prefix_cache=cache)
        passkey._generate(model, tok, ids[:30], 3, cache)
    assert not _deprecations(caught), _deprecations(caught)


# ---- xPos continued on a cache ----
def _generate_logits(model, ids, new_tokens):
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
        eos_token_id=None,
        output_logits=True,
        return_dict_in_generate=True,
    )
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out.sequences, torch.cat(out.logits)


def test_xpos_generate_matches_a_full_forward(loud_model_factory):
    """model.generate with xPos's automatic centre: every cached step keeps the prompt's centre, so its logits
    are a full forward's over the same tokens to float32 rounding (a new centre per step was off by ~5%
    here)."""
    model = loud_model_factory()
    prompt = torch.randint(0, 128, (1, 30), generator=torch.Generator().manual_seed(3))
    with extend.patched(model, "xpos", factor=2.0), torch.no_grad():
        sequence, steps = _generate_logits(model, prompt, 12)
        full = model(sequence[:, :-1]).logits[0, prompt.shape[1] - 1 :]
    assert steps.shape == full.shape
    torch.testing.assert_close(steps, full, atol=tolerance(full), rtol=0)


@pytest.mark.parametrize("keyword", ["installed", "past_key_values"])
def test_xpos_cached_forwards_keep_the_centre_under_either_keyword(keyword, loud_model_factory):
    """Cached forwards called directly, with the installed keyword or the old one (accepted by every
    version)."""
    model = loud_model_factory()
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(3))
    cache = DynamicCache()
    with extend.patched(model, "xpos", factor=2.0), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old name on 5.24
        full = model(ids).logits

        def run(piece):
            passed = with_cache(model, cache) if keyword == "installed" else {"past_key_values": cache}
            return model(piece, use_cache=True, **passed).logits

        steps = torch.cat([run(ids[:, :30])] + [run(ids[:, t : t + 1]) for t in range(30, 40)], 1)
    assert cache.get_seq_length() == 40
    torch.testing.assert_close(steps, full, atol=tolerance(full), rtol=0)


# ---- xPos under every attention implementation ----
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_xpos_is_finite_or_refused_under_every_attention(implementation, dtype, tiny_llama_factory):
    """600 tokens with a small scale_base: eager attention (and SDPA given a padding mask) also scores the
    masked future pairs, whose xPos factor grows as zeta^(-(n-m)/sb); they must stay finite or be refused up
    front."""
    model = tiny_llama_factory(max_position_embeddings=1024, attn_implementation=implementation).to(dtype)
    n = 600
    ids = torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(0))
    padded = torch.ones(1, n, dtype=torch.long)
    padded[0, :2] = 0
    zeta_min = 0.4 / 1.4  # gamma / (1 + gamma), gamma 0.4
    outcome = {}
    for scale_base in (5.0, 9.5, 512.0):
        # masked pair (0, 599): exponent 599 * ln(1/zeta_min) / sb = 150 at sb 5 (overflow), 79 at 9.5,
        # 1.5 at 512
        with extend.patched(model, "xpos", factor=1.0, scale_base=scale_base), torch.no_grad():
            try:
                plain = model(ids).logits
                masked = model(ids, attention_mask=padded).logits[:, 2:]
            except extend.ExtendError as e:
                assert "at most" in str(e)
                outcome[scale_base] = "refused"
                continue
        assert torch.isfinite(plain).all() and torch.isfinite(masked).all(), (scale_base, implementation)
        outcome[scale_base] = "finite"
    assert (n - 1) * abs(torch.log(torch.tensor(zeta_min))) / 5.0 > 88.7  # sb 5 would overflow float32/bf16
    assert outcome == {5.0: "refused", 9.5: "finite", 512.0: "finite"}
