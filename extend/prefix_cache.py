"""Prefix sharing: the KV cache of the longest common token prefix between consecutive prompts is reused,
so a prefix many prompts share (many-shot demonstrations, a passkey haystack up to the needle) runs once.

In the style of a radix / prefix cache with one cached path: `sharing_order` visits a cell's prompts in
lexicographic token order (a depth-first walk of their token trie, which makes the tokens computed equal to
the trie's size — the least any single-path cache can do); `PrefixCache` keeps the cache of the last prompt,
crops it to what the next prompt shares and runs only the rest. Memory: one prompt's cache at a time.

The cache is transformers' `DynamicCache()` built without the model config, so every layer is a plain
`DynamicLayer` that can be cropped anywhere: sliding-window layers then keep all their keys, and the family's
own mask functions (position based) still hide what lies outside the window. Positions come from the cache
length (the family's own `cache_position` / `position_ids` logic), as in `generate`. Its layers are
`RoomyLayer`s: a continuation writes only its new keys and values (DynamicLayer's `torch.cat` copies the whole
cache at every forward: every question, candidate and generated token).

Exactness: a continued forward computes the same function as one forward over the whole prompt; only the
blocking of the sums differs (float32: ~1e-6). Length-dependent (dynamic) methods must see one length for
the whole cell, or a cached prefix would hold keys rotated for another length: the tasks wrap each cell in
`extend.fixed_length` (`cell_length`), shared or not, so both paths compute the same numbers.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from . import scoped
from .forward import body, device_of, with_cache
from .patching import current, fixed_length

# Below this many shared tokens a prompt starts from an empty cache: a continued forward attends with an
# explicit mask instead of SDPA's causal kernel, which costs more than recomputing a short prefix
# (benchmarks/BENCHMARKS.md, "nothing to share").
MIN_SHARED = 256

# transformers' SDPA path copies the key/value heads out to every query head (`repeat_kv`: the whole cache,
# per layer and call) whenever it passes a mask, because CUDA's fused kernels cannot take a mask and
# grouped-query attention together; a forward continued on a cache always passes one. torch's CPU kernel takes
# both (`enable_gqa`) and gives bit-identical results (tests/extend/test_prefix_cache.py) in ~22% less time
# per continued 8k prompt. This variable is transformers' switch for it, read at every attention call;
# transformers takes no per-call or per-model flag for it, so `native_gqa` sets it only around the calls that
# want it (extend/scoped.py).
FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"

# A forward continued on a cache passes SDPA an explicit mask, and the kernel then computes every key block
# for every query, the masked triangle of the new tokens included; a fresh forward uses the causal kernel,
# which skips it. So a continuation runs in blocks of this many tokens (waste <= block^2 / 2 per block).
# SmolLM2, fp32, AVX2 AMD EPYC: a 6144-token tail on a 2048-token prefix took 41.1 s in one forward, 27.4 s in
# 512-token blocks (fresh 8192-token forward: 32.9 s), bit-identical (benchmarks/NOTES.md item 6).
CONTINUE_BLOCK = 512

NATIVE_GQA = (
    "SDPA attends grouped key/value heads without copying them (bit-identical on CPU); set around each "
    "continued forward of the prefix cache, restored after it"
)


@contextlib.contextmanager
def native_gqa(model):
    """Context: on CPU, SDPA attends grouped key/value heads without copying them (see FORCE_GQA); elsewhere,
    or when the user set the variable, nothing changes. The variable is set for the block only (shared by
    nested or concurrent blocks, removed by the last to leave) and recorded on the model's active patch
    meanwhile (`Patch.global_changes`), whose undo also restores it."""
    if device_of(model).type != "cpu":
        yield
        return
    with scoped.environment(FORCE_GQA, "1", NATIVE_GQA, owner=current(model)):
        yield


class RoomyLayer(DynamicLayer):
    """A DynamicLayer whose keys and values are views of a buffer with room past them: `update` copies only
    the new tokens into the room (a new buffer, 1/8 larger than needed, only when it is full), `crop` (the
    parent's slicing) keeps the buffer. The same values as DynamicLayer's, so the same attention results
    (tests/extend/test_prefix_cache.py); only the head and batch strides of the views differ."""

    room = None  # (keys buffer, values buffer)

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = self.get_seq_length()
        m = n + key_states.shape[-2]
        room = self.room
        if (
            room is None
            or m > room[0].shape[-2]
            or room[0].shape[:-2] != key_states.shape[:-2]
            or (n and self.keys.data_ptr() != room[0].data_ptr())
            # made under inference_mode (a prefill) and written outside it (generate): a plain tensor, once
            or (room[0].is_inference() and not torch.is_inference_mode_enabled())
        ):
            size = (*key_states.shape[:-2], m + max(64, m // 8), key_states.shape[-1])
            room = self.room = (key_states.new_empty(size), value_states.new_empty(size))
            if n:  # a new buffer (or keys replaced elsewhere, e.g. a batch reordering): the cache moves once
                room[0][..., :n, :].copy_(self.keys)
                room[1][..., :n, :].copy_(self.values)
        room[0][..., n:m, :].copy_(key_states)
        room[1][..., n:m, :].copy_(value_states)
        self.keys, self.values = room[0][..., :m, :], room[1][..., :m, :]
        return self.keys, self.values

    def reset(self) -> None:
        self.room = None
        super().reset()


def roomy_cache() -> DynamicCache:
    """An empty DynamicCache (no config: every layer croppable, see the module's docstring) of RoomyLayers."""
    cache = DynamicCache()
    if getattr(cache, "layer_class_to_replicate", None) is DynamicLayer:  # every transformers this supports
        cache.layer_class_to_replicate = RoomyLayer
    return cache


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def sharing_order(prompts) -> list[int]:
    """Indices of `prompts` (token lists) in the order that shares the most between neighbours
    (lexicographic: a depth-first walk of the prompts' token trie)."""
    return sorted(range(len(prompts)), key=lambda i: list(prompts[i]))


def cell_length(model, length: int):
    """Context: every forward inside uses the RoPE frequencies (and xPos centre) of a `length`-token call
    (`extend.fixed_length`), so a prefix cached for one prompt of a cell stays valid for the next. Pass the
    cell's longest prompt + new tokens. A no-op for length-independent methods and unpatched models."""
    return fixed_length(model, int(length))


class PrefixCache:
    """One cached token prefix and its KV cache. `share=False` gives the unshared path through the same code
    (every prompt from an empty cache). Counters: tokens `computed` and `reused` so far."""

    def __init__(self, model, *, share: bool = True, min_shared: int | None = None):
        self.model, self.share = model, bool(share)
        self.min_shared = MIN_SHARED if min_shared is None else int(min_shared)
        self.cache, self.ids = None, []
        self.computed = self.reused = 0

    def reuse(self, ids, *, keep_at_most: int | None = None) -> tuple[DynamicCache, int]:
        """Prepare the cache for prompt `ids`: cropped to the prefix it shares with the cached prompt (at most
        `keep_at_most` and len(ids) - 1 tokens, so at least one token runs), or empty. Returns (cache, number
        of cached tokens); the caller runs ids[cached:] on it (then the cache holds `ids`)."""
        ids = list(ids)
        limit = len(ids) - 1 if keep_at_most is None else min(keep_at_most, len(ids) - 1)
        shared = min(common_prefix(self.ids, ids), limit) if self.share and self.cache is not None else 0
        if shared < self.min_shared or shared < 1:
            shared, self.cache = 0, roomy_cache()
        else:
            self.cache.crop(shared - self.cache.get_seq_length())
        self.ids = ids
        self.reused += shared
        self.computed += len(ids) - shared
        return self.cache, shared

    @torch.inference_mode()
    def prefill(self, ids, *, keep_at_most: int | None = None) -> tuple[torch.Tensor, int]:
        """Run prompt `ids` on the cache: (final hidden states of positions [start, len(ids)), start)."""
        _, start = self.reuse(ids, keep_at_most=keep_at_most)
        return self._run(self.ids[start:]), start

    @torch.inference_mode()
    def prime(self, ids) -> DynamicCache:
        """For `generate`: the cache holds ids[:-1] afterwards (the shared prefix reused, the rest run in
        blocks), so generate runs only the last token and its new ones; call `settle()` after it."""
        _, start = self.reuse(ids)
        if start < len(self.ids) - 1:
            self._run(self.ids[start:-1])
        return self.cache

    def _run(self, new_ids) -> torch.Tensor:
        """Final hidden states of `new_ids` run on the cache: one forward when the cache is empty (SDPA's
        causal kernel), else blocks of CONTINUE_BLOCK tokens."""
        x = torch.tensor([list(new_ids)], dtype=torch.long, device=device_of(self.model))
        step = CONTINUE_BLOCK if self.cache.get_seq_length() else x.shape[1]
        with native_gqa(self.model):
            decoder = body(self.model)
            cache = with_cache(decoder, self.cache)
            return torch.cat(
                [
                    decoder(input_ids=x[:, i : i + step], use_cache=True, **cache).last_hidden_state[0]
                    for i in range(0, x.shape[1], step)
                ]
            )

    def settle(self) -> None:
        """Drop what ran after the prompt (continuations, generated tokens): the cache holds the prompt."""
        extra = self.cache.get_seq_length() - len(self.ids)
        if extra > 0:
            self.cache.crop(-extra)
