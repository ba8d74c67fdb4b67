"""Independent reference computations for tests: exact rational arithmetic, no floating point."""

from __future__ import annotations

import itertools
from fractions import Fraction
from math import comb


def eq5_brute_force(m: int, n: int, ell: int, k: int) -> Fraction:
    """Paper 000 eq. (5) summed literally over every tuple (i_1, ..., i_m); tiny m, n only."""
    N = m * n
    total = Fraction(0)
    for j in range(k, m + 1):
        inner = Fraction(0)
        for upper in itertools.product(range(ell, n + 1), repeat=j):
            for lower in itertools.product(range(0, ell), repeat=m - j):
                idx = upper + lower
                num = 1
                for i in idx:
                    num *= comb(n, i)
                inner += Fraction(num, comb(N, sum(idx)))
        total += comb(m, j) * inner
    return 1 - total / (N + 1)


def eq5_exact(m: int, n: int, ell: int, k: int) -> Fraction:
    """Eq. (5) in exact rationals by polynomial convolution (appendix C.1's integral term by term).

    G^j (1-G)^(m-j) in the scaled Bernstein basis is a convolution of the coefficient vectors
    C(n, i) 1{i >= ell} and C(n, i) 1{i < ell}; int_0^1 t^r (1-t)^(N-r) dt = 1 / ((N+1) C(N, r)).
    """
    N = m * n
    up = [comb(n, i) if i >= ell else 0 for i in range(n + 1)]
    down = [comb(n, i) if i < ell else 0 for i in range(n + 1)]
    ups, downs = [[1]], [[1]]
    for _ in range(m):
        ups.append(_convolve(ups[-1], up))
        downs.append(_convolve(downs[-1], down))
    total = Fraction(0)
    for j in range(k, m + 1):
        coeffs = _convolve(ups[j], downs[m - j])
        total += comb(m, j) * sum(Fraction(c, comb(N, r)) for r, c in enumerate(coeffs) if c)
    return 1 - total / (N + 1)


def _convolve(a, b):
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] += x * y
    return out


def binomial_tolerance(p: float, trials: int, z: float = 4.5) -> float:
    """Half-width of a z-sigma band for a binomial proportion (z = 4.5: false alarm ~7e-6)."""
    return z * (p * (1 - p) / trials) ** 0.5 + 1.0 / trials


def appendix_a1_brute_force(sizes, ells, k) -> Fraction:
    """Paper 000 appendix A.1 summed literally: subsets A of size j >= k, tuples i_a >= ell_a on A
    and i_a <= ell_a - 1 off A. Tiny cases only."""
    m, N = len(sizes), sum(sizes)
    total = Fraction(0)
    for j in range(k, m + 1):
        for A in itertools.combinations(range(m), j):
            ranges = [range(ells[a], sizes[a] + 1) if a in A else range(0, min(ells[a], sizes[a] + 1))
                      for a in range(m)]
            for idx in itertools.product(*ranges):
                num = 1
                for a, i in enumerate(idx):
                    num *= comb(sizes[a], i)
                total += Fraction(num, comb(N, sum(idx)))
    return 1 - total / (N + 1)


def appendix_a1_exact(sizes, ells, k) -> Fraction:
    """Appendix A.1 in exact rationals: a dynamic programme over sites on (count of sites whose
    ell_a-th score lies below, scaled Bernstein coefficients of the polynomial)."""
    N = sum(sizes)
    polys = {0: [1]}
    for n, ell in zip(sizes, ells):
        up = [comb(n, i) if i >= ell else 0 for i in range(n + 1)]
        down = [comb(n, i) if i < ell else 0 for i in range(n + 1)]
        grown = {}
        for count, poly in polys.items():
            for c, vec in ((count, down), (count + 1, up)):
                r = _convolve(poly, vec)
                grown[c] = [a + b for a, b in zip(grown[c], r)] if c in grown else r
        polys = grown
    total = Fraction(0)
    for count, poly in polys.items():
        if count >= k:
            total += sum(Fraction(x, comb(N, r)) for r, x in enumerate(poly) if x)
    return 1 - total / (N + 1)
