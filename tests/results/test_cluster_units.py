"""Honest units (issue 29 item 2): rows that share a cluster (the questions asked about one haystack) are one
independent unit. Seeded simulations hold the cell intervals' coverage and the paired test's level at
intra-cluster correlation 0.5 with 2, 4 and 8 clusters of 6 questions, for a 0/1 rate and a mean; the tidy
frame's functions count clusters (n) and rows, and pair settings by cluster id.

The level check allows the nominal 5% plus the binomial noise of LEVEL_REPS simulated nulls: a test whose
true level is exactly 5% exceeds the bound with probability 0.001 whatever the seed, and one at 7% passes it
with probability about 0.01."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest
from ropebench import results
from ropebench.results.frame import normalize
from ropebench.results.meaning import Metric
from ropebench.results.stats import MIN_INFORMATIVE_PAIRS, cell_interval, paired_clusters, paired_interval

ICC = 0.5  # intra-cluster correlation of the latent score
QUESTIONS = 6  # questions per cluster (haystack)
REPS = 1000
LEVEL_REPS = 4000  # simulated true nulls per level check
NOMINAL = 0.05


def binomial_bound(reps: int, p: float, tail: float = 0.001) -> int:
    """The smallest count k with P(Binomial(reps, p) > k) <= tail: the most rejections a test at level p
    shows in ``reps`` independent nulls, but for a 1-in-1000 draw."""
    pmf, cdf = (1 - p) ** reps, 0.0
    for k in range(reps + 1):
        cdf += pmf
        if 1 - cdf <= tail:
            return k
        pmf *= (reps - k) / (k + 1) * p / (1 - p)
    return reps


LEVEL_BOUND = binomial_bound(LEVEL_REPS, NOMINAL)  # 244 of 4000 (6.1%)


def _latent(rng, clusters: int, mu: float, settings: int) -> np.ndarray:
    """(settings, clusters * QUESTIONS) latent scores: mu + a cluster effect (variance ICC, its own per
    setting: a haystack can suit one method and not another, so the paired differences are clustered too) + a
    question's own noise (variance 1 - ICC). Each score is N(mu, 1); two questions of one cluster correlate
    ICC."""
    u = rng.normal(0.0, math.sqrt(ICC), (settings, clusters, 1))
    e = rng.normal(0.0, math.sqrt(1 - ICC), (settings, clusters, QUESTIONS))
    return (mu + u + e).reshape(settings, clusters * QUESTIONS)


def _observed(kind: str, z: np.ndarray) -> np.ndarray:
    return (z > 0).astype(float) if kind == "rate" else z


def _truth(kind: str, mu: float) -> float:
    # rate: P(N(mu, 1) > 0) = Phi(mu); mean: mu
    return NormalDist().cdf(mu) if kind == "rate" else mu


def _labels(clusters: int) -> np.ndarray:
    return np.repeat([f"haystack-{j}" for j in range(clusters)], QUESTIONS)


@pytest.mark.parametrize("kind", ["rate", "mean"])
@pytest.mark.parametrize("clusters", [2, 4, 8])
def test_cell_intervals_cover_at_intra_cluster_correlation_half(kind, clusters):
    """Coverage >= 0.93. A cell with no interval (a mean over fewer than 3 clusters) claims nothing: it counts
    as the whole range, i.e. as covering. Rates always get an interval (Wilson at the effective number of
    clusters)."""
    rng = np.random.default_rng(1000 * clusters + (kind == "rate"))
    labels = _labels(clusters)
    for mu in (0.0, 1.0):
        covered, without = 0, 0
        for _ in range(REPS):
            y = _observed(kind, _latent(rng, clusters, mu, 1)[0])
            ci = cell_interval(kind, y, clusters=labels, unit="haystack")
            assert (ci.n, ci.rows, ci.unit) == (clusters, clusters * QUESTIONS, "haystack")
            if ci.method == "none":
                without += 1
                covered += 1
            else:
                covered += ci.lo <= _truth(kind, mu) <= ci.hi
        assert covered / REPS >= 0.93, (kind, clusters, mu, covered / REPS)
        assert without == (REPS if kind == "mean" and clusters < 3 else 0)


def test_intervals_that_count_rows_as_units_undercover():
    """The simulation bites: the same rows treated as 48 independent questions (no clusters) cover far less
    than 0.95 (design effect 1 + 5 x 0.5 = 3.5)."""
    rng = np.random.default_rng(7)
    covered = sum(
        (ci := cell_interval("mean", _latent(rng, 8, 0.0, 1)[0])).lo <= 0.0 <= ci.hi for _ in range(REPS)
    )
    assert covered / REPS < 0.85


def test_the_level_bound_is_the_binomial_quantile():
    # exact rational tail sums at p = 1/20 (independent of the float recursion above):
    # P(X > bound) <= 1/1000 < P(X > bound - 1)
    assert NOMINAL == 1 / 20

    n, k = LEVEL_REPS, LEVEL_BOUND
    term = math.comb(n, k) * 19 ** (n - k)  # 20**n * P(X = k), an integer
    at_bound, above = term, 0
    for j in range(k, n):
        term = term * (n - j) // ((j + 1) * 19)  # 20**n * P(X = j + 1), exactly
        above += term
    scale = 20**n
    assert 1000 * above <= scale < 1000 * (above + at_bound)
    assert LEVEL_BOUND / LEVEL_REPS < 0.062


@pytest.mark.parametrize("kind", ["rate", "mean"])
@pytest.mark.parametrize("clusters", [2, 4, 8])
def test_paired_test_holds_its_level_under_a_true_null(kind, clusters):
    """Two settings with the same distribution: the paired test over clusters marks a difference no more
    often than a 5% test could by chance (LEVEL_BOUND of LEVEL_REPS). Below MIN_INFORMATIVE_PAIRS (6)
    differing clusters it never marks one."""
    rng = np.random.default_rng(2000 * clusters + (kind == "rate"))
    labels = _labels(clusters)
    rejected = 0
    for _ in range(LEVEL_REPS):
        a, b = _observed(kind, _latent(rng, clusters, 0.5, 2))
        p = paired_clusters(kind, a, labels, b, labels, unit="haystack")
        assert p.n == clusters and p.rows == clusters * QUESTIONS
        rejected += p.significant
    assert rejected <= LEVEL_BOUND, (kind, clusters, rejected / LEVEL_REPS)
    if clusters < MIN_INFORMATIVE_PAIRS:
        assert rejected == 0


@pytest.mark.parametrize("kind", ["rate", "mean"])
def test_paired_test_over_eight_clusters_finds_a_large_difference(kind):
    """Not a test that never rejects: a shift of 1.5 standard deviations is found in most runs."""
    rng = np.random.default_rng(11)
    labels = _labels(8)
    found = 0
    for _ in range(200):
        a = _observed(kind, _latent(rng, 8, 1.5, 1)[0])
        b = _observed(kind, _latent(rng, 8, 0.0, 1)[0])
        found += paired_clusters(kind, a, labels, b, labels).significant
    assert found / 200 > 0.6


def test_paired_test_that_counts_rows_as_units_rejects_too_often():
    """The simulation bites: the same pairs tested row by row (McNemar over 48 questions) reject a true null
    far more often than 5%."""
    rng = np.random.default_rng(13)
    rejected = 0
    for _ in range(REPS):
        a, b = _observed("rate", _latent(rng, 8, 0.5, 2))
        rejected += paired_interval("rate", a, b).significant
    assert rejected / REPS > 0.1


# ------------------------------------------------------------------------------------------ the tidy frame
RATE = Metric(
    "rate", "higher", "fraction of prompts", "hit", reach=("threshold",), independent_unit="haystack"
)


def _frame(haystacks: int, right: dict[str, set[int]]) -> pd.DataFrame:
    """Retrieval-like rows: per method, `haystacks` clusters of QUESTIONS questions (trial = question); a
    method answers every question of the haystacks in right[method] and none of the others."""
    rows = [
        {
            "task": "needles",
            "metric": "hit",
            "model": "m",
            "method": method,
            "factor": 1.0,
            "length": 100,
            "status": "ok",
            "seed": 0,
            "n": 1,
            "trial": h * QUESTIONS + q,
            "cluster": f"haystack-{h}",
            "value": float(h in hits),
            "meaning": RATE.to_json(),
        }
        for method, hits in right.items()
        for h in range(haystacks)
        for q in range(QUESTIONS)
    ]
    return normalize(pd.DataFrame(rows))


def test_six_questions_on_one_haystack_are_one_unit_and_get_no_star():
    frame = _frame(1, {"plain": set(), "ext": {0}})
    long = results.paired_differences(frame, "needles", "hit", cols="length")
    ext = long[long["method"] == "ext"].iloc[0]
    assert (ext["estimate"], ext["n"], ext["rows"], long.attrs["unit"]) == (1.0, 1, 6, "haystack")
    assert not ext["significant"]
    cells = results.estimates(frame, "needles", "hit", by=["method"])
    cell = cells.set_index("method").loc["ext"]
    assert (cell["n"], cell["rows"], cells.attrs["unit"]) == (1, 6, "haystack")
    # Wilson at one effective unit with one success: the same interval as 1 of 1
    z = 1.959963984540054
    assert cell["lo"] == pytest.approx(1 / (1 + z * z)) and cell["hi"] == 1.0
    shown = results.table(frame, "needles", "hit", with_ci=True)
    assert shown.loc["ext", 100].endswith("n=1 (6 rows)")


def test_eight_haystacks_all_one_way_are_significant_by_the_exact_sign_flip_test():
    frame = _frame(8, {"plain": set(), "ext": set(range(8))})
    ext = results.paired_differences(frame, "needles", "hit", cols="length").query("method == 'ext'").iloc[0]
    # 8 cluster differences all +1: of the 2**8 sign patterns only all-plus and all-minus reach |sum| = 8
    assert ext["p"] == pytest.approx(2 / 2**8)
    assert (ext["n"], ext["rows"], ext["informative"]) == (8, 48, 8) and ext["significant"]
    assert ext["interval"] == "cluster t + sign-flip"


def test_pairing_is_by_cluster_id():
    """The baseline answered the questions of each haystack in another order (other trials): pairs are the
    haystacks, not the rows."""
    frame = _frame(8, {"plain": {0, 1}, "ext": set(range(8))})
    plain = frame["method"] == "plain"
    frame.loc[plain, "trial"] = frame.loc[plain, "trial"] + 1000  # no row key in common
    ext = results.paired_differences(frame, "needles", "hit", cols="length").query("method == 'ext'").iloc[0]
    assert (ext["n"], ext["informative"], ext["estimate"]) == (8, 6, pytest.approx(6 / 8))
    assert ext["p"] == pytest.approx(2 / 2**6)  # the 6 differing haystacks, all one way
