"""How conservative a private prediction set can be: paper 003's coverage upper bound.

Paper 003 (Angelopoulos, Bates, Zrnic, Jordan, "Private prediction sets"), section 3: algorithm 3
calibrates at the level q-tilde of eq. (3) (stats.dp.private_level), and theorem 2 gives coverage
>= 1 - alpha. Theorem 3 bounds it from above:

    P(Y in C(X)) <= 1 - (1 - gamma) alpha
                    + (1 - gamma alpha) ( 2 p_max^m + 2 (1 + max{q~/(1-q~), 1}) log(m/(gamma alpha)) / ((n+1) epsilon) )

with p_max^m = max_j P(s_1 in I_j) the largest probability of one bin (section 3, before theorem
3; proof in appendix B.2, eq. 6-8). Corollary 1: for scores with a bounded density and uniform
bins, m proportional to n epsilon and gamma = 1/m give 1 - alpha + O(log(n epsilon / alpha) / (n epsilon)).

Only numpy, scipy and the standard library (stats/ is the ground floor).
"""

from __future__ import annotations

import math

import numpy as np

from stats.dp import private_level


def coverage_upper_bound(n: int, alpha: float, epsilon: float, bins: int, gamma: float, p_max: float) -> float:
    """Theorem 3 of paper 003 (appendix B.2, eq. 6-8): the largest coverage of the private
    prediction sets of algorithm 3 run on n scores with `bins` bins (m) at (alpha, epsilon, gamma),
    when the heaviest bin holds probability p_max of a score.

    q-tilde is eq. (3) uncapped (stats.dp.private_level). When q-tilde >= 1 the mechanism runs at
    level 1 and the theorem says nothing (its max{q~/(1-q~), 1} is unbounded): the bound is 1.
    The theorem's value can exceed 1 (a heavy bin, small n epsilon); it is returned capped at 1,
    the trivial bound."""
    if not (n >= 1 and 0 < alpha < 1 and epsilon > 0 and bins >= 1 and 0 < gamma < 1 and 0 <= p_max <= 1):
        raise ValueError(f"need n >= 1, 0 < alpha < 1, epsilon > 0, bins >= 1, 0 < gamma < 1, 0 <= p_max <= 1; "
                         f"got n={n}, alpha={alpha}, epsilon={epsilon}, bins={bins}, gamma={gamma}, p_max={p_max}")
    q = private_level(n, alpha, epsilon, bins, gamma)
    if q >= 1.0:
        return 1.0
    slack = 2.0 * (1.0 + max(q / (1.0 - q), 1.0)) * math.log(bins / (gamma * alpha)) / ((n + 1) * epsilon)
    return min(1.0, 1.0 - (1.0 - gamma) * alpha + (1.0 - gamma * alpha) * (2.0 * p_max + slack))


def heaviest_bin_share(histogram) -> float:
    """p_max^m of paper 003 section 3 estimated by the largest share of one bin in a histogram of
    scores (counts per bin): max_j #{s_i in I_j} / n. Scores spread evenly over m bins give 1/m."""
    histogram = np.asarray(histogram, dtype=float)
    total = histogram.sum()
    if total <= 0:
        raise ValueError("an empty histogram has no heaviest bin")
    return float(histogram.max() / total)


def corollary1_parameters(n: int, epsilon: float, scale: float = 1.0) -> tuple[int, float]:
    """Corollary 1 of paper 003: m proportional to n epsilon (m = max(1, round(scale n epsilon)))
    and gamma = 1/m; with a bounded score density, p_max^m = O(1/m) and theorem 3 becomes
    1 - alpha + O(log(n epsilon / alpha) / (n epsilon)). A single bin gets gamma = 1/2."""
    bins = max(1, int(round(scale * n * epsilon)))
    return bins, (1.0 / bins if bins > 1 else 0.5)


def corollary1_rate(n: int, alpha: float, epsilon: float) -> float:
    """The excess coverage order of corollary 1: log(n epsilon / alpha) / (n epsilon)."""
    return math.log(n * epsilon / alpha) / (n * epsilon)
