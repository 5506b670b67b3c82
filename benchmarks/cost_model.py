"""Arithmetic on measured forward times, shared by the report's analysis and the prefix-sharing section: pure
functions, no model.

A forward of L tokens is modelled as t(L) = a L + b L^2: the linear layers grow with L, causal attention with
L^2. The fit runs on the per-length forward times of the run itself, so the shares it gives are this run's,
not a profile of another run (benchmarks/probes/profile_forward.py measures the attention kernel directly).
"""

from __future__ import annotations


def quadratic_fit(times: dict[int, float]) -> tuple[float, float] | None:
    """(a, b) of t(L) = a L + b L^2, least squares on the relative error (so 1k counts as much as 16k), both
    kept >= 0; None with fewer than two lengths."""
    points = [(n, t) for n, t in sorted(times.items()) if t and t > 0]
    if len(points) < 2:
        return None
    u = [n / t for n, t in points]  # dividing each equation by t(L) makes the residual relative
    v = [n * n / t for n, t in points]
    suu, svv = sum(x * x for x in u), sum(x * x for x in v)
    suv, su, sv = sum(x * y for x, y in zip(u, v)), sum(u), sum(v)
    det = suu * svv - suv * suv
    a, b = ((su * svv - sv * suv) / det, (suu * sv - suv * su) / det) if det else (-1.0, -1.0)
    if b < 0 or det == 0:
        return su / suu, 0.0
    if a < 0:
        return 0.0, sv / svv
    return a, b


def quadratic_share(fit: tuple[float, float] | None, length: int) -> float | None:
    """The L^2 (attention) term's share of t(length) under the fit."""
    if fit is None:
        return None
    a, b = fit
    return b * length * length / (a * length + b * length * length)


def one_pass_bound(lengths: list[int], share: float) -> float:
    """The best one-pass / per-length ratio over `lengths` when the quadratic term is `share` of the longest
    forward: t(max) / sum t(L), every t(L) scaled down from t(max) by the model above."""
    top = max(lengths)
    linear = sum(n / top for n in lengths)
    square = sum((n / top) ** 2 for n in lengths)
    return 1 / ((1 - share) * linear + share * square)


def max_share_for(lengths: list[int], target: float) -> float:
    """The largest quadratic share of the longest forward that still lets one pass reach `target`
    (negative: not even a linear-cost model reaches it at these lengths)."""
    top = max(lengths)
    linear = sum(n / top for n in lengths)
    square = sum((n / top) ** 2 for n in lengths)
    if linear == square:  # a single length: the ratio is 1 whatever the share
        return 1.0 if target >= 1 else -1.0
    return (linear - 1 / target) / (linear - square)


def rolling_windows(window: int, text_tokens: int) -> tuple[int, int]:
    """(ropebench's, lm-eval's) window count for a text of `text_tokens` tokens: ropebench puts BOS + W-1 new
    tokens in each window (the last aligned to the end), lm-eval W new tokens per window."""
    width = window - 1
    return len(range(0, max(text_tokens - width, 0), width)) + 1, -(-text_tokens // window)
