"""Power (issue 37 item 3): what an unmarked comparison could have marked means what it says — checked by
seeded simulation of the project's own marking rules (results.stats), not by the formulas that produced it.

- paired t: at the reported detectable difference (computed from the true spread) the rule marks 80% of the
  time; the noncentral-t solution also matches the textbook (t_crit + z_0.8) x se for many units;
- clusters (t + exact sign-flip): the reported difference is a lower bound that is nearly tight — marked at
  most ~80% of the time there, and more often 20% beyond; fewer than 6 clusters are never marked;
- paired 0/1 outcomes (McNemar): with every change one way, 80% at the reported difference;
- the power a headline states for a claimed size matches (up to 12 clusters) or brackets the simulated one.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
from ropebench.results import power
from ropebench.results.comparisons import power_text
from ropebench.results.stats import paired_clusters, paired_interval, paired_power, t975

REPS = 2000  # s.e. of a simulated power near 0.8: 0.009


def _clusters(rng, k: int, shift: float, sd: float = 1.0):
    """Two settings' rows on k clusters of 2 questions: the second setting 0, the first a cluster contrast
    N(shift, sd) (the same for both questions of a cluster)."""
    labels = np.repeat(np.arange(k), 2)
    return np.repeat(rng.normal(shift, sd, k), 2), labels, np.zeros(2 * k), labels


def _marked_clusters(rng, k: int, shift: float, reps: int = REPS) -> float:
    return float(
        np.mean([paired_clusters("mean", *_clusters(rng, k, shift)).significant for _ in range(reps)])
    )


@pytest.mark.parametrize("n", [6, 10])
def test_paired_t_marks_the_detectable_difference_80_percent_of_the_time(n):
    rng = np.random.default_rng(n)
    sd = 0.3
    detectable = power.detectable_t(sd / math.sqrt(n), n - 1, t975(n - 1))
    marked = np.mean(
        [paired_interval("mean", rng.normal(detectable, sd, n), np.zeros(n)).significant for _ in range(REPS)]
    )
    assert 0.77 <= marked <= 0.83, marked
    # the reported value on one sample: the same formula with that sample's spread
    a = rng.normal(0.0, sd, n)
    p = paired_interval("mean", a, np.zeros(n))
    assert p.detectable == pytest.approx(
        power.detectable_t(a.std(ddof=1) / math.sqrt(n), n - 1, t975(n - 1)), rel=1e-9
    )


def test_noncentrality_approaches_the_textbook_sum_of_quantiles():
    z80 = NormalDist().inv_cdf(0.8)
    for dof in (60, 400):
        assert power.t_ncp(float(dof), t975(dof)) == pytest.approx(t975(dof) + z80, rel=0.01)


@pytest.mark.parametrize("k", [6, 8, 12])
def test_cluster_detectable_difference_is_a_nearly_tight_lower_bound(k):
    rng = np.random.default_rng(100 + k)
    detectable = power.detectable_clusters(1 / math.sqrt(k), 1.0, k, t975(k - 1))
    assert 0.74 <= _marked_clusters(rng, k, detectable) <= 0.83
    assert _marked_clusters(rng, k, 1.2 * detectable) >= 0.85


def test_the_issue_example_six_haystacks_of_a_rate_cannot_find_0_24():
    """A 0/1 metric at 0.93 vs 0.69 on 6 haystacks of 6 questions (the questions of a haystack agree with
    ICC 0.5): marked only a few percent of the time, and the reported detectable difference says so (it is
    far above 0.24, or beyond any possible difference)."""
    rng = np.random.default_rng(37)
    k, q = 6, 6
    labels = np.repeat(np.arange(k), q)
    marks, detectable = 0, []
    for _ in range(400):
        rows = []
        for p_true in (0.93, 0.69):
            z = NormalDist().inv_cdf(p_true)
            latent = rng.normal(0, math.sqrt(0.5), (k, 1)) + rng.normal(0, math.sqrt(0.5), (k, q))
            rows.append(((latent.ravel() + z) > 0).astype(float))
        res = paired_clusters("rate", rows[0], labels, rows[1], labels)
        marks += res.significant
        detectable.append(res.detectable)
    assert marks / 400 < 0.15
    assert np.median(detectable) > 0.24 * 1.5


def test_fewer_than_six_clusters_cannot_be_marked_and_say_so():
    rng = np.random.default_rng(5)
    res = paired_clusters("mean", *_clusters(rng, 5, 10.0))
    assert not res.significant and res.p == pytest.approx(2 / 2**5)
    assert "0.0625" in res.cannot and math.isnan(res.detectable)
    row = {"interval": res.method, "n": res.n, "detectable": res.detectable, "cannot": res.cannot}
    assert power_text(row) == " (p cannot reach 0.05 at n=5)"


@pytest.mark.parametrize("n", [8, 16])
def test_mcnemar_detectable_difference_with_every_change_one_way(n):
    rng = np.random.default_rng(200 + n)
    delta = power.mcnemar_delta(n)
    marked = 0
    for _ in range(REPS):
        changed = rng.random(n) < delta  # a changes from 0 to 1 on these prompts, never back
        marked += paired_interval("rate", changed.astype(float), np.zeros(n)).significant
    assert 0.76 <= marked / REPS <= 0.83
    assert paired_interval("rate", np.ones(n), np.zeros(n)).detectable == pytest.approx(delta)


@pytest.mark.parametrize("k, shift", [(6, 1.2), (8, 0.9)])
def test_the_stated_power_matches_the_simulated_one(k, shift):
    """Up to 12 clusters paired_power simulates the rule itself (its own seeded draws, its own sign-flip
    code): within simulation error of the project's paired_clusters run on fresh draws; the bounds used
    beyond 12 bracket it too."""
    rng = np.random.default_rng(300 + k)
    row = {"interval": "cluster t + sign-flip", "how": "delta", "estimate": shift, "n": k}
    row |= {"se": 1 / math.sqrt(k), "sd": 1.0}
    lo, hi = paired_power(row)
    simulated = _marked_clusters(rng, k, shift)
    assert lo == hi and abs(lo - simulated) < 0.04, (lo, simulated)
    se, crit = 1 / math.sqrt(k), t975(k - 1)
    lower, upper = power.power_bounds("sign-flip", shift, se=se, crit=crit, sd=1.0, k=k)
    assert lower - 0.03 <= simulated <= upper + 0.03, (lower, simulated, upper)


def test_ratio_detectable_is_a_factor_on_the_log_scale():
    rng = np.random.default_rng(9)
    n, sd = 8, 0.05
    a = np.exp(2.5 + rng.normal(0, sd, n))
    p = paired_interval("log", a, np.full(n, math.exp(2.5)), how="ratio")
    log_ratios = np.log(a) - 2.5
    expected = power.detectable_t(log_ratios.std(ddof=1) / math.sqrt(n), n - 1, t975(n - 1))
    assert p.detectable == pytest.approx(math.exp(expected), rel=1e-9)
    assert power_text({"interval": p.method, "how": "ratio", "detectable": p.detectable, "n": n}).startswith(
        " (80% power at ×/÷1.0"
    )
