"""A causal LM run in pieces: the decoder body, then the LM head only where logits are needed.

Scoring code (the tasks' perplexity, the lm-eval model's loglikelihood, the prefix cache) calls the body and
the head separately so a long window never holds (length x vocab) logits; these helpers give each family's
pieces, including the logit post-processing its ForCausalLM.forward would apply. `with_cache` passes a KV
cache under the keyword the installed transformers expects.
"""

from __future__ import annotations

import inspect

import torch

from .errors import ExtendError


def body(model):
    """The decoder without its LM head (returns last_hidden_state after the final norm)."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise ExtendError(
            f"{type(model).__name__} has no separate decoder body (model.base_model) — "
            "pass a *ForCausalLM model"
        )
    return base


def logit_postprocess(model):
    """The family's logit post-processing (logits -> logits, in their dtype), which its ForCausalLM.forward
    applies and which we bypass by calling the LM head directly."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    scale = getattr(config, "logit_scale", None)  # Cohere
    divisor = getattr(config, "logits_scaling", None)  # Granite
    cap = getattr(config, "final_logit_softcapping", None)  # Gemma2/3

    def apply(logits: torch.Tensor) -> torch.Tensor:
        if scale:
            logits = logits * scale
        if divisor:
            logits = logits / divisor
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return apply


# The keywords a forward takes its KV cache under: transformers 5.24 renamed `past_key_values` (<= 5.23) to
# `cache`; 5.24 still accepts the old name, with a FutureWarning on every call.
CACHE_KEYWORDS = ("cache", "past_key_values")


def cache_keyword(module) -> str:
    """The keyword `module`'s forward (a causal LM or its body; `generate` follows its model) takes a KV cache
    under: `cache` where its signature has it (transformers >= 5.24), else `past_key_values`."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


def with_cache(module, cache) -> dict:
    """Keyword arguments that pass KV cache `cache` to `module(...)` or `module.generate(...)` under the name
    the installed transformers expects, so no version prints a deprecation warning."""
    return {cache_keyword(module): cache}


def passed_cache(args, kwargs):
    """The KV cache a forward call received (under either keyword, or positionally), or None."""
    for name in CACHE_KEYWORDS:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return next((a for a in args if hasattr(a, "get_seq_length")), None)


def device_of(model) -> torch.device:
    return model.get_input_embeddings().weight.device
