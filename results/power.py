"""What an unmarked comparison could have marked: the smallest true difference a paired test marks with
probability ``POWER`` at the comparison's n and observed spread, on the estimate's own scale.

"No mark" is not "no difference": with 6 haystacks the exact sign-flip test marks only when all 6 agree. Each
paired test of :mod:`results.stats` gets the difference at which it reaches 80% power, assuming the units'
contrasts are normal with the observed spread (plug-in): the paired t by its noncentral-t solution (computed,
not approximated; nothing below ``MIN_INFORMATIVE_PAIRS`` units); over clusters the larger of that and the
difference at which the sign-flip test's necessary condition (at most k - 6 of the k contrasts on the
minority side: p >= 2^(m+1) / 2^k) holds with probability 0.8; McNemar, the difference at which 6 or more of
the n pairs change, all one way. The last two are lower bounds (the power of both tests together is at most
either's); fewer than 6 clusters can mark nothing (the smallest exact p is 2 / 2^k). docs/results.md,
"Power", states it for the reader.

:func:`results.stats.paired_power` gives a comparison's power at its own estimate, as bounds (what a
headline states for the effect it claims). Pure numpy and math (no scipy); tests/results/test_power.py
checks both by simulation.
"""

from __future__ import annotations

import functools
import math

import numpy as np

POWER = 0.8
ALPHA = 0.05
# the fewest units (pairs, clusters) that must differ before an exact two-sided test can reach p < ALPHA
MIN_DIFFERING = 6


def _phi(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF, elementwise (math.erfc: exact to double precision)."""
    return 0.5 * np.vectorize(math.erfc, otypes=[float])(-np.asarray(x, float) / math.sqrt(2))


def _crossing(f, target: float, lo: float, hi: float, steps: int) -> float:
    """Where the increasing function ``f`` reaches ``target`` in [lo, hi], by ``steps`` bisections."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@functools.lru_cache(maxsize=256)
def _chi_grid(dof: float) -> tuple[np.ndarray, np.ndarray]:
    """sqrt(V / dof) on a grid over log V (V ~ chi-square with ``dof`` degrees of freedom) and each point's
    probability weight (trapezoid rule on the density of log V, normalised)."""
    y = np.linspace(math.log(1e-14), math.log(dof + 60 * math.sqrt(2 * dof) + 60), 6000)
    v = np.exp(y)
    log_density = (dof / 2) * np.log(v) - v / 2 - (dof / 2) * math.log(2) - math.lgamma(dof / 2)  # of log V
    weight = np.exp(log_density)
    weight[[0, -1]] /= 2
    return np.sqrt(v / dof), weight / weight.sum()


def t_power(ncp: float, dof: float, crit: float) -> float:
    """P(|T| > crit) for T noncentral t with ``dof`` degrees of freedom and noncentrality ``ncp``."""
    u, w = _chi_grid(float(dof))
    return float((w * (_phi(ncp - crit * u) + _phi(-ncp - crit * u))).sum())


@functools.lru_cache(maxsize=1024)
def t_ncp(dof: float, crit: float, power: float = POWER) -> float:
    """The noncentrality at which the two-sided t test (|T| > crit) rejects with probability ``power``."""
    return _crossing(lambda x: t_power(x, dof, crit), power, 0.0, crit + 10.0, 60)


def _binom_cdf(k: int, n: int, q: float) -> float:
    """P(Binomial(n, q) <= k)."""
    if k < 0:
        return 0.0
    return float(sum(math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(min(k, n) + 1)))


def sign_power(shift_over_sd: float, k: int) -> float:
    """An upper bound of the sign-flip test's power at k clusters whose contrasts are normal with mean
    ``shift_over_sd`` standard deviations: the probability that at most k - 6 of them take one sign (the
    test's necessary condition for p < 0.05, either direction)."""
    if k < MIN_DIFFERING:
        return 0.0
    q = float(_phi(-abs(shift_over_sd)))  # a contrast's chance of the sign against the shift
    few_against = _binom_cdf(k - MIN_DIFFERING, k, q)
    few_for = 1 - _binom_cdf(MIN_DIFFERING - 1, k, q)  # at most k - 6 on the shift's side
    both = max(0.0, _binom_cdf(k - MIN_DIFFERING, k, q) - _binom_cdf(MIN_DIFFERING - 1, k, q))
    return min(1.0, few_against + few_for - both)


@functools.lru_cache(maxsize=256)
def sign_shift(k: int, power: float = POWER) -> float:
    """The shift (in the contrasts' standard deviations) at which :func:`sign_power` reaches ``power``."""
    return _crossing(lambda x: sign_power(x, k), power, 0.0, 40.0, 80)


def mcnemar_power(delta: float, n: int) -> float:
    """An upper bound of the exact McNemar test's power at n pairs and a true difference ``delta`` of the
    rates: every change one way, so the discordant count is Binomial(n, |delta|) and p < 0.05 needs >= 6."""
    if n < MIN_DIFFERING:
        return 0.0
    return 1 - _binom_cdf(MIN_DIFFERING - 1, n, min(1.0, abs(delta)))


@functools.lru_cache(maxsize=256)
def mcnemar_delta(n: int, power: float = POWER) -> float:
    """The difference of two paired rates at which :func:`mcnemar_power` reaches ``power`` (nan below 6
    pairs or where no difference reaches it)."""
    if n < MIN_DIFFERING or mcnemar_power(1.0, n) < power:
        return math.nan
    return _crossing(lambda x: mcnemar_power(x, n), power, 0.0, 1.0, 60)


def exact_floor(k: int) -> float:
    """The smallest two-sided p an exact sign test (sign-flip, McNemar) can reach with k differing units."""
    return min(1.0, 2 / 2**k) if k > 0 else 1.0


def detectable_t(se: float, dof: float, crit: float, power: float = POWER) -> float:
    """The true difference a t interval with standard error ``se`` on ``dof`` degrees of freedom (quantile
    ``crit``) excludes from 0 with probability ``power``."""
    if not (se > 0 and math.isfinite(se) and dof >= 1):
        return math.nan
    return t_ncp(float(dof), float(crit), power) * se


def detectable_clusters(se: float, sd: float, k: int, crit: float, power: float = POWER) -> float:
    """The larger of the t's detectable difference and the sign-flip condition's (``sd``: the contrasts'
    standard deviation): below it the cluster test marks less than ``power`` of the time."""
    if k < MIN_DIFFERING or not (sd > 0 and se > 0):
        return math.nan
    return max(detectable_t(se, k - 1, crit, power), sign_shift(k, power) * sd)


def power_bounds(
    exact_test: str, shift: float, *, se: float, crit: float, sd: float = math.nan, k: int = 0
) -> tuple[float, float]:
    """(lower, upper) bounds of a marking rule's power at a true ``shift`` (on the test's scale), with
    normal contrasts of the observed spread (``crit``: the t quantile at k - 1 dof). ``exact_test``: ""
    (a t alone: exact, lower = upper), "sign-flip" (t and the sign-flip test: at most either's power; at
    least the t's power plus the chance that all k contrasts share one sign, which makes p = 2 / 2^k, minus
    1) or "McNemar" (upper only: every change one way; ``shift`` a difference of rates, ``k`` the pairs).
    nan where nothing applies."""
    if exact_test == "McNemar":
        return 0.0, mcnemar_power(shift, k)
    if k < MIN_DIFFERING or not (se > 0 and math.isfinite(shift)):
        return (0.0, 0.0) if k < MIN_DIFFERING else (math.nan, math.nan)
    from_t = t_power(abs(shift) / se, k - 1, crit)
    if exact_test != "sign-flip":
        return from_t, from_t
    if not sd > 0:
        return math.nan, math.nan
    one_sign = float(_phi(shift / sd)) ** k + float(_phi(-shift / sd)) ** k
    return max(0.0, from_t + one_sign - 1), min(from_t, sign_power(shift / sd, k))


# Up to this many clusters the power at a claimed size is simulated with the marking rule itself (exact
# sign-flip over every pattern); beyond, the bounds
SIMULATE_UP_TO = 12
SIMULATIONS = 4000


@functools.lru_cache(maxsize=512)
def simulated_cluster_power(
    shift_over_sd: float, k: int, crit: float, reps: int = SIMULATIONS, seed: int = 0
) -> float:
    """The cluster rule's power (t interval excludes 0 and the exact sign-flip p < 0.05, results.stats) for
    k equally weighted normal contrasts of mean ``shift_over_sd`` standard deviations (``crit``: the t
    quantile at k - 1 dof): seeded simulation (``reps`` draws; s.e. <= 0.008 at 4000), k <=
    ``SIMULATE_UP_TO``."""
    if k < MIN_DIFFERING:
        return 0.0
    rng = np.random.default_rng([seed, k])
    x = rng.normal(round(shift_over_sd, 3), 1.0, (reps, k))
    t_marks = np.abs(x.mean(1)) / (x.std(1, ddof=1) / math.sqrt(k)) > crit
    signs = 1 - 2 * ((np.arange(2**k)[:, None] >> np.arange(k)) & 1)
    p = np.empty(reps)
    for start in range(0, reps, 256):
        chunk = x[start : start + 256]
        sums = np.abs(signs @ chunk.T)  # (patterns, draws)
        p[start : start + 256] = (sums >= np.abs(chunk.sum(1)) * (1 - 1e-9)).mean(0)
    return float((t_marks & (p < ALPHA)).mean())
