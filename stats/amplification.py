"""Privacy amplification by shuffling: Feldman, McMillan and Talwar, 'Hiding among the clones'
(FOCS 2021), as paper 000 section 4 ('Privacy amplification by shuffling or aggregation') uses it.

n parties each apply an epsilon_0-LDP randomizer and a shuffler outputs their messages in a
uniformly random order. Theorem 3.2 of FMT21 reduces the shuffled output on neighbouring data
sets to a pair of distributions on {0, ..., c + 1}, mixed over c ~ Bin(n - 1, e^{-eps_0})
(the number of 'clones' among the other parties):

    P_c = alpha A + (1 - alpha) (A + 1),   Q_c = (1 - alpha) A + alpha (A + 1),
    A ~ Bin(c, 1/2),   alpha = e^{eps_0} / (1 + e^{eps_0}),

and the shuffled output is (eps, delta)-DP for delta = E_c[ D_{e^eps}(P_c || Q_c) ], the hockey-
stick divergence (the two orders are equal by the symmetry x -> c + 1 - x). The likelihood ratio
P_c / Q_c decreases in x, so the divergence is a difference of two binomial CDFs at one cutoff;
`shuffled_delta` sums it over every c with non-negligible mass and adds the neglected mass in
full (an upper bound, as the authors' reference code does). A sum of one-hot bins (secure
aggregation without noise) reveals the same multiset as a shuffle, so the same bound applies.

The bound assumes each party's randomizer is eps_0-DP between any two of its inputs (LDP).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import stats

TAIL = 1e-18  # binomial mass left out of the sum over c (added to delta in full)


def _hockey_stick(c: np.ndarray, epsilon: float, epsilon0: float) -> np.ndarray:
    """D_{e^eps}(P_c || Q_c) for each clone count c (FMT21 theorem 3.2, the one-step divergence)."""
    alpha = math.exp(epsilon0) / (1.0 + math.exp(epsilon0))
    # P(x) > e^eps Q(x)  <=>  x < beta (c + 1), beta = r / (1 + r), r = (alpha - e^eps (1 - alpha)) / (e^eps alpha - (1 - alpha))
    r = (alpha - math.exp(epsilon) * (1 - alpha)) / (math.exp(epsilon) * alpha - (1 - alpha))
    cutoff = np.floor(r / (1.0 + r) * (c + 1))
    a_le = stats.binom.cdf(cutoff, c, 0.5)
    a_le_minus = stats.binom.cdf(cutoff - 1, c, 0.5)
    p_mass = alpha * a_le + (1 - alpha) * a_le_minus
    q_mass = (1 - alpha) * a_le + alpha * a_le_minus
    return np.maximum(p_mass - math.exp(epsilon) * q_mass, 0.0)


def shuffled_delta(epsilon0: float, parties: int, epsilon: float) -> float:
    """delta such that shuffling `parties` eps_0-LDP messages is (eps, delta)-DP (FMT21 thm 3.2,
    numerically). delta = 0 once eps >= eps_0 (the local guarantee already holds)."""
    if epsilon0 <= 0 or parties < 1:
        raise ValueError("need epsilon_0 > 0 and at least one party")
    if epsilon >= epsilon0:
        return 0.0
    if parties == 1:
        return float(_hockey_stick(np.array([0]), epsilon, epsilon0)[0])
    clones = stats.binom(parties - 1, math.exp(-epsilon0))
    lo, hi = int(clones.ppf(TAIL)), int(clones.isf(TAIL))
    c = np.arange(max(lo - 1, 0), min(hi + 1, parties - 1) + 1)
    weights = clones.pmf(c)
    neglected = max(0.0, 1.0 - float(weights.sum()))
    return float(min(1.0, np.dot(weights, _hockey_stick(c, epsilon, epsilon0)) + neglected))


@lru_cache(maxsize=1024)
def shuffled_epsilon(epsilon0: float, parties: int, delta: float, tol: float = 1e-9) -> float:
    """The smallest central eps (to `tol`) with shuffled_delta(eps_0, n, eps) <= delta."""
    if not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")
    if shuffled_delta(epsilon0, parties, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, epsilon0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if shuffled_delta(epsilon0, parties, mid) <= delta else (mid, hi)
    return hi


@lru_cache(maxsize=1024)
def local_epsilon_for(epsilon: float, parties: int, delta: float, tol: float = 1e-7,
                      ceiling: float = 40.0) -> float:
    """The inverse: the largest eps_0 (to `tol`) whose shuffle of `parties` messages is
    (eps, delta)-DP, i.e. shuffled_delta(eps_0, n, eps) <= delta (increasing in eps_0). At
    least eps itself, since eps_0 = eps always works."""
    if epsilon <= 0:
        raise ValueError("epsilon must be positive")
    if not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")
    if shuffled_delta(ceiling, parties, epsilon) <= delta:
        return ceiling
    lo, hi = epsilon, ceiling
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if shuffled_delta(mid, parties, epsilon) <= delta else (lo, mid)
    return lo


def closed_form_epsilon(epsilon0: float, parties: int, delta: float) -> float:
    """FMT21 theorem 3.1: log(1 + (e^eps0 - 1)/(e^eps0 + 1) (8 sqrt(e^eps0 log(4/delta)) / sqrt(n)
    + 8 e^eps0 / n)), valid for eps_0 <= log(n / (16 log(2/delta))); eps_0 itself outside that."""
    if epsilon0 > math.log(parties / (16 * math.log(2 / delta))):
        return epsilon0
    e0 = math.exp(epsilon0)
    return min(epsilon0, math.log1p((e0 - 1) / (e0 + 1) * (8 * math.sqrt(e0 * math.log(4 / delta)) / math.sqrt(parties)
                                                            + 8 * e0 / parties)))
