"""Intervals for one table cell and for paired differences: Wilson for 0/1 rates, seeded bootstraps otherwise.

The unit of resampling is whatever the rows are per: a document (perplexity), a prompt (passkey: depth x
trial), a query. Perplexity-like metrics are averaged the way the suites define them: exp of the
token-weighted mean log (``n`` = tokens behind a row), so a cell's estimate equals its aggregated row.
Every bootstrap draws from ``numpy.random.default_rng(seed)`` with the units in a fixed order: the same
rows give the same interval on every machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054
BOOTSTRAP_DRAWS = 2000
# Below this many pairs that differ, even an exact sign test can not reach two-sided p < 0.05 (2 / 2**5 > 0.05):
# a bootstrap interval that happens to exclude 0 there is not evidence, so no difference is marked.
MIN_INFORMATIVE_PAIRS = 6
RATE_METRICS = frozenset({"correct", "accuracy", "accuracy_norm", "chance", "acc", "acc_norm", "exact_match"})


def metric_kind(metric: str, values: np.ndarray | None = None) -> str:
    """``"log"`` (perplexities: geometric, token-weighted), ``"rate"`` (0/1 outcomes) or ``"mean"``."""
    name = str(metric)
    if name.startswith("ppl") or name.endswith("perplexity"):
        return "log"
    if name in RATE_METRICS:
        return "rate"
    # one value of 1.0 could be anything: only several 0/1 values make an unnamed metric a rate
    if values is not None and len(values) >= 2 and np.isin(values, (0.0, 1.0)).all():
        return "rate"
    return "mean"


def wilson(successes: float, trials: float, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a 0/1 rate: sensible at 0/n and n/n, unlike the normal approximation."""
    if trials <= 0:
        return (math.nan, math.nan)
    p = successes / trials
    den = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / den
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / den
    # at 0/n and n/n the bound is exactly 0 / 1 (centre - half cancels analytically, not in floating point)
    lo = 0.0 if successes <= 0 else max(0.0, centre - half)
    hi = 1.0 if successes >= trials else min(1.0, centre + half)
    return (lo, hi)


def newcombe(k1: float, n1: float, k2: float, n2: float, z: float = Z95) -> tuple[float, float]:
    """Interval for p1 - p2 of two independent rates (Newcombe 1998, method 10: hybrid Wilson score)."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p1 - p2
    return (d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2))


def estimate(kind: str, values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """The cell statistic along the last axis (works on one sample or a matrix of bootstrap resamples)."""
    values = np.asarray(values, float)
    if kind == "rate":
        return values.mean(axis=-1)
    w = np.ones_like(values) if weights is None else np.asarray(weights, float)
    if kind == "log":
        return np.exp((w * np.log(values)).sum(axis=-1) / w.sum(axis=-1))
    return (w * values).sum(axis=-1) / w.sum(axis=-1)


def draws(units: int, seed: int = 0, reps: int = BOOTSTRAP_DRAWS) -> np.ndarray:
    """Bootstrap resamples as a (reps, units) matrix of unit indices."""
    return np.random.default_rng(seed).integers(0, units, size=(reps, units))


def percentile(stats: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


@dataclass(frozen=True)
class Interval:
    estimate: float
    lo: float
    hi: float
    n: int           # units (documents, prompts, queries) behind the estimate
    method: str      # "wilson", "bootstrap", "t", "none"


def cell_interval(kind: str, values: np.ndarray, weights: np.ndarray | None = None, *, seed: int = 0) -> Interval:
    """Estimate + 95% interval of one cell from its per-unit values (one value per document / prompt / query)."""
    values = np.asarray(values, float)
    m = len(values)
    if m == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    est = float(estimate(kind, values, weights))
    if kind == "rate":
        return Interval(est, *wilson(float(values.sum()), m), m, "wilson")
    if m < 2:  # one unit: a bootstrap would return a zero-width interval, which is no evidence
        return Interval(est, math.nan, math.nan, m, "none")
    idx = draws(m, seed)
    w = None if weights is None else np.asarray(weights, float)[idx]
    return Interval(est, *percentile(estimate(kind, values[idx], w)), m, "bootstrap")


@dataclass(frozen=True)
class Paired:
    estimate: float  # difference (a - b) or ratio (a / b) of the cell statistics over the paired units
    lo: float
    hi: float
    n: int           # pairs
    informative: int  # pairs whose values differ
    method: str      # "paired bootstrap", "newcombe (unpaired)", "none"
    null: float      # 0 for differences, 1 for ratios

    @property
    def significant(self) -> bool:
        """The 95% interval excludes the null and there are enough differing pairs for it to mean something."""
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return False
        enough = self.method != "paired bootstrap" or self.informative >= MIN_INFORMATIVE_PAIRS
        return enough and (self.lo > self.null or self.hi < self.null)


def paired_interval(kind: str, a: np.ndarray, b: np.ndarray, wa: np.ndarray | None = None,
                    wb: np.ndarray | None = None, *, how: str = "delta", seed: int = 0) -> Paired:
    """``a`` vs ``b`` on the same units (row i of both is the same document / prompt): a paired bootstrap
    resamples units and recomputes both cell statistics on the same resample."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    m = len(a)
    null = 1.0 if how == "ratio" else 0.0
    if m == 0:
        return Paired(math.nan, math.nan, math.nan, 0, 0, "none", null)

    def contrast(x, y):
        with np.errstate(divide="ignore", invalid="ignore"):
            return x / y if how == "ratio" else x - y

    est = float(contrast(estimate(kind, a, wa), estimate(kind, b, wb)))
    informative = int((a != b).sum())
    if m < 2:
        return Paired(est, math.nan, math.nan, m, informative, "none", null)
    idx = draws(m, seed)
    sa = estimate(kind, a[idx], None if wa is None else np.asarray(wa, float)[idx])
    sb = estimate(kind, b[idx], None if wb is None else np.asarray(wb, float)[idx])
    return Paired(est, *percentile(contrast(sa, sb)), m, informative, "paired bootstrap", null)


def unpaired_rate_interval(k1: float, n1: float, k2: float, n2: float) -> Paired:
    """Difference of two rates known only as totals (no per-unit rows to pair): Newcombe's interval."""
    lo, hi = newcombe(k1, n1, k2, n2)
    return Paired(k1 / n1 - k2 / n2, lo, hi, int(min(n1, n2)), int(min(n1, n2)), "newcombe (unpaired)", 0.0)
