"""Registry of RoPE methods: name -> a pure function (rope, factor, options) -> (inv_freq, attention_factor).
The declaration (`register`, `RopeBase`, `Rope`, `Range`, `Method`) lives in extend/method_spec.py, which the
method modules import; this module loads them (the built-ins, then entry points) and answers lookups.

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
import inspect
import math
import types
import typing
from importlib import import_module
from importlib.metadata import entry_points

from . import method_spec
from .errors import ExtendError, closest
from .method_spec import (  # noqa: F401  (re-exported: the registry's public names; _REGISTRY for tests)
    _REGISTRY,
    COMMON_DEFAULTS,
    COMMON_OPTIONS,
    Method,
    Range,
    Rope,
    RopeBase,
    check_output,
    register,
)

ENTRY_POINT_GROUP = "ropebench.methods"

# Factors above this stretch a trained context past any runnable length and push float32 frequencies towards
# underflow (theta^-1 / s below float32's smallest normal for s ~ 1e30): a factor of 1e300 is a typo.
MAX_FACTOR = 1e6

_entry_points_loaded = False


def load_builtin_methods() -> None:
    """Register the built-in methods (importing their modules registers them; once, then a no-op). They import
    only extend.method_spec, never this module: loading them is a call down, not a loop."""
    import_module(".frequency_methods", __package__)
    import_module(".remap", __package__)  # self-extend, rerope, dca


def _load_entry_points() -> None:
    """Installed packages contribute methods through the `ropebench.methods` entry-point group: the entry
    point names a module (importing it registers) or a function (registered under the entry point's name)."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    load_builtin_methods()  # the built-ins first (a plugin may replace one)

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        if callable(obj) and ep.name not in method_spec._REGISTRY:
            register(ep.name)(obj)


def methods() -> list[str]:
    """Sorted names of all registered methods."""
    _load_entry_points()
    return sorted(method_spec._REGISTRY)


def get(name: str) -> Method:
    _load_entry_points()
    registered = method_spec._REGISTRY  # read at each call: a test may swap in a copy
    if name not in registered:
        raise ExtendError(f"unknown RoPE method {name!r} — {closest(name, registered, 'methods')}")
    return registered[name]


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
                f"option {key} of method {method.name!r} must be a positive integer (the trained context in "
                f"tokens), got {value!r} — e.g. {key}=8192, or leave it out to use the model's own"
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
    for h in [hint, *typing.get_args(hint)]:  # Annotated[...] itself, or inside Optional[Annotated[...]]
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
        example = f" — pass {want}"
        if default not in (None, inspect.Parameter.empty):
            example = f" — e.g. {key}={default!r}"
        raise ExtendError(
            f"option {key} of method {method.name!r} must be {want}{' (or None)' if optional else ''}, "
            f"got {value!r} ({type(value).__name__}){example}"
        )
