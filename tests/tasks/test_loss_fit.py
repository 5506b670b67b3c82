"""tasks.key_tokens.power_law_fit as loss by position uses it: bins of unequal weight (tokens / pooled token
variance), a profile interval for the exponent, and no fit where the data cannot bound it. Seeded simulation
with the true law 3 p^-0.5 + 2.5 (issue 33 item 2)."""

import math

import numpy as np
from ropebench.tasks import key_tokens as kt

TRUE = (3.0, 0.5, 2.5)


def simulate(rng, docs, length=4096, noise=2.0):
    """Bin means and pooled variance of `docs` documents whose token losses are the law plus a document
    offset (absorbed by c) plus independent noise — what PassExtras accumulates."""
    bins = kt.position_bins(1, length)
    p = np.arange(1, length)
    a, b, c = TRUE
    losses = a * p**-b + c + rng.normal(0.0, 0.3, (docs, 1)) + rng.normal(0.0, noise, (docs, len(p)))
    means, tokens = [], []
    for s, e in bins:
        part = losses[:, s - 1 : e - 1]
        means.append(part.mean())
        tokens.append(part.size)
    variance = losses.var(ddof=1)
    return bins, means, [n / variance for n in tokens]


def test_weighted_fit_interval_covers_the_truth_and_is_less_noisy_than_unweighted():
    rng = np.random.default_rng(20261127)
    weighted, unweighted, covered, refused = [], [], 0, 0
    runs = 200
    for _ in range(runs):
        bins, means, weights = simulate(rng, docs=4)
        fit = kt.power_law_fit(bins, means, weights)
        if fit.problem is not None:
            refused += 1
            continue
        weighted.append(fit.b)
        covered += fit.b_interval[0] <= TRUE[1] <= fit.b_interval[1]
        plain = kt.power_law_fit(bins, means)  # every bin weight 1 (the fit before issue 33)
        unweighted.append(plain.b)
    assert refused <= runs * 0.05  # 4 documents of 4096 tokens: the data bound b nearly always
    assert covered / (runs - refused) >= 0.9
    assert np.std(weighted) < 0.5 * np.std(unweighted)  # token weights: the exponent at least 2x less noisy
    assert abs(np.mean(weighted) - TRUE[1]) < 0.05


def test_no_fit_where_the_data_cannot_bound_the_exponent():
    """Loss that falls as a log (the b -> 0 limit: a and c diverge) and too few bins are refused, with the
    reason."""
    bins = kt.position_bins(1, 4096)
    rng = np.random.default_rng(1)
    log_law = [5.0 - 0.3 * math.log((s + e - 1) / 2) + rng.normal(0, 1e-3) for s, e in bins]
    fit = kt.power_law_fit(bins, log_law, [e - s for s, e in bins])
    assert fit.problem.startswith("the data do not bound the exponent") and fit.b_interval is None
    few = kt.power_law_fit(bins[:5], [3.0 * s**-0.5 + 2.5 for s, _ in bins[:5]])
    assert few.problem == "5 bins: a 3-parameter fit needs at least 6"
    flat = kt.power_law_fit(bins, [2.5 + rng.normal(0, 0.01) for _ in bins])
    assert flat.problem is not None  # no fall with position: nothing to fit


def test_interval_narrows_with_more_documents():
    def median_width(docs):
        fits = [kt.power_law_fit(*simulate(np.random.default_rng(docs * 100 + i), docs)) for i in range(5)]
        assert all(f.problem is None for f in fits)
        return float(np.median([f.b_interval[1] - f.b_interval[0] for f in fits]))

    assert median_width(8) < median_width(2)
