"""Which model families the patcher supports, and how it finds their rotary embedding.

Every RoPE decoder in transformers 5.x has one rotary module at `model.base_model.rotary_emb`, called once
per forward; its (cos, sin) go to every layer. We only swap its inverse-frequency buffers and attention
scaling (and, for a temperature on every logit, the attention modules' `scaling`), then let the family's own
forward compute cos/sin — so the family's layout (half rotation, interleaved, partial rotary dims,
per-layer-type frequencies) is respected without knowing it.
"""

from __future__ import annotations

from torch import nn

from .errors import ExtendError

# Families tested with tiny random models in tests/extend/test_families.py (config.model_type values).
TESTED_FAMILIES = (
    "cohere",
    "gemma",
    "gemma2",
    "gemma3_text",
    "gpt_neox",
    "llama",
    "mistral",
    "olmo2",
    "olmo3",
    "phi",
    "phi3",
    "qwen2",
    "qwen3",
    "stablelm",
)
# Families known to use another rotary layout that swapping frequencies does not cover.
UNSUPPORTED_FAMILIES = {
    "llama4_text": (
        "its rotary embedding returns complex freqs_cis and its attention mixes chunked/NoPE layers"
    ),
}


def family(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__


def rotary_module(model: nn.Module) -> nn.Module:
    """The model's single rotary module, or ExtendError naming the family when there is none we support."""
    name = family(model)
    if name in UNSUPPORTED_FAMILIES:
        raise ExtendError(
            f"not supported: {name} ({UNSUPPORTED_FAMILIES[name]}) — supported families: "
            f"{', '.join(TESTED_FAMILIES)}"
        )
    base = getattr(model, "base_model", model)
    rotary = getattr(base, "rotary_emb", None)
    if not isinstance(rotary, nn.Module):
        raise ExtendError(
            f"model family {name!r} has no rotary position embedding (model.base_model.rotary_emb) "
            f"— ropebench patches RoPE decoders such as {', '.join(TESTED_FAMILIES[:6])}, ..."
        )
    if not layer_types(rotary) and not hasattr(rotary, "inv_freq"):
        raise ExtendError(
            f"not supported: {name} — its rotary module {type(rotary).__name__} has no inv_freq "
            f"buffer to rescale"
        )
    return rotary


def layer_types(rotary: nn.Module) -> list[str]:
    """Layer types of a per-layer-type rotary module (Gemma3, OLMo3: `{layer_type}_inv_freq`), else []."""
    rope_type = getattr(rotary, "rope_type", None)
    return sorted(rope_type) if isinstance(rope_type, dict) else []
