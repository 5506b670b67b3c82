"""The attention function behind the position-remapping methods (extend/remap.py), and their patch.

Patching: the model's RoPE stays as `plain` would leave it (so start_from, layer_types,
original_max_position_embeddings, extend.current and extend.fixed_length work as for every method), and
`config._attn_implementation` switches to an attention function registered through transformers'
`AttentionInterface` (with the original implementation's mask function registered under the same name
through `AttentionMaskInterface`). undo() restores the implementation name; the registration is process-wide,
recorded on the patch (`Patch.global_changes`) and removed when the last remap patch using it is undone.

The family's attention module rotates q and k at their plain positions and caches k as usual; this function
rotates them further by (remapped position - plain position) with the family's own `apply_rotary_pos_emb` and
cos/sin from the model's own rotary module (so half/interleaved layouts, partial rotary dims and
per-layer-type frequencies are respected; RoPE rotations compose; where the attention module slices partial
rotary dims itself, as Phi and StableLM do, only those dims turn). Queries go in blocks of QUERY_BLOCK; for
each block and piece the keys are cut into tiles that are wholly inside the piece (one unmasked call for the
whole run), causal, or mixed (a tile-sized mask), each through the CPU flash-attention kernel (on CUDA, which
lacks it, the same in float32 math: `attention_with_lse`), which returns the log-sum-exp used to merge the
pieces. No L x L matrix is built: memory is O(L x block) at most.

Falls through to the original attention function, unchanged (bit-identical), when every pair of the forward
sees plain positions (sequences within the method's window), for layers that are not extended (Gemma3's
sliding layers) and for unpatched models sharing the process. An extended layer with a sliding window (Mistral
v0.1, Gemma2, layer_types chosen by hand) keeps its window: the remapped pairs are those it attends.
Soft-capped logits (Gemma2's attn_logit_softcapping) are refused at patch time: the flash kernel cannot cap.
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, AttentionInterface

from .errors import ExtendError
from .families import family, layer_types, rotary_module
from .memory import REMAP_BLOCK as QUERY_BLOCK  # queries per block, and the width of mixed key tiles
from .remap import Remap
from .scoped import Change, Shared

SUPPORTED = ("sdpa", "eager")
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # CPU only: it has no CUDA kernel


def attention_with_lse(
    q, k, v, causal: bool, attn_mask=None, scale: float = 1.0, *, math: bool | None = None
):
    """(output in q's dtype, float32 log-sum-exp per query) of one (query block x key tile) call: the CPU
    flash kernel on a CPU; on other devices (CUDA), where that kernel does not exist, the same in float32
    math — a block x tile score matrix, never L x L. `math=True`: the math path anywhere (tests compare)."""
    if not (q.device.type != "cpu" if math is None else math):
        return _flash(q, k, v, 0.0, causal, attn_mask=attn_mask, scale=scale)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if causal:  # a causal tile is square and aligned with its query block
        upper = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(upper, float("-inf"))
    if attn_mask is not None:
        scores = scores + attn_mask.float()
    lse = torch.logsumexp(scores, -1)
    # rows with no key: 0 (the caller masks them)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return torch.matmul(weights, v.float()).to(q.dtype), lse


# attention module -> its model's _State, for the modules of every remap-patched model in the process
_STATE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass
class _State:
    remap: Remap
    method: str
    rotary: nn.Module
    apply_rotary: object  # the family's apply_rotary_pos_emb
    original: str  # the attention implementation the model had
    extended: set  # layer types remapped (None for single-type models)
    layered: bool  # the rotary module keeps per-layer-type frequencies
    cache: dict = field(default_factory=dict)  # per forward: rotations and tile plans

    def original_function(self, module: nn.Module):
        if self.original == "eager":
            return sys.modules[type(module).__module__].eager_attention_forward
        return ALL_ATTENTION_FUNCTIONS[self.original]

    def layer_type(self, module: nn.Module):
        if not self.layered:
            return None
        lt = getattr(module, "layer_type", None)
        return lt if lt is not None else module.config.layer_types[module.layer_idx]


def remap_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Registered attention function (see the module docstring)."""
    state = _STATE.get(module)
    if state is None:
        raise ExtendError(
            f"attention module {type(module).__name__} runs a ropebench remap attention but its model "
            f"is not patched — patch it with extend.patch, or set attn_implementation back"
        )
    kv_len = key.shape[2]
    offsets = _offsets(kwargs.get("position_ids"), query.shape[0], kv_len)
    lt = state.layer_type(module)
    if lt not in state.extended or kv_len - min(offsets) <= state.remap.plain_within:
        return state.original_function(module)(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
    if kwargs.get("softcap") or getattr(module.config, "attn_logit_softcapping", None):
        raise ExtendError(_softcap_message(state.method, family(module)))
    window = kwargs.get("sliding_window")  # keys j with i - j < window only, as transformers' sliding mask
    keep = None
    if attention_mask is not None:
        mask = attention_mask[:, :, :, :kv_len]
        keep = mask if mask.dtype == torch.bool else mask == 0  # eager masks: 0 keeps, dtype min masks
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    if len(set(offsets)) == 1:
        out = _attend(state, lt, query, key, value, keep, offsets[0], scale, window)
    else:  # left padding: every row has its own positions
        rows = [slice(b, b + 1) for b in range(len(offsets))]
        masks = [None if keep is None else keep[r] for r in rows]
        out = torch.cat(
            [
                _attend(state, lt, query[r], key[r], value[r], mask, off, scale, window)
                for r, mask, off in zip(rows, masks, offsets)
            ]
        )
    return out.transpose(1, 2).contiguous(), None


def _offsets(position_ids, batch: int, kv_len: int) -> list[int]:
    """Per row: cache index - position (0 unless left-padded or positions start elsewhere), read off the last
    query, whose position is real in every row."""
    if position_ids is None:
        return [0] * batch
    last = position_ids[:, -1].tolist()
    if len(last) == 1 and batch > 1:
        last = last * batch
    return [kv_len - 1 - int(p) for p in last]


def _rotate(state: _State, x: torch.Tensor, delta: torch.Tensor, lt) -> torch.Tensor:
    """x (already at its plain positions) rotated further by `delta` positions, in float32."""
    probe = torch.empty(0, device=x.device, dtype=torch.float32)
    args = (lt,) if state.layered else ()
    cos, sin = state.rotary(probe, delta.to(x.device, torch.float32)[None], *args)
    prefix = f"{lt}_" if lt else ""
    scaling = float(getattr(state.rotary, f"{prefix}attention_scaling", 1.0) or 1.0)
    if scaling != 1.0:  # q and k carry it from their plain rotation already
        cos, sin = cos / scaling, sin / scaling
    x32 = x.float()
    dims = cos.shape[-1]
    if dims < x32.shape[-1]:  # partial rotary: Phi and StableLM pass only these dims to apply_rotary_pos_emb
        turned = state.apply_rotary(x32[..., :dims], x32[..., :dims], cos, sin)[0]
        return torch.cat([turned, x32[..., dims:]], -1).to(x.dtype)
    return state.apply_rotary(x32, x32, cos, sin)[0].to(x.dtype)


def _rotated(state: _State, x, positions, fn, lt, key: tuple):
    """x rotated from `positions` to fn(positions); cached per forward (every layer uses the same)."""
    if fn is None:
        return x
    delta = state.cache.get(key)
    if delta is None:
        delta = state.cache[key] = (fn(positions).to(torch.float64) - positions).to(torch.float32)
    if not delta.any():
        return x
    return _rotate(state, x, delta, lt)


def _plan(state: _State, q_len: int, kv_len: int, off: int, block: int, window: int | None = None) -> list:
    """Per query block (a, b): [(piece index, t0, t1, kind, lo, hi)] with kind full/causal/mixed; lo/hi are
    the piece's key interval per query (cache indices), cut to the layer's sliding `window` when it has
    one."""
    key = ("plan", q_len, kv_len, off, block, window)
    if key in state.cache:
        return state.cache[key]
    q_pos = torch.arange(kv_len - q_len, kv_len) - off
    blocks = []
    for a in range(0, q_len, block):
        b = min(a + block, q_len)
        calls = []
        for index, piece in enumerate(state.remap.pieces):
            lo, hi = piece.keys(q_pos[a:b])
            lo, hi = (lo + off).clamp(0, kv_len), (hi + off).clamp(0, kv_len)
            if window:  # transformers' sliding mask keeps cache index j > i - window
                lo = torch.maximum(lo, torch.arange(kv_len - q_len + a, kv_len - q_len + b) - window + 1)
            if not (hi > lo).any():
                continue
            first, last = int(lo[hi > lo].min()), int(hi.max())
            run = None  # a run of whole tiles, merged into one call
            for t0 in range(first - first % block, last, block):
                t1 = min(t0 + block, kv_len)
                if bool(((hi <= t0) | (lo >= t1)).all()):
                    continue
                if bool((lo <= t0).all() and (hi >= t1).all()):
                    if run and run[1] != t0:
                        calls.append((index, run[0], run[1], "full", None, None))
                    run = (run[0], t1) if run and run[1] == t0 else (t0, t1)
                    continue
                if (
                    t0 == kv_len - q_len + a
                    and t1 - t0 == b - a
                    and bool((lo <= t0).all() and torch.equal(hi, torch.arange(t0 + 1, t1 + 1)))
                ):
                    calls.append((index, t0, t1, "causal", None, None))
                else:
                    calls.append((index, t0, t1, "mixed", lo, hi))
            if run:
                calls.append((index, run[0], run[1], "full", None, None))
        blocks.append((a, b, calls))
    state.cache[key] = blocks
    return blocks


def _attend(
    state: _State, lt, q, k, v, keep, off: int, scale: float, window: int | None = None
) -> torch.Tensor:
    batch, heads, q_len, dim = q.shape
    kv_len, groups = k.shape[2], heads // k.shape[1]
    q_pos = torch.arange(kv_len - q_len, kv_len) - off
    k_pos = torch.arange(kv_len) - off

    def expand(x):  # GQA: repeat every key/value head for its query heads
        if groups == 1:
            return x
        return x[:, :, None].expand(batch, x.shape[1], groups, kv_len, dim).reshape(batch, heads, kv_len, dim)

    values = expand(v)
    queries, keys = [], {}
    for i, piece in enumerate(state.remap.pieces):
        queries.append(_rotated(state, q, q_pos, piece.query_position, lt, ("q", i, q_len, kv_len, off)))
        fn = piece.key_position
        if id(fn) not in keys:
            keys[id(fn)] = expand(_rotated(state, k, k_pos, fn, lt, ("k", i, kv_len, off)))
    out = torch.empty_like(q)
    for a, b, calls in _plan(state, q_len, kv_len, off, QUERY_BLOCK, window):
        acc = lse_acc = None
        for index, t0, t1, kind, lo, hi in calls:
            piece = state.remap.pieces[index]
            qb, kb, vb = (
                queries[index][:, :, a:b],
                keys[id(piece.key_position)][:, :, t0:t1],
                values[:, :, t0:t1],
            )
            empty = mask = None
            if kind == "mixed" or keep is not None:
                j = torch.arange(t0, t1)
                if kind == "mixed":
                    inside = (j >= lo[:, None]) & (j < hi[:, None])
                elif kind == "full":
                    inside = torch.ones(b - a, t1 - t0, dtype=torch.bool)
                else:
                    inside = j[None, :] <= torch.arange(t0, t0 + b - a)[:, None]
                inside = inside.to(q.device)
                if keep is not None:
                    inside = inside & keep[:, :, a:b, t0:t1]
                inside = inside.expand(batch, 1, b - a, t1 - t0)
                empty = ~inside.any(-1)  # rows with no key here: the kernel reports lse 0, not -inf
                mask = torch.zeros(inside.shape, dtype=q.dtype, device=q.device).masked_fill_(
                    ~inside, float("-inf")
                )
                kind = "mixed"
            o, lse = attention_with_lse(qb, kb, vb, kind == "causal", attn_mask=mask, scale=scale)
            if empty is not None:
                lse = lse.masked_fill(empty, float("-inf"))
                o = o.masked_fill(empty[..., None], 0.0)
            if acc is None:
                acc, lse_acc = o.float(), lse
                continue
            total = torch.logaddexp(lse_acc, lse)
            w_old = torch.exp(lse_acc - total).nan_to_num(0.0)
            w_new = torch.exp(lse - total).nan_to_num(0.0)
            acc = acc * w_old[..., None] + o.float() * w_new[..., None]
            lse_acc = total
        out[:, :, a:b] = acc.to(q.dtype)
    return out


# name registered with transformers' attention and mask registries -> the remap patches using it
REGISTERED = Shared()


def _register(original: str) -> tuple[str, Change]:
    """Register `remap_attention` (and the original implementation's mask function) under a name of its own in
    transformers' process-wide registries; the returned Change releases it (removed with the last user)."""
    name = f"ropebench_remap_{original}"

    def install():
        AttentionInterface.register(name, remap_attention)
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])

        def restore():
            for interface in (AttentionInterface, AttentionMaskInterface):
                # transformers has no unregister: `register` writes the class's mapping, so remove it there
                getattr(interface, "_global_mapping", {}).pop(name, None)

        return restore

    change = Change(
        f"transformers AttentionInterface / AttentionMaskInterface {name!r}",
        f"registered (the remap attention, with the mask function of {original!r}); shared by the remap "
        f"patches, used only by the models whose config selects it",
        REGISTERED.acquire(name, install),
    )
    return name, change


def patch(model: nn.Module, spec, factor: float, options: dict, *, rope_bases, patch_plain):
    """extend.patch for a method registered with remap=True. extend.patching.patch calls it and passes its own
    `rope_bases` and `patch_plain(common_options, label) -> Patch` (the frequencies as `plain` leaves them,
    the handle labelled (name, factor, options from plain's)), so this module does not import patching
    back."""
    from .registry import COMMON_OPTIONS
    from .shipped import DEFAULT_START_FROM, check_start_from, global_type, shipped_ropes

    own = {k: v for k, v in options.items() if k not in COMMON_OPTIONS}
    common = {k: v for k, v in options.items() if k in COMMON_OPTIONS}
    if common.get("temperature") is not None:
        raise ExtendError(
            f"{spec.name} keeps RoPE's frequencies and has no attention temperature — drop the "
            f"temperature option"
        )
    rotary = rotary_module(model)
    start_from = check_start_from(common.get("start_from", DEFAULT_START_FROM))
    bases = rope_bases(model, rotary, common.get("original_max_position_embeddings"), start_from)
    remap = spec.fn(
        bases[global_type(shipped_ropes(model.config))],
        factor=factor,
        **dict(spec.options_with_defaults(), **own),
    )
    if not isinstance(remap, Remap):
        raise ExtendError(
            f"method {spec.name!r} is registered with remap=True but returned "
            f"{type(remap).__name__} — return an extend.remap.Remap"
        )
    identity = remap.plain_within == float("inf")  # reduces to plain RoPE (factor 1): no attention to switch
    original = getattr(model.config, "_attn_implementation", None)
    apply = getattr(sys.modules.get(type(model.base_model).__module__), "apply_rotary_pos_emb", None)
    if not identity and original not in SUPPORTED:
        raise ExtendError(
            f"{spec.name} needs the model loaded with attn_implementation 'sdpa' or 'eager', not "
            f"{original!r} — e.g. extend.load(..., attn_implementation='sdpa')"
        )
    if not identity and apply is None:
        raise ExtendError(
            f"{spec.name} is not supported for {family(model)}: its modeling code has no apply_rotary_pos_emb"
        )
    if not identity and getattr(model.config, "attn_logit_softcapping", None):
        raise ExtendError(_softcap_message(spec.name, family(model)))

    def relabel(recorded: dict) -> dict:  # plain's recorded options, without its temperature, + the remap's
        return dict(own, **{k: v for k, v in recorded.items() if k != "temperature"}, **remap.resolved)

    handle = patch_plain(common, (spec.name, factor, relabel))  # frequencies as plain leaves them
    if not identity:
        layered = bool(layer_types(rotary))
        extended = set(handle.options.get("layer_types", [None])) if layered else {None}
        state = _State(remap, spec.name, rotary, apply, original, extended, layered)
        try:
            _switch(model, state, handle)
        except BaseException:
            handle.undo()
            raise
    return handle


def _softcap_message(method: str, name: str) -> str:
    return (
        f"{method} is not supported for {name}: its attention logits are soft-capped "
        f"(attn_logit_softcapping), which the blockwise flash kernel cannot apply — use a frequency method "
        f"(e.g. yarn), or set config.attn_logit_softcapping=None if your model does without it"
    )


def _switch(model: nn.Module, state: _State, handle) -> None:
    """Point every attention module of `model` at the remap attention; each change is recorded on `handle`
    first, so handle.undo() restores it."""
    modules = [
        m
        for m in model.modules()
        if isinstance(getattr(m, "layer_idx", None), int) and hasattr(m, "config") and m is not model
    ]
    configs = list({id(c): c for c in [model.config] + [m.config for m in modules]}.values())
    name, registered = _register(state.original)
    handle.record(registered)
    saved = [(config, config._attn_implementation) for config in configs]

    def restore():
        for config, implementation in saved:
            config._attn_implementation = implementation
        for module in modules:
            _STATE.pop(module, None)

    handle.record(Change("attention implementation", f"{state.original} -> {name}", restore, shared=False))
    hook = model.base_model.register_forward_pre_hook(lambda *_: state.cache.clear())
    handle.record(Change("forward hook", "clears the remap's per-forward cache", hook.remove, shared=False))
    for module in modules:
        _STATE[module] = state
    for config in configs:
        config._attn_implementation = name
