"""What a loaded model ships: its RoPE per layer type (type, factor, theta), its pretraining context, the
context its shipped scaling reaches, each layer type's attention window, and its shipped frequencies computed
statelessly for a given length (transformers' own dynamic/longrope update depends on call history).

Two starting points ("start_from", recorded with every patch):
- "shipped" (default): methods start from the frequencies the model ships (wavelength rules count their
  rotations; per-pair factors multiply them: registry.Method.__call__) with L the context the shipped scaling
  reaches (max_position_embeddings when the config raises it above the
  pretraining context, else L_pretrained x factor); `plain` is the model unchanged (bit-identical).
- "pretrained": methods start from the unscaled theta and the pretraining context L (original_max_position_
  embeddings; else the family's published pretraining context, PRETRAINING_CONTEXT; for `linear` without
  either max_position_embeddings / factor; else max_position_embeddings). `plain` is then the pretrained RoPE:
  shipped scaling removed.
p-RoPE (`proportional`, Gemma 4) is how a model was pretrained, not a scaling: without a factor both starts
are the model as loaded; with one, "pretrained" is p-RoPE at factor 1. Its stopped pairs stay stopped under
every method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .errors import ExtendError

START_FROM = ("pretrained", "shipped")
DEFAULT_START_FROM = "shipped"  # the baseline is the model as loaded (registry.COMMON_DEFAULTS says the same)

# Published pretraining contexts of families whose configs ship scaling without
# original_max_position_embeddings (config.model_type -> tokens). Used only for scaled RoPE; unscaled RoPE's
# context is max_position_embeddings.
PRETRAINING_CONTEXT = {
    # Gemma 3 technical report (Gemma Team 2025, arXiv:2503.19786, "Long context"): pretrained on 32K
    # sequences, then the 4B/12B/27B models scaled to 128K (RoPE linear factor 8 on the global layers); their
    # configs say max_position_embeddings 131072 and nothing about the 32K.
    "gemma3_text": 32768,
}


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
    p_rope: float | None = None  # p of a shipped `proportional` (p-RoPE: pairs past floor(p d/2) stopped)

    @property
    def scaled(self) -> bool:
        """Does the model ship frequencies other than its pretrained ones? p-RoPE itself is how the model was
        pretrained (Gemma 4): `proportional` is scaled only with a factor other than 1."""
        if self.rope_type == "proportional":
            return self.factor not in (None, 1.0)
        return self.rope_type != "default"

    def pretrained_start(self) -> str | None:
        """RopeBase.start of the pretrained frequencies: None when they are theta's series, else what they are
        (p-RoPE's, whose stopped pairs stay stopped under every method)."""
        if self.p_rope is not None and self.p_rope < 1:  # some pairs stopped
            return f"proportional p={self.p_rope:g}"
        return None

    @property
    def length_dependent(self) -> bool:  # transformers updates these per forward (dynamic_rope_update)
        return "dynamic" in self.rope_type or self.rope_type == "longrope"

    def label(self) -> str:
        if self.rope_type == "proportional":
            scale = f" x{self.factor:g}" if self.scaled else ""
            return f"proportional p={self.p_rope if self.p_rope is not None else 1.0:g}{scale}"
        if not self.scaled:
            return "none"
        return f"{self.rope_type} x{self.factor:g}" if self.factor else self.rope_type


def rope_params(config, layer_type: str | None) -> dict | None:
    params = getattr(config, "rope_parameters", None) or {}
    return params.get(layer_type) if layer_type else params


def window_of(config, layer_type: str | None) -> int | None:
    """The attention span of a layer type: config.sliding_window for sliding layers, the chunk size for
    chunked ones, None (unbounded) for global layers and single-type rotary modules."""
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
    published = PRETRAINING_CONTEXT.get(getattr(config, "model_type", None))
    # p-RoPE without a factor is how the model was pretrained (Gemma 4), not a scaling
    unscaled = rope_type == "default" or (rope_type == "proportional" and factor in (None, 1, 1.0))
    if params.get("original_max_position_embeddings"):
        pretrained = int(params["original_max_position_embeddings"])
    elif published and not unscaled and published < max_positions:
        pretrained = published
    elif rope_type in ("linear", "proportional") and factor:  # linear fine-tunes often only raise
        pretrained = max(1, round(max_positions / float(factor)))  # max_position_embeddings
    else:
        pretrained = max_positions
    if unscaled:
        return pretrained, pretrained
    # A config that raises max_position_embeddings states the reach (Llama 3.1/3.2, Gemma3, Phi-3 128k);
    # one that keeps the pretraining value (Qwen2.5 + yarn) reaches pretrained x factor.
    if max_positions > pretrained or not factor:
        return pretrained, max_positions
    return pretrained, round(pretrained * float(factor))


def config_layer_types(config) -> list[str]:
    """Layer types with their own RoPE parameters (Gemma3, OLMo3: rope_parameters per layer type) that the
    model has (transformers builds buffers only for the types in config.layer_types), else []."""
    params = getattr(config, "rope_parameters", None) or {}
    if not params or not all(isinstance(v, dict) for v in params.values()):
        return []
    present = getattr(config, "layer_types", None)
    return sorted(lt for lt in params if not present or lt in present)


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
        out[lt] = Shipped(
            lt,
            rope_type,
            float(factor) if factor else None,
            float(params["rope_theta"]),
            pretrained,
            shipped,
            window_of(config, lt),
            float(params.get("partial_rotary_factor", 1.0)) if rope_type == "proportional" else None,
        )
    if not out:
        raise ExtendError(
            "the model's rotary module has no RoPE parameters (config.rope_parameters is empty)"
        )
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


def shipped_frequencies(
    rotary: nn.Module, info: Shipped, seq_len: int | None, original: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, float]:
    """The shipped (inv_freq, attention scaling) of one layer type for a forward of `seq_len` positions,
    computed from the length alone (no call history). `original`/`scaling`: the module's own buffers as they
    were before patching (its initial frequencies and attention scaling)."""
    if not info.length_dependent or seq_len is None:
        return original, float(scaling)
    longrope = info.rope_type == "longrope"
    # longrope: long factors beyond the pretraining context, short ones within; dynamic: unchanged up to
    # max_position_embeddings (transformers' original_max_seq_len), then rescaled
    if seq_len <= (info.pretrained_context if longrope else rotary.original_max_seq_len):
        return original, float(scaling)
    kwargs = {"layer_type": info.layer_type} if info.layer_type else {}
    fn = ROPE_INIT_FUNCTIONS[info.rope_type]
    inv_freq, attention = fn(rotary.config, original.device, seq_len=seq_len, **kwargs)
    return inv_freq.to(torch.float32), float(scaling if longrope else attention)


def pretrained_frequencies(theta: float, dim: int, device, p_rope: float | None = None) -> torch.Tensor:
    """The unscaled RoPE inverse frequencies theta^(-2i/d), computed as transformers' default rope does; with
    `p_rope` (a shipped `proportional`'s p) the pairs from int(p d/2) on are 0, as transformers' p-RoPE at
    factor 1 (the model was pretrained with them stopped: no method rebuilds their rotation)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if p_rope is not None:
        inv_freq[int(p_rope * dim // 2) :] = 0.0
    return inv_freq.to(device)


def rotary_fraction(config, params: dict) -> float:
    """The fraction of head_dim that carries RoPE: the layer type's (or config's) partial_rotary_factor — but
    not for `proportional`, whose partial_rotary_factor is p-RoPE's p (transformers' p-RoPE spans head_dim,
    the stopped pairs at frequency 0)."""
    if (params.get("rope_type") or params.get("type")) == "proportional":
        return 1.0
    return float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0) or 1.0))


def check_start_from(value) -> str:
    if value not in START_FROM:
        raise ExtendError(
            f"start_from must be 'shipped' (default: stack on the RoPE the model ships) or "
            f"'pretrained' (restart from the unscaled theta and pretraining context), got {value!r}"
        )
    return value
