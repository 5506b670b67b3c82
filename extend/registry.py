"""Registry of RoPE methods: name -> a pure function (rope, factor, options) -> (inv_freq, attention_factor).

A method is one decorated function. Its keyword-only arguments (other than `factor` and `seq_len`) are its
options; their defaults are what `describe` reports. `dynamic=True` marks methods whose frequencies depend
on the current sequence length (they receive `seq_len`); such methods cannot share one forward across
lengths. Facts a caller needs without a model live here too: whether `factor` does anything with given options
(`Method.factor_applies`: plain ignores it, so a sweep runs it once), how far a method reaches
(`Method.reach`) and which options a patch always records, defaults included (`Method.record`: the rule a
dynamic method ran by). `check_method` checks a (method, factor, options) triple without a model.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

import torch

from .errors import ExtendError, closest

ENTRY_POINT_GROUP = "ropebench.methods"
# Options every method takes (handled by extend.patching; defaults in COMMON_DEFAULTS).
COMMON_DEFAULTS = {
    "original_max_position_embeddings": None,
    "start_from": "shipped",
    "layer_types": None,
    "temperature": None,
}
COMMON_OPTIONS = tuple(COMMON_DEFAULTS)


# Factors above this stretch a trained context past any runnable length and push float32 frequencies towards
# underflow (theta^-1 / s below float32's smallest normal for s ~ 1e30): a factor of 1e300 is a typo.
MAX_FACTOR = 1e6


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
        if rope.start is None or self.on_frequencies:
            out = self.fn(rope, factor=factor, **kwargs)
            out = out if isinstance(out, Rope) else Rope(*out)
        else:  # stack: the method's per-pair effect on theta's series, applied to the start frequencies
            geometric = rope.geometric()
            out = self.fn(dataclasses.replace(rope, inv_freq=geometric, start=None), factor=factor, **kwargs)
            out = out if isinstance(out, Rope) else Rope(*out)
            ratio = out.inv_freq.to(rope.inv_freq.device) / geometric
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
_entry_points_loaded = False


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


def _load_entry_points() -> None:
    """Installed packages contribute methods through the `ropebench.methods` entry-point group: the entry
    point names a module (importing it registers) or a function (registered under the entry point's name)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from . import load_builtin_methods  # the built-ins first (a plugin may replace one): `extend` is lazy

    load_builtin_methods()

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if callable(obj) and ep.name not in _REGISTRY:
            register(ep.name)(obj)


def methods() -> list[str]:
    """Sorted names of all registered methods."""
    _load_entry_points()
    return sorted(_REGISTRY)


def get(name: str) -> Method:
    _load_entry_points()
    if name not in _REGISTRY:
        raise ExtendError(f"unknown RoPE method {name!r} — {closest(name, _REGISTRY, 'methods')}")
    return _REGISTRY[name]


def describe(name: str) -> dict:
    """The method's documentation, options (with defaults; None marks a required option) and properties
    (`uses_factor`: whether the factor does anything with the default options)."""
    m = get(name)
    options = {k: (None if v is inspect.Parameter.empty else v) for k, v in m.options.items()}
    options.update(COMMON_DEFAULTS)  # None: resolved per model (trained context, extended layer types, ...)
    return {
        "name": m.name,
        "doc": m.doc,
        "options": options,
        "required": sorted(k for k, v in m.options.items() if v is inspect.Parameter.empty),
        "dynamic": m.dynamic,
        "min_factor": m.min_factor,
        "remap": m.remap,
        "uses_factor": m.factor_applies(),
    }


def check_factor(method: Method, factor) -> float:
    if isinstance(factor, bool) or not isinstance(factor, (int, float)):
        raise ExtendError(f"factor must be a number, got {factor!r} — pass e.g. factor=2.0")
    factor = float(factor)
    if not math.isfinite(factor) or factor <= 0:
        raise ExtendError(f"factor must be a finite number > 0, got {factor} — pass e.g. factor=2.0")
    if factor > MAX_FACTOR:
        raise ExtendError(
            f"factor {factor:g} of method {method.name!r} is beyond the supported maximum "
            f"{MAX_FACTOR:g} (its positions or frequencies would underflow) — use e.g. factor=2, 4 or 8"
        )
    if factor < method.min_factor:
        raise ExtendError(
            f"method {method.name!r} only extends context: factor must be >= {method.min_factor:g}, "
            f"got {factor:g} — use factors >= {method.min_factor:g} (or 'pi' to compress positions)"
        )
    return factor


def check_method(name: str, factor=1.0, options: dict | None = None) -> tuple[Method, float, dict]:
    """Everything about (method, factor, options) that is known without a model: the name, the factor against
    the method's range, the option names, required options and option value types. Raises ExtendError."""
    method = get(name)
    return method, check_factor(method, factor), check_options(method, dict(options or {}))


def check_options(method: Method, options: dict) -> dict:
    """The options, checked (names, required ones, value types), plus the method's `record` options at their
    defaults where not given: what a patch records says which rule ran."""
    known = set(method.options) | set(COMMON_OPTIONS)
    unknown = sorted(set(options) - known)
    if unknown:
        close = closest(unknown[0], known, "options") if len(unknown) == 1 else ""
        mean = f"{close} " if close.startswith("did you mean") else ""
        raise ExtendError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for method {method.name!r} — {mean}"
            f"valid options: {', '.join(sorted(known))}"
        )
    missing = sorted(
        k for k, v in method.options.items() if v is inspect.Parameter.empty and k not in options
    )
    if missing:
        raise ExtendError(
            f"method {method.name!r} needs option(s) {', '.join(missing)} (no default) — give "
            f"them, e.g. {missing[0]}=[...]"
        )
    for key, value in options.items():
        check_option_value(method, key, value)
    return {**{k: method.options[k] for k in method.record}, **options}


_KINDS = {float: "a number", int: "an integer", bool: "true or false", str: "a string", list: "a list"}


def _option_kinds(method: Method, key: str) -> tuple[set, bool] | None:
    """(accepted kinds among float/int/bool/str/list, None allowed) from the option's annotation, else its
    default; None when neither says (the method checks the value itself)."""
    try:
        hint = typing.get_type_hints(method.fn).get(key)
    except Exception:  # noqa: BLE001 - unresolvable annotations: fall back to the default's type
        hint = None
    default = method.options.get(key, inspect.Parameter.empty)
    if hint is None:
        if default is None or default is inspect.Parameter.empty:
            return None
        hint = list if isinstance(default, (list, tuple)) else type(default)
    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds, optional = set(), default is None
    for a in args:
        if a is type(None):
            optional = True
            continue
        origin = typing.get_origin(a) or a
        if origin in (list, tuple) or (
            isinstance(origin, type) and issubclass(origin, collections.abc.Sequence) and origin is not str
        ):
            kinds.add(list)
        elif origin in _KINDS:
            kinds.add(origin)
        else:
            return None  # a type we do not know how to check
    return (kinds, optional) if kinds else None


def check_option_value(method: Method, key: str, value) -> None:
    """The value of one option against the method's signature (annotation, else default type); one ExtendError
    naming the option, the value and an example. `original_max_position_embeddings` must be a positive
    integer."""
    if key in COMMON_OPTIONS and key != "original_max_position_embeddings":
        return  # start_from, layer_types, temperature: checked by extend.patching against the model
    if key in COMMON_OPTIONS:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ExtendError(
                f"option {key} of method {method.name!r} must be a positive integer (the trained "
                f"context in tokens), got {value!r} — e.g. {key}=8192, or leave it out to use the "
                f"model's own"
            )
        return
    found = _option_kinds(method, key)
    if found is None:
        return
    kinds, optional = found
    if value is None and optional:
        return
    _check_kind(method, key, value, kinds, optional)
    check_option_range(method, key, value)


def option_range(method: Method, key: str) -> Range | None:
    """The `Range` declared on an option's annotation (`Annotated[float, Range(gt=0)]`), else None."""
    try:
        hint = typing.get_type_hints(method.fn, include_extras=True).get(key)
    except Exception:  # noqa: BLE001 - unresolvable annotations: no declared range
        return None
    candidates = [hint, *typing.get_args(hint)]  # Annotated[...] itself, or inside Optional[Annotated[...]]
    for h in candidates:
        for extra in getattr(h, "__metadata__", ()):
            if isinstance(extra, Range):
                return extra
    return None


def check_option_range(method: Method, key: str, value) -> None:
    """A numeric option value against its declared Range: one ExtendError naming option, value and range."""
    rng = option_range(method, key)
    if rng is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    problem = rng.problem(value)
    if problem is not None:
        default = method.options.get(key)
        example = f"e.g. {key}={default!r}" if isinstance(default, (int, float)) else f"a value {problem}"
        why = f" ({rng.why})" if rng.why else ""
        raise ExtendError(
            f"option {key} of method {method.name!r} must be {problem}{why}, got {value!r} — use {example}"
        )


def _check_kind(method: Method, key: str, value, kinds: set, optional: bool) -> None:
    ok = (bool in kinds and isinstance(value, bool)) or (
        not isinstance(value, bool)
        and (
            (float in kinds and isinstance(value, (int, float)) and math.isfinite(value))
            or (int in kinds and isinstance(value, int))
            or (str in kinds and isinstance(value, str))
            or (list in kinds and isinstance(value, (list, tuple)))
        )
    )
    if not ok:
        want = " or ".join(_KINDS[k] for k in (float, int, bool, str, list) if k in kinds)
        if float in kinds and isinstance(value, float):
            want = "a finite number"
        default = method.options.get(key)
        example = (
            f" — e.g. {key}={default!r}"
            if default not in (None, inspect.Parameter.empty)
            else f" — pass {want}"
        )
        raise ExtendError(
            f"option {key} of method {method.name!r} must be {want}{' (or None)' if optional else ''}, "
            f"got {value!r} ({type(value).__name__}){example}"
        )
