"""ropebench core: a registry of RoPE context-extension methods that patch a loaded Hugging Face decoder
in place (and undo cleanly), plus model loading.

    model, tok = extend.load("smollm2-135m")
    with extend.patched(model, "yarn", factor=2):
        with extend.fixed_length(model, prompt_len + new_tokens):   # one set of frequencies per call
            ...
    print(extend.inspect(model, "yarn", factor=2))                  # what the patch changes, per layer type

The names load on first use (PEP 562), so `ropebench.extend.errors` (the error classes every layer shares) and
`ropebench.results` stay free of torch and transformers; the first use of a name registers the built-in
methods.
"""

# One copy of each module: this folder is package `ropebench.extend` (pyproject's package-dir);
# imported under its folder name it would be a second module tree, invisible to the sweep (docs/layout.md).
if __name__ != "ropebench.extend":
    raise ImportError(
        f"{__name__!r} is the folder of `ropebench.extend`: write `from ropebench import extend`"
    )

from importlib import import_module
from typing import Any

from .errors import ExtendError, RopebenchError

# name -> the submodule that defines it
_LAZY = {
    "TESTED_FAMILIES": "families",
    "UNSUPPORTED_FAMILIES": "families",
    "inspect": "inspector",
    "ALIASES": "loading",
    "embedded_gguf": "loading",
    "load": "loading",
    "Patch": "patching",
    "current": "patching",
    "fixed_length": "patching",
    "length_dependent": "patching",
    "patch": "patching",
    "patched": "patching",
    "trained_context": "patching",
    "Rope": "registry",
    "RopeBase": "registry",
    "describe": "registry",
    "methods": "registry",
    "register": "registry",
}

__all__ = [
    "ALIASES",
    "TESTED_FAMILIES",
    "UNSUPPORTED_FAMILIES",
    "ExtendError",
    "Patch",
    "Rope",
    "RopeBase",
    "RopebenchError",
    "current",
    "describe",
    "embedded_gguf",
    "fixed_length",
    "inspect",
    "length_dependent",
    "load",
    "methods",
    "patch",
    "patched",
    "register",
    "trained_context",
]  # every name above


def load_builtin_methods() -> None:
    """Register the built-in methods (once; then a no-op): the registry loads them."""
    import_module(".registry", __name__).load_builtin_methods()


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # dunder probes (copy, pickle, doctest) are not names of ours
        raise AttributeError(f"module 'extend' has no attribute {name!r}")
    load_builtin_methods()  # every name below serves the registered methods
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value  # cache: later lookups skip __getattr__
        return value
    # a submodule used as an attribute (`extend.loading.gguf_snapshot`) after `from ropebench import extend`
    try:
        return import_module(f".{name}", __name__)
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":
            raise
    raise AttributeError(f"module 'extend' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
