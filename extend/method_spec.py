"""What a RoPE method is: its declaration (`register`), the model parameters it starts from (`RopeBase`),
what it returns (`Rope`) and the bounds of its options (`Range`). Method modules (frequency_methods, remap)
import only this; extend/registry.py loads them and answers lookups (get, methods, describe, checks), so no
module that defines methods imports the registry that loads it (no loop).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .errors import ExtendError

# Options every method takes (handled by extend.patching; defaults in COMMON_DEFAULTS).
COMMON_DEFAULTS = {
    "original_max_position_embeddings": None,
    "start_from": "shipped",
    "layer_types": None,
    "temperature": None,
}
COMMON_OPTIONS = tuple(COMMON_DEFAULTS)


@dataclass(frozen=True)
class Range:
    """The allowed values of a method option, declared on its annotation: `Annotated[float, Range(gt=0)]`.
    `check_options` checks it (so `extend.patch`, the sweep, the lm-eval model and `inspect` all refuse
    `beta_fast=-5` with the same line). Bounds are exclusive (gt/lt) or inclusive (ge/le); None =
    unbounded."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    why: str = ""  # what the bound means, e.g. "rotations must be positive"

    def problem(self, value) -> str | None:
        """None when `value` is within the range, else what it must be (e.g. "> 0")."""
        for bound, holds, sign in (
            (self.gt, lambda b: value > b, ">"),
            (self.ge, lambda b: value >= b, ">="),
            (self.lt, lambda b: value < b, "<"),
            (self.le, lambda b: value <= b, "<="),
        ):
            if bound is not None and not holds(bound):
                return f"{sign} {bound:g}"
        return None


@dataclass(frozen=True)
class RopeBase:
    """The model's own RoPE parameters that every method starts from (one per layer type)."""

    theta: float
    dim: int  # rotary dimensions (head_dim * partial_rotary_factor)
    head_dim: int
    original_max_position_embeddings: int  # trained context
    inv_freq: torch.Tensor  # the frequencies the method starts from, float32, shape (dim // 2,)
    partial_rotary_factor: float = 1.0
    # None: inv_freq is theta's series theta^(-2i/d) (transformers' default). Else what they are instead:
    # the frequencies the model ships, which a method starts from under start_from="shipped" (e.g.
    # "llama3 x8"), or p-RoPE's with stopped pairs ("proportional p=0.25"). See Method.__call__.
    start: str | None = None

    def geometric(self) -> torch.Tensor:
        """theta's series theta^(-2i/d), computed as transformers' default rope does: inv_freq when `start` is
        None."""
        if self.start is None:
            return self.inv_freq
        from .shipped import pretrained_frequencies  # imports transformers: only on this path

        return pretrained_frequencies(self.theta, self.dim, self.inv_freq.device)


@dataclass(frozen=True)
class Rope:
    """What a method returns. `xpos_*` are set only by methods that add an xPos-style decay."""

    inv_freq: torch.Tensor
    attention_factor: float = 1.0
    xpos_zeta: torch.Tensor | None = None  # per rotary pair, shape (dim // 2,)
    xpos_scale_base: float = math.inf  # exponent = (position - centre) / xpos_scale_base
    xpos_centre: float | None = None  # None: centred on the positions being run (see extend/xpos.py)


@dataclass(frozen=True)
class Method:
    name: str
    fn: Callable[..., Rope | tuple]
    dynamic: bool = False
    min_factor: float = 0.0  # factor must be > 0; methods that only extend need >= 1
    identity_at_one: bool = False  # factor 1 is mathematically the unpatched model
    options: dict = field(default_factory=dict)  # option -> default (inspect.Parameter.empty = required)
    doc: str = ""
    remap: bool = False  # position remapping (extend/remap.py): fn returns a remap.Remap, not frequencies
    # Whether factor changes anything: a bool, or options (defaults filled in) -> bool. See factor_applies.
    uses_factor: bool | Callable[[dict], bool] = True
    # (factor, trained context, options with defaults) -> the longest sequence the method is meant for;
    # None: factor x context (context alone where the factor does not apply). See reach.
    reach_fn: Callable[[float, int, dict], float] | None = None
    # Options recorded in every patch's options even when left at their default (see check_options): a default
    # that sources disagree on (dynamic-ntk's scale_rule) must be visible in each row.
    record: tuple[str, ...] = ()
    # True: the function computes from rope.inv_freq whatever they are (RopeBase.start), so its wavelength
    # rules (YaRN's ramp, llama3's bands) count rotations of the frequencies it starts from. False (a plugin's
    # default): it gets theta's series, and its per-pair ratio method(theta's)/theta's multiplies the start.
    on_frequencies: bool = False

    def __call__(self, rope: RopeBase, factor: float, seq_len: int | None = None, **options) -> Rope:
        kwargs = dict(self.options_with_defaults(), **options)
        if self.dynamic:
            kwargs["seq_len"] = seq_len
        # stack: the method's per-pair effect on theta's series, applied to the start frequencies
        stack = rope.start is not None and not self.on_frequencies
        base = dataclasses.replace(rope, inv_freq=rope.geometric(), start=None) if stack else rope
        out = self.fn(base, factor=factor, **kwargs)
        out = out if isinstance(out, Rope) else Rope(*out)
        if stack:
            ratio = out.inv_freq.to(rope.inv_freq.device) / base.inv_freq
            # a stopped pair (p-RoPE: 0) stays stopped
            stacked = torch.where(rope.inv_freq == 0, torch.zeros_like(ratio), rope.inv_freq * ratio)
            out = dataclasses.replace(out, inv_freq=stacked)
        check_output(self.name, rope, out.inv_freq)
        return out

    def options_with_defaults(self) -> dict:
        return {k: v for k, v in self.options.items() if v is not inspect.Parameter.empty}

    def factor_applies(self, options: dict | None = None) -> bool:
        """False when `factor` has no effect (plain; dynamic-ntk and dynamic-yarn with scale_rule="paper"), or
        must stay 1 with these options (self-extend with `group`, rerope with leaky=False): such a method runs
        once, at factor 1, in a sweep over factors."""
        if callable(self.uses_factor):
            return bool(self.uses_factor(dict(self.options_with_defaults(), **(options or {}))))
        return bool(self.uses_factor)

    def reach(self, factor: float, context: int, options: dict | None = None) -> float:
        """The longest sequence (tokens) the method is meant for at `factor` on a model trained on `context`
        tokens; math.inf for any length (e.g. dca). Past it a run extrapolates."""
        options = dict(self.options_with_defaults(), **(options or {}))
        if self.reach_fn is not None:
            return float(self.reach_fn(factor, context, options))
        return float(context * (factor if self.factor_applies(options) else 1.0))


def check_output(name: str, rope: RopeBase, inv_freq) -> None:
    """A method's inverse frequencies must be a floating-point tensor of rope.dim // 2 (the layer type's
    rotary dims / 2) finite, positive values; else one ExtendError naming the method (a bug in the method)."""
    want = rope.dim // 2
    if not isinstance(inv_freq, torch.Tensor):
        problem = f"a {type(inv_freq).__name__}, not a torch tensor"
    elif not inv_freq.is_floating_point():
        problem = f"dtype {inv_freq.dtype}, not a floating-point dtype"
    elif tuple(inv_freq.shape) != (want,):
        problem = f"shape {tuple(inv_freq.shape)}, not ({want},)"
    # 0 is a pair that does not rotate (p-RoPE, transformers' `proportional`): allowed
    elif inv_freq.device.type != "meta" and not bool((torch.isfinite(inv_freq) & (inv_freq >= 0)).all()):
        problem = "values that are not finite and non-negative"
    else:
        return
    raise ExtendError(
        f"method {name!r} returned inverse frequencies of {problem} — a bug in the method: it must return "
        f"{want} finite non-negative floats ({rope.dim} rotary dims / 2)"
    )


_REGISTRY: dict[str, Method] = {}


def register(
    name: str,
    *,
    dynamic: bool = False,
    min_factor: float = 0.0,
    identity_at_one: bool = False,
    replace: bool = False,
    remap: bool = False,
    uses_factor: bool | Callable[[dict], bool] = True,
    reach: Callable[[float, int, dict], float] | None = None,
    record: tuple[str, ...] = (),
    on_frequencies: bool = False,
):
    """Decorator: add a method. The function takes `(rope: RopeBase, *, factor, [seq_len], **options)` and
    returns `(inv_freq, attention_factor)` or a `Rope` — or, with `remap=True`, a `extend.remap.Remap` (the
    position indices each (query, key) pair sees; see extend/remap.py). Registering an existing name needs
    `replace=True`. `uses_factor=False` (or a function of the options) marks a method whose factor does
    nothing or must stay 1; `reach(factor, context, options)` overrides the default reach factor x context;
    `record` names options a patch records even at their default (e.g. a rule whose default differs between
    sources); `on_frequencies=True` says the function computes from `rope.inv_freq` whatever they are (the
    shipped frequencies under start_from="shipped", p-RoPE's): else it gets theta's series and its per-pair
    ratio multiplies the frequencies the patch starts from."""

    def decorate(fn):
        if not isinstance(name, str) or not name:
            raise ExtendError("a method name must be a non-empty string — pass e.g. @register('my-method')")
        if name in _REGISTRY and not replace:
            raise ExtendError(
                f"method {name!r} is already registered — pick another name or pass replace=True"
            )
        params = inspect.signature(fn).parameters
        if "factor" not in params:
            raise ExtendError(f"method {name!r}: the function must take a keyword argument 'factor'")
        if dynamic and "seq_len" not in params:
            raise ExtendError(f"method {name!r} is dynamic, so its function must take 'seq_len'")
        options = {
            k: p.default
            for k, p in params.items()
            if p.kind == p.KEYWORD_ONLY and k not in ("factor", "seq_len")
        }
        unknown = [k for k in record if options.get(k, inspect.Parameter.empty) is inspect.Parameter.empty]
        if unknown:
            raise ExtendError(
                f"method {name!r}: record={unknown} names no option with a default — record only "
                f"options of the function that have defaults"
            )
        _REGISTRY[name] = Method(
            name,
            fn,
            dynamic,
            min_factor,
            identity_at_one,
            options,
            inspect.cleandoc(fn.__doc__ or ""),
            remap,
            uses_factor,
            reach,
            tuple(record),
            bool(on_frequencies),
        )
        return fn

    return decorate
