"""What RoPE theory predicts from the frequencies alone, to set beside what the tasks measure.

- Men et al. 2024, "Base of RoPE Bounds Context Length" (arXiv:2405.14591): attention can tell similar tokens
  from random ones at relative distance m only while B(m) = sum_i cos(m theta_i) >= 0. For theta_i = b^(-2i/d)
  the smallest base b with B(m) >= 0 for every m < L is the base's lower bound for context L
  (`base_lower_bound`; head_dim 128: 4k -> 2.7e4, 8k -> 8.4e4, 32k -> 6.4e5). For any frequencies, patched
  ones included, `men_reach` is the first distance where B(m) < 0: the context the criterion allows.
  Men et al. derive the bound for a base *trained* for a context; for patched frequencies the criterion is
  only a prediction.
- Liu et al. 2024, "Scaling Laws of RoPE-based Extrapolation" (arXiv:2310.05209): only the dimensions whose
  period 2 pi / theta_i fits in the training context T see every rotation in training; their count (in head
  dimensions, two per pair) is the critical dimension (`critical_dimension`; Llama-2: 92 of 128; SmolLM2-135M,
  b = 1e5, d = 64, T = 8192: 40). It is fixed by pretraining: a patch does not change which dimensions were
  trained. A setting that turns the model's RoPE into a base beta (`effective_base`; ntk x s:
  b s^(d/(d-2))) then extrapolates up to T_extra = 2 pi beta^(d_crit/d) (`extrapolation_bound`: the period,
  under the patched frequencies, of the first pair that did not turn fully in training; ntk x2 on SmolLM2:
  13104 tokens).
- YaRN (Peng et al. 2023, arXiv:2309.00071, eq. 17-18): the pairs between `beta_fast` and `beta_slow`
  rotations in the trained context are ramped (`yarn_ramp`).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

# B(m) >= 0 holds only in narrow windows of the base just above the bound (4k, head_dim 128: the first window
# is 0.08% wide), so the search steps the base by this relative amount: 4k gives 2.695e4, the paper's 2.7e4.
STEP = 2e-5
_CANDIDATES = (256, 2048)  # bases tried on one failing distance: 256 first (the passing one: 70th at median)
_BLOCK = 1024  # distances per vectorised step; a failing base usually fails early, so stop at the first block
_RECENT = 128  # failing distances re-checked first: most candidate bases fail at one of them
# Search no further: with theta_0 = 1 the sum is cos(m) + the other pairs, so dim 2 never passes, and a tiny
# dim passes only at bases far past any used (dim 8 at 4k: ~1e15). Beyond this `base_lower_bound` says inf.
MAX_BASE = 1e15
# The bound's search costs about (iterations x context x dim); at 32k and head_dim 128 it takes 11 s on one
# AVX2 core (AMD EPYC, 2026-11-29). Callers that run unasked (inspect, the sweep) compute it only up to this
# context; call base_lower_bound directly for more.
BOUND_MAX_CONTEXT = 32768


def _negative(angles: np.ndarray) -> np.ndarray:
    """sum_i cos(angles[m, i]) < 0 per row m, as float64 sums it; float32 cos (~10x faster) decides each row
    whose sum is further from 0 than its error (|x| 2^-24 per angle, ulps per cos, n^2 2^-24 per sum; x2)."""
    rough, n = np.cos(angles.astype(np.float32)).sum(axis=1), angles.shape[1]
    negative, unsure = rough < 0, np.abs(rough) <= (np.abs(angles).sum(axis=1) + n * n + 16 * n) * 2.0**-23
    negative[unsure] = np.cos(angles[unsure]).sum(axis=1) < 0
    return negative


def _first_negative(inv_freq: np.ndarray, limit: int) -> int | None:
    """The smallest distance m in [0, limit) with sum_i cos(m theta_i) < 0, or None."""
    for start in range(0, limit, _BLOCK):
        negative = np.flatnonzero(
            _negative(np.outer(np.arange(start, min(start + _BLOCK, limit), dtype=np.float64), inv_freq))
        )
        if negative.size:
            return start + int(negative[0])
    return None


def men_reach(inv_freq, limit: int) -> int:
    """Men et al.'s criterion for these frequencies: the first relative distance m with sum_i
    cos(m theta_i) < 0, i.e. the context the criterion allows; `limit` when it holds for every m < limit."""
    first = _first_negative(np.asarray(inv_freq, dtype=np.float64).ravel(), int(limit))
    return int(limit) if first is None else first


@lru_cache(maxsize=64)
def base_lower_bound(dim: int, context: int) -> float:
    """The smallest RoPE base b with sum_i cos(m b^(-2i/dim)) >= 0 for every m < context (Men et al. 2024), to
    a relative precision of STEP; inf when none up to MAX_BASE does. `dim` is the rotary dimension (head_dim
    for full rotary).

    The criterion is not monotone in b, so no bisection: starting from b = 2, find the first failing distance
    m, step b up on that one distance (O(dim) per candidate) until it passes, and repeat; distances that
    failed before are re-checked first, and only a base that passes them all gets the full
    O(context x dim) check."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 or dim % 2 or context < 1:
        raise ValueError(
            f"base_lower_bound needs an even integer dim >= 2 and context >= 1, got {dim}, {context}"
        )
    if dim == 2 and context > 2:  # cos(m) alone: negative at m = 2 whatever the base
        return math.inf
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    steps = (1 + STEP) ** np.arange(1, _CANDIDATES[-1] + 1)
    base, recent = 2.0, []
    while base <= MAX_BASE:
        bad = np.flatnonzero(_negative(np.outer(recent, base**-exponents))) if recent else []
        failing = recent[bad[0]] if len(bad) else None
        if failing is None:
            failing = _first_negative(base**-exponents, context)
            if failing is None:
                return float(base)
            recent = (recent + [failing])[-_RECENT:]
        while base <= MAX_BASE:  # the next base at which this distance passes
            for candidates in (base * steps[: _CANDIDATES[0]], base * steps[_CANDIDATES[0] :]):
                passing = np.flatnonzero(~_negative(failing * candidates[:, None] ** -exponents))
                if passing.size:
                    break
            if passing.size:
                base = candidates[passing[0]]
                break
            base = candidates[-1]
    return math.inf


def critical_dimension(inv_freq, trained_context: int) -> int:
    """Liu et al. 2024: the head dimensions (two per rotary pair) whose period 2 pi / theta_i is at most the
    training context, i.e. that saw a full rotation in training. For theta_i = b^(-2i/d) this is
    2 ceil((d/2) log_b(T / 2 pi)) (Llama-2, d=128, b=1e4, T=4096: 92)."""
    theta = np.asarray(inv_freq, dtype=np.float64)
    with np.errstate(divide="ignore"):  # a stopped pair (p-RoPE: theta 0) has an infinite period: not counted
        return 2 * int(np.count_nonzero(2 * math.pi / theta <= trained_context))


def extrapolation_bound(inv_freq, critical_dim: int) -> float:
    """Liu et al. 2024: T_extra = 2 pi beta^(d_crit/d) for frequencies beta^(-2i/d), i.e. the period
    2 pi / theta'_k of pair k = d_crit/2 (the first pair that did not turn fully in pretraining) under
    these (patched) frequencies: defined for any frequencies. inf when that pair is stopped (theta' = 0) or
    every pair is critical (nothing left to extrapolate on)."""
    theta = np.asarray(inv_freq, dtype=np.float64).ravel()
    k = int(critical_dim) // 2
    if k >= theta.size or theta[k] <= 0:
        return math.inf
    return float(2 * math.pi / theta[k])


def effective_base(inv_freq, critical_dim: int) -> float:
    """The RoPE base beta of these (patched) frequencies as Liu et al.'s T_extra = 2 pi beta^(d_crit/d) uses
    it: the base whose series beta^(-2i/d) turns pair k = d_crit/2 as these frequencies do,
    beta = theta'_k^(-d/(2k)). For theta's series the base itself, for ntk x s b s^(d/(d-2)) (exactly: every
    pair agrees); for other methods the base that gives the same T_extra. NaN when d_crit is 0 (no pair
    trained), inf when pair k is stopped or every pair is critical."""
    theta = np.asarray(inv_freq, dtype=np.float64).ravel()
    k = int(critical_dim) // 2
    if k == 0:
        return math.nan
    if k >= theta.size or theta[k] <= 0:
        return math.inf
    return float(theta[k] ** (-theta.size / k))


def yarn_ramp(
    base: float, dim: int, trained_context: int, beta_fast: float = 32.0, beta_slow: float = 1.0
) -> tuple[int, int]:
    """YaRN's ramp (pair indices, eq. 17-18): pairs below `low` turn more than beta_fast times in the trained
    context L (kept), above `high` fewer than beta_slow times (interpolated). Pair i turns L theta_i / 2 pi
    times, so the pair that turns r times is i(r) = dim ln(L / (2 pi r)) / (2 ln base);
    low = floor(i(beta_fast)), high = ceil(i(beta_slow)), clipped to the pairs [0, dim/2 - 1]."""

    def pair(rotations: float) -> float:
        return dim * math.log(trained_context / (2 * math.pi * rotations)) / (2 * math.log(base))

    return max(math.floor(pair(beta_fast)), 0), min(math.ceil(pair(beta_slow)), dim // 2 - 1)


def describe(
    inv_freq,
    *,
    theta: float,
    dim: int,
    trained_context: int,
    target: int | None = None,
    trained_inv_freq=None,
) -> str:
    """One line of what the theory predicts for these frequencies of a `dim`-dim rotary of base `theta`
    trained at `trained_context`, for contexts up to `target` (default: the trained context).
    `trained_inv_freq`: the frequencies the model was trained with, for a patched setting (`inv_freq` then
    the patched ones): Liu et al.'s d_crit comes from them, T_extra and the effective base from the patched
    ones. Without it (the model as it is) the line also gives the properties of the model and its context:
    Men et al.'s lower bound on the base of a model trained for that context, and YaRN's ramp."""
    target = int(target or trained_context)
    reach = men_reach(inv_freq, 4 * target)
    holds = f"every m < {4 * target}" if reach == 4 * target else f"m < {reach}"
    verdict = "meets" if reach >= target else "short of"
    critical = critical_dimension(inv_freq if trained_inv_freq is None else trained_inv_freq, trained_context)
    beta, bound = effective_base(inv_freq, critical), extrapolation_bound(inv_freq, critical)
    line = (
        f"theory: sum_i cos(m theta_i) >= 0 (Men et al.'s criterion) for {holds}, {verdict} {target}; "
        f"critical dimension d_crit (Liu et al., fixed by pretraining at {trained_context}) {critical} "
        f"of {dim}; effective base {beta:.3g}, extrapolation bound T_extra = 2 pi base^(d_crit/d) = "
        + (f"{bound:.0f} tokens" if math.isfinite(bound) else "unbounded")
    )
    if trained_inv_freq is not None:
        return line
    if trained_context > BOUND_MAX_CONTEXT:
        smallest = (
            f"not computed above {BOUND_MAX_CONTEXT} tokens "
            f"(extend.theory.base_lower_bound({dim}, {trained_context}))"
        )
    else:
        found = base_lower_bound(dim, trained_context)
        smallest = f"{found:.3g}" if math.isfinite(found) else f"above {MAX_BASE:.0e} (none found)"
    low, high = yarn_ramp(theta, dim, trained_context)
    return (
        f"{line}; lower bound on the base of a model trained for {trained_context} (Men et al.) {smallest} "
        f"(theta {theta:g}); YaRN ramp pairs {low}..{high}"
    )
