"""The law of W = X_1 + ... + X_m, independent X_j ~ Bernoulli(p_j): the Poisson-binomial law.

Paper 000, appendix A.1 writes the coverage of the quantile of quantiles with unequal site
sizes as a sum over subsets of sites; integrated over uniforms (appendix C.1) it becomes an
integral of P(W(t) <= k - 1), W(t) being Poisson-binomial. Everything here works row by row:
`p` has shape (nodes, m), one row per quadrature node t.

Two exact evaluations of the probability mass function:
  - the recursion over sites (O(m^2) per row), used for small m;
  - a product tree (O(m log^2 m) per row): the generating function prod_j (q_j + p_j z) is
    multiplied pairwise, blocks of `LEAF` sites by the recursion and the rest by real FFTs.
    Each product of two probability vectors is exact up to rounding of order 1e-16 of their
    largest entry, so the CDF carries absolute errors of order 1e-14 at m = 10,000 (tested
    against the recursion).
"""

from __future__ import annotations

import numpy as np
from scipy import fft

#: Above this many sites the product tree is faster than the recursion (measured: 3x at 1,000).
TREE_SITES = 256
#: Sites per leaf of the product tree (multiplied by the recursion).
LEAF = 32
#: Rows (quadrature nodes) multiplied out together by the product tree.
TREE_ROWS = 16
#: (node, site) pairs whose leave-one-out recursion runs together.
LOO_CHUNK = 16384
#: log(1 / 1e-16): a Bernstein exponent at least this large certifies a tail below 1e-16.
TAIL_EXPONENT = 16.0 * np.log(10.0)


def poisson_binomial_pmf(p: np.ndarray, width: int | None = None) -> np.ndarray:
    """P(W = c) for c = 0..width-1 (default all m + 1), row by row."""
    m = p.shape[1]
    width = m + 1 if width is None else min(width, m + 1)
    if m > TREE_SITES:
        return pmf_by_product_tree(p)[:, :width]
    return pmf_by_recursion(p, width)


def pmf_by_recursion(p: np.ndarray, width: int) -> np.ndarray:
    """The recursion over sites; counts at or beyond `width` are never needed for
    P(W = c < width), so they are not carried."""
    rows, m = p.shape
    pmf = np.zeros((width, rows))  # counts along axis 0: each update is a contiguous block
    pmf[0] = 1.0
    q = 1.0 - p
    for j in range(m):
        top = min(j + 1, width - 1)  # counts 0..top can be non-zero after site j
        moved = pmf[:top] * p[:, j]
        pmf[:top + 1] *= q[:, j]
        pmf[1:top + 1] += moved
    return pmf.T


def pmf_by_product_tree(p: np.ndarray) -> np.ndarray:
    """The coefficients of prod_j (q_j + p_j z), all m + 1 of them, row by row: TREE_ROWS rows at a
    time (each row's arithmetic is its own, so the values are the same as all at once; the blocks
    stay in cache: at 10,000 sites twice as fast, and memory stays at TREE_ROWS trees)."""
    rows, m = p.shape
    if rows <= TREE_ROWS:
        return _product_tree(p)
    out = np.empty((rows, m + 1))
    for i in range(0, rows, TREE_ROWS):
        out[i:i + TREE_ROWS] = _product_tree(p[i:i + TREE_ROWS])
    return out


def _product_tree(p: np.ndarray) -> np.ndarray:
    rows, m = p.shape
    blocks = -(-m // LEAF)
    padded = np.zeros((rows, blocks * LEAF))  # p = 0 pads: a factor of 1
    padded[:, :m] = p
    padded = padded.reshape(rows, blocks, LEAF)
    poly = np.zeros((rows, blocks, LEAF + 1))
    poly[..., 0] = 1.0
    for j in range(LEAF):
        pj = padded[..., j:j + 1]
        moved = poly[..., :j + 1] * pj
        poly[..., :j + 2] *= 1.0 - pj
        poly[..., 1:j + 2] += moved
    while poly.shape[1] > 1:
        if poly.shape[1] % 2:
            one = np.zeros((rows, 1, poly.shape[2]))
            one[..., 0] = 1.0
            poly = np.concatenate([poly, one], axis=1)
        length = poly.shape[2]
        size = fft.next_fast_len(2 * length - 1, real=True)
        spectrum = fft.rfft(poly[:, 0::2], size)
        spectrum *= fft.rfft(poly[:, 1::2], size)
        poly = fft.irfft(spectrum, size)[..., :2 * length - 1]
    return np.clip(poly[:, 0, :m + 1], 0.0, 1.0)


def poisson_binomial_cdf(p: np.ndarray) -> np.ndarray:
    """P(W <= c) for c = 0..m, row by row."""
    return np.minimum(np.cumsum(poisson_binomial_pmf(p), axis=1), 1.0)


def poisson_binomial_below(p: np.ndarray, k: int) -> np.ndarray:
    """P(W <= k - 1) row by row. The recursion carries only min(k, m - k + 1) counts: the lower
    tail directly, or one minus the upper tail through the failures m - W."""
    m = p.shape[1]
    if m > TREE_SITES:
        return np.minimum(pmf_by_product_tree(p)[:, :k].sum(axis=1), 1.0)
    if k <= m - k + 1:
        return np.minimum(pmf_by_recursion(p, k).sum(axis=1), 1.0)
    upper = pmf_by_recursion(1.0 - p, m - k + 1).sum(axis=1)  # P(m - W <= m - k) = P(W >= k)
    return np.clip(1.0 - upper, 0.0, 1.0)


def certified_tails(p: np.ndarray, k_low: int, k_high: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows where P(W >= k_low) <= 1e-16 (left) and rows where P(W <= k_high - 1) <= 1e-16
    (right), each certified by the better of two bounds on sums of independent variables in
    [0, 1] with mean mu and variance v, for a count c beyond the mean:
      Bernstein  P(W - mu >= s) <= exp(-s^2 / (2 (v + s / 3))),  s = c - mu;
      Chernoff   P(W >= c) <= exp(-(c log(c / mu) - c + mu))  (and the same for the failures
                 m - W), which is the sharper one for counts near 0 or m.

    W(t) grows stochastically with t (every p_j(t) does), so a certificate at t holds at every
    smaller t (left) or every larger t (right): a rigorous bracket for the quadrature.
    """
    m = p.shape[1]
    mean = p.sum(axis=1)
    variance = (p * (1.0 - p)).sum(axis=1)

    def exponent(count, mu, s):  # a lower bound on -log P(tail), valid where s = count - mu > 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # mu subnormal: count / mu = inf
            bernstein = s * s / (2.0 * (variance + s / 3.0))
            chernoff = count * np.log(count / mu) - count + mu
        return np.where(s > 0, np.fmax(bernstein, np.nan_to_num(chernoff, nan=0.0, posinf=np.inf)), 0.0)

    left = exponent(float(k_low), mean, k_low - mean) >= TAIL_EXPONENT
    failures = m - (k_high - 1)  # W <= k_high - 1  <=>  m - W >= failures
    right = exponent(float(failures), m - mean, mean - (k_high - 1)) >= TAIL_EXPONENT
    return left, right


def leave_one_out_at(pmf: np.ndarray, p: np.ndarray, c: int, floor: float = 1e-14, work: list | None = None
                     ) -> np.ndarray:
    """P(W_{-j} = c) for every column j, from the law of W (rows x (m + 1)) and each p_j (the
    number of recursion steps taken, over all rows and columns, added to work[0] when given).

    Removing Bernoulli(p) from W: P(W = i) = (1 - p) x_i + p x_{i-1}. Solved upwards where
    p <= 1/2 and downwards where p > 1/2, so rounding errors are damped in both (ratio
    min(p, q) / max(p, q) <= 1). Two shortcuts, each losing at most 2 x `floor`:
      - x_c <= P(W = c) / q and <= P(W = c + 1) / p, so rows where both are below `floor` are 0;
      - in the other rows the recursions start where W's own tail is below `floor` (x there
        is at most twice that), not at 0 and m: at 10,000 sites about 20x fewer steps.
    """
    rows, width = pmf.shape
    m = width - 1
    out = np.zeros_like(p)
    near = pmf[:, c] if c + 1 > m else np.maximum(pmf[:, c], pmf[:, c + 1])
    active = near > floor
    if not active.any():
        return out
    pmf, p = pmf[active], p[active]
    q = 1.0 - p
    cdf = np.cumsum(pmf, axis=1)
    below = np.flatnonzero((cdf <= floor).all(axis=0))  # counts below which every row is ~empty
    start = min(int(below[-1]) + 1 if below.size else 0, c)
    above = np.flatnonzero((cdf >= 1.0 - floor).all(axis=0))
    stop = max(int(above[0]) if above.size else m, c)  # P(W > stop) <= floor in every row
    f = np.ascontiguousarray(pmf.T)
    x = np.empty_like(p)
    # each (row, column) runs the one recursion it keeps, LOO_CHUNK of them at a time (in cache)
    for upwards in (True, False):
        rows_at, cols_at = np.nonzero(p <= 0.5 if upwards else p > 0.5)
        if work is not None:
            work[0] += rows_at.size * (c + 1 - start if upwards else stop - c)
        for lo in range(0, rows_at.size, LOO_CHUNK):
            r, j = rows_at[lo:lo + LOO_CHUNK], cols_at[lo:lo + LOO_CHUNK]
            pj, qj = p[r, j], q[r, j]
            value = np.zeros(r.size)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                if upwards:
                    for i in range(start, c + 1):
                        value = (f[i][r] - pj * value) / qj
                else:
                    for i in range(stop, c, -1):  # x_{i-1} = (f_i - q x_i) / p, from x_stop ~ 0
                        value = (f[i][r] - qj * value) / pj
            x[r, j] = value
    out[active] = x
    return out
