"""The intervals mean what they say: seeded simulations from known populations.

Perplexity cells: per-document log-perplexities x_i drawn around mu with token counts w_i, so the population
value the task's estimator (exp of the token-weighted mean log-loss) targets is exp(mu). Four populations for
the units, each at every n from 3 to 16:
- normal (log-normal perplexities), tokens equal or varying independently of the values;
- skewed: mu + sigma * (Exp(1) - 1), a centred exponential (skewness 2: a few much harder documents), tokens
  equal or varying;
- weight-correlated: heavier units are noisier (spread proportional to the weight, e.g. LongPPL's documents
  with more key tokens), with uniform or heavy-tailed (log-normal) weights.
A 95% interval must cover the truth at least 0.93 of the time in each (SIM_REPS replications: the standard
error of a coverage near 0.95 is 0.0022), and at most 0.995 in the normal cases (wider only where it must be).
Kish's t on n - 1 dof, used before, covers 0.88-0.92 in the skewed cases and, at n = 16, 0.87 and 0.62 in
the weight-correlated ones. Paired tests: two settings with the same population on the same documents /
prompts (a true null) may be called significant at most 6% of the time.
"""

import math

import numpy as np
import pytest
from ropebench.results.overview import legend_lines
from ropebench.results.stats import (
    MIN_T_UNITS,
    SKEW_T_ONE_SIDED_MISS,
    cell_interval,
    paired_interval,
    skew_t,
    t975,
    t975_array,
)

REPS = 4000
SIM_REPS = 10000
MU, SIGMA = 2.5, 0.3  # per-document log-perplexity: ppl around 12, spread like different books
NS = range(3, 17)


def _tokens(rng, n, equal):
    return np.full(n, 4095.0) if equal else rng.integers(200, 4000, n).astype(float)


def _normal(rng, shape, equal):
    tokens = np.full(shape, 4095.0) if equal else rng.integers(200, 4000, shape).astype(float)
    return rng.normal(MU, SIGMA, shape), tokens


def _skewed(rng, shape, equal):
    tokens = np.full(shape, 4095.0) if equal else rng.integers(200, 4000, shape).astype(float)
    return MU + SIGMA * (rng.exponential(1.0, shape) - 1.0), tokens


def _noisier_when_heavier(rng, shape, heavy_tailed):
    keys = np.ceil(30 * rng.lognormal(0.0, 1.0, shape)) if heavy_tailed else rng.integers(1, 400, shape)
    keys = keys.astype(float)
    return MU + SIGMA * keys / keys.mean() * rng.normal(0.0, 1.0, shape), keys


CASES = {
    "normal, equal tokens": lambda rng, shape: _normal(rng, shape, True),
    "normal, varying tokens": lambda rng, shape: _normal(rng, shape, False),
    "skewed, equal tokens": lambda rng, shape: _skewed(rng, shape, True),
    "skewed, varying tokens": lambda rng, shape: _skewed(rng, shape, False),
    "noisier when heavier": lambda rng, shape: _noisier_when_heavier(rng, shape, False),
    "noisier when heavier, heavy-tailed weights": lambda rng, shape: _noisier_when_heavier(rng, shape, True),
}


def _draw(case: str, n: int, reps: int = SIM_REPS):
    rng = np.random.default_rng([list(CASES).index(case), n])
    return CASES[case](rng, (reps, n))


def _kish_t(x, w):
    """The interval used before, by its formula: Kish's variance s^2 sum(w^2) / sum(w)^2, t on n - 1 dof."""
    n = x.shape[-1]
    centre = (w * x).sum(-1) / w.sum(-1)
    half = t975(n - 1) * np.sqrt(x.var(-1, ddof=1) * (w * w).sum(-1) / w.sum(-1) ** 2)
    return centre - half, centre + half


@pytest.mark.parametrize("case", list(CASES))
def test_perplexity_interval_covers_the_population_value_at_3_to_16_documents(case):
    """Coverage, and each bound read alone (issue 37 item 7): the misses fall on the side the units are
    skewed to, so a bound alone errs more than a symmetric interval's 2.5%; the legend states the rate each
    bound holds (SKEW_T_ONE_SIDED_MISS), and this holds it on every population and n."""
    coverage, below, above = {}, {}, {}
    for n in NS:
        x, w = _draw(case, n)
        _, lo, hi = skew_t(x, w)
        coverage[n] = float(((lo <= MU) & (MU <= hi)).mean())
        below[n], above[n] = float((MU < lo).mean()), float((hi < MU).mean())  # truth under / over it
    assert min(coverage.values()) >= 0.93, coverage
    if case.startswith("normal"):
        assert max(coverage.values()) <= 0.995, coverage
    assert max(max(below.values()), max(above.values())) <= SKEW_T_ONE_SIDED_MISS, (below, above)
    if case.startswith("skewed"):  # the stated rate is needed: the upper bound alone errs beyond 2.5%
        assert max(above.values()) > 0.025 and max(below.values()) < 0.01, (below, above)


@pytest.mark.parametrize("case, n", [("skewed, equal tokens", 5), ("noisier when heavier", 16)])
def test_the_simulation_bites(case, n):
    """Kish's t on n - 1 dof (the interval used before) misses these populations' truth too often."""
    x, w = _draw(case, n)
    lo, hi = _kish_t(x, w)
    assert ((lo <= MU) & (MU <= hi)).mean() < 0.925


@pytest.mark.parametrize("n, widest", [(3, 2.2), (5, 1.5), (8, 1.3), (16, 1.15)])
def test_width_in_the_normal_case_stays_near_the_plain_t(n, widest):
    """What robustness to skew costs where nothing is skewed: the mean width against the plain t interval
    (documented: 2.1x at n = 3, 1.45x at 5, 1.24x at 8, 1.10x at 16)."""
    x, w = _draw("normal, equal tokens", n)
    _, lo, hi = skew_t(x, w)
    plain_lo, plain_hi = _kish_t(x, w)
    assert 1.0 <= (hi - lo).mean() / (plain_hi - plain_lo).mean() <= widest


def test_the_interval_leans_the_way_the_sample_is_skewed():
    x = np.log(np.array([10.0, 11.0, 12.0, 11.5, 40.0]))
    centre, lo, hi = skew_t(x)
    assert hi - centre > centre - lo > 0
    centre, lo, hi = skew_t(-x)  # mirrored values, mirrored interval
    assert centre - lo > hi - centre > 0
    centre, lo, hi = skew_t(np.full(4, 2.0), np.array([1.0, 5.0, 2.0, 9.0]))  # no spread: no width
    assert centre == lo == hi == pytest.approx(2.0)


@pytest.mark.parametrize("clustered", [False, True], ids=["documents", "clusters"])
def test_perplexity_cell_uses_the_calibrated_interval(clustered):
    """The same coverage through the table's cell_interval: 8 skewed documents, each scored as one row, or as
    2 windows (rows) that share the document's cluster."""
    rng = np.random.default_rng(17 + clustered)
    truth, hits, reps = math.exp(MU), 0, 2000
    for _ in range(reps):
        doc = MU + SIGMA * (rng.exponential(1.0, 8) - 1.0)
        if clustered:
            loss = np.repeat(doc, 2) + rng.normal(0, 0.05, 16)
            ci = cell_interval("log", np.exp(loss), np.full(16, 2048.0), clusters=np.repeat(np.arange(8), 2))
            assert (ci.method, ci.n, ci.rows) == ("t (clusters)", 8, 16)
        else:
            ci = cell_interval("log", np.exp(doc), np.full(8, 4096.0))
            assert (ci.method, ci.n) == ("t", 8)
        hits += ci.lo <= truth <= ci.hi
    assert hits / reps >= 0.93


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
    fractional = np.array([1.0, 1.07, 1.3, 1.5, 2.25, 3.9, 6.5, 9.99, 10.5, 14.3, 47.5, 600.2])
    assert t975_array(fractional) == pytest.approx(stats.t.ppf(0.975, fractional), abs=1e-9)
    assert t975(2.25) == pytest.approx(float(stats.t.ppf(0.975, 2.25)), abs=1e-9)


@pytest.mark.parametrize("n, base", [(24, 0.9), (100, 0.9), (400, 0.6)])
def test_nolima_rule_rarely_claims_a_length_at_the_edge_of_its_bar(n, base):
    """results.reach_rules' `short` rule: claim L when Wilson's lower bound at L >= 0.85 x the base's point
    estimate (the base established: its lower bound >= 0.5). The base's own noise is not in the bar, so at a
    true rate of exactly 0.85 x the true base the rule claims L more often than Wilson's one-sided 2.5%:
    stated in docs/results.md as 3-6%; this holds it under 7% (seeded, 40 000 draws: s.e. ~0.0013)."""
    from ropebench.results.reach_rules import MIN_BAR, NOLIMA_FRACTION
    from ropebench.results.stats import wilson

    lower = np.array([wilson(k, n)[0] for k in range(n + 1)])  # the project's own Wilson bound, per count
    rng = np.random.default_rng(7)
    k_base = rng.binomial(n, base, 40_000)
    k_at = rng.binomial(n, NOLIMA_FRACTION * base, 40_000)
    claimed = (lower[k_base] >= MIN_BAR) & (lower[k_at] >= NOLIMA_FRACTION * k_base / n)
    assert 0.01 < claimed.mean() < 0.07


def test_legend_names_the_interval_the_captions_name_and_its_one_sided_rate():
    legend = legend_lines()
    assert "perplexity: skew_t" in legend[0] and "t on the log scale" not in legend[0]
    skew = next(line for line in legend if line.startswith("skew_t"))
    assert f"up to {SKEW_T_ONE_SIDED_MISS:.0%}" in skew
