"""Exact coverage of the quantile of quantiles when sites hold different numbers of scores.

Paper 000, appendix A.1: site j holds n_j scores and sends its ell_j-th smallest; the server
keeps the k-th smallest answer Q. For continuous scores the coverage P(S <= Q) is the formula
of A.1 (Balakrishnan's INID order statistics). As in appendix C.1 it is an integral over
uniforms: with U_j the ell_j-th smallest of n_j uniforms (a Beta(ell_j, n_j - ell_j + 1)
variable) and p_j(t) = P(U_j <= t) = I_t(ell_j, n_j - ell_j + 1),

    M(ell_1..ell_m, k) = E[Q] = int_0^1 P(W(t) <= k - 1) dt,   W(t) ~ PoissonBinomial(p_1(t)..p_m(t)),

whose term-by-term expansion is exactly A.1's sum over subsets. A site asked for ell_j > n_j
answers +inf (eq. 2): it never counts among the k smallest, so it is left out of W, and when
fewer than k sites can answer finitely Q is +inf and the coverage is 1.

`coverage_unbalanced` evaluates one plan to ~1e-13 (a bracketing scan, then composite
Gauss-Legendre with panels doubled until two levels agree); `coverage_all_k` gives every k at
once on a fixed grid, for search, and the planner re-checks its final choice with the former.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betainc, betaincinv

TAIL_MASS = 1e-18
SCAN_POINTS = 129
SCAN_PASSES = 5
PANEL_NODES = 32
MAX_PANELS = 512
AGREEMENT = 1e-13

_x, _w = np.polynomial.legendre.leggauss(PANEL_NODES)
_UNIT_X, _UNIT_W = (_x + 1.0) / 2.0, _w / 2.0


def poisson_binomial_pmf(p: np.ndarray, width: int | None = None) -> np.ndarray:
    """P(W = c) for c = 0..width-1 (default all m + 1), row by row, W = sum of Bernoulli(p[:, j]).

    A dynamic programme over sites; counts at or beyond `width` are never needed for
    P(W = c < width), so they are not carried.
    """
    rows, m = p.shape
    width = m + 1 if width is None else min(width, m + 1)
    pmf = np.zeros((width, rows))  # counts along axis 0: each update is a contiguous block
    pmf[0] = 1.0
    q = 1.0 - p
    for j in range(m):
        top = min(j + 1, width - 1)  # counts 0..top can be non-zero after site j
        moved = pmf[:top] * p[:, j]
        pmf[:top + 1] *= q[:, j]
        pmf[1:top + 1] += moved
    return pmf.T


def poisson_binomial_cdf(p: np.ndarray) -> np.ndarray:
    """P(W <= c) for c = 0..m, row by row."""
    return np.minimum(np.cumsum(poisson_binomial_pmf(p), axis=1), 1.0)


def poisson_binomial_below(p: np.ndarray, k: int) -> np.ndarray:
    """P(W <= k - 1) row by row, carrying only min(k, m - k + 1) counts: the lower tail directly,
    or one minus the upper tail through the failures m - W."""
    m = p.shape[1]
    if k <= m - k + 1:
        return np.minimum(poisson_binomial_pmf(p, k).sum(axis=1), 1.0)
    upper = poisson_binomial_pmf(1.0 - p, m - k + 1).sum(axis=1)  # P(m - W <= m - k) = P(W >= k)
    return np.clip(1.0 - upper, 0.0, 1.0)


def site_cdfs(t: np.ndarray, sizes: np.ndarray, ells: np.ndarray) -> np.ndarray:
    """p_j(t) = P(U_j <= t) = I_t(ell_j, n_j - ell_j + 1), shape (len(t), m)."""
    return betainc(ells, sizes - ells + 1, np.asarray(t, dtype=float)[:, None])


def finite_sites(sizes, ells) -> tuple[np.ndarray, np.ndarray]:
    """The sizes and orders of the sites whose answer is finite (ell_j <= n_j)."""
    sizes, ells = np.asarray(sizes, dtype=float), np.asarray(ells, dtype=float)
    if sizes.shape != ells.shape or sizes.ndim != 1:
        raise ValueError("sizes and ells must be 1-d arrays of the same length")
    if np.any(sizes < 1) or np.any(ells < 1):
        raise ValueError("sizes and orders must be >= 1")
    keep = ells <= sizes
    return sizes[keep], ells[keep]


def support(sizes: np.ndarray, ells: np.ndarray, tail: float = TAIL_MASS) -> tuple[float, float]:
    """[lo, hi] holding every U_j, hence every Q, except for total mass `tail` on each side."""
    m = len(sizes)
    lo = float(np.min(betaincinv(ells, sizes - ells + 1, tail / m)))
    hi = 1.0 - float(np.min(betaincinv(sizes - ells + 1, ells, tail / m)))
    return lo, hi


def coverage_all_k(sizes, ells, panels: int = 8) -> np.ndarray:
    """M(ells, k) for k = 1..m on a fixed composite grid (for search; error ~1e-9 or better).

    Entries for k beyond the number of finite sites are 1 (Q = +inf).
    """
    m = len(sizes)
    fs, fe = finite_sites(sizes, ells)
    out = np.ones(m)
    if fs.size == 0:
        return out
    lo, hi = support(fs, fe)
    t, w = _composite(lo, hi, panels)
    survival = poisson_binomial_cdf(site_cdfs(t, fs, fe))[:, : fs.size]  # P(W <= k - 1)
    out[: fs.size] = lo + w @ survival
    return out


def coverage_unbalanced(sizes, ells, k: int) -> float:
    """M(ell_1..ell_m, k) of paper 000 appendix A.1, to about 1e-13."""
    m = len(sizes)
    if not 1 <= k <= m:
        raise ValueError(f"k must lie in [1, {m}], got {k}")
    fs, fe = finite_sites(sizes, ells)
    if k > fs.size:
        return 1.0
    a, b = _bracket(fs, fe, k)
    if b <= a:
        return float(a)
    previous = None
    panels = 2
    while True:
        t, w = _composite(a, b, panels)
        value = a + float(w @ poisson_binomial_below(site_cdfs(t, fs, fe), k))
        if previous is not None and abs(value - previous) < AGREEMENT:
            return float(value)
        if panels >= MAX_PANELS:
            raise ArithmeticError(f"quadrature did not settle (last change {abs(value - previous):.2e})")
        previous, panels = value, panels * 2


def _bracket(sizes: np.ndarray, ells: np.ndarray, k: int) -> tuple[float, float]:
    """[a, b] outside which P(W(t) <= k - 1) is within 1e-16 of 1 (left) or 0 (right)."""
    lo, hi = support(sizes, ells)
    for _ in range(SCAN_PASSES):  # each pass narrows [lo, hi] to the scan cells around the transition
        t = np.linspace(lo, hi, SCAN_POINTS)
        survival = poisson_binomial_below(site_cdfs(t, sizes, ells), k)
        ones = np.flatnonzero(survival >= 1.0 - 1e-16)
        zeros = np.flatnonzero(survival <= 1e-16)
        new_lo = t[ones[-1]] if ones.size else lo
        new_hi = t[zeros[0]] if zeros.size else hi
        if new_hi - new_lo > 0.25 * (hi - lo):
            return new_lo, new_hi
        lo, hi = new_lo, new_hi
    return lo, hi


def _composite(a: float, b: float, panels: int) -> tuple[np.ndarray, np.ndarray]:
    edges = np.linspace(a, b, panels + 1)
    width = np.diff(edges)[:, None]
    t = (edges[:-1, None] + width * _UNIT_X).reshape(-1)
    w = (width * _UNIT_W).reshape(-1)
    return t, w
