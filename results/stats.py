"""Intervals for one table cell and for paired differences, each with correct small-sample coverage.

- 0/1 rates: Wilson. Paired 0/1 outcomes (the same prompts under two settings): Newcombe's paired score
  interval for the difference, marked significant only when the exact McNemar test agrees (p < 0.05).
- Everything else (perplexities, other per-unit values): Student's t over the units. Perplexity-like metrics
  are averaged the way the tasks define them: exp of the token-weighted mean log (``n`` = tokens behind a
  row), so a cell's estimate equals its aggregated row; the t interval is taken on that log scale and exp'd
  back. Token weights enter through Kish's design effect: the variance of a weighted mean of n units with
  sample variance s^2 is s^2 * sum(w^2) / sum(w)^2 (s^2 / n for equal weights, the plain t interval).
  Below ``MIN_T_UNITS`` units no interval is shown.

A percentile bootstrap over 4-8 documents covers the truth 0.77-0.87 of the time instead of 0.95, and a paired
bootstrap rejects a true null ~15% of the time at 8 pairs; tests/results/test_interval_calibration.py
simulates the intervals used here instead. Every interval is closed-form: the same rows give the same interval
anywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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


@dataclass(frozen=True)
class MetricSpec:
    """How the summary and report treat a metric. A metric not in ``METRICS`` gets its kind's defaults (see
    :func:`metric_spec`), so a new task's metrics show up without an entry here."""

    kind: str  # "log" (perplexity-like: geometric, token-weighted), "rate" (0/1 outcomes), "mean"
    headline: bool = True  # a summary value (@ longest; log metrics also @ trained) and a paired difference
    reach: bool | None = None  # has a pass/fail bar, so effective lengths (None: rates and log metrics do)
    reference: bool = False  # shown beside its task's values, not compared (a chance rate)

    @property
    def has_bar(self) -> bool:
        return self.kind in ("rate", "log") if self.reach is None else self.reach


# Metrics whose treatment differs from their kind's default: duplicates, details and references stay out of
# the summary. Every other metric a task records (say a new task's "rank1" or "logprob") needs no entry.
METRICS: dict[str, MetricSpec] = {
    "ppl": MetricSpec(
        "log"
    ),  # a task's reach uses one perplexity: ppl_tail when recorded (see results.reach)
    "ppl_tail": MetricSpec("log", headline=False, reach=True),
    "longppl": MetricSpec("log", reach=False),
    "loss": MetricSpec("mean", headline=False),  # log(ppl): the same numbers
    "loss_bin": MetricSpec("mean", headline=False),
    "loss_fit_a": MetricSpec("mean", headline=False),
    "loss_fit_b": MetricSpec("mean", headline=False),
    "loss_fit_c": MetricSpec("mean", headline=False),
    "correct": MetricSpec("rate"),
    # accuracies are graded against chance, not passed or failed: no reach (a retrieved answer has one)
    "accuracy": MetricSpec("rate", reach=False),
    "exact_match": MetricSpec("rate"),
    "acc": MetricSpec("rate", reach=False),
    "acc_norm": MetricSpec("rate", reach=False),
    "accuracy_norm": MetricSpec("rate", headline=False, reach=False),  # recorded aggregated only: no pairs
    "macro_f1": MetricSpec("mean", headline=False),
    "macro_f1_norm": MetricSpec("mean", headline=False),
    "chance": MetricSpec("rate", headline=False, reach=False, reference=True),
    "prompt_tokens": MetricSpec("mean", headline=False),
}
RATE_METRICS = frozenset(name for name, spec in METRICS.items() if spec.kind == "rate")


def metric_kind(metric: str, values: np.ndarray | None = None) -> str:
    """``"log"`` (perplexities: geometric, token-weighted), ``"rate"`` (0/1 outcomes) or ``"mean"``."""
    name = str(metric)
    if name in METRICS:
        return METRICS[name].kind
    if name.startswith("ppl") or name.endswith("perplexity"):
        return "log"
    # one value of 1.0 could be anything: only several 0/1 values make an unnamed metric a rate
    if values is not None and len(values) >= 2 and np.isin(values, (0.0, 1.0)).all():
        return "rate"
    return "mean"


def metric_spec(metric: str, unit_values: np.ndarray | None = None) -> MetricSpec:
    """``METRICS[metric]``, else the defaults of its kind (from the name, else from the per-unit values):
    rates and log metrics are headline values with a bar; a mean is a headline value only when per-unit rows
    exist (without them it has no interval and no pairs, e.g. a fitted coefficient)."""
    if str(metric) in METRICS:
        return METRICS[str(metric)]
    values = None if unit_values is None or not len(unit_values) else np.asarray(unit_values, float)
    kind = metric_kind(metric, values)
    return MetricSpec(kind, headline=kind != "mean" or values is not None)


def t975(dof: int) -> float:
    """The 0.975 quantile of Student's t with ``dof`` degrees of freedom (two-sided 95%)."""
    if dof < 1:
        return math.nan
    if dof <= len(_T975):
        return _T975[dof - 1]
    z, v = Z95, float(dof)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


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


@dataclass(frozen=True)
class Interval:
    estimate: float
    lo: float
    hi: float
    n: int  # units (documents, prompts, queries) behind the estimate
    method: str  # "wilson", "t", "none"


def cell_interval(
    kind: str, values: np.ndarray, weights: np.ndarray | None = None, *, seed: int = 0
) -> Interval:
    """Estimate + 95% interval of one cell from its per-unit values (one value per document / prompt / query).
    ``seed`` is kept for callers; every interval here is closed-form."""
    values = np.asarray(values, float)
    m = len(values)
    if m == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    est = float(estimate(kind, values, weights))
    if kind == "rate":
        return Interval(est, *wilson(float(values.sum()), m), m, "wilson")
    if m < MIN_T_UNITS:
        return Interval(est, math.nan, math.nan, m, "none")
    if kind == "log":
        centre, half = weighted_t(np.log(values), weights)
        return Interval(est, math.exp(centre - half), math.exp(centre + half), m, "t")
    centre, half = weighted_t(values, weights)
    return Interval(est, centre - half, centre + half, m, "t")


@dataclass(frozen=True)
class Paired:
    estimate: float  # difference (a - b) or ratio (a / b) of the cell statistics over the paired units
    lo: float
    hi: float
    n: int  # pairs
    informative: int  # pairs whose values differ
    method: str  # "paired t", "paired score + McNemar", "newcombe (unpaired)", "none"
    null: float  # 0 for differences, 1 for ratios
    p: float = math.nan  # the exact test's p-value where there is one (paired 0/1 outcomes)

    @property
    def significant(self) -> bool:
        """The 95% interval excludes the null, enough pairs differ for that to mean something, and the exact
        test (where there is one) agrees."""
        if not (math.isfinite(self.lo) and math.isfinite(self.hi)):
            return False
        if self.method in (PAIRED_T, PAIRED_RATES) and self.informative < MIN_INFORMATIVE_PAIRS:
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


def paired_interval(
    kind: str,
    a: np.ndarray,
    b: np.ndarray,
    wa: np.ndarray | None = None,
    wb: np.ndarray | None = None,
    *,
    how: str = "delta",
    seed: int = 0,
) -> Paired:
    """``a`` vs ``b`` on the same units (row i of both is the same document / prompt).

    0/1 outcomes, difference: Newcombe's paired score interval and the exact McNemar test. Otherwise a paired
    t over the units' contrasts (per-document log ratios for perplexities), weighted by the pair's mean
    weight, from ``MIN_T_UNITS`` pairs on. ``seed`` is kept for callers; nothing here is random."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    m = len(a)
    null = 1.0 if how == "ratio" else 0.0
    if m == 0:
        return Paired(math.nan, math.nan, math.nan, 0, 0, "none", null)
    ea, eb = float(estimate(kind, a, wa)), float(estimate(kind, b, wb))
    with np.errstate(divide="ignore", invalid="ignore"):
        est = float(np.divide(ea, eb)) if how == "ratio" else ea - eb
    informative = int((a != b).sum())
    if kind == "rate":
        return _paired_rates(a, b, est, how, null, informative)
    if m < MIN_T_UNITS or (how == "ratio" and not (np.isfinite(est) and est > 0)):
        return Paired(est, math.nan, math.nan, m, informative, "none", null)
    w = (
        None
        if wa is None and wb is None
        else (np.ones(m) if wa is None else np.asarray(wa, float)) / 2
        + (np.ones(m) if wb is None else np.asarray(wb, float)) / 2
    )
    z = _influence(kind, a, ea, how) - _influence(kind, b, eb, how)
    _, half = weighted_t(z, w)
    if how == "ratio":
        return Paired(est, est * math.exp(-half), est * math.exp(half), m, informative, PAIRED_T, null)
    return Paired(est, est - half, est + half, m, informative, PAIRED_T, null)


def _paired_rates(
    a: np.ndarray, b: np.ndarray, est: float, how: str, null: float, informative: int
) -> Paired:
    only_a, only_b = int(((a == 1) & (b == 0)).sum()), int(((a == 0) & (b == 1)).sum())
    p = mcnemar_exact(only_a, only_b)
    if how == "ratio":  # a ratio of paired rates gets no interval (0/n makes it undefined or infinite)
        return Paired(est, math.nan, math.nan, len(a), informative, "none", null, p)
    both, neither = int(((a == 1) & (b == 1)).sum()), int(((a == 0) & (b == 0)).sum())
    lo, hi = newcombe_paired(both, only_a, only_b, neither)
    return Paired(est, lo, hi, len(a), informative, PAIRED_RATES, null, p)


def unpaired_rate_interval(k1: float, n1: float, k2: float, n2: float) -> Paired:
    """Difference of two rates known only as totals (no per-unit rows to pair): Newcombe's interval."""
    lo, hi = newcombe(k1, n1, k2, n2)
    return Paired(k1 / n1 - k2 / n2, lo, hi, int(min(n1, n2)), int(min(n1, n2)), "newcombe (unpaired)", 0.0)
