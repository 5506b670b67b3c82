"""What a loaded model ships: its RoPE per layer type (type, factor, theta), its pretraining context, the
context its shipped scaling reaches, each layer type's attention window, and its shipped frequencies computed
statelessly for a given length (transformers' own dynamic/longrope update depends on call history).

Two starting points ("start_from", recorded with every patch):
- "pretrained": methods start from the unscaled theta and the pretraining context L (original_max_position_
  embeddings; for `linear` without it max_position_embeddings / factor; else max_position_embeddings).
  `plain` is then the pretrained RoPE: shipped scaling removed.
- "shipped": methods stack on what the model ships (their effect multiplies the shipped frequencies) with L the
  context the shipped scaling reaches (max(max_position_embeddings, L_pretrained x factor)); `plain` is the model
  unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .errors import ExtendError

START_FROM = ("pretrained", "shipped")


@dataclass(frozen=True)
class Shipped:
    """One layer type's RoPE as the model ships it."""

    layer_type: str | None
    rope_type: str  # "default" when the model ships no scaling
    factor: float | None
    theta: float
    pretrained_context: int
    shipped_context: int
    window: int | None  # attention window of this layer type (None: global attention)

    @property
    def scaled(self) -> bool:
        return self.rope_type != "default"

    @property
    def length_dependent(self) -> bool:  # transformers updates these per forward (dynamic_rope_update)
        return "dynamic" in self.rope_type or self.rope_type == "longrope"

    def label(self) -> str:
        if not self.scaled:
            return "none"
        return f"{self.rope_type} x{self.factor:g}" if self.factor else self.rope_type


def rope_params(config, layer_type: str | None) -> dict | None:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get(layer_type) if layer_type else params


def window_of(config, layer_type: str | None) -> int | None:
    """The attention span of a layer type: config.sliding_window for sliding layers, the chunk size for chunked
    ones, None (unbounded) for global layers and single-type rotary modules."""
    if not layer_type:
        return None
    if "sliding" in layer_type:
        window = getattr(config, "sliding_window", None)
    elif "chunk" in layer_type:
        window = getattr(config, "attention_chunk_size", None)
    else:
        return None
    return int(window) if window else None


def _contexts(config, params: dict) -> tuple[int, int]:
    """(pretraining context, context the shipped scaling reaches) from one layer type's parameters."""
    max_positions = int(config.max_position_embeddings)
    rope_type = params.get("rope_type", "default")
    factor = params.get("factor")
    if params.get("original_max_position_embeddings"):
        pretrained = int(params["original_max_position_embeddings"])
    elif rope_type == "linear" and factor:  # linear fine-tunes often only raise max_position_embeddings
        pretrained = max(1, round(max_positions / float(factor)))
    else:
        pretrained = max_positions
    if rope_type == "default":
        return pretrained, pretrained
    shipped = max(max_positions, round(pretrained * float(factor))) if factor else max_positions
    return pretrained, shipped


def config_layer_types(config) -> list[str]:
    """Layer types with their own RoPE parameters (Gemma3, OLMo3: rope_parameters per layer type), else []."""
    params = getattr(config, "rope_parameters", None) or {}
    return sorted(params) if params and all(isinstance(v, dict) for v in params.values()) else []


def shipped_ropes(config) -> dict[str | None, Shipped]:
    """Per layer type (key None for single-type models) what the model ships, from its config alone."""
    out = {}
    for lt in config_layer_types(config) or [None]:
        params = rope_params(config, lt)
        if params is None:
            continue
        rope_type = params.get("rope_type") or params.get("type") or "default"
        factor = params.get("factor")
        pretrained, shipped = _contexts(config, dict(params, rope_type=rope_type))
        out[lt] = Shipped(lt, rope_type, float(factor) if factor else None, float(params["rope_theta"]), pretrained,
                          shipped, window_of(config, lt))
    if not out:
        raise ExtendError("the model's rotary module has no RoPE parameters (config.rope_parameters is empty)")
    return out


def global_type(shipped: dict[str | None, Shipped]) -> str | None:
    """The layer type whose parameters define the trained context: the first one with global attention."""
    return next((lt for lt, s in shipped.items() if s.window is None), next(iter(shipped)))


def context_for(shipped: dict[str | None, Shipped], start_from: str) -> int:
    info = shipped[global_type(shipped)]
    return info.pretrained_context if start_from == "pretrained" else info.shipped_context


def default_extended(shipped: dict[str | None, Shipped], context: int) -> list:
    """Layer types whose attention span can exceed the trained context (sliding layers whose window is below
    it never see a longer distance, so they keep their frequencies — as transformers' own Gemma3 scaling)."""
    return [lt for lt, s in shipped.items() if s.window is None or s.window > context]


def shipped_frequencies(rotary: nn.Module, info: Shipped, seq_len: int | None, original: torch.Tensor,
                        scaling: float) -> tuple[torch.Tensor, float]:
    """The shipped (inv_freq, attention scaling) of one layer type for a forward of `seq_len` positions,
    computed from the length alone (no call history). `original`/`scaling`: the module's own buffers as they
    were before patching (its initial frequencies and attention scaling)."""
    if not info.length_dependent or seq_len is None:
        return original, float(scaling)
    kwargs = {"layer_type": info.layer_type} if info.layer_type else {}
    fn = ROPE_INIT_FUNCTIONS[info.rope_type]
    if info.rope_type == "longrope":  # long factors beyond the pretraining context, short ones within
        if seq_len <= info.pretrained_context:
            return original, float(scaling)
        inv_freq, _ = fn(rotary.config, original.device, seq_len=seq_len, **kwargs)
        return inv_freq.to(torch.float32), float(scaling)
    # dynamic: unchanged up to max_position_embeddings (transformers' original_max_seq_len), then rescaled
    if seq_len <= rotary.original_max_seq_len:
        return original, float(scaling)
    inv_freq, attention = fn(rotary.config, original.device, seq_len=seq_len, **kwargs)
    return inv_freq.to(torch.float32), float(attention)


def pretrained_frequencies(theta: float, dim: int, device) -> torch.Tensor:
    """The unscaled RoPE inverse frequencies theta^(-2i/d), computed as transformers' default rope does."""
    return (1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))).to(device)


def check_start_from(value) -> str:
    if value not in START_FROM:
        raise ExtendError(f"start_from must be 'pretrained' (restart from the unscaled theta and pretraining "
                          f"context) or 'shipped' (stack on the model's shipped RoPE scaling), got {value!r}")
    return value
