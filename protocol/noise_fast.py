"""Exact discrete Gaussian vectors N_Z(0, sigma^2), vectorised, from the operating system's CSPRNG.

Issue 49, point 4: OpenDP's exact sampler (protocol.noise.discrete_gaussian_reference) draws
40,000-75,000 values a second here once set up; this one draws several million a second on two
cores (bench/discrete_gaussian.py), with the same output distribution: P(x) = exp(-x^2 /
(2 sigma^2)) / Z on the integers, exactly (no floating-point rounding of the distribution, no
truncation, so nothing to add to the privacy accounting).

Algorithm: rejection sampling as in Canonne, Kamath and Steinke 2020 ("The discrete Gaussian for
differential privacy", algorithm 3: a discrete Laplace proposal and a Bernoulli(exp(-gamma))
acceptance), with a proposal chosen so that it is drawn exactly from random bits, and the
acceptance decided exactly by comparing a lazily refined uniform with a rigorously bounded
probability (the "approximate, then refine where ambiguous" comparison of exact samplers of
transcendental probabilities, e.g. Karney 2016, "Sampling exactly from the normal distribution").

1. Proposal, a two-sided "staircase" Laplace with step t = 2^k (k = the nearest integer to
   log2(sigma ln 2), at least 0): |y| = G t + u with G ~ Geometric(1/2) (P(G = g) = 2^-(g+1), the
   number of trailing zero bits of random words), u uniform on {0, ..., t-1} (k random bits), and
   a random sign; a negative zero is rejected. Every integer y then has proposal probability
   2^-g / (4t), g = floor(|y| / t): a power of two, drawn exactly from the bits.
2. Acceptance with probability A(y) = exp(-a(y)),
       a(y) = (|y| / sigma - lambda)^2 / 2 + ln 2 * u / t >= 0,   lambda = ln 2 * sigma / t,
   which equals y^2 / (2 sigma^2) - g ln 2 + lambda^2 / 2; so P(propose y and accept) =
   exp(-y^2 / (2 sigma^2)) exp(-lambda^2 / 2) / (4t), proportional to the N_Z pmf: the accepted
   values are i.i.d. N_Z(0, sigma^2). The acceptance rate per proposal is exp(-lambda^2/2) Z / (4t),
   about 0.47-0.55 for sigma >= 2 (0.30 at sigma = 0.5).
3. The Bernoulli(exp(-a)) draw is a uniform U = (j + V) 2^-53 (j: 53 random bits, V: further
   bits, drawn only if needed) compared with p = exp(-a). In float64 (numpy, the whole vector)
   a is computed with a rigorous absolute error bound E (below), giving p_lo <= p <= p_hi; the
   proposal is accepted if (j + 1) 2^-53 <= p_lo, rejected if j 2^-53 >= p_hi. Otherwise (an
   ambiguous draw, probability about p_hi - p_lo + 2^-53 < 1e-9) the decision is made exactly
   in Python: p is bounded by interval arithmetic (mpmath's libmpi, outward rounding, widened a
   further 2^-(prec-20)) at growing precision while V's bits are drawn 64 at a time, until the
   interval of U lies wholly below or above that of p. Proposals whose |y| would not fit the fast
   path's 64-bit integers (G t + u >= 2^62, or G >= 74) go to the same exact path.

Float error bound (e = 2^-53: every IEEE operation rounds with relative error <= e; m = |y| < 2^62):
sigma_hat = sqrt(sigma^2) and 1/sigma_hat carry relative error <= 3e, so r_hat = m / sigma (as
m * (1/sigma_hat)) and lambda_hat carry <= 6e and <= 4e; d = r - lambda then has absolute error
<= 6e (r + lambda) + e |d|; squaring, halving, adding ln 2 * u/t (error <= 3e) and the final sum
give |a_hat - a| <= 10e (|d| + 1)(r + lambda + 1). The code uses E = 2^-44 (1 + (|d| + 1)(r +
lambda + 1)), 51 times that, and p_lo = exp(-(a_hat + E)) (1 - 2^-40) - 2^-900, p_hi =
exp(-(a_hat - E)) (1 + 2^-40) + 2^-900: the factors 1 -+ 2^-40 absorb numpy's exp error (up to
8,192 ulps, against the few it has) and the rounding of these expressions, the 2^-900 its
underflow (exp(-745) is below 2^-1074). Exactness rests on these bounds being bounds, and on
mpmath's directed-rounding exp and sqrt erring by less than 2^20 units in their last place.
tests/test_discrete_gaussian_fast.py checks the float bounds against 60-digit values across the
whole fast range and the exact path alone (the bounds widened) against the N_Z pmf.

Randomness: every bit comes from os.urandom (looked up at call time), one call per batch of
proposals plus one per rare refinement: 8 bytes a proposal (53 bits of U, the sign, 10 bits for
G) and 1, 2, 4 or 8 bytes for u (none when t = 1); a proposal whose 10 G bits are all zero
(probability 2^-10) draws 8 more.
"""

from __future__ import annotations

import math
import os
from fractions import Fraction
from functools import lru_cache

import numpy as np

LN2 = math.log(2.0)
#: bits of the geometric G read from a proposal's first word; all zero (2^-10) reads another word
_G_BITS = 10
#: a G at or beyond this is decided by the exact path (its first 74 bits were all zero)
_G_UNKNOWN = _G_BITS + 64
#: magnitudes at or beyond 2^62 are decided by the exact path (the fast path's int64 arithmetic)
_FAST_LIMIT = 2 ** 62
#: the float bounds' slack (see the module docstring); tests widen them to drive the exact path
_ERROR_SCALE = 2.0 ** -44
_EXP_SLACK = 2.0 ** -40
_UNDERFLOW = 2.0 ** -900
#: proposals per batch (memory: about 100 bytes each while a batch is live)
_BATCH = 1 << 16

# trailing zeros of the 10 G bits; 0 (all zero) marks a G of at least 10
_TZ = np.zeros(1 << _G_BITS, dtype=np.int64)
for _i in range(1, 1 << _G_BITS):
    _TZ[_i] = (_i & -_i).bit_length() - 1


class _Params:
    """The sampler's constants for one sigma^2 (module docstring, steps 1-2)."""

    def __init__(self, sigma2: float):
        self.sigma2 = float(sigma2)
        sigma = math.sqrt(self.sigma2)
        self.k = max(0, round(math.log2(LN2 * sigma))) if LN2 * sigma > 0 else 0
        self.t = 1 << self.k
        self.inv_sigma = 1.0 / sigma
        self.lam = LN2 * sigma / self.t
        #: the largest G the fast path takes (G t + u < 2^62) and never beyond the known G bits
        self.g_max = min(_FAST_LIMIT // self.t - 1, _G_UNKNOWN - 1)
        widths = [bits for bits in (8, 16, 32, 64) if self.k <= bits]
        self.u_dtype = None if self.k == 0 else np.dtype(f"uint{widths[0]}")
        # acceptance rate per proposal, exp(-lambda^2 / 2) Z / (4t), only to size batches
        if sigma < 50:
            xs = np.arange(-int(40 * sigma) - 2, int(40 * sigma) + 3, dtype=np.float64)
            z = float(np.exp(-xs * xs / (2.0 * self.sigma2)).sum())
        else:
            z = sigma * math.sqrt(2.0 * math.pi)
        self.acceptance = math.exp(-self.lam ** 2 / 2.0) * z / (4.0 * self.t)


@lru_cache(maxsize=64)
def _params(sigma2: float) -> _Params:
    return _Params(sigma2)


def _fraction(value) -> Fraction:
    from mpmath.libmp import to_man_exp

    man, exp = to_man_exp(value)
    return Fraction(man) * Fraction(2) ** exp


def _acceptance_bounds(p: _Params, m: int, u: int, prec: int) -> tuple[Fraction, Fraction]:
    """Rigorous rational bounds on exp(-a) for |y| = m, u = m mod t, at `prec` bits: interval
    arithmetic with outward rounding, widened by a relative 2^-(prec-20)."""
    from mpmath.libmp import fhalf, from_float, from_int, mpf_ln2, round_ceiling, round_floor
    from mpmath.libmp.libmpi import mpi_add, mpi_div, mpi_exp, mpi_mul, mpi_neg, mpi_sqrt, mpi_square, mpi_sub

    s2 = from_float(p.sigma2)
    sigma = mpi_sqrt((s2, s2), prec)
    ln2 = (mpf_ln2(prec, round_floor), mpf_ln2(prec, round_ceiling))
    big_m, big_t, big_u = from_int(m), from_int(p.t), from_int(u)
    r = mpi_div((big_m, big_m), sigma, prec)
    lam = mpi_div(mpi_mul(ln2, sigma, prec), (big_t, big_t), prec)
    half_d2 = mpi_mul(mpi_square(mpi_sub(r, lam, prec), prec), (fhalf, fhalf), prec)
    a = mpi_add(half_d2, mpi_mul(ln2, mpi_div((big_u, big_u), (big_t, big_t), prec), prec), prec)
    lo, hi = mpi_exp(mpi_neg(a), prec)
    slack = Fraction(1, 1 << (prec - 20))
    return _fraction(lo) * (1 - slack), _fraction(hi) * (1 + slack)


def _exact_accept(p: _Params, m: int, u: int, j: int) -> bool:
    """Bernoulli(exp(-a)) decided exactly, given that the uniform U's first 53 bits are j: U's
    further bits are drawn 64 at a time until U's interval is wholly below or above p's."""
    numerator, bits, prec = j, 53, 96
    while True:
        lo, hi = _acceptance_bounds(p, m, u, prec)
        if Fraction(numerator + 1, 1 << bits) <= lo:
            return True
        if Fraction(numerator, 1 << bits) >= hi:
            return False
        numerator = (numerator << 64) | int.from_bytes(os.urandom(8), "little")
        bits += 64
        prec += 64


def _geometric_tail(start: int) -> int:
    """G given that its first `start` bits were zero: start + the trailing zeros of fresh words."""
    g = start
    while True:
        word = int.from_bytes(os.urandom(8), "little")
        if word:
            return g + ((word & -word).bit_length() - 1)
        g += 64


def _float_bounds(p: _Params, m: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """p_lo <= exp(-a) <= p_hi for magnitudes m < 2^62 and u = m mod t, in float64 (module
    docstring: the error bound E and the slack for exp and its underflow)."""
    with np.errstate(over="ignore", under="ignore"):
        r = m.astype(np.float64) * p.inv_sigma
        d = r - p.lam
        a = 0.5 * d * d + LN2 * (u.astype(np.float64) * (1.0 / p.t))
        e = _ERROR_SCALE * (1.0 + (np.abs(d) + 1.0) * (r + (p.lam + 1.0)))
        p_lo = np.exp(-(a + e)) * (1.0 - _EXP_SLACK) - _UNDERFLOW
        p_hi = np.exp(-(a - e)) * (1.0 + _EXP_SLACK) + _UNDERFLOW
    return p_lo, p_hi


def _batch(p: _Params, count: int) -> np.ndarray:
    """`count` proposals; returns the accepted values, in proposal order."""
    u_size = 0 if p.u_dtype is None else p.u_dtype.itemsize
    raw = os.urandom(count * (8 + u_size))
    words = np.frombuffer(raw, dtype=np.uint64, count=count)
    j = words & np.uint64((1 << 53) - 1)
    negative = ((words >> np.uint64(53)) & np.uint64(1)).astype(bool)
    g = _TZ[(words >> np.uint64(54)).astype(np.intp)]
    long_g = np.flatnonzero((words >> np.uint64(54)) == 0)
    if long_g.size:  # the 10 G bits were all zero: G = 10 + trailing zeros of another word
        extra = np.frombuffer(os.urandom(8 * long_g.size), dtype=np.uint64)
        lowest = extra & (~extra + np.uint64(1))
        g[long_g] = np.where(extra == 0, _G_UNKNOWN, _G_BITS + np.frexp(lowest.astype(np.float64))[1] - 1)
    if u_size:
        u = np.frombuffer(raw, dtype=p.u_dtype, count=count, offset=8 * count).astype(np.int64)
        if p.k % (8 * u_size):
            u &= np.int64(p.t - 1)
    else:
        u = np.zeros(count, dtype=np.int64)
    slow = g > p.g_max
    m = np.where(slow, 0, g) * np.int64(p.t) + u
    p_lo, p_hi = _float_bounds(p, m, u)
    uniform = j.astype(np.float64) * 2.0 ** -53
    accept = (uniform + 2.0 ** -53) <= p_lo
    ambiguous = ~accept & (uniform < p_hi)
    hole = (m == 0) & negative & ~slow
    accept &= ~hole & ~slow  # a slow proposal's m above is a placeholder: the exact path decides it
    values = np.where(negative, -m, m)
    for i in np.flatnonzero((ambiguous & ~hole & ~slow) | slow):
        if slow[i]:
            gi = int(g[i]) if g[i] < _G_UNKNOWN else _geometric_tail(_G_UNKNOWN)
            mi = gi * p.t + int(u[i])
        else:
            mi = int(m[i])
        if mi == 0 and negative[i]:
            continue
        if _exact_accept(p, mi, int(u[i]), int(j[i])):
            if mi >= 2 ** 63:
                raise OverflowError(f"a discrete Gaussian draw of magnitude {mi} does not fit int64 "
                                    f"(sigma^2={p.sigma2!r})")
            values[i] = -mi if negative[i] else mi
            accept[i] = True
    return values[accept]


def discrete_gaussian_vector(sigma2: float, size: int) -> np.ndarray:
    """`size` i.i.d. exact draws of N_Z(0, sigma2) as int64 (module docstring), from os.urandom.
    A draw that does not fit int64 raises OverflowError (protocol.noise.max_sigma2 keeps draws
    within 2^62 except with probability 2^-128)."""
    sigma2 = float(sigma2)
    if not 0 < sigma2 <= 2.0 ** 120:
        raise ValueError(f"sigma^2 must be in (0, 2^120] (draws that fit int64), got {sigma2!r}")
    size = int(size)
    p = _params(sigma2)
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        need = size - filled
        count = min(_BATCH, int(need / p.acceptance * 1.02) + 64)
        got = _batch(p, count)[:need]
        out[filled:filled + got.size] = got
        filled += got.size
    return out
