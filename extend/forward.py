"""A causal LM run in pieces: the decoder body, then the LM head only where logits are needed.

Scoring code (the suites' perplexity, the lm-eval model's loglikelihood, the prefix cache) calls the body and
the head separately so a long window never holds (length x vocab) logits; these helpers give each family's
pieces, including the logit post-processing its ForCausalLM.forward would apply.
"""
from __future__ import annotations

import torch

from .errors import ExtendError


def body(model):
    """The decoder without its LM head (returns last_hidden_state after the final norm)."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise ExtendError(f"{type(model).__name__} has no separate decoder body (model.base_model) — "
                          "pass a *ForCausalLM model")
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


def device_of(model) -> torch.device:
    return model.get_input_embeddings().weight.device
