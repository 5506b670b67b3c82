"""Intervals for one table cell and for paired differences, each with correct small-sample coverage.

- 0/1 rates: Wilson. Paired 0/1 outcomes (the same prompts under two settings): Newcombe's paired score
  interval for the difference, marked significant only when the exact McNemar test agrees (p < 0.05).
- Perplexity-like metrics are averaged the way the tasks define them: exp of the token-weighted mean log
  (``n`` = tokens behind a row), so a cell's estimate equals its aggregated row; the interval is taken on that
  log scale and exp'd back. Per-document log perplexities are often skewed (a few much harder documents),
  and with LongPPL the heavier units (more key tokens) can be the noisier ones: a plain t interval covers
  0.88-0.92 of the time under skewness 2 and less under weight-correlated noise. So the interval is
  :func:`skew_t`: t with the larger of Kish's and the HC2 variance, a reduced share of the degrees of
  freedom, lengthened on the side the sample is skewed to (Hall's transformation) — >= 0.93 coverage at
  n = 3..16 in simulation, at some width in the symmetric case (see its docstring).
- Everything else (other per-unit values, e.g. ranks): Student's t over the units on n - 1 dof; weights enter
  through Kish's design effect: the variance of a weighted mean of n units with sample variance s^2 is
  s^2 * sum(w^2) / sum(w)^2 (s^2 / n for equal weights, the plain t interval).
- Below ``MIN_T_UNITS`` units no interval is shown.

A percentile bootstrap over 4-8 documents covers the truth 0.77-0.87 of the time instead of 0.95, and a paired
bootstrap rejects a true null ~15% of the time at 8 pairs; tests/results/test_interval_calibration.py
simulates the intervals used here instead. Every interval is closed-form: the same rows give the same interval
anywhere (the one sampled quantity, the sign-flip p beyond 16 clusters, is seeded).

Honest units: rows that share one independent unit (a ``cluster`` id: the questions asked about one
haystack) are not independent, so every interval and test here counts clusters. A cell: the clusters'
statistics (means; token-weighted log means for perplexities) with a t interval over clusters (for
perplexities :func:`skew_t`, the clusters weighted by their tokens), and for 0/1
outcomes Wilson's interval at the effective number of clusters (Kish: (sum n_j)^2 / sum n_j^2; a cluster's
mean is bounded by [0, 1], so its variance is at most p(1 - p) and Wilson on k clusters is conservative,
exact when the questions of a cluster always agree). A paired difference: the clusters' contrasts (the
difference of the two settings' cluster statistics, or their log ratio), a t interval over them and an exact
sign-flip test (under no difference each cluster's contrast is as likely negative as positive); marked
significant only when both agree and at least ``MIN_INFORMATIVE_PAIRS`` clusters differ.
tests/results/test_cluster_units.py simulates both at intra-cluster correlation 0.5. Rows without a cluster
are each their own unit, and a cell whose units are all single rows gets the per-row methods above.

Its size (~650 lines): each interval with its small-sample argument and the simulations that back it,
documented beside the code it justifies.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from .store import ResultsError

Z95 = 1.959963984540054
# Student's t 0.975 quantiles for 1..10 degrees of freedom; beyond, the Cornish-Fisher expansion
# (error < 1e-5).
_T975 = (12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139)
# Fewest units for a t interval: with 2 the interval (+-12.7 standard errors) rests on one difference.
MIN_T_UNITS = 3
# Below this many pairs that differ, even an exact sign test can not reach two-sided p < 0.05
# (2 / 2**5 > 0.05): an interval that happens to exclude "no difference" there rests on a distributional
# assumption alone, so no difference is marked (for paired 0/1 outcomes the exact McNemar test implies it).
MIN_INFORMATIVE_PAIRS = 6
ALPHA = 0.05
PAIRED_T = "paired t"
PAIRED_RATES = "paired score + McNemar"
PAIRED_CLUSTERS = "cluster t + sign-flip"  # paired over clusters (rows that share an independent unit)
WILSON_CLUSTERS = "wilson (clusters)"
T_CLUSTERS = "t (clusters)"
# Up to this many differing clusters the sign-flip test enumerates every sign pattern (exact); beyond, a
# seeded Monte Carlo sample of SIGN_FLIP_DRAWS patterns (its p-value is exact in expectation and reproducible)
SIGN_FLIP_EXACT = 16
SIGN_FLIP_DRAWS = 20000


def t975(dof: float) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom (two-sided 95%; fractional ``dof``:
    :func:`t975_array`)."""
    if dof < 1:
        return math.nan
    if dof != int(dof):
        return _t975_fractional(float(dof))
    dof = int(dof)
    if dof <= len(_T975):
        return _T975[dof - 1]
    return _t975_expansion(dof)


@functools.lru_cache(maxsize=4096)
def _t975_fractional(dof: float) -> float:
    return float(t975_array(dof))


def _t975_expansion(dof: float) -> float:
    z, v = Z95, float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


def wilson(successes: float, trials: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a 0/1 rate: sensible at 0/n and n/n, unlike the normal approximation.
    ``trials`` may be fractional (an effective number of units); none gives (nan, nan). Successes outside
    [0, trials] are a ResultsError."""
    problem = _count_problem(successes, trials)
    if problem is not None:
        raise ResultsError(f"wilson({successes!r}, {trials!r}): {problem}")
    if trials == 0:
        return (math.nan, math.nan)
    successes = min(successes, trials)  # a fractional effective count may round a hair above
    p = successes / trials
    den = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / den
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / den
    # at 0/n and n/n the bound is exactly 0 / 1 (centre - half cancels analytically, not in floating point)
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= trials else min(1.0, centre + half)
    return (lo, hi)


def _count_problem(successes, trials) -> str | None:
    for name, v in (("successes", successes), ("trials", trials)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            return f"{name} must be a number — e.g. wilson(3, 5) for 3 of 5"
        if not math.isfinite(v) or v < 0:
            return f"{name} must be a finite number >= 0 — e.g. wilson(3, 5) for 3 of 5"
    if successes > trials * (1 + 1e-12):
        return "successes exceed trials — pass (successes, trials), e.g. wilson(3, 5) for 3 of 5"
    return None


def newcombe(k1: float, n1: float, k2: float, n2: float, z: float = Z95) -> tuple[float, float]:
    """Interval for p1 - p2 of two independent rates (Newcombe 1998, method 10: hybrid Wilson score)."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p1 - p2
    return (d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def newcombe_paired(both: int, only_a: int, only_b: int, neither: int, z: float = Z95) -> tuple[float, float]:
    """Interval for p_a - p_b of paired 0/1 outcomes (Newcombe 1998, Stat Med 17:2635, method 10: the Wilson
    limits of both margins, squared and added with the 2x2 table's phi correlation, whose numerator
    A = both * neither - only_a * only_b is continuity-corrected: A - n/2 above n/2, 0 in [0, n/2])."""
    n = both + only_a + only_b + neither
    pa, pb = (both + only_a) / n, (both + only_b) / n
    la, ua = wilson(both + only_a, n, z)
    lb, ub = wilson(both + only_b, n, z)
    den = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    a = both * neither - only_a * only_b
    a = a - n / 2 if a > n / 2 else (0.0 if a >= 0 else a)
    phi = a / math.sqrt(den) if den > 0 else 0.0
    d = pa - pb
    lower = math.sqrt(max(0.0, (pa - la) ** 2 - 2 * phi * (pa - la) * (ub - pb) + (ub - pb) ** 2))
    upper = math.sqrt(max(0.0, (ua - pa) ** 2 - 2 * phi * (ua - pa) * (pb - lb) + (pb - lb) ** 2))
    return (max(-1.0, d - lower), min(1.0, d + upper))


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value: the discordant pairs split as Binomial(only_a + only_b, 1/2) under the
    null. Conservative (never rejects more than 5% at p < 0.05)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def estimate(kind: str, values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """The cell statistic along the last axis: a mean for rates, a weighted mean otherwise (of the logs, exp'd
    back, for perplexities)."""
    values = np.asarray(values, float)
    if kind == "rate":
        return values.mean(axis=-1)
    w = np.ones_like(values) if weights is None else np.asarray(weights, float)
    if kind == "log":
        return np.exp((w * np.log(values)).sum(axis=-1) / w.sum(axis=-1))
    return (w * values).sum(axis=-1) / w.sum(axis=-1)


def weighted_t(x: np.ndarray, weights: np.ndarray | None) -> tuple[float, float]:
    """Centre and 95% half-width of the weighted mean of ``x``: t with n - 1 degrees of freedom and Kish's
    variance s^2 * sum(w^2) / sum(w)^2 (s^2: the sample variance of x)."""
    x = np.asarray(x, float)
    w = np.ones_like(x) if weights is None else np.asarray(weights, float)
    centre = float((w * x).sum() / w.sum())
    var = float(x.var(ddof=1)) * float((w * w).sum()) / float(w.sum()) ** 2
    return centre, t975(len(x) - 1) * math.sqrt(var)


# Perplexity-like cells (kind "log", see skew_t): the t quantile's degrees of freedom are this share of the
# variance estimate's own, and Hall's skewness correction lengthens one side by at most SKEW_MAX_STRETCH;
# both chosen by simulation (tests/results/test_interval_calibration.py).
SKEW_DOF_SHARE = 0.65
SKEW_MAX_STRETCH = 1.5
# skew_t is a two-sided 95% interval whose misses are not split evenly: where the units are skewed, almost all
# fall on the side the skew points to (the upper bound of right-skewed log perplexities). Read alone, either
# bound errs at most this often in the simulated populations (tests/results/test_interval_calibration.py:
# up to 0.057 at n = 4-6, skewness 2, equal tokens; the other bound under 0.01): a 94% one-sided bound, not
# the 97.5% a symmetric interval's bound would be. Hall's correction cannot balance it at small n: the samples
# that miss are those that drew none of the rare large values, so they do not look skewed.
SKEW_T_ONE_SIDED_MISS = 0.06


def _betainc(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The regularized incomplete beta function I_x(a, b), elementwise: Lentz's continued fraction (Numerical
    Recipes 6.4), on the side of its symmetry I_x(a, b) = 1 - I_{1-x}(b, a) where it converges fast."""
    a, b, x = np.broadcast_arrays(*(np.asarray(v, float) for v in (a, b, x)))
    swap = x > (a + 1) / (a + b + 2)
    a, b, x = np.where(swap, b, a), np.where(swap, a, b), np.where(swap, 1 - x, x)
    lgamma = np.vectorize(math.lgamma, otypes=[float])
    with np.errstate(divide="ignore"):
        front = np.exp(lgamma(a + b) - lgamma(a) - lgamma(b) + a * np.log(x) + b * np.log1p(-x))
    tiny = 1e-300
    c = np.ones_like(x)
    d = 1 - (a + b) * x / (a + 1)
    d = 1 / np.where(np.abs(d) < tiny, tiny, d)
    h = d.copy()
    for m in range(1, 301):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1 + num / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            h = h * d * c
        if np.all(np.abs(d * c - 1) < 1e-15):
            break
    out = front * h / a
    return np.where(swap, 1 - out, out)


def t975_array(dof) -> np.ndarray:
    """The 0.975 quantile of Student's t for each (possibly fractional) ``dof`` >= 1, elementwise: Newton's
    method on P(|T| > t) = I_{dof / (dof + t^2)}(dof / 2, 1 / 2) = 0.05 (error < 1e-9), started from the
    printed quantiles of the neighbouring integer dof interpolated in 1 / dof (beyond 10 dof: the
    Cornish-Fisher expansion). P(|T| > t) is convex and decreasing in t, so after at most one step Newton's
    iterates rise monotonically to the root."""
    dof = np.asarray(dof, float)
    if np.any(dof < 1) or not np.all(np.isfinite(dof)):
        raise ValueError("t975_array needs finite degrees of freedom >= 1")
    lo = np.floor(np.minimum(dof, 10.0)).astype(int)
    hi = np.minimum(lo + 1, 10)
    table = np.array(_T975)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(hi > lo, (1 / lo - 1 / np.minimum(dof, 10.0)) / (1 / lo - 1 / hi), 0.0)
    t = np.where(dof < 10, table[lo - 1] + share * (table[hi - 1] - table[lo - 1]), 0.0)
    big = dof >= 10
    if np.any(big):
        t = np.where(big, np.vectorize(_t975_expansion)(np.maximum(dof, 10.0)), t)
    lgamma = np.vectorize(math.lgamma, otypes=[float])
    log_c = lgamma((dof + 1) / 2) - lgamma(dof / 2) - 0.5 * np.log(dof * math.pi)
    for _ in range(20):
        tail = _betainc(dof / 2, 0.5, dof / (dof + t * t))
        density = np.exp(log_c - (dof + 1) / 2 * np.log1p(t * t / dof))
        step = (tail - 0.05) / (2 * density)
        t = t + step
        if np.all(np.abs(step) < 1e-10 * t):
            break
    return t


def skew_t(x: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Estimate and 95% interval of the weighted mean of ``x`` along the last axis (at least 2 values; any
    leading axes are independent samples), for perplexity-like cells: ``x`` holds per-unit log perplexities,
    ``weights`` their tokens. Returns (centre, lo, hi), on the scale of ``x``.

    - Variance: the larger of Kish's s^2 * sum(w^2) / sum(w)^2 (exact when the units share one variance) and
      the heteroscedasticity-consistent HC2 estimate sum(w_i^2 r_i^2 / (1 - w_i / sum(w))) / sum(w)^2 (r: the
      residuals about the weighted mean; consistent when heavier units are noisier). Equal weights: both are
      s^2 / n.
    - Degrees of freedom: ``SKEW_DOF_SHARE`` x the variance estimate's own, at least 1: n - 1 for Kish's;
      Kish's effective n - 1 = (sum w)^2 / sum(w^2) - 1 for HC2's (Satterthwaite's count for unequal
      weights). Fractional dof get the exact t quantile.
    - Skewness (Hall 1992, JRSS B 54:221): a = g1 * sum(w^3) / sum(w^2)^1.5 is the estimated skewness of the
      weighted mean (g1: the values' sample skewness; g1 / sqrt(n) for equal weights); the studentised
      T = (centre - truth) / se is mapped by Hall's monotone g(T) = T + aT^2/3 + a^2T^3/27 + a/6 and
      |g(T)| <= t inverted. That interval's far side, capped at ``SKEW_MAX_STRETCH`` x t standard errors,
      lengthens the symmetric t interval on the side the skewness points to; the other side stays at t
      standard errors.

    Simulated in tests/results/test_interval_calibration.py (10 000 replications per n = 3..16; per-unit
    values normal, centred exponential (skewness 2), or spread in proportion to the unit's weight): coverage
    0.942-0.956 (skewed, equal tokens), 0.961-0.974 (skewed, varying tokens), 0.956-0.998 (weight-correlated),
    where Kish's t on n - 1 dof covered 0.881-0.922 (skewed) and down to 0.87 (uniform weights) or 0.62
    (heavy-tailed weights) at n = 16. The price, for normal values with equal tokens: coverage 0.962-0.988,
    on average 2.14x the plain t interval's width at n = 3, 1.46x at 5, 1.24x at 8 and 1.11x at 16 (varying
    tokens: 2.70x, 1.84x, 1.44x, 1.21x)."""
    x = np.asarray(x, float)
    n = x.shape[-1]
    w = np.ones_like(x) if weights is None else np.broadcast_to(np.asarray(weights, float), x.shape)
    sw, sw2, sw3 = w.sum(axis=-1), (w * w).sum(axis=-1), (w**3).sum(axis=-1)
    centre = (w * x).sum(axis=-1) / sw
    r = x - centre[..., None]
    kish = x.var(axis=-1, ddof=1) * sw2 / sw**2
    room = 1 - w / sw[..., None]  # 0 only for a unit holding all the weight, whose residual is then 0
    with np.errstate(divide="ignore", invalid="ignore"):
        hc2 = np.where(room > 0, (w * r) ** 2 / room, 0.0).sum(axis=-1) / sw**2
    se = np.sqrt(np.maximum(kish, hc2))
    dof = np.maximum(1.0, SKEW_DOF_SHARE * (np.where(hc2 > kish, sw**2 / sw2, n) - 1))
    t = t975_array(dof) if dof.ndim else np.asarray(t975(float(dof)))  # one sample: the cached scalar
    d = x - x.mean(axis=-1, keepdims=True)
    m2, m3 = (d * d).mean(axis=-1), (d**3).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(m2 > 0, m3 / m2**1.5, 0.0) * sw3 / sw2**1.5
        safe = np.where(np.abs(a) < 1e-9, 1.0, a)

        def g_inverse(y):
            return np.where(np.abs(a) < 1e-9, y, 3 / safe * (np.cbrt(1 + safe * y) - 1))

        below, above = g_inverse(t - a / 6), -g_inverse(-t - a / 6)  # T's bounds, as distances from 0
    longest = SKEW_MAX_STRETCH * t
    below, above = np.clip(below, t, longest), np.clip(above, t, longest)
    return centre, centre - se * below, centre + se * above


@dataclass(frozen=True)
class Interval:
    estimate: float
    lo: float
    hi: float
    n: int  # independent units behind the estimate (documents, trials, haystacks: clusters where rows share)
    method: str  # "wilson", "t", "wilson (clusters)", "t (clusters)", "none"
    rows: int | None = None  # rows (questions, prompts) behind it; None: n (each row its own unit)
    unit: str = ""  # what one independent unit is (the metric's declared independent_unit)

    def __post_init__(self):
        if self.rows is None:
            object.__setattr__(self, "rows", self.n)


def unit_labels(clusters, m: int) -> np.ndarray | None:
    """Cluster labels of ``m`` rows as an array, or None when every row is its own unit (no clusters given,
    or no label repeats): then the per-row methods apply unchanged."""
    if clusters is None:
        return None
    labels = np.asarray(clusters, dtype=object)
    if len(labels) != m:
        raise ValueError(f"{len(labels)} cluster labels for {m} values")
    return labels if len(set(labels.tolist())) < m else None


def cluster_stats(
    kind: str, values: np.ndarray, weights: np.ndarray | None, labels: np.ndarray
) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
    """Per cluster (in order of first appearance): its label, its statistic (a mean; for perplexities the
    weighted mean of the logs, on the log scale), its weight (summed row weights; rows for rates) and its
    number of rows."""
    values = np.asarray(values, float)
    w = np.ones_like(values) if weights is None or kind == "rate" else np.asarray(weights, float)
    order = list(dict.fromkeys(labels.tolist()))
    index = {c: i for i, c in enumerate(order)}
    ids = np.array([index[c] for c in labels.tolist()])
    x = np.log(values) if kind == "log" else values
    weight = np.bincount(ids, weights=w, minlength=len(order))
    stat = np.bincount(ids, weights=w * x, minlength=len(order)) / weight
    size = np.bincount(ids, minlength=len(order)).astype(float)
    return order, stat, weight, size


def cell_interval(
    kind: str,
    values: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    seed: int = 0,
    clusters=None,
    unit: str = "",
) -> Interval:
    """Estimate + 95% interval of one cell from its per-unit values (one value per document / prompt / query).
    ``clusters``: one label per value; values that share a label are one independent unit (see the module
    docstring). ``seed`` is kept for callers; every interval here is closed-form."""
    values = np.asarray(values, float)
    m = len(values)
    if m == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "none", 0, unit)
    est = float(estimate(kind, values, weights))
    labels = unit_labels(clusters, m)
    if labels is not None:
        return _cluster_interval(kind, values, weights, labels, est, unit)
    if kind == "rate":
        return Interval(est, *wilson(float(values.sum()), m), m, "wilson", m, unit)
    if m < MIN_T_UNITS:
        return Interval(est, math.nan, math.nan, m, "none", m, unit)
    if kind == "log":
        _, lo, hi = skew_t(np.log(values), weights)
        return Interval(est, math.exp(lo), math.exp(hi), m, "t", m, unit)
    centre, half = weighted_t(values, weights)
    return Interval(est, centre - half, centre + half, m, "t", m, unit)


def _cluster_interval(
    kind: str, values: np.ndarray, weights, labels: np.ndarray, est: float, unit: str
) -> Interval:
    _, stat, weight, size = cluster_stats(kind, values, weights, labels)
    k, rows = len(stat), len(values)
    if kind == "rate":
        k_eff = float(size.sum()) ** 2 / float((size * size).sum())  # Kish: k for clusters of one size
        return Interval(est, *wilson(est * k_eff, k_eff), k, WILSON_CLUSTERS, rows, unit)
    if k < MIN_T_UNITS:
        return Interval(est, math.nan, math.nan, k, "none", rows, unit)
    if kind == "log":
        _, lo, hi = skew_t(stat, weight)
        return Interval(est, math.exp(lo), math.exp(hi), k, T_CLUSTERS, rows, unit)
    centre, half = weighted_t(stat, weight)
    return Interval(est, centre - half, centre + half, k, T_CLUSTERS, rows, unit)


@dataclass(frozen=True)
class Paired:
    estimate: float  # difference (a - b) or ratio (a / b) of the cell statistics over the paired units
    lo: float
    hi: float
    n: int  # pairs of independent units (clusters where rows share one)
    informative: int  # pairs (clusters) whose values differ
    method: (
        str  # "paired t", "paired score + McNemar", "cluster t + sign-flip", "newcombe (unpaired)", "none"
    )
    null: float  # 0 for differences, 1 for ratios
    p: float = math.nan  # the exact test's p-value where there is one (McNemar; the clusters' sign-flip)
    rows: int | None = None  # paired rows (questions) behind it; None: n
    unit: str = ""  # what one independent unit is (the metric's declared independent_unit)
    # Power (results/power.py): the smallest true difference the test marks with 80% probability at this n
    # and observed spread (a difference; for a ratio the factor f >= 1: a ratio beyond f or 1/f); nan where
    # none is computable, and ``cannot`` then says why nothing could be marked at all ("" when it could)
    detectable: float = math.nan
    cannot: str = ""
    se: float = math.nan  # standard error of the contrasts' mean, on the test's scale (log for a ratio)
    sd: float = math.nan  # the clusters' contrasts' standard deviation (the sign-flip bound); nan otherwise

    def __post_init__(self):
        if self.rows is None:
            object.__setattr__(self, "rows", self.n)

    @property
    def significant(self) -> bool:
        """The 95% interval excludes the null, enough independent units differ for that to mean something,
        and the exact test (where there is one) agrees."""
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return False
        if (
            self.method in (PAIRED_T, PAIRED_RATES, PAIRED_CLUSTERS)
            and self.informative < MIN_INFORMATIVE_PAIRS
        ):
            return False
        if math.isfinite(self.p) and self.p >= ALPHA:
            return False
        return self.lo > self.null or self.hi < self.null


def _influence(kind: str, x: np.ndarray, est: float, how: str) -> np.ndarray:
    """Each unit's linearised contribution to one side's statistic: on the log scale for a ratio, on the
    statistic's own scale for a difference (exact for a ratio of perplexities and a difference of means)."""
    if kind == "log":
        return np.log(x) if how == "ratio" else est * np.log(x)
    return x / est if how == "ratio" else x


def _pair_weights(m: int, wa, wb) -> np.ndarray | None:
    if wa is None and wb is None:
        return None
    return (np.ones(m) if wa is None else np.asarray(wa, float)) / 2 + (
        np.ones(m) if wb is None else np.asarray(wb, float)
    ) / 2


def paired_interval(
    kind: str,
    a: np.ndarray,
    b: np.ndarray,
    wa: np.ndarray | None = None,
    wb: np.ndarray | None = None,
    *,
    how: str = "delta",
    seed: int = 0,
    unit: str = "",
) -> Paired:
    """``a`` vs ``b`` on the same units (row i of both is the same document / prompt; each row its own
    independent unit — rows that share a cluster pair through :func:`paired_clusters`, which
    ``results.comparisons.paired_cells`` picks where labels repeat).

    0/1 outcomes, difference: Newcombe's paired score interval and the exact McNemar test. Otherwise a paired
    t over the units' contrasts (per-document log ratios for perplexities), weighted by the pair's mean
    weight, from ``MIN_T_UNITS`` pairs on. ``seed`` is kept for callers; nothing here is sampled."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    m = len(a)
    null = 1.0 if how == "ratio" else 0.0
    if m == 0:
        return Paired(math.nan, math.nan, math.nan, 0, 0, "none", null, unit=unit)
    ea, eb = float(estimate(kind, a, wa)), float(estimate(kind, b, wb))
    with np.errstate(divide="ignore", invalid="ignore"):
        est = float(np.divide(ea, eb)) if how == "ratio" else ea - eb
    informative = int((a != b).sum())
    if kind == "rate":
        return _paired_rates(a, b, est, how, null, informative, unit)
    if m < MIN_T_UNITS or (how == "ratio" and not (np.isfinite(est) and est > 0)):
        return Paired(est, math.nan, math.nan, m, informative, "none", null, unit=unit)
    z = _influence(kind, a, ea, how) - _influence(kind, b, eb, how)
    _, half = weighted_t(z, _pair_weights(m, wa, wb))
    power = _t_power_fields(half, m, how)
    if how == "ratio":
        lo, hi = est * math.exp(-half), est * math.exp(half)
        return Paired(est, lo, hi, m, informative, PAIRED_T, null, unit=unit, **power)
    return Paired(est, est - half, est + half, m, informative, PAIRED_T, null, unit=unit, **power)


def _t_power_fields(half: float, m: int, how: str) -> dict:
    """A paired t's power fields (see :class:`Paired`): its standard error and detectable difference."""
    from . import power

    se = half / t975(m - 1)
    if m < MIN_INFORMATIVE_PAIRS:
        return {"se": se, "cannot": f"{m} pairs: a mark needs at least {MIN_INFORMATIVE_PAIRS} that differ"}
    detectable = power.detectable_t(se, m - 1, t975(m - 1))
    return {"se": se, "detectable": math.exp(detectable) if how == "ratio" else detectable}


def _paired_rates(
    a: np.ndarray, b: np.ndarray, est: float, how: str, null: float, informative: int, unit: str = ""
) -> Paired:
    only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    p = mcnemar_exact(only_a, only_b)
    if how == "ratio":  # a ratio of paired rates gets no interval (0/n makes it undefined or infinite)
        return Paired(est, math.nan, math.nan, len(a), informative, "none", null, p, unit=unit)
    both, neither = int(((a == 1) & (b == 1)).sum()), int(((a == 0) & (b == 0)).sum())
    lo, hi = newcombe_paired(both, only_a, only_b, neither)
    power = _exact_power_fields(len(a), "pairs", "McNemar")
    return Paired(est, lo, hi, len(a), informative, PAIRED_RATES, null, p, unit=unit, **power)


def _exact_power_fields(k: int, units: str, test: str) -> dict:
    """Where an exact test can not reach p < 0.05 at all (fewer than 6 units): why; else for McNemar the
    detectable difference of the rates (results/power.py)."""
    from . import power

    if k < MIN_INFORMATIVE_PAIRS:
        floor = power.exact_floor(k)
        return {"cannot": f"{k} {units}: the exact {test} test's smallest p is {floor:.3g} (needs ≥ 6)"}
    return {"detectable": power.mcnemar_delta(k)} if test == "McNemar" else {}


def paired_clusters(
    kind: str,
    a: np.ndarray,
    clusters_a,
    b: np.ndarray,
    clusters_b,
    wa: np.ndarray | None = None,
    wb: np.ndarray | None = None,
    *,
    how: str = "delta",
    seed: int = 0,
    unit: str = "",
) -> Paired:
    """Two settings paired by cluster id: each side's statistic per cluster (over that side's rows of the
    cluster), one contrast per cluster both sides have (a - b; the log ratio for how="ratio"), a t interval
    over the contrasts (weighted by the clusters' mean weight) around the estimate of the paired rows, and
    the exact sign-flip test's p. ``n`` = paired clusters, ``rows`` = rows behind them."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    la, lb = np.asarray(clusters_a, dtype=object), np.asarray(clusters_b, dtype=object)
    null = 1.0 if how == "ratio" else 0.0
    shared = set(la.tolist()) & set(lb.tolist())
    keep_a, keep_b = np.isin(la, list(shared)), np.isin(lb, list(shared))
    if not shared:
        return Paired(math.nan, math.nan, math.nan, 0, 0, "none", null, rows=0, unit=unit)
    a, la, b, lb = a[keep_a], la[keep_a], b[keep_b], lb[keep_b]
    wa = None if wa is None else np.asarray(wa, float)[keep_a]
    wb = None if wb is None else np.asarray(wb, float)[keep_b]
    ea, eb = float(estimate(kind, a, wa)), float(estimate(kind, b, wb))
    with np.errstate(divide="ignore", invalid="ignore"):
        est = float(np.divide(ea, eb)) if how == "ratio" else ea - eb
    order_a, sa, wta, _ = cluster_stats(kind, a, wa, la)
    order_b, sb, wtb, _ = cluster_stats(kind, b, wb, lb)
    sb, wtb = sb[[order_b.index(c) for c in order_a]], wtb[[order_b.index(c) for c in order_a]]
    k, rows = len(order_a), int(min(len(a), len(b)))
    d = _cluster_contrasts(kind, sa, sb, how)
    informative = int((np.abs(d) > 1e-12).sum()) if np.isfinite(d).all() else 0
    if k < MIN_T_UNITS or not np.isfinite(d).all() or not np.isfinite(est) or (how == "ratio" and est <= 0):
        return Paired(est, math.nan, math.nan, k, informative, "none", null, rows=rows, unit=unit)
    w = (wta + wtb) / 2
    p = sign_flip_p(d, w, seed=seed)
    _, half = weighted_t(d, w)
    lo, hi = (est * math.exp(-half), est * math.exp(half)) if how == "ratio" else (est - half, est + half)
    power = _cluster_power_fields(d, half, k, how, bounded=kind == "rate")
    return Paired(est, lo, hi, k, informative, PAIRED_CLUSTERS, null, p, rows, unit, **power)


def _cluster_power_fields(d: np.ndarray, half: float, k: int, how: str, bounded: bool = False) -> dict:
    """The cluster test's power fields: fewer than 6 clusters can not be marked (the sign-flip floor), else
    the detectable difference from the contrasts' spread (results/power.py); inf where it is beyond any
    possible difference (``bounded``: of two rates, at most 1)."""
    from . import power

    se, sd = half / t975(k - 1), float(np.std(d, ddof=1))
    fields = {"se": se, "sd": sd, **_exact_power_fields(k, "clusters", "sign-flip")}
    if "cannot" not in fields:
        detectable = power.detectable_clusters(se, sd, k, t975(k - 1))
        if bounded and how == "delta" and detectable >= 1:
            detectable = math.inf
        fields["detectable"] = math.exp(detectable) if how == "ratio" else detectable
    return fields


def _cluster_contrasts(kind: str, sa: np.ndarray, sb: np.ndarray, how: str) -> np.ndarray:
    """One contrast per cluster from the two sides' cluster statistics (perplexities': log scale)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "log":
            return sa - sb if how == "ratio" else np.exp(sa) - np.exp(sb)
        return np.log(sa / sb) if how == "ratio" else sa - sb


def sign_flip_p(d: np.ndarray, weights: np.ndarray | None = None, *, seed: int = 0) -> float:
    """Two-sided p-value of the sign-flip (permutation) test that the contrasts ``d`` are symmetric about 0:
    the share of sign patterns whose weighted sum is at least as far from 0 as the observed one. Exact
    (every pattern) up to ``SIGN_FLIP_EXACT`` non-zero contrasts, else a seeded sample (the observed
    pattern counted once: never 0)."""
    d = np.asarray(d, float)
    w = np.ones_like(d) if weights is None else np.asarray(weights, float)
    x = (w * d)[np.abs(d) > 1e-12]
    k = len(x)
    if k == 0:
        return 1.0
    observed = abs(float(x.sum())) * (1 - 1e-9)  # ties (equal |sums|) count as extreme
    if k <= SIGN_FLIP_EXACT:
        signs = 1 - 2 * ((np.arange(2**k)[:, None] >> np.arange(k)) & 1)
        return float((np.abs(signs @ x) >= observed).mean())
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(SIGN_FLIP_DRAWS, k))
    return float((1 + (np.abs(signs @ x) >= observed).sum()) / (SIGN_FLIP_DRAWS + 1))


def unpaired_rate_interval(k1: float, n1: float, k2: float, n2: float) -> Paired:
    """Difference of two rates known only as totals (no per-unit rows to pair): Newcombe's interval."""
    lo, hi = newcombe(k1, n1, k2, n2)
    return Paired(k1 / n1 - k2 / n2, lo, hi, int(min(n1, n2)), int(min(n1, n2)), "newcombe (unpaired)", 0.0)


def paired_power(row) -> tuple[float, float]:
    """(lower, upper) power bounds of one comparison (a row of ``results.paired_differences``: its
    ``interval``, ``how``, ``estimate``, ``se``, ``sd`` and ``n``) for a true difference equal to its
    estimate: the power behind a claim that size (6-12 clusters: simulated, both the same). nan where there
    is no test."""
    from . import power

    interval, n = row.get("interval"), row.get("n")
    if interval not in (PAIRED_T, PAIRED_CLUSTERS, PAIRED_RATES) or n is None or math.isnan(float(n)):
        return math.nan, math.nan
    estimate, se, sd = float(row["estimate"]), float(row.get("se", math.nan)), float(row.get("sd", math.nan))
    if interval == PAIRED_RATES:
        return power.power_bounds("McNemar", estimate, se=se, crit=math.nan, k=int(n))
    shift = math.log(estimate) if row.get("how") == "ratio" and estimate > 0 else estimate
    k = int(n)
    if interval == PAIRED_CLUSTERS and power.MIN_DIFFERING <= k <= power.SIMULATE_UP_TO and sd > 0:
        simulated = power.simulated_cluster_power(abs(shift) / sd, k, t975(k - 1))
        return simulated, simulated
    exact = "sign-flip" if interval == PAIRED_CLUSTERS else ""
    return power.power_bounds(exact, shift, se=se, crit=t975(k - 1) if k > 1 else math.nan, sd=sd, k=k)
