"""Checks that need a model's config or tokenizer but not its weights: run by the sweep and the lm-eval model
before anything loads (`ropebench inspect` runs the same patch on the same skeleton).

- `check_on_config(config, method, factor, options)`: the patch itself, applied to a weightless skeleton of
  the model (extend.inspector.skeleton) and undone — start_from, temperature and layer_types against the
  model's layer types, longrope list lengths against its rotary pairs, windows against its trained context,
  llama3's frequency factors: every rule extend.patch enforces, with the same message.
- `config_of(spec)` / `tokenizer_of(spec)`: read once per process (a GGUF's from its cached snapshot when
  there is one).
"""

from __future__ import annotations

import functools

from .errors import ExtendError


@functools.lru_cache(maxsize=8)
def config_of(spec: str, trust_remote_code: bool = False):
    from .loading import load_config

    config = load_config(spec, trust_remote_code)
    text = getattr(config, "text_config", None) or config
    if not getattr(text, "num_hidden_layers", None) or not getattr(text, "hidden_size", None):
        raise ExtendError(
            f"the config of {spec!r} has no num_hidden_layers / hidden_size — not a decoder "
            f"config; pass a causal LM (saved with save_pretrained) or a .gguf file"
        )
    return config


@functools.lru_cache(maxsize=8)
def tokenizer_of(spec: str, trust_remote_code: bool = False):
    """The tokenizer `extend.load(spec)` would return, without the weights."""
    from transformers import AutoTokenizer

    from .loading import _from_files, check_model_spec

    spec = check_model_spec(spec)
    try:
        return _from_files(AutoTokenizer, spec, trust_remote_code)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise ExtendError(
            f"could not read the tokenizer of {spec!r}: {first} — check the model's tokenizer files"
        ) from e


_SKELETONS: dict[int, tuple] = {}  # id(config) -> (config, skeleton); configs are unhashable


def _skeleton(config):
    from .inspector import skeleton

    if id(config) not in _SKELETONS:
        _SKELETONS[id(config)] = (config, skeleton(config))
    return _SKELETONS[id(config)][1]


def context_in_force(config, method: str, factor: float = 1.0, options: dict | None = None) -> int | None:
    """The trained context the patch (method, factor, options) puts in force on the model `config` describes
    (it follows a forced original_max_position_embeddings and start_from; what key_tokens' evaluator "self"
    sees), from a weightless skeleton; None when the skeleton cannot be built (the load decides)."""
    from .patching import patch

    try:
        model = _skeleton(config)
    except Exception:  # noqa: BLE001 - as in check_on_config
        return None
    with patch(model, method, factor, **dict(options or {})) as handle:
        context = handle.options.get("trained_context")
    return int(context) if context else None


def check_on_config(config, method: str, factor: float = 1.0, options: dict | None = None) -> None:
    """Patch a weightless skeleton of the model `config` describes with (method, factor, options), then undo:
    raises the ExtendError extend.patch would raise on the loaded model."""
    from .patching import patch

    try:
        model = _skeleton(config)
    except Exception:  # noqa: BLE001 - a family transformers cannot build on the meta device: the load decides
        return
    try:
        patch(model, method, factor, **dict(options or {})).undo()
    except ExtendError as e:
        if " — " in str(e):
            raise
        raise ExtendError(
            f"{e} — fix the option (`ropebench inspect MODEL` shows the model's RoPE and layer types)"
        ) from None
