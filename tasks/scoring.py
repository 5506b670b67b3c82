"""Shared scoring: the decoder body once, then lm_head + cross-entropy in chunks of positions.

A full (length x vocab) logits tensor for a long window is the memory peak of naive evaluation
(8k tokens x 49k vocab x 4 bytes = 1.6 GB for a 135M model); scoring `chunk_size` positions at a time
bounds it to (chunk_size x vocab). Logits are computed in the model's dtype, the loss in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The model-execution pieces live in the core (the lm-eval model uses them too); importable from here as
# before.
from ropebench.extend.forward import body, device_of, logit_postprocess, with_cache
from ropebench.extend.prefix_cache import PrefixCache, native_gqa

from .errors import TaskError


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """Float32 logits for some hidden states, with the family's logit post-processing."""
    return logit_postprocess(model)(model.get_output_embeddings()(hidden).float())


# Bytes of float32 logits per cross-entropy call. The upcast, log-softmax and gather of a few-MB block stay in
# the CPU cache; over a whole chunk (1024 x 49k x 4 B = 200 MB) each of them streams through memory, which
# made the loss cost as much as the LM head itself. Row-wise, so the result is bit-identical
# (benchmarks/NOTES.md).
LOSS_BLOCK_BYTES = 8 * 2**20


@torch.inference_mode()
def token_nll(model, input_ids, *, start: int = 1, chunk_size: int = 1024) -> torch.Tensor:
    """Negative log-likelihood (float32, on CPU) of tokens input_ids[start:], each given its prefix.

    One forward of the decoder body over the whole window; the LM head only ever sees
    `chunk_size` positions at once, and the float32 loss a cache-sized block of those."""
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(1, -1).to(device_of(model))
    if not 1 <= start < ids.shape[1]:
        raise TaskError(f"nothing to score: start={start} for a window of {ids.shape[1]} tokens")
    if chunk_size < 1:
        raise TaskError(f"chunk_size must be positive, got {chunk_size}")
    hidden = body(model)(input_ids=ids, use_cache=False).last_hidden_state
    return nll_from_hidden(model, hidden[0, start - 1 : -1], ids[0, start:], chunk_size=chunk_size).cpu()


def nll_from_hidden(
    model, hidden: torch.Tensor, targets: torch.Tensor, *, chunk_size: int = 1024
) -> torch.Tensor:
    """Float32 NLL of targets[i] given the final hidden state hidden[i] (on the model's device): the LM head
    on `chunk_size` rows at a time (model dtype), the float32 loss on a cache-sized block of those."""
    head, postprocess = model.get_output_embeddings(), logit_postprocess(model)
    out = torch.empty(targets.shape[0], dtype=torch.float32, device=hidden.device)
    for i in range(0, targets.shape[0], chunk_size):
        logits = head(hidden[i : i + chunk_size])
        block = max(1, LOSS_BLOCK_BYTES // (4 * logits.shape[-1]))
        for k in range(0, logits.shape[0], block):
            part = logits[k : k + block]
            rows = slice(i + k, i + k + part.shape[0])
            out[rows] = F.cross_entropy(postprocess(part.float()), targets[rows], reduction="none")
        del logits
    return out


@torch.inference_mode()
def continuation_logprobs(
    model, prefix_ids, continuations: list[list[int]], *, prefix_cache=None
) -> list[torch.Tensor]:
    """Per-token log-probabilities of each continuation after one shared prefix.

    The prefix runs once (KV cache kept); each continuation then runs on that cache, which is
    cropped back to the prefix afterwards — so K labels cost one long forward, not K. With a
    `extend.prefix_cache.PrefixCache`, the part of the prefix it shares with the previous prompt is not
    rerun."""
    if not continuations or any(len(c) == 0 for c in continuations):
        raise TaskError("every continuation needs at least one token")
    dev = device_of(model)
    cache = prefix_cache if prefix_cache is not None else PrefixCache(model, share=False)
    hidden, _ = cache.prefill(prefix_ids)
    first = torch.log_softmax(head_logits(model, hidden[-1:]), -1)[0]
    results = []
    for cont in continuations:
        lp = [first[cont[0]].item()]
        if len(cont) > 1:
            rest = torch.tensor([cont[:-1]], dtype=torch.long, device=dev)
            with native_gqa(model):
                decoder = body(model)
                h = decoder(
                    input_ids=rest, use_cache=True, **with_cache(decoder, cache.cache)
                ).last_hidden_state
            logp = torch.log_softmax(head_logits(model, h[0]), -1)
            lp += logp[torch.arange(len(cont) - 1), torch.tensor(cont[1:], device=dev)].tolist()
            cache.settle()  # back to the prefix (every layer of the prefix cache can be cropped)
        results.append(torch.tensor(lp))
    return results
