"""How much memory a forward at length L needs, from the model config alone, and whether it fits here.

The estimate (bytes) adds what a long forward holds at its peak:
- weights: embedding (+ LM head unless tied) and per layer attention + gated MLP projections;
- KV cache: layers x 2 x kv heads x head_dim x L (generation and the prefix cache keep it);
- activations of one layer: residual stream, q/k/v and the MLP's three projections for L positions;
- attention: eager attention builds heads x L x L scores (and a float L x L mask), and softmaxes them in
  float32 (transformers' eager_attention_forward, on every device); sdpa gets an L x L mask (a boolean one
  and, measured on CPU, a float copy; CUDA's kernels convert a boolean mask to a float one too) where the
  model has sliding-window layers shorter than L (plain causal sdpa needs no mask, so no L x L: CUDA's flash
  and memory-efficient kernels, CPU's flash kernel); position-remapping methods attend blockwise (no L x L
  either; off the CPU their float32 math path holds a query block x L score tile and its weights,
  extend/remap_attention.py's attention_with_lse);
- logits: the tasks score `chunk` positions x vocabulary at a time (float32).
It is an order-of-magnitude guard (tests/extend/test_refuse_before_load.py compares it with a measured peak):
a sweep that cannot fit is refused before the weights load, with the estimate and the largest length that
fits.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from .errors import ExtendError

GB = 1024**3
LOGIT_CHUNK = 1024  # positions per LM-head call in the tasks (perplexity chunk_size default)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
REMAP_BLOCK = 512  # queries per block of the remap attention (remap_attention.QUERY_BLOCK is this)


@dataclass(frozen=True)
class Estimate:
    length: int
    parts: dict  # name -> bytes

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v / GB:.1f}" for k, v in self.parts.items() if v >= 0.05 * GB)
        return f"about {self.total / GB:.1f} GB ({shown or 'all parts below 0.1 GB'})"


def _int(config, *names, default=0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def _needs_mask(config, length: int) -> bool:
    """sdpa gets an explicit L x L mask when some layer attends through a window shorter than L."""
    window = _int(config, "sliding_window", "attention_chunk_size")
    types = getattr(config, "layer_types", None) or []
    windowed = bool(window) and (not types or any("sliding" in t or "chunk" in t for t in types))
    return windowed and length > window


def estimate(
    config,
    length: int,
    *,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    blockwise: bool = False,
    device: str | None = None,
    kv_cache: bool = True,
) -> Estimate:
    """Peak memory of one forward of `length` tokens (see the module docstring). `blockwise`: the attention of
    a position-remapping method (no L x L matrix). `device`: where it runs (None: the CPU). `kv_cache`: the
    forward keeps its keys and values (generation, the prefix cache; the default, as the sweep's tasks do);
    False for a bare scoring pass such as the perplexity task's (`use_cache=False`)."""
    c = getattr(config, "text_config", None) or config  # the decoder's (Gemma3's multimodal config nests it)
    size = DTYPE_BYTES.get(str(dtype).removeprefix("torch."), 4)
    hidden = _int(c, "hidden_size", "n_embd", "d_model")
    layers = _int(c, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(c, "num_attention_heads", "n_head", default=1)
    kv_heads = _int(c, "num_key_value_heads", default=heads)
    head_dim = _int(c, "head_dim", default=hidden // max(heads, 1))
    inter = _int(c, "intermediate_size", "n_inner", default=4 * hidden)
    vocab = _int(c, "vocab_size")
    tied = bool(getattr(c, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))
    attn_params = hidden * head_dim * (2 * heads + 2 * kv_heads)
    weights = (vocab * hidden * (1 if tied else 2) + layers * (attn_params + 3 * hidden * inter)) * size
    kv = layers * 2 * kv_heads * head_dim * length * size if kv_cache else 0
    activations = length * (4 * hidden + 2 * (heads + 2 * kv_heads) * head_dim + 3 * inter) * size
    square = length * length
    if blockwise:
        # the CPU flash kernel holds nothing L-sized; the float32 math path elsewhere, scores + weights of a
        # query block against every key
        attention = 0 if str(device or "cpu") == "cpu" else 2 * heads * REMAP_BLOCK * length * 4
    elif attn_implementation == "eager":
        # scores + their softmax per head (the softmax in float32, cast back), and a float mask
        attention = square * (heads * (2 * size + 4) + size)
    else:
        # a boolean mask, and sdpa's float copy of it on CPU (measured: ~5 bytes per pair, 2-layer model)
        attention = 5 * square if _needs_mask(c, length) else 0
    logits = 2 * min(length, LOGIT_CHUNK) * vocab * 4
    return Estimate(
        length,
        {
            "weights": weights,
            "KV cache": kv,
            "activations": activations,
            "attention mask/scores": attention,
            "logits": logits,
        },
    )


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_room() -> int | None:
    """What a cgroup memory limit leaves (v2, then v1); None without one."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            with open(limit_file) as f:
                limit = f.read().strip()
            with open(usage_file) as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            return max(0, int(limit) - usage)
    return None


def available(device: str | None = None) -> int | None:
    """Bytes free for a model on `device` (a GPU's free memory; on a CPU the smaller of MemAvailable and a
    cgroup limit's room); None where this cannot be read (then nothing is refused)."""
    override = os.environ.get("ROPEBENCH_MEMORY_GB")  # e.g. a shared machine's fair share
    if override:
        try:
            budget = float(override)
        except ValueError:
            budget = math.nan
        if not (math.isfinite(budget) and budget > 0):  # inf, nan, 0 or below: no budget a run can use
            raise ExtendError(
                f"ROPEBENCH_MEMORY_GB={override!r} is not a positive number of GB — set it to e.g. 16, or "
                f"unset it"
            )
        return int(budget * GB)
    if str(device or "").startswith("cuda"):
        try:
            import torch

            index = int(str(device).partition(":")[2] or 0)
            return int(torch.cuda.mem_get_info(index)[0])
        except Exception:  # noqa: BLE001 - no usable CUDA query: do not guess
            return None
    if str(device or "cpu") != "cpu":
        return None
    found = [x for x in (_meminfo_available(), _cgroup_room()) if x is not None]
    return min(found) if found else None


def largest_fitting(config, room: int, **kwargs) -> int:
    """The largest length whose estimate fits in `room` bytes (0 when not even one token fits)."""
    lo, hi = 0, 1
    while estimate(config, hi, **kwargs).total <= room and hi < 1 << 40:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if estimate(config, mid, **kwargs).total <= room else (lo, mid)
    return lo


def check_fits(config, length: int, *, model: str, device: str | None = None, **kwargs) -> None:
    """ExtendError when a forward of `length` tokens cannot fit in this machine's free memory: the estimate,
    what is free, and the largest length that fits."""
    room = available(device)
    if room is None:
        return
    need = estimate(config, length, device=device, **kwargs)
    if need.total <= room:
        return
    fits = largest_fitting(config, room, device=device, **kwargs)
    raise ExtendError(
        f"length {length} on {model} needs {need.describe()} but {room / GB:.1f} GB is free on "
        f"{device or 'cpu'} — use lengths <= {fits} (the largest that fits), or a machine with more memory"
    )
