"""Position-remapping methods: Self-Extend, ReRoPE (and leaky ReRoPE), Dual Chunk Attention.

The frequency methods (extend/frequency_methods.py) change RoPE's frequencies; these keep them and change
which position indices a (query, key) pair is rotated with. Each method is a pure function of the model's base
RoPE parameters (`RopeBase`: only the trained context c is used), `factor` and its options, returning a
`Remap`: a few `Piece`s that partition every query's keys. Within a piece, query i is rotated to
`query_position(i)` and key j to `key_position(j)`, so their logit sees the relative position
query_position(i) - key_position(j) (RoPE is relative). Positions are absolute token positions (0 = first
token); `keys(i)` gives the piece's keys of query i as the half-open interval [lo, hi) of positions.
extend/remap_attention.py evaluates this blockwise and merges the pieces through their log-sum-exp, so no
L x L matrix is ever built.

`factor` means the same as for the frequency methods where the method has such a knob, and none of these
methods depends on the sequence length (a position's logits depend on (i, j) only, so one forward serves
every prefix length):
- self-extend: the target context factor x c; the group size G is the smallest integer that keeps every
  relative position of factor x c tokens within the trained context (or give `group` and leave factor at 1).
- rerope: leaky ReRoPE's slope 1/k beyond the window, with k chosen so that factor x c tokens stay within the
  trained context (factor 1: k = 1, plain RoPE); `leaky=False` is ReRoPE proper (clipped; any length; factor
  must stay 1).
- dca: positional interpolation inside DCA (ChunkLlama's `scaling_factor`: every position index / factor);
  DCA itself works at any length.

Register your own with `@extend.register(name, remap=True)` on a function returning a `Remap`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import torch

from .errors import ExtendError
from .method_spec import Range, RopeBase, register

# Declared ranges (registry.check_options); the upper bound (below the trained context) needs the model.
Tokens = Annotated[int, Range(ge=1, why="a number of tokens")]
TokensOrZero = Annotated[int, Range(ge=0, why="a number of tokens")]

Positions = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class Piece:
    """Pairs (i, j) with lo(i) <= j < hi(i), rotated to query_position(i) and key_position(j). A position
    function of None means the plain position (no extra rotation)."""

    name: str
    query_position: Positions | None
    key_position: Positions | None
    keys: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]  # query positions -> (lo, hi)


@dataclass(frozen=True)
class Remap:
    """A method's position remapping. `plain_within`: sequences of at most this many tokens see plain RoPE
    (every pair falls in a plain piece), so the model's own attention runs unchanged (bit-identical)."""

    pieces: tuple[Piece, ...]
    plain_within: float
    resolved: dict  # what the method derived (group, window, ...), recorded with the patch

    def relative_positions(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Relative position of every (i, j) with j <= i (NaN elsewhere), float64 — for docs and debugging;
        the attention never builds it."""
        i, j = i.to(torch.float64)[:, None], j.to(torch.float64)[None, :]
        out = torch.full(torch.broadcast_shapes(i.shape, j.shape), math.nan, dtype=torch.float64)
        for piece in self.pieces:
            lo, hi = piece.keys(i.long())
            inside = (j >= lo) & (j < hi)
            q = piece.query_position(i) if piece.query_position else i
            k = piece.key_position(j) if piece.key_position else j
            out = torch.where(inside, (q - k).expand_as(out), out)
        return out


def _near(window: int) -> Piece:
    """Neighbour tokens (distance < window): plain positions."""
    return Piece("near", None, None, lambda p: ((p - window + 1).clamp(min=0), p + 1))


def _far_keys(window: int):
    return lambda p: (torch.zeros_like(p), (p - window + 1).clamp(min=0))


def _check_window(name: str, window, context: int, option: str = "window") -> int:
    if isinstance(window, bool) or not isinstance(window, int) or not 0 < window < context:
        raise ExtendError(
            f"{name}: {option} must be an integer in 1..{context - 1} (below the trained context "
            f"{context}), got {window!r} — e.g. {option}={context // 8}"
        )
    return window


def self_extend_group(factor: float, window: int, context: int) -> int:
    """Smallest group size G such that the largest grouped relative position of ceil(factor x c) tokens,
    (T - 1) // G + window - window // G, stays within the trained positions (<= c - 1)."""
    target = math.ceil(factor * context)
    for group in range(1, target + 1):
        if (target - 1) // group + window - window // group <= context - 1:
            return group
    raise ExtendError(
        f"self-extend: no group size reaches factor {factor:g} with window {window} — use a smaller window"
    )


def _self_extend_reach(factor: float, context: int, options: dict) -> float:
    """factor x c; with `group` G (factor 1) the largest T that self_extend_group's bound admits."""
    group = options["group"]
    if group is None:
        return factor * context
    window = context // 8 if options["window"] is None else options["window"]
    return group * (context - window + window // group)


@register(
    "self-extend",
    min_factor=1.0,
    remap=True,
    uses_factor=lambda o: o["group"] is None,
    reach=_self_extend_reach,
)
def self_extend(rope: RopeBase, *, factor: float, window: Tokens | None = None, group: Tokens | None = None):
    """Position remapping: grouped positions beyond a window.

    Formula: plain positions within `window` tokens (default L/8), grouped
    floor(i/G) + window - floor(window/G) vs floor(j/G) beyond; G from `factor` (reach s L) or `group`
    Reference: Jin et al. 2024, arXiv:2401.01325

    Self-Extend (Jin et al. 2024, "LLM Maybe LongLM", arXiv:2401.01325): neighbour attention with plain
    positions for keys within `window` tokens (i - j < window); beyond, grouped attention with positions
    floor(i / G) + window - floor(window / G) for the query and floor(j / G) for the key (the shift makes the
    two meet at the window's edge), as in the authors' `self_extend_patch`. `factor`: the context to reach,
    factor x c — G is the smallest group size that keeps every relative position of that many tokens within
    the trained context c (factor 1: G = 1, plain RoPE); or give `group` (then factor must be 1).
    Default window: c / 8. Not length-dependent."""
    context = rope.original_max_position_embeddings
    window = _check_window("self-extend", context // 8 if window is None else window, context)
    if group is not None:
        if isinstance(group, bool) or not isinstance(group, int) or group < 1:
            raise ExtendError(f"self-extend: group must be a positive integer, got {group!r} — e.g. group=4")
        if factor != 1.0:
            raise ExtendError(
                f"self-extend: give either factor (the group size is derived from it) or group, "
                f"not both — got factor={factor:g} and group={group}"
            )
    else:
        group = self_extend_group(factor, window, context)
    shift = window - window // group
    grouped = Piece(
        "grouped",
        lambda p: torch.div(p, group, rounding_mode="floor") + shift,
        lambda p: torch.div(p, group, rounding_mode="floor"),
        _far_keys(window),
    )
    return Remap(
        (_near(window), grouped), math.inf if group == 1 else window, {"window": window, "group": group}
    )


@register(
    "rerope",
    min_factor=1.0,
    remap=True,
    uses_factor=lambda o: bool(o["leaky"]),
    reach=lambda factor, context, o: factor * context if o["leaky"] else math.inf,
)
def rerope(rope: RopeBase, *, factor: float, window: Tokens | None = None, leaky: bool = True):
    """Position remapping: relative positions clipped (or leaky) beyond a window.

    Formula: relative positions clipped at `window` (default L/8; `leaky=False`, factor 1), or leaky:
    window + (i - j - window)/k beyond it, k chosen so s L stays within L
    Reference: Su 2023, kexue.fm/archives/9708

    ReRoPE (Su 2023, "Rectified Rotary Position Embeddings", kexue.fm/archives/9708): relative positions
    clipped at `window` — plain for i - j < window, `window` beyond (query at position window, key at 0).
    Leaky ReRoPE (leaky=True, default): beyond the window the relative position grows with slope 1/k,
    window + (i - j - window) / k (query at i / k + window (1 - 1 / k), key at j / k), with
    k = (factor c - 1 - window) / (c - 1 - window) so that factor x c tokens stay within the trained context
    c (factor 1: k = 1, plain RoPE). leaky=False is ReRoPE proper (works at any length; factor must be 1).
    Default window: c / 8. Not length-dependent."""
    context = rope.original_max_position_embeddings
    window = _check_window("rerope", context // 8 if window is None else window, context)
    if not isinstance(leaky, bool):
        raise ExtendError(f"rerope: leaky must be true or false, got {leaky!r}")
    if not leaky:
        if factor != 1.0:
            raise ExtendError(
                f"rerope with leaky=False (clipped positions) has no scale: it works at any length "
                f"— pass factor=1, or leaky=True to use factor {factor:g} as the target context"
            )
        far = Piece(
            "far",
            lambda p: torch.full_like(p, window, dtype=torch.float64),
            lambda p: torch.zeros_like(p, dtype=torch.float64),
            _far_keys(window),
        )
        return Remap((_near(window), far), window, {"window": window, "leaky": False})
    k = (factor * context - 1 - window) / (context - 1 - window)
    far = Piece(
        "far",
        lambda p: p.to(torch.float64) / k + window * (1 - 1 / k),
        lambda p: p.to(torch.float64) / k,
        _far_keys(window),
    )
    return Remap(
        (_near(window), far), math.inf if k == 1.0 else window, {"window": window, "leaky": True, "k": k}
    )


@register("dca", min_factor=1.0, remap=True, reach=lambda factor, context, o: math.inf)
def dca(
    rope: RopeBase,
    *,
    factor: float,
    chunk_size: Tokens | None = None,
    local_window: TokensOrZero | None = None,
):
    """Position remapping: Dual Chunk Attention.

    Formula: intra-, successive- and inter-chunk position indices (default `chunk_size` 3L/4, `local_window`
    L/16); `factor` interpolates positions inside DCA
    Reference: An et al. 2024, arXiv:2402.17463

    Dual Chunk Attention (An et al. 2024, arXiv:2402.17463; the authors' ChunkLlama code and option names):
    chunks of s = chunk_size - local_window tokens; every key at position j % s. A query i attends its own
    chunk at i % s (intra-chunk), the previous chunk at min(i % s + s, chunk_size) (successive-chunk: the
    first local_window positions keep their true distance), earlier chunks at min(2s - 1, chunk_size)
    (inter-chunk). No relative position exceeds chunk_size < c. Defaults: chunk_size 3c/4, local_window
    c/16 (ChunkLlama's). `factor`: positional interpolation inside DCA, every position index / factor
    (ChunkLlama's scaling_factor; factor 1 = DCA alone, which works at any length). Not length-dependent."""
    context = rope.original_max_position_embeddings
    chunk_size = _check_window(
        "dca", context * 3 // 4 if chunk_size is None else chunk_size, context, "chunk_size"
    )
    local_window = context // 16 if local_window is None else local_window
    if (
        isinstance(local_window, bool)
        or not isinstance(local_window, int)
        or not 0 <= local_window < chunk_size
    ):
        raise ExtendError(
            f"dca: local_window must be an integer in 0..chunk_size-1 ({chunk_size - 1}), got "
            f"{local_window!r} — e.g. local_window={max(1, context // 16)}"
        )
    s = chunk_size - local_window

    def within(p):
        return torch.remainder(p, s)

    def start(p):  # first position of p's chunk
        return p - within(p)

    def scaled(fn):
        return lambda p: fn(p).to(torch.float64) / factor

    key = scaled(within)
    intra = Piece("intra", scaled(within), key, lambda p: (start(p), p + 1))
    successive = Piece(
        "successive",
        scaled(lambda p: (within(p) + s).clamp(max=chunk_size)),
        key,
        lambda p: ((start(p) - s).clamp(min=0), start(p)),
    )
    inter = Piece(
        "inter",
        scaled(lambda p: torch.full_like(p, min(2 * s - 1, chunk_size))),
        key,
        lambda p: (torch.zeros_like(p), (start(p) - s).clamp(min=0)),
    )
    return Remap(
        (intra, successive, inter),
        s if factor == 1.0 else 0,
        {"chunk_size": chunk_size, "local_window": local_window},
    )
