"""Loss by position's fit: half-octave position bins and the weighted power-law fit a * p^-b + c over bin
means, with a profile interval for b (used by tasks.pass_extras.PassExtras; docs/tasks.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

FIT_LEVEL = 0.95  # the exponent's interval
CHI2_1 = {0.95: 3.841458820694124}[FIT_LEVEL]  # the chi-square (1 dof) quantile of FIT_LEVEL
B_RANGE = (0.0, 10.0)  # the exponent's search range (0 excluded)
MIN_FIT_BINS = 6  # a fit of 3 parameters needs dof left to test its shape and scale its interval
MIN_FIT_DOCS = 2  # one text's tokens drift together: their spread says nothing of another text's


def bin_starts(end: int) -> list[int]:
    """Half-octave bin starts 1, 2, 3, 4, 6, 8, 11, 16, ... (round(2^(k/2)), distinct) below `end`."""
    starts, k = [], 0
    while (s := round(2 ** (k / 2))) < end:
        if not starts or s != starts[-1]:
            starts.append(s)
        k += 1
    return starts


def position_bins(first: int, end: int) -> list[tuple[int, int]]:
    """(start, stop) of the bins holding the positions first..end-1, the first clipped to `first`."""
    starts = bin_starts(end)
    bounds = list(zip(starts, starts[1:] + [end], strict=True))
    return [(max(s, first), e) for s, e in bounds if e > first]


@dataclass(frozen=True)
class PowerLawFit:
    """loss(p) = a * p^-b + c fitted to bin means. `problem`: why the data cannot support the fit (then a, b,
    c are what the search ended on, not a result to report); `b_interval`: FIT_LEVEL profile interval of b."""

    a: float
    b: float
    c: float
    b_interval: tuple[float, float] | None
    chi2_per_dof: float
    bins: int
    problem: str | None = None


def _power_means(bins):
    """exponents -> M[j, i], the mean of p^-exponents[j] over the integer positions of bin i (a number p: that
    point; (start, stop): positions start..stop-1, exact up to 64 positions, else the midpoint-rule integral).
    The positions are laid out once: a fit calls it about 60 times."""
    import numpy as np

    s, e = np.array([tuple(i) if isinstance(i, (tuple, list)) else (i, i + 1) for i in bins], float).T
    exact, size = e - s <= 64, e - s
    log_p = np.log(np.concatenate([np.arange(a, z) for a, z in zip(s[exact], e[exact])] or [np.ones(0)]))
    firsts = np.cumsum(size[exact]) - size[exact]  # where each exact bin's positions start in log_p
    lo, hi = np.log(s[~exact] - 0.5), np.log(e[~exact] - 0.5)  # integral of p^-b over [s - 1/2, e - 1/2]

    def means(exponents):
        b = np.asarray(exponents, float)[:, None]
        out = np.empty((len(b), len(s)))
        out[:, exact] = np.add.reduceat(np.exp(-b * log_p), firsts.astype(int), axis=1) / size[exact]
        one, near = 1.0 - b, np.abs(1.0 - b) < 1e-9
        integral = np.where(near, hi - lo, (np.exp(one * hi) - np.exp(one * lo)) / np.where(near, 1.0, one))
        out[:, ~exact] = integral / size[~exact]
        return out

    return means


def power_law_fit(x, y, weights=None) -> PowerLawFit | None:
    """loss = a * p^-b + c by weighted least squares over bins, 0 < b <= 10 (None for fewer than 4 bins).

    x: per bin a position or a (start, stop) range (the model is then averaged over the bin's positions, as
    the bin mean is); weights: inverse variances of the bin means (default: equal, of the residuals' size).
    For a given b the best a and c are a weighted linear solve; b is searched on a grid, then by golden
    section. The interval of b is the profile one, {b : chi2(b) - chi2_min <= chi2_1(FIT_LEVEL) * s} with
    s = max(1, chi2_min / (bins - 3)) (widened when the bins scatter more than their weights say; without
    weights s = chi2_min / (bins - 3)). `problem` is set when the data do not bound b: the best b or the
    interval at an end of the search range (there a and c diverge: near b = 0, a * p^-b + c ~ (a + c) -
    a * b * ln p for any large a), or fewer than MIN_FIT_BINS bins."""
    import numpy as np

    y = np.asarray(y, float)
    k = len(y)
    if k < 4:
        return None
    w = np.ones(k) if weights is None else np.asarray(weights, float)
    grid, power_means = np.linspace(*B_RANGE, 1001)[1:], _power_means(x)

    def chi2(bs):
        m = power_means(bs)  # (len(bs), k)
        sw = w.sum()
        mx, my = (m * w).sum(1) / sw, (w * y).sum() / sw
        dx, dy = m - mx[:, None], y - my
        sxx, sxy = (w * dx * dx).sum(1), (w * dx * dy).sum(1)
        a = sxy / np.where(sxx > 0, sxx, np.inf)
        c = my - a * mx
        r = y[None, :] - a[:, None] * m - c[:, None]
        return (w * r * r).sum(1), a, c

    profile, _, _ = chi2(grid)
    j = int(np.argmin(profile))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):  # golden section between the best grid point's neighbours
        m1, m2 = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        f1, f2 = chi2([m1, m2])[0]
        lo, hi = (lo, m2) if f1 <= f2 else (m1, hi)
    b = (lo + hi) / 2
    best, a_arr, c_arr = chi2([b])
    best, a, c = float(best[0]), float(a_arr[0]), float(c_arr[0])
    dof = k - 3
    # given weights are inverse variances (scaled up where the bins scatter more); without, the variance is
    # the residuals' own
    scale = (best / dof if weights is None else max(1.0, best / dof)) if dof > 0 else math.inf
    threshold = CHI2_1 * scale
    inside = profile - best <= threshold
    left = right = j
    while left > 0 and inside[left - 1]:
        left -= 1
    while right < len(grid) - 1 and inside[right + 1]:
        right += 1
    interval, problem = None, None
    if not all(map(math.isfinite, (a, b, c, best))):
        problem = "the fit did not converge"
    elif k < MIN_FIT_BINS:
        problem = f"{k} bins: a 3-parameter fit needs at least {MIN_FIT_BINS}"
    elif left == 0 or right == len(grid) - 1:
        problem = (
            f"the data do not bound the exponent: its {FIT_LEVEL:.0%} interval reaches an end of the search "
            f"range ({B_RANGE[0]:g}, {B_RANGE[1]:g}]"
        )
    else:

        def edge(i_out, i_in):  # linear interpolation of the crossing between two grid points
            f_out, f_in = profile[i_out] - best - threshold, profile[i_in] - best - threshold
            t = f_out / (f_out - f_in) if f_out != f_in else 0.5
            return float(grid[i_out] + t * (grid[i_in] - grid[i_out]))

        interval = (min(edge(left - 1, left), b), max(edge(right + 1, right), b))
    return PowerLawFit(a, b, c, interval, best / dof if dof > 0 else math.nan, k, problem)
