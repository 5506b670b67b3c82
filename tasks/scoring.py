"""Shared scoring: the decoder body once, then lm_head + cross-entropy in chunks of positions.

A full (length x vocab) logits tensor for a long window is the memory peak of naive evaluation
(8k tokens x 49k vocab x 4 bytes = 1.6 GB for a 135M model); scoring `chunk_size` positions at a time
bounds it to (chunk_size x vocab). Logits are computed in the model's dtype, the loss in float32.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from .errors import TaskError


def body(model):
    """The decoder without its LM head (returns last_hidden_state after the final norm)."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        raise TaskError(f"{type(model).__name__} has no separate decoder body (model.base_model) — "
                        "pass a *ForCausalLM model")
    return base


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """Float32 logits for some hidden states, with the family's logit post-processing."""
    logits = model.get_output_embeddings()(hidden).float()
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    # Families that post-process logits in their ForCausalLM.forward; we bypass that forward.
    if getattr(config, "logit_scale", None):  # Cohere
        logits = logits * config.logit_scale
    if getattr(config, "logits_scaling", None):  # Granite
        logits = logits / config.logits_scaling
    cap = getattr(config, "final_logit_softcapping", None)  # Gemma2/3
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def device_of(model) -> torch.device:
    return model.get_input_embeddings().weight.device


@torch.inference_mode()
def token_nll(model, input_ids, *, start: int = 1, chunk_size: int = 1024) -> torch.Tensor:
    """Negative log-likelihood (float32, on CPU) of tokens input_ids[start:], each given its prefix.

    One forward of the decoder body over the whole window; the LM head only ever sees
    `chunk_size` positions at once."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1).to(device_of(model))
    if not 1 <= start < ids.shape[1]:
        raise TaskError(f"nothing to score: start={start} for a window of {ids.shape[1]} tokens")
    if chunk_size < 1:
        raise TaskError(f"chunk_size must be positive, got {chunk_size}")
    hidden = body(model)(input_ids=ids, use_cache=False).last_hidden_state
    targets = ids[0, start:]
    out = torch.empty(targets.shape[0], dtype=torch.float32)
    for i in range(0, targets.shape[0], chunk_size):
        j = min(i + chunk_size, targets.shape[0])
        logits = head_logits(model, hidden[0, start - 1 + i:start - 1 + j])
        out[i:j] = F.cross_entropy(logits, targets[i:j], reduction="none").cpu()
        del logits
    return out


@torch.inference_mode()
def continuation_logprobs(model, prefix_ids, continuations: list[list[int]]) -> list[torch.Tensor]:
    """Per-token log-probabilities of each continuation after one shared prefix.

    The prefix runs once (KV cache kept); each continuation then runs on that cache, which is
    cropped back to the prefix afterwards — so K labels cost one long forward, not K."""
    if not continuations or any(len(c) == 0 for c in continuations):
        raise TaskError("every continuation needs at least one token")
    dev = device_of(model)
    ids = torch.as_tensor(prefix_ids, dtype=torch.long).reshape(1, -1).to(dev)
    out = body(model)(input_ids=ids, use_cache=True)
    cache = out.past_key_values
    # Full-attention layers can be cropped back to the prefix; sliding-window layers drop old keys
    # as they go, so for those each continuation runs on a copy instead.
    croppable = all(type(layer).__name__ == "DynamicLayer" for layer in getattr(cache, "layers", [None]))
    first = torch.log_softmax(head_logits(model, out.last_hidden_state[0, -1:]), -1)[0]
    results = []
    for cont in continuations:
        lp = [first[cont[0]].item()]
        if len(cont) > 1:
            rest = torch.tensor([cont[:-1]], dtype=torch.long, device=dev)
            past = cache if croppable else copy.deepcopy(cache)
            h = body(model)(input_ids=rest, past_key_values=past, use_cache=True).last_hidden_state
            logp = torch.log_softmax(head_logits(model, h[0]), -1)
            lp += logp[torch.arange(len(cont) - 1), torch.tensor(cont[1:], device=dev)].tolist()
            if croppable:
                cache.crop(-(len(cont) - 1))
        results.append(torch.tensor(lp))
    return results
