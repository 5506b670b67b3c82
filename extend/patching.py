"""Patch a loaded decoder's RoPE in place and undo it.

`patch(model, method, factor, **options)` swaps `model.base_model.rotary_emb` for a thin wrapper and sets
the wrapped module's inverse frequencies / attention scaling to the method's, per layer type. Options common
to every method (besides the method's own):
- start_from: "shipped" (default; stack on the RoPE the model ships, with the context it reaches: `plain` is the
  model as loaded) or "pretrained" (the unscaled theta and the pretraining context) — see extend/shipped.py;
- layer_types: the layer types to extend (default: those whose attention span can exceed the trained
  context: the global layers of Gemma3/OLMo3; sliding layers with a shorter window keep their frequencies);
- temperature: where an attention temperature (YaRN, LongRoPE) goes — "logits" multiplies every logit by it
  through the attention modules' `scaling` (the papers' uniform 1/t; default for partial-rotary models such as
  Phi, GPT-NeoX, StableLM), "rotary" scales cos/sin as transformers does (only the rotary dims of q.k get it;
  the same thing when every dim rotates, so the default there);
- original_max_position_embeddings: override the trained context L.
Length-dependent RoPE (dynamic methods, a shipped dynamic/longrope) is recomputed from each forward's length,
statelessly, or from the length fixed by `fixed_length(model, n)` for a cached generate/score call.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from . import registry, xpos
from .errors import ExtendError
from .families import family, rotary_module
from .registry import Rope, RopeBase
from .shipped import (
    DEFAULT_START_FROM,
    Shipped,
    check_start_from,
    context_for,
    default_extended,
    global_type,
    pretrained_frequencies,
    shipped_frequencies,
    shipped_ropes,
)

TEMPERATURES = ("logits", "rotary")


def trained_context(model: nn.Module, start_from: str = DEFAULT_START_FROM) -> int:
    """The context the model was trained with, read from the global layer type's RoPE parameters: "shipped"
    (default: the context its shipped scaling reaches; max_position_embeddings for unscaled RoPE) or
    "pretrained" (original_max_position_embeddings; else the family's published pretraining context; linear
    without either: max_position_embeddings / factor; else max_position_embeddings). Needs only `model.config`."""
    return context_for(shipped_ropes(model.config), check_start_from(start_from))


def rope_bases(
    model: nn.Module, rotary: nn.Module, original: int | None = None, start_from: str = DEFAULT_START_FROM
) -> dict[str | None, RopeBase]:
    """The model's pretrained RoPE parameters, one per layer type (key None for single-type modules), with
    the trained context L of `start_from` (or `original`)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shipped = shipped_ropes(config)
    original = int(original or context_for(shipped, start_from))
    bases = {}
    for lt, info in shipped.items():
        params = config.rope_parameters[lt] if lt else config.rope_parameters
        partial = float(
            params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0) or 1.0)
        )
        dim = int(head_dim * partial)
        prefix = f"{lt}_" if lt else ""
        buffer = getattr(rotary, f"{prefix}original_inv_freq", None)
        if buffer is None:
            buffer = getattr(rotary, f"{prefix}inv_freq")
        if not info.scaled:
            inv_freq = buffer  # the model's own tensor: factor-1 paths stay bit-identical
        else:  # the model ships scaled frequencies: its pretrained ones come from theta
            inv_freq = pretrained_frequencies(info.theta, dim, buffer.device)
        if inv_freq.numel() != dim // 2:
            raise ExtendError(
                f"not supported: {family(model)} — its rotary module has {inv_freq.numel()} "
                f"frequencies, expected {dim // 2} for {dim} rotary dims"
            )
        bases[lt] = RopeBase(info.theta, dim, head_dim, original, inv_freq, partial)
    return bases


@dataclass
class Patch:
    """An active patch. `undo()` restores the model exactly; also usable as a context manager.
    `options` are the options given plus what was resolved (start_from, trained_context, base_theta,
    shipped_rope, temperature, layer_types) — the sweep records them with every result row."""

    model: nn.Module = field(repr=False)
    method: str
    factor: float
    options: dict
    length_dependent: bool
    _rotary: nn.Module = field(repr=False, default=None)
    _saved: dict = field(repr=False, default_factory=dict)
    _saved_scaling: list = field(repr=False, default_factory=list)  # (attention module, its scaling)
    _hooks: list = field(repr=False, default_factory=list)
    _apply_module: str | None = field(repr=False, default=None)
    _active: bool = field(repr=False, default=True)
    _given: tuple | None = field(
        repr=False, default=None
    )  # (method, factor, options) as given: for `unpatched`

    @property
    def active(self) -> bool:
        return self._active

    def undo(self) -> None:
        if not self._active:
            return
        self.model.base_model.rotary_emb = self._rotary
        for name, value in self._saved.items():
            setattr(self._rotary, name, value)
        for module, scaling in self._saved_scaling:
            module.scaling = scaling
        for hook in self._hooks:
            hook.remove()
        if self._apply_module:
            xpos.unwrap_apply(self._apply_module)
        self._active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()


class PatchedRotary(nn.Module):
    """Stands where the model's rotary module stood; computes each layer type's frequencies, then calls the
    model's own rotary module so its cos/sin layout is kept."""

    def __init__(
        self,
        rotary: nn.Module,
        method: registry.Method,
        factor: float,
        options: dict,
        bases: dict,
        shipped: dict[str | None, Shipped],
        start_from: str,
        extended: list,
        temperature: str,
    ):
        super().__init__()
        self.rotary = rotary
        self.method = method
        self.factor = factor
        self.options = options
        self.bases = bases
        self.shipped = shipped
        self.start_from = start_from
        self.extended = set(extended)
        self.temperature = temperature
        self.own = {}  # layer type -> the module's own (initial inv_freq, attention scaling), for `shipped`
        self.attention = {}  # layer type -> [(attention module, its own scaling)] for temperature="logits"
        self.xpos_layout: str | None = None
        self.ropes: dict = {}  # layer type -> Rope, for length-independent layer types
        self.method_factor: dict = {}  # layer type -> the method's own attention factor (temperature="logits")
        self.hits = [0]  # xpos: apply_rotary_pos_emb calls that used this forward's k scaling
        self.fixed_seq_len: int | None = None  # set by fixed_length()
        self.xpos_centre: float | None = None  # the centre of the sequence being generated (auto centre)
        self.continuing = (
            False  # does the current forward continue a KV cache? (set by a pre-hook, xpos only)
        )
        self.patch: Patch | None = None

    def layer_dynamic(self, layer_type) -> bool:
        """Do this layer type's frequencies depend on the sequence length?"""
        if self.method.dynamic and layer_type in self.extended:
            return True
        return self.start_from == "shipped" and self.shipped[layer_type].length_dependent

    def shipped_rope(self, layer_type, seq_len) -> Rope:
        inv_freq, scaling = shipped_frequencies(
            self.rotary, self.shipped[layer_type], seq_len, *self.own[layer_type]
        )
        return Rope(inv_freq, scaling)

    def method_rope(self, layer_type, seq_len) -> Rope:
        base = self.bases[layer_type]
        rope = self.method(base, self.factor, seq_len=seq_len, **self.options)
        if self.method.identity_at_one and self.factor == 1.0:
            # The formula ran; at factor 1 it must give the unpatched frequencies. Use the model's own tensor
            # then, so the logits are bit-identical (a few ulp of rounding would otherwise remain).
            close = torch.allclose(
                rope.inv_freq.double().cpu(), base.inv_freq.double().cpu(), rtol=1e-6, atol=0
            )
            if not close or abs(rope.attention_factor - 1.0) > 1e-9:
                raise ExtendError(
                    f"method {self.method.name!r} at factor 1 does not reduce to the unpatched RoPE "
                    f"— a bug in the method; report it"
                )
            rope = Rope(base.inv_freq, 1.0)
        return rope

    def rope_for(self, layer_type, seq_len: int | None) -> Rope:
        if layer_type in self.ropes:
            return self.ropes[layer_type]
        scaled = self.shipped[layer_type].scaled
        self.method_factor[layer_type] = 1.0
        if layer_type in self.extended and self.method.name != "plain":
            rope = self.method_rope(layer_type, seq_len)
            self.method_factor[layer_type] = rope.attention_factor
            if (
                self.start_from == "shipped"
                and scaled
                and rope.inv_freq is not self.bases[layer_type].inv_freq
            ):
                # Stack: the method's effect on the pretrained frequencies, applied to the shipped ones.
                ship = self.shipped_rope(layer_type, seq_len)
                ratio = rope.inv_freq.to(ship.inv_freq.device) / self.bases[layer_type].inv_freq.to(
                    ship.inv_freq.device
                )
                rope = Rope(
                    ship.inv_freq * ratio,
                    ship.attention_factor * rope.attention_factor,
                    rope.xpos_zeta,
                    rope.xpos_scale_base,
                    rope.xpos_centre,
                )
            elif self.start_from == "shipped" and scaled:
                rope = self.shipped_rope(layer_type, seq_len)
        elif self.start_from == "shipped":
            rope = self.shipped_rope(layer_type, seq_len)
        else:
            rope = Rope(self.bases[layer_type].inv_freq, 1.0)
        if not self.layer_dynamic(layer_type):
            self.ropes[layer_type] = rope
        return rope

    def install(self, layer_type, rope: Rope) -> None:
        prefix = f"{layer_type}_" if layer_type else ""
        buffer = getattr(self.rotary, f"{prefix}inv_freq")
        inv_freq = (
            rope.inv_freq
            if rope.inv_freq is self.bases[layer_type].inv_freq
            else rope.inv_freq.to(buffer.device)
        )
        setattr(self.rotary, f"{prefix}inv_freq", inv_freq)
        rotary_scaling = rope.attention_factor
        if self.temperature == "logits" and layer_type in self.extended:
            # The method's temperature moves to every logit; a shipped one (start_from="shipped") stays on cos/sin.
            method_factor = self.method_factor.get(layer_type, 1.0)
            for module, own in self.attention.get(layer_type, ()):
                module.scaling = own * method_factor**2  # cos and sin both carried it: q.k got it twice
            rotary_scaling = rope.attention_factor / method_factor
        setattr(self.rotary, f"{prefix}attention_scaling", rotary_scaling)

    def forward(self, x, position_ids, *args, **kwargs):
        layer_type = args[0] if args else kwargs.get("layer_type")
        high = int(position_ids.max())
        seq_len = high + 1
        if self.fixed_seq_len is not None:
            if seq_len > self.fixed_seq_len:
                raise ExtendError(
                    f"a forward reaches position {high}, beyond extend.fixed_length(model, "
                    f"{self.fixed_seq_len}) — fix the length of the whole call (prompt + new tokens)"
                )
            seq_len = self.fixed_seq_len
        rope = self.rope_for(layer_type, seq_len)
        if self.layer_dynamic(layer_type):
            self.install(layer_type, rope)
        cos, sin = self.rotary(x, position_ids, *args, **kwargs)
        if self.xpos_layout is None or rope.xpos_zeta is None or math.isinf(rope.xpos_scale_base):
            return cos, sin
        low = int(position_ids.min())
        centre = self.centre(rope, low, high)
        xpos.check_span(
            low, high, centre, rope.xpos_zeta, rope.xpos_scale_base, self.fixed_seq_len is not None
        )
        return xpos.scale_cos_sin(
            cos, sin, position_ids, rope.xpos_zeta, rope.xpos_scale_base, centre, self.xpos_layout, self.hits
        )

    def centre(self, rope: Rope, low: int, high: int) -> float:
        """xPos exponent centre: as given; else the middle of the fixed length; else the middle of this forward's
        positions, kept for the forwards that continue it from a KV cache (so cached keys stay valid)."""
        if rope.xpos_centre is not None:
            return rope.xpos_centre
        if self.fixed_seq_len is not None:
            return (self.fixed_seq_len - 1) / 2
        if not self.continuing or self.xpos_centre is None:
            self.xpos_centre = float(low + high) / 2
        return self.xpos_centre


def current(model: nn.Module) -> Patch | None:
    """The active patch of this model, or None."""
    rotary = getattr(getattr(model, "base_model", model), "rotary_emb", None)
    return getattr(rotary, "patch", None) if isinstance(rotary, PatchedRotary) else None


def length_dependent(model: nn.Module) -> bool:
    """True when the model's RoPE frequencies depend on the current sequence length: an active dynamic
    method, or a model that ships dynamic/longrope RoPE (unpatched, or patched with start_from="shipped")."""
    active = current(model)
    if active is not None:
        return active.length_dependent
    config = getattr(model, "config", None)
    if not getattr(config, "rope_parameters", None):
        return False
    try:
        return any(s.length_dependent for s in shipped_ropes(config).values())
    except (ExtendError, KeyError, TypeError):
        return False


@contextlib.contextmanager
def fixed_length(model: nn.Module, seq_len: int):
    """While active, length-dependent RoPE (dynamic-ntk, dynamic-yarn, longrope, a model's own shipped
    dynamic/longrope — also unpatched) uses the frequencies of `seq_len` for every forward, whatever the
    forward's own length: one cached generate/score call (or a shared KV prefix and its continuations) keeps
    one set of frequencies. Pass the call's full length (prompt + new tokens); a forward beyond it raises
    ExtendError. Also fixes xPos's centre. A no-op for length-independent unpatched models."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len <= 0:
        raise ExtendError(f"fixed_length needs a positive integer length, got {seq_len!r}")
    temporary = None
    if current(model) is None:
        if not length_dependent(model):
            yield
            return
        temporary = patch(model, "plain", start_from="shipped")  # the model unchanged, computed statelessly
    wrapper = model.base_model.rotary_emb
    previous = wrapper.fixed_seq_len
    wrapper.fixed_seq_len = seq_len
    try:
        yield
    finally:
        wrapper.fixed_seq_len = previous
        if temporary is not None:
            temporary.undo()


def _attention_modules(model: nn.Module, layer_types: list) -> dict:
    """Layer type -> [(attention module, its scaling)] for the modules that take a `scaling` attribute."""
    config_types = getattr(model.config, "layer_types", None)
    out: dict = {}
    for module in model.modules():
        scaling, index = getattr(module, "scaling", None), getattr(module, "layer_idx", None)
        if not isinstance(scaling, float) or not isinstance(index, int):
            continue
        lt = config_types[index] if any(layer_types) and config_types else None
        out.setdefault(lt, []).append((module, scaling))
    return out


def _watch_cache(model: nn.Module, wrapper: PatchedRotary):
    """Tell the wrapper whether a forward continues a filled KV cache (xPos then keeps its centre). The cache
    comes under either keyword (`cache` from transformers 5.24 on, `past_key_values` before; see
    extend.forward.CACHE_KEYWORDS) or positionally."""
    from .forward import passed_cache  # imported here: this function is the only user in this module

    def note(module, args, kwargs):
        cache = passed_cache(args, kwargs)
        length = cache.get_seq_length() if cache is not None else 0
        wrapper.continuing = bool(length)

    return model.base_model.register_forward_pre_hook(note, with_kwargs=True)


def _check_common(options: dict, shipped: dict, model) -> tuple[str, list | None, str | None, int | None]:
    start_from = check_start_from(options.pop("start_from", DEFAULT_START_FROM))
    original = options.pop("original_max_position_embeddings", None)
    if original is not None and (
        isinstance(original, bool) or not isinstance(original, int) or original <= 0
    ):
        raise ExtendError(f"original_max_position_embeddings must be a positive integer, got {original!r}")
    chosen = options.pop("layer_types", None)
    if chosen is not None:
        known = [lt for lt in shipped if lt]
        if isinstance(chosen, str):
            chosen = [chosen]
        if not known:
            raise ExtendError(
                f"layer_types only applies to models with per-layer-type RoPE (Gemma3, OLMo3); "
                f"{family(model)} has one RoPE for every layer — drop the option"
            )
        if not isinstance(chosen, (list, tuple)) or not chosen or any(lt not in known for lt in chosen):
            raise ExtendError(
                f"layer_types must be a non-empty list of this model's layer types {known}, got {chosen!r}"
            )
        chosen = list(chosen)
    temperature = options.pop("temperature", None)
    if temperature is not None and temperature not in TEMPERATURES:
        raise ExtendError(
            f"temperature must be 'logits' (every attention logit, as the papers) or 'rotary' "
            f"(cos/sin, as transformers), got {temperature!r}"
        )
    return start_from, chosen, temperature, original


def patch(model: nn.Module, method: str, factor: float = 1.0, **options) -> Patch:
    """Patch `model` in place with RoPE method `method` at scale `factor`; returns a handle with `.undo()`.
    Options: the method's own (see `describe(method)`) plus start_from, layer_types, temperature and
    original_max_position_embeddings (see this module's docstring)."""
    handle = _patch(model, method, factor, **options)
    handle._given = (method, factor, dict(options))
    return handle


@contextlib.contextmanager
def unpatched(model: nn.Module):
    """The model as loaded inside the block, whatever patch is active; on exit that patch is applied again into
    the same handle, so whoever holds it still undoes it. For a baseline measured inside a patched run (the
    default LongPPL evaluator, tasks/key_tokens.py)."""
    active = current(model)
    if active is None:
        yield model
        return
    method, factor, options = active._given
    active.undo()
    try:
        yield model
    finally:
        again = patch(model, method, factor, **options)
        vars(active).update(vars(again))
        model.base_model.rotary_emb.patch = active


def _patch(model: nn.Module, method: str, factor: float, **options) -> Patch:
    spec = registry.get(method)
    factor = registry.check_factor(spec, factor)
    options = registry.check_options(spec, dict(options))
    active = current(model)
    if active is not None:
        raise ExtendError(
            f"model is already patched with {active.method!r} — call .undo() on that patch "
            f"(or leave its `with extend.patched(...)` block) before patching again"
        )
    if (
        spec.remap
    ):  # position remapping (Self-Extend, ReRoPE, DCA): the attention changes, see extend/remap.py
        from . import remap_attention

        return remap_attention.patch(
            model,
            spec,
            factor,
            options,
            rope_bases=rope_bases,
            patch_plain=lambda **common: patch(model, "plain", 1.0, **common),
        )
    rotary = rotary_module(model)
    given = dict(options)
    shipped = shipped_ropes(model.config)
    start_from, chosen, temperature, original = _check_common(options, shipped, model)
    bases = rope_bases(model, rotary, original, start_from)
    context = next(iter(bases.values())).original_max_position_embeddings
    extended = chosen if chosen is not None else default_extended(shipped, context)
    partial = any(bases[lt].dim < bases[lt].head_dim for lt in extended)
    temperature = temperature or ("logits" if partial else "rotary")
    wrapper = PatchedRotary(rotary, spec, factor, options, bases, shipped, start_from, extended, temperature)
    for lt in bases:
        prefix = f"{lt}_" if lt else ""
        own = getattr(rotary, f"{prefix}original_inv_freq", None)
        wrapper.own[lt] = (
            own if own is not None else getattr(rotary, f"{prefix}inv_freq"),
            float(getattr(rotary, f"{prefix}attention_scaling", 1.0)),
        )
    # Validate by computing every layer type's frequencies (at the trained context) before touching the model.
    ropes = {lt: wrapper.rope_for(lt, context) for lt in bases}
    uses_xpos = any(r.xpos_zeta is not None and not math.isinf(r.xpos_scale_base) for r in ropes.values())
    dtype = next(model.parameters()).dtype
    handle_module = None
    if uses_xpos:
        if dtype == torch.float16:
            raise ExtendError(
                "xpos decays grow past fp16's range at long contexts — load the model in float32 or bfloat16"
            )
        wrapper.xpos_layout = xpos.rotation_layout(rotary, bases, model)
        handle_module = xpos.apply_module(model)
    if temperature == "logits":
        wrapper.attention = _attention_modules(model, list(bases))
        if extended and not any(lt in wrapper.attention for lt in extended):
            raise ExtendError(
                f"temperature='logits' is not supported for {family(model)}: its attention modules "
                f"have no `scaling` attribute — use temperature='rotary'"
            )
    info = shipped[global_type(shipped)]
    resolved = {
        "start_from": start_from,
        "trained_context": context,
        "base_theta": info.theta,
        "shipped_rope": info.label(),
        "temperature": temperature,
    }
    if any(lt for lt in shipped):  # per-layer-type models: which types were extended
        resolved["layer_types"] = sorted(extended)
    handle = Patch(
        model,
        method,
        factor,
        dict(given, **resolved),
        any(wrapper.layer_dynamic(lt) for lt in bases),
        rotary,
        _apply_module=handle_module,
    )
    wrapper.patch = handle
    prefixes = [f"{lt}_" if lt else "" for lt in bases]
    names = [p + n for p in prefixes for n in ("inv_freq", "attention_scaling")]
    handle._saved = {n: getattr(rotary, n) for n in names if hasattr(rotary, n)}
    if "rope_type" in vars(rotary):
        handle._saved["rope_type"] = rotary.rope_type
        # The model's own dynamic/longrope update would overwrite our frequencies (and depends on history).
        rotary.rope_type = (
            {lt: "default" for lt in rotary.rope_type} if isinstance(rotary.rope_type, dict) else "default"
        )
    handle._saved_scaling = [pair for pairs in wrapper.attention.values() for pair in pairs]
    for lt, rope in ropes.items():
        if not wrapper.layer_dynamic(lt):
            wrapper.install(lt, rope)
    if handle._apply_module:
        xpos.wrap_apply(handle._apply_module)
        handle._hooks = xpos.guard(model, wrapper.hits) + [_watch_cache(model, wrapper)]
    model.base_model.rotary_emb = wrapper
    return handle


@contextlib.contextmanager
def patched(model: nn.Module, method: str, factor: float = 1.0, **options):
    """`with patched(model, "yarn", factor=2): ...` — the model is restored on exit, even on error."""
    handle = patch(model, method, factor, **options)
    try:
        yield handle
    finally:
        handle.undo()
