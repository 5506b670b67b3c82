"""ropebench core: a registry of RoPE context-extension methods that patch a loaded Hugging Face decoder
in place (and undo cleanly), plus model loading.

    model, tok = extend.load("smollm2-135m")
    with extend.patched(model, "yarn", factor=2):
        with extend.fixed_length(model, prompt_len + new_tokens):   # one set of frequencies per call
            ...
    print(extend.inspect(model, "yarn", factor=2))                  # what the patch changes, per layer type
"""

from . import frequency_methods as _frequency_methods  # noqa: F401  (registers the frequency methods)
from . import remap as _remap_methods  # noqa: F401  (registers self-extend, rerope, dca)
from .errors import ExtendError, RopebenchError
from .families import TESTED_FAMILIES, UNSUPPORTED_FAMILIES
from .inspector import inspect
from .loading import ALIASES, embedded_gguf, load
from .patching import Patch, current, fixed_length, length_dependent, patch, patched, trained_context
from .registry import Rope, RopeBase, describe, methods, register

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
]
