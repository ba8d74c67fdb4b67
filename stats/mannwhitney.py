"""Federated Mann-Whitney U tests (paper 004, section 4).

U = sum_i sum_j S(X_i, Y_j) with S = +1 / 0 / -1 as Y_j is above / tied with / below X_i
(section 4.1), so E[U] = 0 under H0 and Var U = m n (N + 1) / 3 [1 - sum(t^3 - t) / (N (N^2 - 1))].
(scipy's U_Y counts pairs with ties as 1/2: U = 2 U_Y - m n.) One-sided alternative: Y larger;
p-values from the normal limit, as in the paper.

Per site: (U_l, V_l, n_l, m_l) (`site_statistic`). Combined: T_sum (eq. 1), T_w with the
power-optimal weights (eq. 2, section 4.3 and appendix eq. 14), Fisher's chi^2_{2L} (section 4.4),
and U_fed on a federated K-anonymous table (eq. 3) whose bins are ties.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class SiteStatistic:
    """What one site contributes to the federated tests (paper 004, sections 4.1-4.3): U_l, its
    tie-corrected null variance and the two sample sizes."""

    u: float  # U_l
    variance: float  # V_l = Var(U_l | H0), tie-corrected
    n: int  # control (x) size
    m: int  # treatment (y) size


def null_variance(n: float, m: float, tie_sizes: np.ndarray) -> float:
    """Section 4.1: V = m n (N + 1) / 3 [1 - sum_r (t_r^3 - t_r) / (N (N^2 - 1))]; t_r may be
    fractional (the bins of a federated table)."""
    big_n = n + m
    if big_n < 2:
        return 0.0
    t = np.asarray(tie_sizes, dtype=float)
    return float(m * n * (big_n + 1) / 3.0 * (1.0 - np.sum(t ** 3 - t) / (big_n * (big_n ** 2 - 1))))


def u_statistic(x: np.ndarray, y: np.ndarray) -> float:
    """U = #{(i, j): Y_j > X_i} - #{Y_j < X_i}, by sorting (O((n + m) log n))."""
    xs = np.sort(np.asarray(x, dtype=float))
    y = np.asarray(y, dtype=float)
    above = np.searchsorted(xs, y, side="left")  # x strictly below each y
    below = xs.size - np.searchsorted(xs, y, side="right")  # x strictly above each y
    return float(np.sum(above) - np.sum(below))


def site_statistic(x: np.ndarray, y: np.ndarray) -> SiteStatistic:
    """(U_l, V_l) of one site's own data (section 4.2)."""
    pooled = np.concatenate([np.asarray(x, float), np.asarray(y, float)])
    _, ties = np.unique(pooled, return_counts=True)
    return SiteStatistic(u_statistic(x, y), null_variance(len(x), len(y), ties), len(x), len(y))


def p_value(z: float) -> float:
    """One-sided (Y larger) normal p-value."""
    return float(stats.norm.sf(z))


def z_score(stat: SiteStatistic) -> float:
    """One site's standardized statistic U_l / V_l^(1/2) (0 when the variance is 0)."""
    return stat.u / math.sqrt(stat.variance) if stat.variance > 0 else 0.0


def t_sum(sites: list[SiteStatistic]) -> float:
    """Eq. (1): sum_l U_l / (sum_l V_l)^(1/2)."""
    variance = sum(s.variance for s in sites)
    return sum(s.u for s in sites) / math.sqrt(variance) if variance > 0 else 0.0


def optimal_weights(sites: list[SiteStatistic]) -> np.ndarray:
    """Section 4.3 and appendix eq. (14): a_l proportional to the standardized effect
    delta_l = m_l n_l (P+ - P-) / SD(U_l | H0); with a common P+ - P- this is m_l n_l / V_l^(1/2)
    (sample sizes and, through V_l, ties)."""
    return np.array([s.m * s.n / math.sqrt(s.variance) if s.variance > 0 else 0.0 for s in sites])


def t_weighted(sites: list[SiteStatistic], weights: np.ndarray | None = None) -> float:
    """Eq. (2): sum_l a_l Z_l / (sum_l a_l^2)^(1/2)."""
    a = optimal_weights(sites) if weights is None else np.asarray(weights, dtype=float)
    norm = math.sqrt(float(np.sum(a ** 2)))
    return float(np.dot(a, [z_score(s) for s in sites]) / norm) if norm > 0 else 0.0


def fisher_p_value(p_values: list[float]) -> float:
    """Section 4.4: T_F = -2 sum_l log p_l ~ chi^2_{2L} under H0."""
    p = np.clip(np.asarray(p_values, dtype=float), 1e-300, 1.0)
    return float(stats.chi2.sf(-2.0 * np.sum(np.log(p)), 2 * p.size))


def u_federated(fx: np.ndarray, fy: np.ndarray) -> tuple[float, float]:
    """Eq. (3): U_fed = sum_i sum_j fx_i fy_j S(c_i, c_j) over the bins of a federated table, and
    its null variance with every bin a tie (section 4.5). Frequencies may be fractional."""
    fx, fy = np.asarray(fx, dtype=float), np.asarray(fy, dtype=float)
    x_below = np.concatenate([[0.0], np.cumsum(fx)[:-1]])  # x in bins strictly before bin j
    x_above = fx.sum() - np.cumsum(fx)  # x in bins strictly after bin j
    u = float(np.dot(fy, x_below - x_above))
    return u, null_variance(fx.sum(), fy.sum(), fx + fy)


def pooled_test(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The centralized reference: (z, one-sided p) of U on the pooled data."""
    stat = site_statistic(x, y)
    z = z_score(stat)
    return z, p_value(z)
