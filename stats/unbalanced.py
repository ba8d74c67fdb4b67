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

`coverage_window` evaluates a run of server orders k to ~1e-13 each: a bracket certified by
tail bounds, then composite Gauss-Legendre with panels doubled until two levels agree, the
Poisson-binomial law at each node from stats.poissonbinomial (a product tree of FFTs beyond
a few hundred sites). `smallest_order_reaching` finds the smallest valid k with a few windows,
so planning 10,000 unequal sites takes about a second (it took minutes with a k-by-k scan).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.special import betainc, betaincinv

from stats.poissonbinomial import certified_tails, poisson_binomial_cdf

TAIL_MASS = 1e-18
BISECTIONS = 24
PANEL_NODES = 32
MAX_PANELS = 512
AGREEMENT = 1e-13
#: Quadrature nodes whose Poisson-binomial laws are held at once (cdf_columns).
NODE_CHUNK = 512

_x, _w = np.polynomial.legendre.leggauss(PANEL_NODES)
_UNIT_X, _UNIT_W = (_x + 1.0) / 2.0, _w / 2.0


def site_cdfs(t: np.ndarray, sizes: np.ndarray, ells: np.ndarray) -> np.ndarray:
    """p_j(t) = P(U_j <= t) = I_t(ell_j, n_j - ell_j + 1), shape (len(t), m).

    Computed once per distinct (n_j, ell_j): thousands of sites have a few hundred of them.
    """
    n, ell, inverse, _ = distinct_pairs(sizes, ells)
    return betainc(ell, n - ell + 1, np.asarray(t, dtype=float)[:, None])[:, inverse]


def distinct_pairs(sizes, ells) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (n, ell) pairs, per site the index of its pair, and per pair its first site
    (cached: the planner asks for the same orders many times)."""
    sizes, ells = np.asarray(sizes, dtype=float), np.asarray(ells, dtype=float)
    return _distinct_pairs(sizes.tobytes(), ells.tobytes())


@lru_cache(maxsize=64)
def _distinct_pairs(sizes: bytes, ells: bytes):
    pairs, first, inverse = np.unique(np.stack([np.frombuffer(sizes), np.frombuffer(ells)]), axis=1,
                                      return_index=True, return_inverse=True)
    return pairs[0], pairs[1], inverse.reshape(-1), first


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


def coverage_unbalanced(sizes, ells, k: int) -> float:
    """M(ell_1..ell_m, k) of paper 000 appendix A.1, to about 1e-13."""
    return float(coverage_window(sizes, ells, k, k)[0])


def coverage_window(sizes, ells, k_low: int, k_high: int) -> np.ndarray:
    """M(ells, k) for k = k_low..k_high, each to about 1e-13, on one quadrature.

    The integrand P(W(t) <= k - 1) of every k in the window is 1 left of the bracket of k_low
    and 0 right of the bracket of k_high (to 1e-16), so one grid over their union serves all;
    panels are doubled until two levels agree for every k.
    """
    m = len(sizes)
    if not 1 <= k_low <= k_high <= m:
        raise ValueError(f"server orders must satisfy 1 <= k_low <= k_high <= {m}, got {k_low}..{k_high}")
    fs, fe = finite_sites(sizes, ells)
    out = np.ones(k_high - k_low + 1)  # k beyond the finite answers: Q = +inf
    top = min(k_high, fs.size)
    if k_low > top:
        return out
    a, b = _bracket(fs, fe, k_low, top)
    if b <= a:
        out[: top - k_low + 1] = a
        return out
    previous = None
    panels = 2
    while True:
        t, w = _composite(a, b, panels)
        value = a + w @ cdf_columns(t, fs, fe, k_low - 1, top)  # P(W <= k - 1) for k = k_low..top
        if previous is not None and np.max(np.abs(value - previous)) < AGREEMENT:
            out[: top - k_low + 1] = value
            return out
        if panels >= MAX_PANELS:
            raise ArithmeticError(f"quadrature did not settle (last change {np.max(np.abs(value - previous)):.2e})")
        previous, panels = value, panels * 2


def cdf_columns(t: np.ndarray, sizes: np.ndarray, ells: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """P(W(t) <= c) for c = lo..hi-1 at every node t, NODE_CHUNK nodes at a time: each node's law
    is computed on its own (the same values as all at once), so memory stays at NODE_CHUNK laws
    of m + 1 counts (and the product tree's buffers) however many nodes the quadrature needs."""
    out = None
    for i in range(0, t.size, NODE_CHUNK):
        cdf = poisson_binomial_cdf(site_cdfs(t[i:i + NODE_CHUNK], sizes, ells))
        if out is None:  # the layout of one whole law (the recursion's is column-major): the same sums
            out = np.empty((t.size, hi - lo), order="F" if cdf.flags.f_contiguous and not cdf.flags.c_contiguous else "C")
        out[i:i + NODE_CHUNK] = cdf[:, lo:hi]
    return out


def smallest_order_reaching(sizes, ells, level: float) -> tuple[int, float]:
    """The smallest server order k with M(ells, k) >= level, and M there; (0, nan) if none.

    M grows with k. The first window is centred on the k whose crossing time matches: Q_k is
    near the t where E W(t) = k - 1/2, so k ~ E W(level) + 1/2, half-width one standard
    deviation of W(level); windows then gallop (doubling) towards the answer. Only k up to the
    number of finite answers are considered: beyond it Q is +inf, the whole line, not a plan.
    """
    fs, fe = finite_sites(sizes, ells)
    finite = fs.size
    if finite == 0:
        return 0, float("nan")
    p = site_cdfs(np.array([level]), fs, fe)[0]
    centre = int(np.clip(round(p.sum() + 0.5), 1, finite))
    half = max(4, int(np.ceil(np.sqrt((p * (1.0 - p)).sum()))))
    low, high = max(1, centre - half), min(finite, centre + half)
    found, known_short = None, 0  # (k, M) valid so far; largest k known to fall short
    while True:
        values = coverage_window(sizes, ells, low, high)
        ok = np.flatnonzero(values >= level)
        width = 2 * (high - low + 1)
        if ok.size:
            found = (low + int(ok[0]), float(values[ok[0]]))
            if ok[0] > 0 or low == known_short + 1:
                return found
            low, high = max(known_short + 1, low - width), low - 1
        else:
            known_short = high
            if found is not None and found[0] == high + 1:
                return found
            if high == finite:
                return 0, float("nan")
            low, high = high + 1, min(finite, high + width)
            if found is not None:
                high = min(high, found[0] - 1)


def _bracket(sizes: np.ndarray, ells: np.ndarray, k_low: int, k_high: int | None = None) -> tuple[float, float]:
    """[a, b] with P(W(t) <= k - 1) within 1e-16 of 1 for t <= a and of 0 for t >= b, for every
    k in k_low..k_high: the Bernstein certificates of poissonbinomial.certified_tails, pushed
    inwards by bisection (each kept end is itself certified, so the bracket is rigorous even
    where the bound is not monotone in t)."""
    k_high = k_low if k_high is None else k_high
    lo, hi = support(sizes, ells)
    left, right = certified_tails(site_cdfs(np.array([lo, hi]), sizes, ells), k_low, k_high)
    # invariants: a, b certified (or a support end); a_out, b_out not certified
    a, a_out = (lo, hi) if left[0] else (lo, lo)  # a support end that fails stays put
    b, b_out = (hi, lo) if right[1] else (hi, hi)
    for _ in range(BISECTIONS):
        t = np.array([0.5 * (a + a_out), 0.5 * (b + b_out)])
        left, right = certified_tails(site_cdfs(t, sizes, ells), k_low, k_high)
        a, a_out = (t[0], a_out) if left[0] else (a, t[0])
        b, b_out = (t[1], b_out) if right[1] else (b, t[1])
    return a, b


def _composite(a: float, b: float, panels: int) -> tuple[np.ndarray, np.ndarray]:
    edges = np.linspace(a, b, panels + 1)
    width = np.diff(edges)[:, None]
    t = (edges[:-1, None] + width * _UNIT_X).reshape(-1)
    w = (width * _UNIT_W).reshape(-1)
    return t, w
