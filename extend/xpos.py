"""xPos plumbing: q and k need different scalings (zeta^(+(m-c)/scale_base) and zeta^(-(n-c)/scale_base)) but
a family's `apply_rotary_pos_emb` takes one (cos, sin). The patched rotary module returns q's (cos, sin) and
registers k's under the id of that cos tensor; the family's `apply_rotary_pos_emb` is wrapped to look them up
(and falls through for every other call, so unpatched models in the same process are unaffected). The wrapper
is a process-wide change (extend/scoped.py): recorded on each xpos patch, removed when the last one of the
family is undone.

Range: zeta^x must stay a normal float32/bfloat16 number (|x ln zeta| <= EXPONENT_LIMIT, with headroom for the
size of q and k themselves). That bounds two things: the distance of every position from the centre (q and k),
and the span of the positions one forward runs — its attention scores every (query m, key n) pair, q.k ~
zeta^((m-n)/sb), and eager attention (or SDPA given a mask) also computes the masked future pairs n > m, which
grow instead of decay and would overflow to inf and NaN. `check_span` raises ExtendError naming the bound
instead of letting inf/NaN through, so xPos is finite under every attention implementation.
"""

from __future__ import annotations

import functools
import math
import sys
import weakref

import torch
from torch import nn

from .errors import ExtendError
from .families import family
from .scoped import Change, Shared

EXPONENT_LIMIT = 80.0  # e^80 ~ 5.5e34: float32/bf16 overflow at e^88.7 leaves ~6000x for |q|, |k|

# id(q's cos) -> (weakref to that cos, k's cos, k's sin, hit counter); entries vanish with the cos.
_XPOS_K: dict[int, tuple] = {}
# family module name -> its wrapped apply_rotary_pos_emb, held by the active xpos patches of that family
APPLY_WRAPPED = Shared()


def max_offset(zeta: torch.Tensor, scale_base: float) -> float:
    """Largest distance (position - centre, or between a query and a key of one forward) whose scaling stays
    representable."""
    return EXPONENT_LIMIT * scale_base / abs(math.log(float(zeta.min())))


def check_span(
    low: int, high: int, centre: float, zeta: torch.Tensor, scale_base: float, fixed: bool
) -> None:
    """ExtendError unless one forward over positions low..high with this centre stays finite: q and k within
    max_offset of the centre, and every (query, key) pair of the forward, masked ones included, within
    max_offset of each other."""
    limit = max_offset(zeta, scale_base)
    if high - low > limit:
        raise ExtendError(
            f"xpos (scale_base {scale_base:g} after the factor) keeps every q.k finite (masked pairs "
            f"included) only for positions at most {int(limit)} apart in one forward; positions "
            f"{low}..{high} go beyond — use shorter lengths, a larger factor or scale_base"
        )
    if max(centre - low, high - centre) > limit:
        hint = "" if fixed else ", or run the whole call inside extend.fixed_length(model, total_length)"
        raise ExtendError(
            f"xpos (scale_base {scale_base:g} after the factor) keeps q and k finite at most "
            f"{int(limit)} positions from its centre; positions {low}..{high} with centre {centre:g} "
            f"go beyond — use shorter lengths, a larger factor or scale_base{hint}"
        )


def scale_cos_sin(cos, sin, position_ids, zeta, scale_base: float, centre: float, layout: str, hits: list):
    """q's (cos, sin); k's are registered for the wrapped apply_rotary_pos_emb."""
    zeta = zeta.to(cos.device)
    zeta = torch.cat((zeta, zeta)) if layout == "half" else zeta.repeat_interleave(2)
    exponent = (position_ids.to(torch.float32)[..., None] - centre) / scale_base
    scale_q = zeta**exponent  # (batch, seq, rotary dims)
    scale_k = zeta**-exponent
    cos_q, sin_q = (cos.float() * scale_q).to(cos.dtype), (sin.float() * scale_q).to(sin.dtype)
    cos_k, sin_k = (cos.float() * scale_k).to(cos.dtype), (sin.float() * scale_k).to(sin.dtype)
    key = id(cos_q)
    _XPOS_K[key] = (weakref.ref(cos_q, lambda _, key=key: _XPOS_K.pop(key, None)), cos_k, sin_k, hits)
    return cos_q, sin_q


def wrap_apply(module_name: str) -> Change:
    """Wrap the family module's `apply_rotary_pos_emb` to apply xPos's k scaling (see the module docstring);
    the returned Change, recorded on the patch, releases it. One wrapper per family module, shared by every
    xpos patch of that family and removed with the last one; calls it does not recognise go to the
    original."""

    def install():
        module = sys.modules[module_name]
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
        return functools.partial(setattr, module, "apply_rotary_pos_emb", original)

    return Change(
        f"{module_name}.apply_rotary_pos_emb",
        "wrapped to give k its own xPos scaling; shared by the xpos patches of this family, other calls "
        "go to the original unchanged",
        APPLY_WRAPPED.acquire(module_name, install),
    )


def rotation_layout(rotary: nn.Module, bases: dict, model) -> str:
    """'half' (rotate_half: [x1.., x2..]) or 'interleaved' (Cohere: pairs adjacent), read off the module's
    own cos at position 1 — the frequencies are distinct, so the pattern is unambiguous."""
    lt = next(iter(bases))
    args = (lt,) if lt else ()
    probe = torch.ones(1, 1, 1, device=bases[lt].inv_freq.device)
    out = rotary(probe, torch.ones(1, 1, dtype=torch.long, device=probe.device), *args)
    if not (
        isinstance(out, tuple)
        and len(out) == 2
        and out[0].shape[-1] == bases[lt].dim
        and not out[0].is_complex()
    ):
        raise ExtendError(
            f"xpos is not supported for {family(model)}: its rotary module does not return "
            f"(cos, sin) over the rotary dims"
        )
    cos = out[0][0, 0]
    half = bases[lt].dim // 2
    if torch.equal(cos[:half], cos[half:]):
        return "half"
    if torch.equal(cos[0::2], cos[1::2]):
        return "interleaved"
    raise ExtendError(f"xpos is not supported for {family(model)}: unknown cos/sin layout")


def apply_module(model: nn.Module) -> str:
    name = type(model.base_model).__module__
    if not hasattr(sys.modules.get(name), "apply_rotary_pos_emb"):
        raise ExtendError(
            f"xpos is not supported for {family(model)}: its modeling code has no "
            f"apply_rotary_pos_emb to route q and k scalings through"
        )
    return name


def guard(model: nn.Module, hits: list) -> list:
    """Fail loudly if a forward ran without the family's attention picking up xpos's k scaling (a family
    that slices or copies cos/sin before applying them would otherwise silently get plain RoPE)."""

    def reset(module, args, kwargs):
        hits[0] = 0

    def check(module, args, kwargs, output):
        if hits[0] == 0:
            raise ExtendError(
                f"xpos is not supported for {family(model)}: its attention did not apply the "
                f"patched rotary embedding"
            )

    base = model.base_model
    return [
        base.register_forward_pre_hook(reset, with_kwargs=True),
        base.register_forward_hook(check, with_kwargs=True),
    ]
