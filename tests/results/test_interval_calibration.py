"""The intervals mean what they say: seeded simulations from known populations.

Perplexity cells: per-document log-perplexities ~ N(mu, sigma) (log-normal perplexities) and token counts
drawn independently, so the population value the task's estimator (exp of the token-weighted mean log-loss)
targets is exp(mu). A 95% interval must cover it 0.93-0.97 of the time wherever one is shown (4000
replications: the standard error of a coverage near 0.95 is 0.0034). Paired tests: two settings with the same
population on the same documents / prompts (a true null) may be called significant at most 6% of the time.
"""

import math

import numpy as np
import pytest

from results.stats import MIN_T_UNITS, cell_interval, paired_interval, t975

REPS = 4000
MU, SIGMA = 2.5, 0.3  # per-document log-perplexity: ppl around 12, spread like different books


def _tokens(rng, n, equal):
    return np.full(n, 4095.0) if equal else rng.integers(200, 4000, n).astype(float)


@pytest.mark.parametrize("equal_tokens", [True, False], ids=["equal-tokens", "varying-tokens"])
@pytest.mark.parametrize("n", [4, 8, 16])
def test_perplexity_cell_interval_covers_the_population_value(n, equal_tokens):
    rng = np.random.default_rng(1000 + n + 7 * equal_tokens)
    truth = math.exp(MU)
    hits = 0
    for _ in range(REPS):
        ppl = np.exp(rng.normal(MU, SIGMA, n))
        ci = cell_interval("log", ppl, _tokens(rng, n, equal_tokens))
        assert ci.method == "t" and ci.n == n
        hits += ci.lo <= truth <= ci.hi
    assert 0.93 <= hits / REPS <= 0.97, f"coverage {hits / REPS:.4f} at n={n}"


def test_no_interval_below_the_stated_number_of_documents():
    rng = np.random.default_rng(3)
    for n in range(1, MIN_T_UNITS):
        ci = cell_interval("log", np.exp(rng.normal(MU, SIGMA, n)), np.full(n, 100.0))
        assert ci.method == "none" and math.isnan(ci.lo) and math.isnan(ci.hi) and ci.n == n
    assert cell_interval("log", np.exp(rng.normal(MU, SIGMA, MIN_T_UNITS)), None).method == "t"


def test_mean_metric_interval_covers_too():
    rng = np.random.default_rng(11)
    hits = sum(
        cell_interval("mean", v, None).lo <= 5.0 <= cell_interval("mean", v, None).hi
        for v in (rng.normal(5.0, 2.0, 4) for _ in range(REPS))
    )
    assert 0.93 <= hits / REPS <= 0.97


@pytest.mark.parametrize("n", [8, 16])
def test_paired_perplexity_ratio_holds_its_level_under_a_true_null(n):
    # the same documents under two settings with the same population: a document effect shared by both plus
    # setting-specific noise; token counts vary by document
    rng = np.random.default_rng(2000 + n)
    rejected = 0
    for _ in range(REPS):
        doc = rng.normal(MU, SIGMA, n)
        a, b = np.exp(doc + rng.normal(0, 0.05, n)), np.exp(doc + rng.normal(0, 0.05, n))
        w = rng.integers(200, 4000, n).astype(float)
        p = paired_interval("log", a, b, w, w, how="ratio")
        assert p.method == "paired t"
        rejected += p.significant
    assert rejected / REPS <= 0.06, f"null rejected {rejected / REPS:.4f} at n={n}"
    assert rejected / REPS >= 0.03  # near its nominal 5%, not silenced by an overly strict rule


@pytest.mark.parametrize("n", [8, 16, 40])
def test_paired_rates_hold_their_level_under_a_true_null(n):
    # passkey-like 0/1 outcomes on the same prompts: P(correct) 0.6 for both settings, correlated by prompt
    rng = np.random.default_rng(3000 + n)
    rejected = 0
    for _ in range(REPS):
        easy = rng.random(n) < 0.5
        p_ok = np.where(easy, 0.9, 0.3)
        a, b = (rng.random(n) < p_ok).astype(float), (rng.random(n) < p_ok).astype(float)
        rejected += paired_interval("rate", a, b).significant
    assert rejected / REPS <= 0.06, f"null rejected {rejected / REPS:.4f} at n={n}"


def test_a_real_paired_difference_is_found():
    # the power side: a consistent 35% perplexity gain over 8 documents, and 8 of 8 prompts won
    rng = np.random.default_rng(5)
    doc = rng.normal(MU, SIGMA, 8)
    p = paired_interval("log", np.exp(doc + rng.normal(0, 0.05, 8)), np.exp(doc + 0.3), how="ratio")
    assert p.significant and p.hi < 1
    r = paired_interval("rate", np.ones(8), np.zeros(8))
    assert r.significant and r.p == pytest.approx(2 / 2**8) and r.lo > 0


def test_t_quantiles_match_scipy():
    stats = pytest.importorskip("scipy.stats")
    for dof in (1, 2, 3, 7, 10, 11, 15, 30, 31, 60, 200, 5000):
        assert t975(dof) == pytest.approx(float(stats.t.ppf(0.975, dof)), abs=2e-5)


@pytest.mark.parametrize("n, base", [(24, 0.9), (100, 0.9), (400, 0.6)])
def test_nolima_rule_rarely_claims_a_length_at_the_edge_of_its_bar(n, base):
    """results.reach's `short` rule: claim L when Wilson's lower bound at L >= 0.85 x the base's point
    estimate (the base established: its lower bound >= 0.5). The base's own noise is not in the bar, so at a
    true rate of exactly 0.85 x the true base the rule claims L more often than Wilson's one-sided 2.5%:
    stated in docs/results.md as 3-6%; this holds it under 7% (seeded, 40 000 draws: s.e. ~0.0013)."""
    from results.reach import MIN_BAR, NOLIMA_FRACTION
    from results.stats import wilson

    lower = np.array([wilson(k, n)[0] for k in range(n + 1)])  # the project's own Wilson bound, per count
    rng = np.random.default_rng(7)
    k_base = rng.binomial(n, base, 40_000)
    k_at = rng.binomial(n, NOLIMA_FRACTION * base, 40_000)
    claimed = (lower[k_base] >= MIN_BAR) & (lower[k_at] >= NOLIMA_FRACTION * k_base / n)
    assert 0.01 < claimed.mean() < 0.07
