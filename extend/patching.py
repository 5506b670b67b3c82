"""Patch a loaded decoder's RoPE in place and undo it.

`patch(model, method, factor, **options)` swaps `model.base_model.rotary_emb` for a thin wrapper and sets
the wrapped module's inverse frequencies / attention scaling to the method's, per layer type. Options common
to every method (besides the method's own):
- start_from: "shipped" (default; stack on the RoPE the model ships, with the context it reaches: `plain` is
  the model as loaded) or "pretrained" (the unscaled theta and the pretraining context) — see
  extend/shipped.py;
- layer_types: the layer types to extend (default: those whose attention span can exceed the trained
  context: the global layers of Gemma3/OLMo3; sliding layers with a shorter window keep their frequencies);
- temperature: where an attention temperature (YaRN, LongRoPE) goes — "logits" multiplies every logit by it
  through the attention modules' `scaling` (the papers' uniform 1/t; default for partial-rotary models such as
  Phi, GPT-NeoX, StableLM), "rotary" scales cos/sin as transformers does (only the rotary dims of q.k get it;
  the same thing when every dim rotates, so the default there);
- original_max_position_embeddings: override the trained context L.
Length-dependent RoPE (dynamic methods, a shipped dynamic/longrope) is recomputed from each forward's length,
statelessly, or from the length fixed by `fixed_length(model, n)` for a cached generate/score call.

Its size (~650 lines): a patch and its undo are read together, every change made here has its undo here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math

import torch
from torch import nn

from . import registry, xpos
from .errors import ExtendError
from .families import family, rotary_module
from .method_spec import Rope, RopeBase
from .scoped import Change
from .shipped import (
    DEFAULT_START_FROM,
    Shipped,
    check_start_from,
    context_for,
    default_extended,
    global_type,
    pretrained_frequencies,
    rotary_fraction,
    shipped_frequencies,
    shipped_ropes,
)

TEMPERATURES = ("logits", "rotary")


def trained_context(model: nn.Module, start_from: str = DEFAULT_START_FROM) -> int:
    """The context the model was trained with, read from the global layer type's RoPE parameters: "shipped"
    (default: the context its shipped scaling reaches) or "pretrained" (the pretraining context, derived as
    extend/shipped.py's docstring says). Needs only `model.config`."""
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
        partial = rotary_fraction(config, params)
        dim = int(head_dim * partial)
        prefix = f"{lt}_" if lt else ""
        buffer = getattr(rotary, f"{prefix}original_inv_freq", None)
        if buffer is None:
            buffer = getattr(rotary, f"{prefix}inv_freq")
        if not info.scaled:
            inv_freq = buffer  # the model's own tensor: factor-1 paths stay bit-identical
        else:  # the model ships scaled frequencies: its pretrained ones come from theta
            inv_freq = pretrained_frequencies(info.theta, dim, buffer.device, info.p_rope)
        if inv_freq.numel() != dim // 2:
            raise ExtendError(
                f"not supported: {family(model)} — its rotary module has {inv_freq.numel()} "
                f"frequencies, expected {dim // 2} for {dim} rotary dims"
            )
        bases[lt] = RopeBase(info.theta, dim, head_dim, original, inv_freq, partial, info.pretrained_start())
    return bases


class Patch:
    """An active patch: the handle `extend.patch` returns. `undo()` restores the model exactly, and every
    process-wide change the patch made; also a context manager. Read-only properties: `model`, `method`,
    `factor`, `options` (a copy: the options given plus what was resolved — start_from, trained_context,
    base_theta, shipped_rope, temperature, layer_types; the sweep records them with every result row),
    `length_dependent`, `active`, `global_changes`; for what the patch computes: `layer_types`,
    `extended_layer_types`, `frequencies(...)`, `scalings(...)`, `loaded_frequencies(...)`. Code that extends
    a patch records what it changes with `record(change)`, so that undo() puts it back."""

    def __init__(self, model: nn.Module, method: str, factor: float, options: dict, length_dependent: bool):
        self._model = model
        self._method, self._factor, self._options = method, factor, dict(options)
        self._length_dependent = bool(length_dependent)
        self._changes: list[Change] = []  # restored by undo(), last first
        self._wrapper: PatchedRotary | None = None
        self._active = True
        self._given: tuple | None = None  # (method, factor, options) as given: for `unpatched`

    model = property(lambda self: self._model, doc="The patched model.")
    method = property(lambda self: self._method, doc="The method's registered name.")
    factor = property(lambda self: self._factor, doc="The scale factor s.")
    length_dependent = property(
        lambda self: self._length_dependent,
        doc="Do the frequencies depend on each forward's length (see extend.fixed_length)?",
    )

    options = property(
        lambda self: copy.deepcopy(self._options),
        doc="The options given plus what the patch resolved (a copy: changing it changes nothing).",
    )
    active = property(lambda self: self._active, doc="Not undone yet.")

    @property
    def global_changes(self) -> tuple[Change, ...]:
        """The process-wide changes this patch holds now (e.g. a family function xpos wraps, an attention
        function registered with transformers), each with a `name` and a `description`; undo() restores them.
        Empty for most methods."""
        return tuple(c for c in self._changes if c.shared and c.active)

    def record(self, change: Change) -> None:
        """Record a change made for this patch (an `extend.scoped.Change`); undo() restores it (last recorded
        first). For code that extends a patch, such as a position-remapping method's attention switch."""
        if not self._active:
            change.restore()
            raise ExtendError(
                f"the {self._method!r} patch was undone — record changes only on an active patch"
            )
        self._changes = [c for c in self._changes if c.active] + [change]

    @property
    def layer_types(self) -> tuple:
        """The rotary module's layer types (Gemma3, OLMo3), or (None,) for models with one RoPE."""
        return tuple(self._rotary_wrapper().bases)

    @property
    def extended_layer_types(self) -> tuple:
        """The layer types the method extends (the others keep their frequencies)."""
        wrapper = self._rotary_wrapper()
        return tuple(lt for lt in wrapper.bases if lt in wrapper.extended)

    def frequencies(self, layer_type=None, seq_len: int | None = None) -> Rope:
        """The RoPE the patch gives `layer_type` (None on models with one RoPE) for a forward of `seq_len`
        tokens (default: the trained context; length-independent layer types ignore it): inverse frequencies
        as installed and the attention factor. Computes only: the model is not changed."""
        return self._rope(layer_type, seq_len)[0]

    def scalings(self, layer_type=None, seq_len: int | None = None) -> tuple[float, float | None]:
        """(cos/sin scaling, attention-logit multiplier) a forward of `seq_len` tokens runs `layer_type` with:
        the attention temperature goes to cos/sin (temperature="rotary") or to every logit through the
        attention modules' `scaling` ("logits"); the multiplier is None where the patch leaves the logits'
        scaling alone."""
        wrapper = self._rotary_wrapper(layer_type)
        rope, method_factor = self._rope(layer_type, seq_len)
        if wrapper.temperature != "logits" or not wrapper.attention.get(layer_type):
            return rope.attention_factor, None
        if layer_type not in wrapper.extended:
            return rope.attention_factor, 1.0
        return rope.attention_factor / method_factor, method_factor**2  # as PatchedRotary.install sets them

    def _rope(self, layer_type, seq_len: int | None) -> tuple[Rope, float]:
        """(the layer type's Rope at seq_len, the method's own attention factor in it); the wrapper is left
        as it was."""
        wrapper = self._rotary_wrapper(layer_type)
        seq_len = int(self._options["trained_context"] if seq_len is None else seq_len)
        kept = dict(wrapper.method_factor)
        try:
            return wrapper.rope_for(layer_type, seq_len), wrapper.method_factor.get(layer_type, 1.0)
        finally:
            wrapper.method_factor.clear()
            wrapper.method_factor.update(kept)

    def loaded_frequencies(self, layer_type=None) -> torch.Tensor:
        """The inverse frequencies of `layer_type` as the model was loaded (a copy)."""
        return self._rotary_wrapper(layer_type).own[layer_type][0].detach().clone()

    def _rotary_wrapper(self, layer_type=...) -> PatchedRotary:
        if not self._active or self._wrapper is None:
            raise ExtendError(f"the {self._method!r} patch was undone — ask an active patch")
        if layer_type is not ... and layer_type not in self._wrapper.bases:
            raise ExtendError(
                f"layer type {layer_type!r} is not one of this model's {list(self._wrapper.bases)}"
            )
        return self._wrapper

    def undo(self) -> None:
        """Restore the model and every change the patch recorded, last first; idempotent. A restore step that
        fails does not stop the others: the first failure is raised after all of them ran."""
        if not self._active:
            return
        self._active = False
        failure = None
        for change in reversed(self._changes):
            try:
                change.restore()
            except BaseException as exc:  # noqa: BLE001 - restore the rest, then raise the first
                failure = failure or exc
        self._changes = []
        if failure is not None:
            raise failure

    def _take_over(self, other: Patch) -> None:
        """Become `other` (a fresh patch of the same model), so whoever holds this handle undoes that one."""
        vars(self).update(vars(other))
        other._active, other._changes = False, []
        if self._wrapper is not None:
            self._wrapper.patch = self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()

    def __repr__(self) -> str:
        return (
            f"Patch(method={self._method!r}, factor={self._factor!r}, options={self._options!r}, "
            f"length_dependent={self._length_dependent!r})"
        )


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
        self.method_factor: dict = {}  # layer type -> the method's attention factor (temperature="logits")
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
        return Rope(
            *shipped_frequencies(self.rotary, self.shipped[layer_type], seq_len, *self.own[layer_type])
        )

    def method_rope(self, layer_type, seq_len, base: RopeBase | None = None) -> Rope:
        base = base or self.bases[layer_type]
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
            if self.start_from == "shipped" and scaled:
                # The method starts from the shipped frequencies (RopeBase.start): its wavelength rules count
                # their rotations; a method that computes from theta stacks its per-pair ratio on them
                # (registry.Method.__call__). Temperatures multiply.
                ship = self.shipped_rope(layer_type, seq_len)
                start = dataclasses.replace(
                    self.bases[layer_type], inv_freq=ship.inv_freq, start=self.shipped[layer_type].label()
                )
                rope = self.method_rope(layer_type, seq_len, start)
                self.method_factor[layer_type] = rope.attention_factor
                rope = dataclasses.replace(
                    rope, attention_factor=ship.attention_factor * rope.attention_factor
                )
            else:
                rope = self.method_rope(layer_type, seq_len)
                self.method_factor[layer_type] = rope.attention_factor
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
        inv_freq = rope.inv_freq
        if inv_freq is not self.bases[layer_type].inv_freq:
            inv_freq = inv_freq.to(buffer.device)
        setattr(self.rotary, f"{prefix}inv_freq", inv_freq)
        rotary_scaling = rope.attention_factor
        if self.temperature == "logits" and layer_type in self.extended:
            # The method's temperature moves to every logit; a shipped one (start_from="shipped") stays on
            # cos/sin.
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
        """xPos exponent centre: as given; else the middle of the fixed length; else the middle of this
        forward's positions, kept for the forwards that continue it from a KV cache (so cached keys stay
        valid)."""
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
        wrapper.continuing = cache is not None and bool(cache.get_seq_length())

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
    handle = _patch(model, method, factor, dict(options))
    handle._given = (method, factor, dict(options))
    return handle


@contextlib.contextmanager
def unpatched(model: nn.Module):
    """The model as loaded inside the block, whatever patch is active; on exit that patch is applied again
    into the same handle, so whoever holds it still undoes it. For a baseline measured inside a patched run
    (the default LongPPL evaluator, tasks/key_tokens.py)."""
    active = current(model)
    if active is None:
        yield model
        return
    method, factor, options = active._given
    active.undo()
    try:
        yield model
    finally:
        active._take_over(patch(model, method, factor, **options))


def _patch(model: nn.Module, method: str, factor: float, options: dict, label=None) -> Patch:
    """`label`: (name, factor, options from the recorded ones) the handle shows instead of this method's — for
    a position-remapping method, which patches the frequencies as `plain` (extend/remap_attention.py)."""
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
            patch_plain=lambda common, label: _patch(model, "plain", 1.0, common, label),
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
    apply_module = None
    if uses_xpos:
        if next(model.parameters()).dtype == torch.float16:
            raise ExtendError(
                "xpos decays grow past fp16's range at long contexts — load the model in float32 or bfloat16"
            )
        wrapper.xpos_layout = xpos.rotation_layout(rotary, bases, model)
        apply_module = xpos.apply_module(model)
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
    name, shown_factor, recorded = spec.name, factor, dict(given, **resolved)
    if label is not None:
        name, shown_factor, relabel = label
        recorded = relabel(recorded)
    handle = Patch(model, name, shown_factor, recorded, any(wrapper.layer_dynamic(lt) for lt in bases))
    handle._wrapper = wrapper
    wrapper.patch = handle
    try:
        _install(model, handle, wrapper, rotary, ropes, apply_module)
    except BaseException:
        handle.undo()  # nothing half-applied
        raise
    return handle


def _install(model, handle: Patch, wrapper: PatchedRotary, rotary, ropes: dict, apply_module: str | None):
    """Change the model (and, for xpos, the family's apply_rotary_pos_emb), recording each change on `handle`
    before making it, so its undo() restores exactly what was done."""
    prefixes = [f"{lt}_" if lt else "" for lt in ropes]
    names = [p + n for p in prefixes for n in ("inv_freq", "attention_scaling")]
    if "rope_type" in vars(rotary):
        names.append("rope_type")
    saved = {n: getattr(rotary, n) for n in names if hasattr(rotary, n)}

    def restore_buffers():
        for n, value in saved.items():
            setattr(rotary, n, value)

    handle.record(
        Change("rotary module", "the method's frequencies and scaling", restore_buffers, shared=False)
    )
    if "rope_type" in saved:
        # The model's own dynamic/longrope update would overwrite our frequencies (and depends on history).
        rope_type = saved["rope_type"]
        rotary.rope_type = {lt: "default" for lt in rope_type} if isinstance(rope_type, dict) else "default"
    scalings = [pair for pairs in wrapper.attention.values() for pair in pairs]  # (attention module, scaling)

    def restore_scalings():
        for module, scaling in scalings:
            module.scaling = scaling

    handle.record(Change("attention scaling", "the attention temperature", restore_scalings, shared=False))
    for lt, rope in ropes.items():
        if not wrapper.layer_dynamic(lt):
            wrapper.install(lt, rope)
    if apply_module:
        handle.record(xpos.wrap_apply(apply_module))
        for hook in xpos.guard(model, wrapper.hits) + [_watch_cache(model, wrapper)]:
            handle.record(Change("forward hook", "xpos bookkeeping", hook.remove, shared=False))
    base = model.base_model
    restore_rotary = functools.partial(setattr, base, "rotary_emb", base.rotary_emb)
    handle.record(Change("rotary_emb", "the patched rotary module", restore_rotary, shared=False))
    base.rotary_emb = wrapper


@contextlib.contextmanager
def patched(model: nn.Module, method: str, factor: float = 1.0, **options):
    """`with patched(model, "yarn", factor=2): ...` — the model is restored on exit, even on error."""
    handle = patch(model, method, factor, **options)
    try:
        yield handle
    finally:
        handle.undo()
