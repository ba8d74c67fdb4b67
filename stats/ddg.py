"""Distributed discrete Gaussian (DDG) quantiles: paper 001 (algorithms 1 and 2, theorems 1-3,
lemma 9), on histograms summed by secure aggregation over Z_M.

Each site turns its values into a (flat or hierarchical) histogram x, scales it by c, adds
discrete Gaussian noise xi ~ N_Z(0, sigma^2) per entry (drawn by protocol.noise, exactly, from
the operating system's CSPRNG) and reduces mod M. The secure sum s gives H_hat = s / c (read in
the centred range (-M/2, M/2]), whose CDF estimate F_hat gives the quantile by eq. (1).

Privacy (lemma 9, after Kairouz, Liu and Steinke 2021, theorem 14): the sum of n sites' noise
makes a query of l2-sensitivity S2 and l1-sensitivity S1 on d entries (1/2) eps^2-zCDP with
    eps = min{ sqrt(S2^2 / (n sigma^2) + psi d / 2),  S1 / (sqrt(n) sigma) + psi sqrt(d) },
    psi = 10 sum_{i=1}^{n-1} exp(-2 pi^2 sigma^2 i / (i + 1)).
(Paper 001 writes one S for both; for the flat histogram S1 = S2 = c.)
Flat histogram (theorem 1): S = c, d = b. Hierarchical (theorem 2) as printed: S = c log2 b and
d = 2b. One client adds c to exactly one node on each of the log2 b levels kept, so the exact
sensitivities are S2 = c sqrt(log2 b), S1 = c log2 b on d = 2b - 2 entries; `exact` accounting
(the default) uses these, `paper` accounting the printed theorem (an upper bound, kept to
reproduce figure 2). zCDP converts to (epsilon, delta)-DP by Canonne, Kamath and Steinke 2020,
proposition 12 / corollary 13.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq, minimize_scalar

# -- privacy -----------------------------------------------------------------------------------


def psi(sites: int, sigma2: float) -> float:
    """psi of theorem 1 / lemma 9: 10 sum_{i=1}^{n-1} exp(-2 pi^2 sigma^2 i / (i + 1)), summed
    exactly. (The paper's 'psi <= 10 (n-1) exp(-2 pi^2 sigma^2)' has the inequality reversed,
    since i / (i + 1) < 1; 10 (n-1) exp(-pi^2 sigma^2) is an upper bound. We never use either.)"""
    i = np.arange(1, max(sites, 1), dtype=float)
    return float(10.0 * np.exp(-2.0 * math.pi**2 * sigma2 * i / (i + 1.0)).sum())


def ddg_concentrated_epsilon(sensitivity: float, sites: int, sigma2: float, dimension: int,
                             l1_sensitivity: float | None = None) -> float:
    """Lemma 9 (paper 001 appendix A; Kairouz-Liu-Steinke 2021 theorem 14): the sum of `sites`
    independent N_Z(0, sigma^2 I_d) added to a query of l2-sensitivity S2 = `sensitivity` and
    l1-sensitivity S1 (default S2, as the paper writes it) is (1/2) eps^2-zCDP with this eps.
    Needs sigma >= 1/2."""
    if sigma2 < 0.25:
        raise ValueError("lemma 9 needs sigma >= 1/2")
    if sites < 1:
        return math.inf
    p = psi(sites, sigma2)
    l1 = sensitivity if l1_sensitivity is None else l1_sensitivity
    first = math.sqrt(sensitivity**2 / (sites * sigma2) + p * dimension / 2.0)
    second = l1 / (math.sqrt(sites) * math.sqrt(sigma2)) + p * math.sqrt(dimension)
    return min(first, second)


ACCOUNTING = ("exact", "paper")


def histogram_sensitivities(c: float, bins: int, hierarchical: bool, accounting: str = "exact"
                            ) -> tuple[float, float, int]:
    """(S2, S1, d): theorem 1 (flat: c, c, b); theorem 2 as printed ('paper': c log2 b, c log2 b,
    2b) or with the exact norms of one client's change ('exact': c sqrt(log2 b), c log2 b, 2b - 2)."""
    if accounting not in ACCOUNTING:
        raise ValueError(f"accounting must be one of {ACCOUNTING}, got {accounting!r}")
    if not hierarchical:
        return float(c), float(c), bins
    levels = math.log2(bins)
    if accounting == "paper":
        return c * levels, c * levels, 2 * bins
    return c * math.sqrt(levels), c * levels, 2 * bins - 2


def histogram_concentrated_epsilon(c: float, sites: int, sigma2: float, bins: int, hierarchical: bool,
                                   accounting: str = "exact") -> float:
    """Theorem 1 (flat) or theorem 2 (hierarchical): the zCDP eps of algorithm 1 or 2."""
    s2, s1, d = histogram_sensitivities(c, bins, hierarchical, accounting)
    return ddg_concentrated_epsilon(s2, sites, sigma2, d, l1_sensitivity=s1)


def zcdp_delta(rho: float, epsilon: float) -> float:
    """delta for which rho-zCDP implies (epsilon, delta)-DP (Canonne, Kamath, Steinke 2020,
    corollary 13): inf over a > 1 of exp((a-1)(a rho - eps)) / (a - 1) * (1 - 1/a)^a, capped at 1."""
    if rho <= 0:
        return 0.0

    def log_delta(a):
        return (a - 1) * (a * rho - epsilon) - math.log(a - 1) + a * math.log1p(-1.0 / a)

    hi = max(2.0, 2.0 * (epsilon + 1.0) / rho + 2.0)
    best = minimize_scalar(log_delta, bounds=(1.0 + 1e-9, hi), method="bounded", options={"xatol": 1e-10})
    grid = np.geomspace(1.0 + 1e-6, hi, 400)
    value = min(best.fun, min(log_delta(a) for a in grid))
    return float(min(1.0, math.exp(value)))


def zcdp_to_approx_dp(rho: float, delta: float) -> float:
    """The smallest epsilon with rho-zCDP => (epsilon, delta)-DP: solving `zcdp_delta`'s bound
    for epsilon at each order a gives eps(a) = a rho + (log(1/delta) - log(a-1) + a log(1 - 1/a)) / (a-1),
    minimized over a > 1 (a vectorized grid, then a bounded refinement around its best point)."""
    if rho <= 0:
        return 0.0
    if not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")

    def eps_at(a):
        a = np.asarray(a, dtype=float)
        return a * rho + (math.log(1.0 / delta) - np.log(a - 1.0) + a * np.log1p(-1.0 / a)) / (a - 1.0)

    grid = 1.0 + np.geomspace(1e-6, 1e6, 2000)
    values = eps_at(grid)
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    best = minimize_scalar(lambda a: float(eps_at(a)), bounds=(lo, hi), method="bounded", options={"xatol": 1e-12})
    return float(max(0.0, min(values[i], best.fun)))


def histogram_epsilon(c: float, sites: int, sigma2: float, bins: int, hierarchical: bool, delta: float,
                      accounting: str = "exact") -> float:
    """(epsilon, delta)-DP of algorithm 1 or 2 with n = `sites` noise-adding sites."""
    eps = histogram_concentrated_epsilon(c, sites, sigma2, bins, hierarchical, accounting)
    return zcdp_to_approx_dp(eps**2 / 2.0, delta)


def scaling_for_epsilon(epsilon: float, delta: float, sites: int, sigma2: float, bins: int,
                        hierarchical: bool, accounting: str = "exact") -> tuple[int, float]:
    """(c, sigma^2) meeting a requested (epsilon, delta)-DP with `sites` noise-adding sites.

    Paper 001 section 4 fixes sigma^2 = 2 and varies c; c must be a positive integer (c x is
    added on the ring), so: find the real c* with epsilon(c*, sigma^2) = epsilon, round up to
    the integer c = max(1, ceil(c*)), then raise sigma^2 until epsilon(c, sigma^2) = epsilon.
    The effective noise sigma / c is then the one the request allows, with no rounding loss."""
    def eps_at(c, s2):
        return histogram_epsilon(c, sites, s2, bins, hierarchical, delta, accounting)

    if eps_at(1e-9, sigma2) >= epsilon:
        raise ValueError(f"epsilon={epsilon:g} is below the psi term of lemma 9 at sigma^2={sigma2:g} "
                         f"with {sites} sites; raise sigma^2")
    hi = 1.0
    while eps_at(hi, sigma2) < epsilon:
        hi *= 2.0
    c_real = brentq(lambda c: eps_at(c, sigma2) - epsilon, 1e-9, hi, xtol=1e-9)
    c = max(1, math.ceil(c_real - 1e-9))
    if eps_at(c, sigma2) <= epsilon:
        return c, sigma2
    hi = sigma2
    while eps_at(c, hi) > epsilon:
        hi *= 2.0
    lo = sigma2
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if eps_at(c, mid) <= epsilon else (mid, hi)
    return c, hi


def ring_bits_required(c: int, values: int, sites: int, sigma2: float, bins: int, hierarchical: bool,
                       failure: float) -> int:
    """log2 of the smallest power-of-two M meeting the ring condition of theorem 1/3 (flat:
    M >= 2 + 2cn + 2n sqrt(2 sigma^2 log(8nb/delta))) or theorem 2 (log(16nb/delta)), with
    probability 1 - failure of no wrap-around. The paper has one value per client; with many
    values per site, the count term uses the number of values and the noise term the number of
    noise-adding sites (the same proof: |c h| <= c N and each site's noise is bounded)."""
    factor = 16 if hierarchical else 8
    need = 2 + 2 * c * values + 2 * sites * math.sqrt(2 * sigma2 * math.log(factor * sites * bins / failure))
    return max(1, math.ceil(math.log2(need)))


# -- histograms and quantiles ------------------------------------------------------------------


def flat_histogram(values, edges: np.ndarray) -> np.ndarray:
    """Algorithm 1 line 1: counts of I(l_{j-1} <= value < l_j), j = 1..b; values are clipped to
    [l_0, l_b] and the top edge l_b itself counts in the last bin."""
    b = len(edges) - 1
    idx = np.clip(np.searchsorted(edges, np.asarray(values, dtype=float), side="right") - 1, 0, b - 1)
    return np.bincount(idx, minlength=b).astype(np.int64)


def hierarchical_histogram(values, edges: np.ndarray) -> np.ndarray:
    """Algorithm 2 line 1: the counts H(r, j) of levels r = 0..log2(b) - 1 (level r has b / 2^r
    nodes, each the sum of 2^r consecutive bins), concatenated level by level: 2b - 2 entries."""
    return hierarchical_from_flat(flat_histogram(values, edges))


def hierarchical_from_flat(flat: np.ndarray) -> np.ndarray:
    """Paper 001, algorithm 2 line 1, from a flat histogram of b = 2^L bins: each level the pairwise
    sums of the one below, levels 0..L-1 concatenated (2b - 2 entries)."""
    b = len(flat)
    if b < 2 or b & (b - 1):
        raise ValueError(f"a hierarchical histogram needs b a power of two >= 2, got {b}")
    levels, level = [], np.asarray(flat)
    while len(level) >= 2:
        levels.append(level)
        level = level.reshape(-1, 2).sum(axis=1)
    return np.concatenate(levels)


def dyadic_partition(j: int, bins: int) -> list[tuple[int, int]]:
    """The maximal dyadic partition P_j of [1, j] as (level r, node o), o 1-based within its
    level: e.g. [1, 15] = [1, 8] u [9, 12] u [13, 14] u [15] (paper 001 section 2). The top
    level (the whole range, count n) is never used, so j = b splits into two halves."""
    parts, start = [], 0  # covered [1, start]
    top = int(math.log2(bins)) - 1
    while start < j:
        r = top
        while r > 0 and (start % (1 << r) or start + (1 << r) > j):
            r -= 1
        parts.append((r, start // (1 << r) + 1))
        start += 1 << r
    return parts


def hierarchical_cumulative(tree: np.ndarray, bins: int) -> np.ndarray:
    """F(j) for j = 1..b from a (noisy) hierarchical histogram, summing the nodes of P_j."""
    offsets, offset, size = [], 0, bins
    while size >= 2:
        offsets.append(offset)
        offset += size
        size //= 2
    return np.array([sum(tree[offsets[r] + o - 1] for r, o in dyadic_partition(j, bins))
                     for j in range(1, bins + 1)], dtype=float)


def estimated_cdf(h_hat: np.ndarray, count: str, n: int | None = None) -> np.ndarray:
    """Algorithm 1 line 4: F_hat_j = (h_1 + ... + h_j) / n_hat, with n_hat = sum(h_hat)
    (option 1, 'estimated') or the true n (option 2, 'exact')."""
    cumulative = np.cumsum(np.asarray(h_hat, dtype=float))
    if count == "estimated":
        total = cumulative[-1]
        return cumulative / total if total > 0 else np.full_like(cumulative, np.nan)
    if count == "exact":
        return cumulative / float(n)
    raise ValueError(f"count must be 'estimated' or 'exact', got {count!r}")


def quantile_index(cdf: np.ndarray, p: float) -> int:
    """Eq. (1): j*_p = argmin_j |F_hat_j - p| (1-based; the smallest j on ties)."""
    return int(np.argmin(np.abs(np.asarray(cdf, dtype=float) - p))) + 1


def quantile_error(true_cdf: np.ndarray, j: int, p: float) -> float:
    """Eq. (3): Delta_p = R_p(F, j) = |F_j - p| at the index chosen from the estimate."""
    return float(abs(true_cdf[j - 1] - p))


def centred(total: np.ndarray, modulus_bits: int) -> np.ndarray:
    """Elements of Z_M read in {-M/2 + 1, ..., M/2} (paper 001 appendix A), as int64."""
    m = 1 << modulus_bits
    values = np.asarray(total, dtype=np.uint64).astype(object) if modulus_bits == 64 else total.astype(np.int64)
    values = np.where(values > m // 2, values - m, values)
    return np.asarray(values, dtype=np.int64)


def to_ring(values: np.ndarray, modulus_bits: int) -> np.ndarray:
    """Integers (possibly negative) as elements of Z_M on uint64."""
    return (np.asarray(values, dtype=np.int64).astype(np.uint64)) & np.uint64((1 << modulus_bits) - 1) \
        if modulus_bits < 64 else np.asarray(values, dtype=np.int64).astype(np.uint64)
