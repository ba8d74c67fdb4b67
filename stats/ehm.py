"""How far a Poisson-binomial law is from the binomial of the same mean (paper 000, theorem C.3).

Paper 000, proposition 3.4, bounds the coverage lost to heterogeneous sites by the expected total
variation distance d_TV(PoisBin(p_1, ..., p_m), Bin(m, p~)); theorem C.3 (Ehm 1991, theorem 1)
bounds that distance with p~ = (1/m) sum p_j:

    C [1 - p~^(m+1) - (1 - p~)^(m+1)] [1 - sum p_j (1 - p_j) / (m p~ (1 - p~))]
        <= d_TV(PoisBin(p), Bin(m, p~))
        <= m / (m + 1) [1 - p~^(m+1) - (1 - p~)^(m+1)] [1 - sum p_j (1 - p_j) / (m p~ (1 - p~))]

with C a universal constant the paper does not give. The second bracket equals
sum (p_j - p~)^2 / (m p~ (1 - p~)): the spread of the p_j relative to a binomial's variance, zero
exactly when all p_j are equal (then both laws are Bin(m, p~) and the distance is 0).

`distance` computes the left-hand side's middle term exactly (both probability mass functions,
half their L1 distance), `upper_bound` and `lower_bound_factor` the two sides (the lower one
without its unknown C), and `lower_constant` the ratio distance / factor: the largest C for
which the left inequality holds at that p.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binom

from stats.poissonbinomial import poisson_binomial_pmf


def _check(p) -> np.ndarray:
    p = np.asarray(p, dtype=float)
    if p.ndim != 1 or p.size < 1 or np.any(p < 0) or np.any(p > 1):
        raise ValueError("p must be a non-empty vector of probabilities in [0, 1]")
    return p


def spread(p) -> float:
    """1 - sum p_j (1 - p_j) / (m p~ (1 - p~)) = sum (p_j - p~)^2 / (m p~ (1 - p~)), the second
    bracket of theorem C.3 (paper 000, appendix C.3); 0 when p~ is 0 or 1 (all p_j equal)."""
    p = _check(p)
    mean = p.mean()
    if mean <= 0.0 or mean >= 1.0:
        return 0.0
    return float(np.sum((p - mean) ** 2) / (p.size * mean * (1.0 - mean)))


def edge(p) -> float:
    """1 - p~^(m+1) - (1 - p~)^(m+1), the first bracket of theorem C.3."""
    p = _check(p)
    mean, m = p.mean(), p.size
    return float(1.0 - mean ** (m + 1) - (1.0 - mean) ** (m + 1))


def upper_bound(p) -> float:
    """Theorem C.3's right-hand side (paper 000, appendix C.3; Ehm 1991, theorem 1):
    m / (m + 1) [1 - p~^(m+1) - (1 - p~)^(m+1)] [1 - sum p_j (1 - p_j) / (m p~ (1 - p~))]."""
    p = _check(p)
    return p.size / (p.size + 1.0) * edge(p) * spread(p)


def lower_bound_factor(p) -> float:
    """Theorem C.3's left-hand side divided by its universal constant C:
    [1 - p~^(m+1) - (1 - p~)^(m+1)] [1 - sum p_j (1 - p_j) / (m p~ (1 - p~))]."""
    return edge(p) * spread(p)


def distance(p) -> float:
    """d_TV(PoisBin(p_1, ..., p_m), Bin(m, p~)) exactly: half the L1 distance of the two mass
    functions on 0..m (paper 000, proposition 3.4 and theorem C.3)."""
    p = _check(p)
    pois = poisson_binomial_pmf(p[None, :])[0]
    bino = binom.pmf(np.arange(p.size + 1), p.size, p.mean())
    return float(0.5 * np.abs(pois - bino).sum())


def lower_constant(p) -> float:
    """distance / lower_bound_factor: the largest C for which theorem C.3's left inequality holds
    at this p (nan when the factor is 0, where both sides are 0)."""
    factor = lower_bound_factor(p)
    return float(distance(p) / factor) if factor > 0 else float("nan")
