"""extend.prefix_cache: the sharing order, and a continued forward equal to one forward over the whole prompt
on tiny models of many families (sliding-window layers with prompts longer than the window included)."""

import itertools
import os

import pytest
import torch
import transformers as T
from ropebench.extend import prefix_cache
from ropebench.extend.forward import with_cache
from ropebench.extend.prefix_cache import PrefixCache, common_prefix, sharing_order
from ropebench.tasks.scoring import continuation_logprobs


def test_common_prefix_and_order_walk_the_trie():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2 and common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    prompts = [[1, 5, 6], [2, 1], [1, 2, 3, 4], [1, 2, 3, 9], [1, 5, 7]]
    order = sharing_order(prompts)
    assert order == [2, 3, 0, 4, 1]
    # one cached path visiting the prompts in this order computes each node of their token trie once
    trie = {tuple(p[:k]) for p in prompts for k in range(1, len(p) + 1)}
    computed = len(prompts[order[0]]) + sum(
        len(prompts[b]) - common_prefix(prompts[a], prompts[b]) for a, b in itertools.pairwise(order)
    )
    assert computed == len(trie)


# families with the layouts that matter for a continued forward: plain, sliding window (window 8 < prompt),
# hybrid sliding/full with softcapping, layer-typed rotary, partial rotary, fused qkv, interleaved rotation
FAMILIES = ["llama", "mistral", "gemma2", "gemma3_text", "gpt_neox", "phi3", "olmo3", "cohere"]


def prompts_sharing(n_shared=30, tails=(5, 12, 9), seed=0):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, 128, (n_shared,), generator=g).tolist()
    return [shared + torch.randint(3, 128, (k,), generator=g).tolist() for k in tails]


@pytest.mark.parametrize("block", [512, 4])  # 4: every continuation runs in several blocks
@pytest.mark.parametrize("family", FAMILIES)
def test_continued_forward_equals_one_forward(family, block, monkeypatch, family_model_factory):
    monkeypatch.setattr(prefix_cache, "CONTINUE_BLOCK", block)
    model = family_model_factory(family)
    if hasattr(model.config, "sliding_window") and family in ("mistral", "gemma2"):
        model.config.sliding_window = 8
    conts = [[5], [7, 9, 11]]
    cache = PrefixCache(model, min_shared=1)
    for p in prompts_sharing():
        got = continuation_logprobs(model, p, conts, prefix_cache=cache)
        unshared = continuation_logprobs(model, p, conts)
        for cont, a, b in zip(conts, got, unshared):
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([p + cont])).logits[0].float(), -1)
            want = torch.stack([logp[len(p) - 1 + i, t] for i, t in enumerate(cont)])
            assert torch.allclose(a, want, atol=1e-5) and torch.allclose(b, want, atol=1e-5)
    assert cache.reused == 2 * 30 and cache.computed == 30 + 5 + 12 + 9  # the shared 30 tokens ran once


@pytest.mark.parametrize("block", [512, 4])
@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3_text"])
def test_generation_from_a_shared_prefix_equals_plain_generate(
    family, block, monkeypatch, family_model_factory
):
    monkeypatch.setattr(prefix_cache, "CONTINUE_BLOCK", block)
    model = family_model_factory(family)
    if family == "mistral":
        model.config.sliding_window = 8
    config = T.GenerationConfig(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
    cache = PrefixCache(model, min_shared=1)
    for p in prompts_sharing():
        x = torch.tensor([p])
        want = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=config)
        past = cache.prime(p)
        assert past.get_seq_length() == len(p) - 1  # generate runs the last prompt token itself
        got = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            generation_config=config,
            **with_cache(model, past),
        )
        cache.settle()
        assert torch.equal(got, want) and cache.cache.get_seq_length() == len(p)
    assert cache.reused == 60


def test_short_shared_prefix_starts_from_an_empty_cache(family_model_factory):
    model = family_model_factory("llama")
    cache = PrefixCache(model, min_shared=20)
    a, b = prompts_sharing(n_shared=10, tails=(6, 6))
    cache.prefill(a)
    hidden, start = cache.prefill(b)
    assert start == 0 and cache.reused == 0 and hidden.shape[0] == len(b)
    off = PrefixCache(model, share=False, min_shared=1)
    off.prefill(a)
    assert off.prefill(a)[1] == 0 and off.reused == 0
    on = PrefixCache(model, min_shared=1)
    on.prefill(a)
    hidden, start = on.prefill(a)  # the same prompt again: all but its last token come from the cache
    assert start == len(a) - 1 and hidden.shape[0] == 1
    hidden, start = on.prefill(a + [7, 8], keep_at_most=3)  # hidden states needed from position 3 on
    assert start == 3 and hidden.shape[0] == len(a) + 2 - 3


def test_dynamic_method_needs_and_gets_one_length_per_cell(tiny_llama_factory):
    """dynamic-ntk past the trained context, two prompts of different lengths sharing a prefix: inside
    cell_length the cached prefix scores as the unshared path; without it the cached keys were rotated for
    another length and the scores differ."""

    from ropebench import extend
    from ropebench.extend.prefix_cache import cell_length

    model = tiny_llama_factory(max_position_embeddings=32)
    a, b = prompts_sharing(n_shared=60, tails=(4, 20))
    conts = [[5, 6]]

    def scores(share, fixed):
        cache = PrefixCache(model, share=share, min_shared=1)
        out = []
        with cell_length(model, 90) if fixed else torch.inference_mode():
            for p in (a, b):
                out.append(continuation_logprobs(model, p, conts, prefix_cache=cache)[0])
        return torch.cat(out)

    with extend.patched(model, "dynamic-ntk", factor=4):
        same = (scores(True, True) - scores(False, True)).abs().max()
        stale = (scores(True, False) - scores(False, False)).abs().max()
    assert same <= 1e-5 < stale  # (a random tiny model is flat: the stale difference is ~1e-4 here)


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "phi3"])
def test_native_gqa_is_bit_identical_and_copies_no_heads(family, monkeypatch, family_model_factory):
    """A forward continued on a cache passes SDPA a mask; transformers then copies the grouped key/value heads
    out to every query head unless told that the (CPU) kernel can take both. Under `native_gqa` it does not
    copy, and the float32 numbers are the same bits; the variable is restored afterwards."""
    from ropebench.extend.prefix_cache import FORCE_GQA, native_gqa
    from transformers.integrations import sdpa_attention

    model = family_model_factory(family)
    if model.config.num_key_value_heads == model.config.num_attention_heads:
        model.config.num_key_value_heads = 1  # make it grouped: rebuild with one key/value head
        model = type(model)(model.config).eval()
    monkeypatch.delenv(FORCE_GQA, raising=False)
    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or real(x, n))
    prefix, rest = prompts_sharing(n_shared=40, tails=(7,))[0][:40], [5, 9, 11, 13]

    def continued():
        cache = PrefixCache(model, min_shared=1, share=True)
        cache.prefill(prefix)
        with torch.no_grad():
            return body_hidden(model, rest, cache)

    plain = continued()
    assert copies  # the masked continuation copied heads
    copies.clear()
    with native_gqa(model):
        native = continued()
    assert copies == [] and FORCE_GQA not in os.environ
    assert torch.equal(native, plain)


def body_hidden(model, ids, cache):
    from ropebench.extend.forward import body

    x = torch.tensor([ids])
    return body(model)(input_ids=x, use_cache=True, **with_cache(body(model), cache.cache)).last_hidden_state


@pytest.mark.parametrize("family", FAMILIES)
def test_roomy_layers_give_the_same_bits_as_dynamic_layers(family, monkeypatch, family_model_factory):
    """The prefix cache's RoomyLayers against transformers' DynamicLayers (torch.cat at every forward) on the
    same prompts, continuations and greedy generation: float32 results bit-identical."""
    from transformers import DynamicCache

    model = family_model_factory(family)
    if family in ("mistral", "gemma2"):
        model.config.sliding_window = 8
    conts = [[5], [7, 9, 11]]
    config = T.GenerationConfig(max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)

    def run():
        cache, out = PrefixCache(model, min_shared=1), []
        for p in prompts_sharing():
            out += continuation_logprobs(model, p, conts, prefix_cache=cache)
            x = torch.tensor([p])
            past = cache.prime(p)
            kinds = {type(layer).__name__ for layer in past.layers}
            kwargs = {"attention_mask": torch.ones_like(x), "generation_config": config}
            out.append(model.generate(input_ids=x, **kwargs, **with_cache(model, past))[0])
            cache.settle()
        return out, kinds

    roomy, kinds = run()
    assert kinds == {"RoomyLayer"}
    monkeypatch.setattr(prefix_cache, "roomy_cache", DynamicCache)
    dynamic, kinds = run()
    assert kinds == {"DynamicLayer"}
    assert len(roomy) == len(dynamic) and all(torch.equal(a, b) for a, b in zip(roomy, dynamic))


def test_a_continuation_writes_only_its_new_tokens(family_model_factory):
    """On a prefilled prompt, each continuation, crop and generated token leaves the cached keys where they
    are (one buffer, no copy of the prefix); a continuation past the buffer's room moves them once, same
    values."""
    from ropebench.extend.prefix_cache import RoomyLayer

    model = family_model_factory("llama")
    cache = PrefixCache(model, min_shared=1)
    prompt = prompts_sharing(n_shared=40, tails=(8,))[0]
    cache.prefill(prompt)
    layer = cache.cache.layers[0]
    assert isinstance(layer, RoomyLayer)
    buffer, room = layer.room[0].data_ptr(), layer.room[0].shape[-2]
    before = layer.keys[..., :-1, :].clone()  # the prompt again reruns its last token (a continued forward)
    assert room > len(prompt) and layer.keys.data_ptr() == buffer
    for cont in ([5, 6, 7], [9], [11, 12]):
        continuation_logprobs(model, prompt, [cont, [3, 4]], prefix_cache=cache)
        assert layer.room[0].data_ptr() == buffer and layer.keys.data_ptr() == buffer
        assert torch.equal(layer.keys[..., :-1, :], before)  # settled back to the prompt: its keys untouched
    long = list(range(3, 3 + room))  # more new tokens than the room holds
    continuation_logprobs(model, prompt, [long], prefix_cache=cache)
    assert layer.room[0].data_ptr() != buffer and layer.room[0].shape[-2] > room + len(prompt)
    assert torch.equal(layer.keys[..., :-1, :], before)
