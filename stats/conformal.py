"""Order statistics and the split conformal quantities built on them (paper 000, section 2-3)."""

from __future__ import annotations

import math

import numpy as np


def check_alpha(alpha: float) -> None:
    """Raise ValueError unless the miscoverage level alpha lies in (0, 1)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")


def split_conformal_order(n: int, alpha: float) -> int:
    """ceil((n + 1)(1 - alpha)), the order of split conformal (paper 000, section 2.1).

    A small guard keeps exact products such as 30 * 0.9 from rounding up to the next integer.
    """
    check_alpha(alpha)
    return math.ceil((n + 1) * (1.0 - alpha) - 1e-9)


def smallest_calibration(alpha: float) -> int:
    """The fewest calibration points for which the split conformal threshold is finite: the least
    n with ceil((n + 1)(1 - alpha)) <= n (9 for alpha = 0.1). FedType (paper 002, eq. 4, with
    alpha = theta) refuses sites with fewer validation points."""
    n = 1
    while split_conformal_order(n, alpha) > n:
        n += 1
    return n


def order_statistic(values, k: int) -> float:
    """Q_(k) of paper 000 eq. (2): the k-th smallest value, or +inf when k exceeds the sample size.

    k is 1-based; k < 1 is an error (there is no 0-th smallest value).
    """
    if k < 1:
        raise ValueError(f"order k must be >= 1, got {k}")
    values = np.asarray(values, dtype=float).reshape(-1)
    if k > values.size:
        return math.inf
    return float(np.partition(values, k - 1)[k - 1])


def split_conformal_threshold(scores, alpha: float) -> float:
    """Split conformal threshold Q_(ceil((n+1)(1-alpha))) on n pooled scores (paper 000, section 2.1)."""
    scores = np.asarray(scores, dtype=float).reshape(-1)
    return order_statistic(scores, split_conformal_order(scores.size, alpha))


def quantile_of_quantiles(local_quantiles, k: int) -> float:
    """Q_(k) of the sites' local quantiles: the server step of FedCP-QQ (paper 000, eq. 3)."""
    return order_statistic(local_quantiles, k)


def average_of_quantiles(local_quantiles) -> float:
    """FedCP-Avg's server step (Lu & Kalpathy-Cramer 2021, the baseline of paper 000 section 5)."""
    return float(np.mean(np.asarray(local_quantiles, dtype=float)))
