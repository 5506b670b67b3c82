"""Patch a loaded decoder's RoPE in place and undo it.

`patch(model, method, factor, **options)` swaps `model.base_model.rotary_emb` for a thin wrapper and sets
the wrapped module's inverse frequencies / attention scaling to the method's. Dynamic methods recompute
them from each forward's own length (stateless). xPos additionally scales q and k differently: the wrapper
returns q's (cos, sin) and registers k's under the id of that cos tensor; the family's
`apply_rotary_pos_emb` is wrapped to look them up (and falls through for every other call, so unpatched
models in the same process are unaffected).
"""

from __future__ import annotations

import contextlib
import math
import sys
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from . import registry
from .errors import ExtendError
from .families import family, layer_types, rotary_module
from .registry import Rope, RopeBase


def trained_context(model: nn.Module) -> int:
    """The context the model was trained with (rope_parameters' original_max_position_embeddings, else
    max_position_embeddings)."""
    config = model.config
    params = getattr(config, "rope_parameters", None) or {}
    if params and all(isinstance(v, dict) for v in params.values()):  # per layer type
        params = next(iter(params.values()))
    return int(params.get("original_max_position_embeddings") or config.max_position_embeddings)


def rope_bases(model: nn.Module, rotary: nn.Module, original: int | None = None) -> dict[str | None, RopeBase]:
    """The model's base RoPE parameters, one per layer type (key None for single-type modules)."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    original = int(original or trained_context(model))
    bases = {}
    for lt in layer_types(rotary) or [None]:
        params = config.rope_parameters[lt] if lt else config.rope_parameters
        if params is None:
            continue
        prefix = f"{lt}_" if lt else ""
        partial = float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0) or 1.0))
        dim = int(head_dim * partial)
        buffer = getattr(rotary, f"{prefix}original_inv_freq", None)
        if buffer is None:
            buffer = getattr(rotary, f"{prefix}inv_freq")
        rope_type = rotary.rope_type[lt] if lt else rotary.rope_type
        theta = float(params["rope_theta"])
        if rope_type == "default":
            inv_freq = buffer  # the model's own tensor: factor-1 paths stay bit-identical
        else:  # the model ships scaled frequencies: start from its unscaled base
            inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
            inv_freq = inv_freq.to(buffer.device)
        if inv_freq.numel() != dim // 2:
            raise ExtendError(f"not supported: {family(model)} — its rotary module has {inv_freq.numel()} "
                              f"frequencies, expected {dim // 2} for {dim} rotary dims")
        bases[lt] = RopeBase(theta, dim, head_dim, original, inv_freq, partial)
    return bases


# xPos: id(q's cos) -> (weakref to that cos, k's cos, k's sin, hit counter); entries vanish with the cos.
_XPOS_K: dict[int, tuple] = {}
# family module name -> [original apply_rotary_pos_emb, number of active xpos patches]
_APPLY_WRAPPED: dict[str, list] = {}


def _register_xpos_k(cos_q, cos_k, sin_k, hits: list):
    key = id(cos_q)
    _XPOS_K[key] = (weakref.ref(cos_q, lambda _, key=key: _XPOS_K.pop(key, None)), cos_k, sin_k, hits)


def _wrap_apply(module_name: str):
    module = sys.modules[module_name]
    if module_name in _APPLY_WRAPPED:
        _APPLY_WRAPPED[module_name][1] += 1
        return
    original = module.apply_rotary_pos_emb

    def apply_rotary_pos_emb(q, k, cos, sin, *args, **kwargs):
        entry = _XPOS_K.get(id(cos))
        if entry is None or entry[0]() is not cos:
            return original(q, k, cos, sin, *args, **kwargs)
        _, cos_k, sin_k, hits = entry
        hits[0] += 1
        q_embed, _ = original(q, k, cos, sin, *args, **kwargs)
        _, k_embed = original(q, k, cos_k, sin_k, *args, **kwargs)
        return q_embed, k_embed

    apply_rotary_pos_emb.__wrapped__ = original
    module.apply_rotary_pos_emb = apply_rotary_pos_emb
    _APPLY_WRAPPED[module_name] = [original, 1]


def _unwrap_apply(module_name: str):
    entry = _APPLY_WRAPPED.get(module_name)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        sys.modules[module_name].apply_rotary_pos_emb = entry[0]
        del _APPLY_WRAPPED[module_name]



@dataclass
class Patch:
    """An active patch. `undo()` restores the model exactly; also usable as a context manager."""

    model: nn.Module = field(repr=False)
    method: str
    factor: float
    options: dict
    length_dependent: bool
    _rotary: nn.Module = field(repr=False, default=None)
    _saved: dict = field(repr=False, default_factory=dict)
    _hooks: list = field(repr=False, default_factory=list)
    _apply_module: str | None = field(repr=False, default=None)
    _active: bool = field(repr=False, default=True)

    @property
    def active(self) -> bool:
        return self._active

    def undo(self) -> None:
        if not self._active:
            return
        base = self.model.base_model
        base.rotary_emb = self._rotary
        for name, value in self._saved.items():
            setattr(self._rotary, name, value)
        for hook in self._hooks:
            hook.remove()
        if self._apply_module:
            _unwrap_apply(self._apply_module)
        self._active = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.undo()


class PatchedRotary(nn.Module):
    """Stands where the model's rotary module stood; computes the method's frequencies, then calls the
    model's own rotary module so its cos/sin layout is kept."""

    def __init__(self, rotary: nn.Module, method: registry.Method, factor: float, options: dict,
                 bases: dict, xpos_layout: str | None):
        super().__init__()
        self.rotary = rotary
        self.method = method
        self.factor = factor
        self.options = options
        self.bases = bases
        self.xpos_layout = xpos_layout
        self.ropes: dict = {}  # layer type -> Rope (static methods; dynamic ones recompute per forward)
        self.hits = [0]  # xpos: apply_rotary_pos_emb calls that used this forward's k scaling
        self.patch: Patch | None = None

    def rope_for(self, layer_type, seq_len: int | None) -> Rope:
        if not self.method.dynamic and layer_type in self.ropes:
            return self.ropes[layer_type]
        base = self.bases[layer_type]
        if self.method.identity_at_one and self.factor == 1.0:
            rope = Rope(base.inv_freq, 1.0)
        else:
            rope = self.method(base, self.factor, seq_len=seq_len, **self.options)
        if not self.method.dynamic:
            self.ropes[layer_type] = rope
        return rope

    def install(self, layer_type, rope: Rope) -> None:
        prefix = f"{layer_type}_" if layer_type else ""
        buffer = getattr(self.rotary, f"{prefix}inv_freq")
        inv_freq = rope.inv_freq if rope.inv_freq is self.bases[layer_type].inv_freq else rope.inv_freq.to(
            buffer.device)
        setattr(self.rotary, f"{prefix}inv_freq", inv_freq)
        setattr(self.rotary, f"{prefix}attention_scaling", rope.attention_factor)

    def forward(self, x, position_ids, *args, **kwargs):
        layer_type = args[0] if args else kwargs.get("layer_type")
        rope = None
        if self.method.dynamic:
            rope = self.rope_for(layer_type, int(position_ids.max()) + 1)
            self.install(layer_type, rope)
        cos, sin = self.rotary(x, position_ids, *args, **kwargs)
        if self.xpos_layout is None:
            return cos, sin
        rope = rope or self.rope_for(layer_type, None)
        if rope.xpos_zeta is None or math.isinf(rope.xpos_scale_base):
            return cos, sin
        zeta = rope.xpos_zeta.to(cos.device)
        zeta = torch.cat((zeta, zeta)) if self.xpos_layout == "half" else zeta.repeat_interleave(2)
        exponent = (position_ids.to(torch.float32)[..., None] - rope.xpos_centre) / rope.xpos_scale_base
        scale_q = zeta ** exponent  # (batch, seq, rotary dims)
        scale_k = zeta ** -exponent
        cos_q, sin_q = (cos.float() * scale_q).to(cos.dtype), (sin.float() * scale_q).to(sin.dtype)
        cos_k, sin_k = (cos.float() * scale_k).to(cos.dtype), (sin.float() * scale_k).to(sin.dtype)
        _register_xpos_k(cos_q, cos_k, sin_k, self.hits)
        return cos_q, sin_q


def current(model: nn.Module) -> Patch | None:
    """The active patch of this model, or None."""
    rotary = getattr(getattr(model, "base_model", model), "rotary_emb", None)
    return getattr(rotary, "patch", None) if isinstance(rotary, PatchedRotary) else None


def length_dependent(model: nn.Module) -> bool:
    """True when the active method's frequencies depend on the current sequence length."""
    active = current(model)
    return bool(active and active.length_dependent)


def patch(model: nn.Module, method: str, factor: float = 1.0, **options) -> Patch:
    """Patch `model` in place with RoPE method `method` at scale `factor`; returns a handle with `.undo()`.
    Options: the method's own (see `describe(method)`) plus `original_max_position_embeddings`."""
    spec = registry.get(method)
    factor = registry.check_factor(spec, factor)
    options = registry.check_options(spec, dict(options))
    active = current(model)
    if active is not None:
        raise ExtendError(f"model is already patched with {active.method!r} — call .undo() on that patch "
                          f"(or leave its `with extend.patched(...)` block) before patching again")
    rotary = rotary_module(model)
    original = options.pop("original_max_position_embeddings", None)
    if original is not None and (isinstance(original, bool) or not isinstance(original, int) or original <= 0):
        raise ExtendError(f"original_max_position_embeddings must be a positive integer, got {original!r}")
    bases = rope_bases(model, rotary, original)
    dtype = next(model.parameters()).dtype
    handle = Patch(model, method, factor, dict(options, **({"original_max_position_embeddings": original}
                                                            if original else {})), spec.dynamic, rotary)
    wrapper = PatchedRotary(rotary, spec, factor, options, bases, None)
    # Validate by computing every layer type's frequencies before touching the model.
    ropes = {lt: wrapper.rope_for(lt, trained_context(model)) for lt in bases}
    uses_xpos = any(r.xpos_zeta is not None and not math.isinf(r.xpos_scale_base) for r in ropes.values())
    if uses_xpos:
        if dtype == torch.float16:
            raise ExtendError("xpos decays grow past fp16's range at long contexts — load the model in "
                              "float32 or bfloat16")
        wrapper.xpos_layout = _rotation_layout(rotary, bases, model)
        handle._apply_module = _apply_module(model)
    wrapper.patch = handle
    if spec.name != "plain":
        prefixes = [f"{lt}_" if lt else "" for lt in bases]
        names = [p + n for p in prefixes for n in ("inv_freq", "attention_scaling")]
        handle._saved = {n: getattr(rotary, n) for n in names if hasattr(rotary, n)}
        if "rope_type" in vars(rotary):
            handle._saved["rope_type"] = rotary.rope_type
            # The model's own dynamic/longrope update would overwrite our frequencies.
            rotary.rope_type = {lt: "default" for lt in rotary.rope_type} if isinstance(
                rotary.rope_type, dict) else "default"
        if not spec.dynamic:
            for lt, rope in ropes.items():
                wrapper.install(lt, rope)
    if handle._apply_module:
        _wrap_apply(handle._apply_module)
        handle._hooks = _xpos_guard(model, wrapper)
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


def _rotation_layout(rotary: nn.Module, bases: dict, model) -> str:
    """'half' (rotate_half: [x1.., x2..]) or 'interleaved' (Cohere: pairs adjacent), read off the module's
    own cos at position 1 — the frequencies are distinct, so the pattern is unambiguous."""
    lt = next(iter(bases))
    args = (lt,) if lt else ()
    probe = torch.ones(1, 1, 1, device=bases[lt].inv_freq.device)
    out = rotary(probe, torch.ones(1, 1, dtype=torch.long, device=probe.device), *args)
    if not (isinstance(out, tuple) and len(out) == 2 and out[0].shape[-1] == bases[lt].dim
            and not out[0].is_complex()):
        raise ExtendError(f"xpos is not supported for {family(model)}: its rotary module does not return "
                          f"(cos, sin) over the rotary dims")
    cos = out[0][0, 0]
    half = bases[lt].dim // 2
    if torch.equal(cos[:half], cos[half:]):
        return "half"
    if torch.equal(cos[0::2], cos[1::2]):
        return "interleaved"
    raise ExtendError(f"xpos is not supported for {family(model)}: unknown cos/sin layout")


def _apply_module(model: nn.Module) -> str:
    name = type(model.base_model).__module__
    if not hasattr(sys.modules.get(name), "apply_rotary_pos_emb"):
        raise ExtendError(f"xpos is not supported for {family(model)}: its modeling code has no "
                          f"apply_rotary_pos_emb to route q and k scalings through")
    return name


def _xpos_guard(model: nn.Module, wrapper: PatchedRotary) -> list:
    """Fail loudly if a forward ran without the family's attention picking up xpos's k scaling (a family
    that slices or copies cos/sin before applying them would otherwise silently get plain RoPE)."""

    def reset(module, args, kwargs):
        wrapper.hits[0] = 0

    def check(module, args, kwargs, output):
        if wrapper.hits[0] == 0:
            raise ExtendError(f"xpos is not supported for {family(model)}: its attention did not apply the "
                              f"patched rotary embedding")

    base = model.base_model
    return [base.register_forward_pre_hook(reset, with_kwargs=True),
            base.register_forward_hook(check, with_kwargs=True)]
