"""Shamir secret sharing over the prime field GF(P), P = 2^256 + 297 (the least prime above 2^256).

A secret s < P is the constant term of a random polynomial f of degree t - 1; holder x gets
(x, f(x)). Any t shares determine f and hence s = f(0) by Lagrange interpolation at zero; fewer
than t reveal nothing about s (Shamir, 'How to share a secret', CACM 1979). Secure aggregation
shares 32-byte secrets (X25519 private keys and mask seeds): every one lies below P, and a
share is 33 bytes. (Until issue 40 the field was GF(2^521 - 1): shares of 66 bytes, and
arithmetic on twice the digits for the same secrets; a 10,000-site session spent seconds of the
coordinator's time rebuilding secrets in it.)
The coefficients come from the operating system's CSPRNG (`secrets`), never from a seeded PRNG.

Shares that do not lie on one polynomial are detected by one random check (reconstruct_secret)
and, for robust unmasking (issue 48), corrected by Reed-Solomon decoding while at most
floor((n - t) / 2) of the n are wrong (recover_secret, decode_shares: Gao's algorithm).
"""

from __future__ import annotations

import os
import secrets
from functools import lru_cache
from typing import Callable, Collection, Iterable, Mapping

PRIME = 2**256 + 297  # sympy.nextprime(2**256); tests/test_secagg.py checks it is prime
SHARE_BYTES = (PRIME.bit_length() + 7) // 8  # 33


class ShareError(ValueError):
    """Shares that cannot give a secret: too few, repeated holders, or inconsistent values.
    `left_out`: holders whose shares recover_secret left out before it gave up (found wrong in
    other secrets)."""

    left_out: tuple[int, ...] = ()


def split_secret(secret: int, threshold: int, holders: Iterable[int],
                 randbelow: Callable[[int], int] = secrets.randbelow) -> dict[int, int]:
    """Shares {x: f(x)} of `secret` for each holder x (distinct integers in [1, P)), any
    `threshold` of which reconstruct it."""
    holders = list(holders)
    if not 0 <= secret < PRIME:
        raise ValueError("the secret must lie in [0, P)")
    if not 1 <= threshold <= len(holders):
        raise ValueError(f"threshold {threshold} needs between 1 and {len(holders)} holders")
    if len(set(holders)) != len(holders) or any(not 0 < x < PRIME for x in holders):
        raise ValueError("holders must be distinct integers in [1, P)")
    coefficients = [secret] + [randbelow(PRIME) for _ in range(threshold - 1)]
    return {x: _evaluate(coefficients, x) for x in holders}


def reconstruct_secret(shares: Mapping[int, int], threshold: int) -> int:
    """f(0) from at least `threshold` shares; every share must lie on one polynomial of degree
    below t, so a corrupted share is detected rather than silently used (ShareError naming the
    holders whose shares are off, found by `decode_shares`; `recover_secret` corrects them instead).

    Through all n shares at once, in barycentric form (Berrut and Trefethen, "Barycentric Lagrange
    interpolation", SIAM Review 2004, eq. 3.3), with w_j = 1 / prod_{i != j} (x_j - x_i):
        p(0) = l(0) sum_j w_j y_j / (0 - x_j),   l(0) = prod_j (0 - x_j),
    p the interpolant of degree below n, which is f when the shares agree. They agree exactly
    when p has degree below t, that is when sum_j w_j y_j x_j^k = 0 for k = 0 .. n - t - 1 (the
    n-point divided difference of p(x) x^k is the x^(n-1) coefficient of a polynomial of degree
    below n); `_consistent` checks a random combination of those n - t conditions, which a set of
    shares off the polynomial passes with probability at most 2^-256. One set of weights and
    O(n) field products per secret, where checking each extra share by interpolation took
    O((n - t) t) products: 476 us against 598 us for SecAgg+'s 29 holders and t = 15."""
    xs, z, consistent = _checked(shares, threshold)
    if not consistent:
        raise ShareError(_stray_shares(shares, threshold))
    return _interpolate(xs, z, 0)


def recover_secret(shares: Mapping[int, int], threshold: int,
                   distrusted: Collection[int] = ()) -> tuple[int, tuple[int, ...]]:
    """(f(0), the holders whose shares are off f, sorted): robust unmasking (issue 48).

    The common case costs what `reconstruct_secret` costs: one set of barycentric weights and one
    random consistency check over all n shares. Only when that check fails:
      1. with the shares of `distrusted` holders (found wrong in other secrets) left out, the same
         check on the others (a holder that sends garbage for every secret it holds is decoded
         once, in the first, and left out of the rest at the cost of a second check);
      2. `decode_shares` (Gao's Reed-Solomon decoder) on all n shares: up to floor((n - t) / 2)
         wrong ones corrected;
      3. the decoder on the shares of step 1 (errors and erasures: 2 e + s <= n - t).
    The holders returned are every one whose share is off the polynomial found, those left out
    included, so they do not depend on `distrusted`. When every step fails, ShareError says how
    many shares there were, that the wrong ones cannot be told apart, and (`left_out`) which were
    left out. With t shares nothing can be checked (any t values lie on a polynomial of degree
    below t): when only t holders answer they are used as they are, as before, but once the check
    has failed, leaving holders out is tried only while more than t shares remain (the t left
    could hold another wrong one, which nothing would then show)."""
    xs, z, consistent = _checked(shares, threshold)
    if consistent:
        return _interpolate(xs, z, 0), ()
    kept = {x: y for x, y in shares.items() if x not in distrusted}
    erasing = threshold < len(kept) < len(shares)  # t left would pass any check: there is evidence to check
    if erasing:
        kept_xs, kept_z, consistent = _checked(kept, threshold)
        if consistent:
            return _interpolate(kept_xs, kept_z, 0), tuple(
                x for x in sorted(set(shares) - set(kept)) if _interpolate(kept_xs, kept_z, x) != shares[x] % PRIME)
    try:
        coefficients, wrong = decode_shares(shares, threshold)
        return coefficients[0], wrong
    except ShareError as exc:
        left_out = tuple(sorted(set(shares) - set(kept)))
        if not erasing:
            if left_out:
                exc.left_out = left_out
                exc.args = (f"{exc}; with the {_shares(len(left_out))} of holders found wrong in other secrets "
                            f"left out, {len(kept)} remain, and {threshold + 1} are needed to rebuild it and check "
                            f"the shares",)
            raise
    try:
        coefficients, wrong = decode_shares(kept, threshold)
    except ShareError as exc:
        exc.left_out = left_out
        exc.args = (f"{exc} (with the {_shares(len(left_out))} of holders found wrong in other secrets left out)",)
        raise
    return coefficients[0], tuple(sorted(wrong + tuple(x for x in left_out
                                                       if _evaluate(coefficients, x) != shares[x] % PRIME)))


def _shares(count: int) -> str:
    return f"{count} share{'s' * (count != 1)}"


def _checked(shares: Mapping[int, int], threshold: int) -> tuple[tuple[int, ...], list[int], bool]:
    """(xs, z, whether the shares lie on one polynomial of degree below t): the sorted holders,
    their barycentric terms z_j = w_j y_j (so that _interpolate(xs, z, at) is f(at)), and the check."""
    if len(shares) < threshold:
        raise ShareError(f"{len(shares)} shares, {threshold} needed")
    points = sorted(shares.items())
    xs = tuple(x for x, _ in points)
    z = [y * w % PRIME for (_, y), w in zip(points, _barycentric_weights(xs))]
    return xs, z, len(points) == threshold or _consistent(xs, z, len(points) - threshold)


def _consistent(xs: tuple[int, ...], z: list[int], conditions: int) -> bool:
    """sum_j z_j R(x_j) = 0 mod P for R a random polynomial of degree below `conditions`, z_j =
    w_j y_j: a random combination of the conditions above. R's coefficients are 256-bit numbers
    from the OS CSPRNG (2^256 distinct residues: a combination that is not zero vanishes for at
    most one value of any one coefficient, so with probability at most 2^-256)."""
    entropy = os.urandom(32 * conditions)
    rho = [int.from_bytes(entropy[i:i + 32], "big") for i in range(0, len(entropy), 32)]
    total = 0
    for zj, x in zip(z, xs):
        r = 0
        for coefficient in rho:  # Horner's rule on small x: no reduction needed until the end
            r = r * x + coefficient
        total += zj * r
    return total % PRIME == 0


def _stray_shares(shares: Mapping[int, int], threshold: int) -> str:
    """Which shares do not lie on the polynomial of the others (only when some share is off):
    the holders `decode_shares` finds, or that more are wrong than it can tell apart."""
    try:
        _, wrong = decode_shares(shares, threshold)
    except ShareError as exc:
        return str(exc)
    if len(wrong) == 1:
        return f"share of holder {wrong[0]} does not lie on the polynomial of the others"
    return f"shares of holders {', '.join(map(str, wrong))} do not lie on the polynomial of the others"


def decode_shares(shares: Mapping[int, int], threshold: int, prime: int = PRIME) -> tuple[list[int], tuple[int, ...]]:
    """Reed-Solomon decoding of Shamir shares: the polynomial f of degree below t = `threshold`
    that at most e = floor((n - t) / 2) of the n shares {x: y} are off, as its t coefficients
    (constant term, the secret, first), and those holders, sorted; ShareError when there is none.

    Shamir shares of a degree t - 1 polynomial are a codeword of the Reed-Solomon code of length
    n and dimension t over GF(p) (McEliece and Sarwate, "On sharing secrets and Reed-Solomon
    codes", CACM 1981), of minimum distance n - t + 1: e wrong shares can be corrected while
    2e <= n - t. Gao's algorithm (S. Gao, "A new algorithm for decoding Reed-Solomon codes", in
    Communications, Information and Network Security, Kluwer 2003, pp. 55-68):
      1. g0 = prod_i (X - x_i); g1 the interpolant of degree below n through all n shares;
      2. the extended Euclidean algorithm on (g0, g1), stopped at the first remainder g of degree
         below (n + t) / 2, with g = u g0 + v g1;
      3. f = g / v when v divides g and f has degree below t; the wrong shares are at the roots
         of v (the error locator). Otherwise no codeword lies within e of the shares: failure.
    This is the unique-decoding radius and no further: with more than e wrong shares the decoder
    either fails (always, for e + 1 wrong shares when n - t is odd) or, when the wrong values
    lie within e of another polynomial (possible for e + 1 wrong shares when n - t is even, and
    for e + 2 always), returns that one: liars who send the values of a polynomial through t - 1
    honest shares and a secret of their choosing steer it there; random garbage over GF(P) lands
    there with negligible probability once n > t (each wrong value beyond the first would have
    to fall on one polynomial), and n = t checks nothing. The
    result is checked here (at most e disagreements), so a success is always the polynomial within
    e of the shares that brute force finds (tests/test_robust_unmasking.py compares them).

    O(n^2) field operations on Python integers; measured (median of 40, random holders in
    1..10,000, one core of this 2-core AMD EPYC machine): 0.5-0.7 ms for n = 29, t = 15 (SecAgg+'s
    largest neighbourhood at 10,000 sites: k = default_degree(10,000) = 28) and 1.2-2.0 ms for
    n = 50, t = 26, from one wrong share to e; 20-37 ms for n = 200, t = 101 (a full graph of 200
    sites). recover_secret runs it only after its consistency check fails (0.15-0.35 ms for those
    sizes, the whole cost when the shares agree).
    `prime`: the field (the tests decode over small fields against brute force)."""
    n, t, p = len(shares), threshold, prime
    if t < 1 or n < t:
        raise ShareError(f"{n} shares, {t} needed")
    points = sorted(shares.items())
    xs = [x % p for x, _ in points]
    ys = [y % p for _, y in points]
    if len(set(xs)) != n or 0 in xs:
        raise ShareError("holders must be distinct nonzero elements of the field")
    g0 = [1]
    for x in xs:  # (X - x) times g0, coefficients low to high
        g0 = [(a - x * b) % p for a, b in zip([0] + g0, g0 + [0])]
    quotients = [_deflate(g0, x, p) for x in xs]  # g0 / (X - x_i), degree n - 1
    weights = batch_inverse([_poly_eval(q, x, p) for q, x in zip(quotients, xs)], p)  # 1 / g0'(x_i)
    g1 = [0] * n
    for q, w, y in zip(quotients, weights, ys):
        c = w * y % p
        if c:
            for j, a in enumerate(q):
                g1[j] += c * a
    g1 = _trim([a % p for a in g1])
    bound = n + t  # stop at the first remainder r with 2 deg r < n + t
    r0, r1, v0, v1 = _trim(g0), g1, [], [1]
    while 2 * (len(r1) - 1) >= bound:
        q, r = _poly_divmod(r0, r1, p)
        r0, r1 = r1, r
        v0, v1 = v1, _poly_sub(v0, _poly_mul(q, v1, p), p)
    f, remainder = _poly_divmod(r1, v1, p)
    errors = (n - t) // 2
    if not remainder and len(f) <= t:
        f = f + [0] * (t - len(f))
        wrong = tuple(x for (x, _), xm, y in zip(points, xs, ys) if _poly_eval(f, xm, p) != y)
        if len(wrong) <= errors:
            return f, wrong
    raise ShareError(f"{n} shares of a threshold-{t} secret do not lie on one polynomial of degree below {t}, and "
                     f"more are off it than the {errors} that {n} shares can correct: cannot tell which holders "
                     f"sent the wrong ones")


def _trim(a: list[int]) -> list[int]:
    """A polynomial's coefficients (low to high) without leading zeros: [] is the zero polynomial."""
    while a and not a[-1]:
        a.pop()
    return a


def _deflate(a: list[int], x: int, p: int) -> list[int]:
    """a / (X - x) for a root x of a (synthetic division)."""
    out = [0] * (len(a) - 1)
    carry = 0
    for j in range(len(a) - 1, 0, -1):
        carry = (a[j] + x * carry) % p
        out[j - 1] = carry
    return out


def _poly_eval(a: list[int], x: int, p: int) -> int:
    acc = 0
    for c in reversed(a):
        acc = (acc * x + c) % p
    return acc


def _poly_mul(a: list[int], b: list[int], p: int) -> list[int]:
    if not a or not b:
        return []
    out = [0] * (len(a) + len(b) - 1)
    for i, ai in enumerate(a):
        for j, bj in enumerate(b):
            out[i + j] += ai * bj
    return _trim([c % p for c in out])


def _poly_sub(a: list[int], b: list[int], p: int) -> list[int]:
    out = [0] * max(len(a), len(b))
    for i, c in enumerate(a):
        out[i] = c
    for i, c in enumerate(b):
        out[i] = (out[i] - c) % p
    return _trim(out)


def _poly_divmod(a: list[int], b: list[int], p: int) -> tuple[list[int], list[int]]:
    """(quotient, remainder) of a by a nonzero b."""
    a = list(a)
    lead = pow(b[-1], -1, p)
    q = [0] * max(0, len(a) - len(b) + 1)
    for shift in range(len(a) - len(b), -1, -1):
        c = a[shift + len(b) - 1] * lead % p
        q[shift] = c
        if c:
            for j, bj in enumerate(b):
                a[shift + j] = (a[shift + j] - c * bj) % p
    return _trim(q), _trim(a[:len(b) - 1])


def _interpolate(xs: tuple[int, ...], c: list[int], at: int) -> int:
    """f(at) = l(at) sum_i c_i / (at - x_i) mod P, for `at` not among the xs."""
    scale = 1
    for x in xs:
        scale *= at - x
    return scale % PRIME * (sum(ci * _inverse(at - x) for ci, x in zip(c, xs)) % PRIME) % PRIME


@lru_cache(maxsize=1 << 16)
def _inverse(d: int) -> int:
    """1 / d mod P for a small nonzero integer d (a difference of holder indices)."""
    return pow(d % PRIME, -1, PRIME)


@lru_cache(maxsize=4096)
def _barycentric_weights(xs: tuple[int, ...]) -> tuple[int, ...]:
    """b_i = 1 / prod_{j != i} (x_i - x_j) mod P: products of small integers taken exactly, the t
    of them inverted together with one modular inverse (batch_inverse)."""
    products = []
    for i, xi in enumerate(xs):
        product = 1
        for j, xj in enumerate(xs):
            if i != j:
                product *= xi - xj
        products.append(product % PRIME)
    return tuple(batch_inverse(products))


def share_to_bytes(value: int) -> bytes:
    return int(value).to_bytes(SHARE_BYTES, "big")


def share_from_bytes(data: bytes) -> int:
    if not isinstance(data, bytes) or len(data) != SHARE_BYTES:
        raise ShareError(f"a share is {SHARE_BYTES} bytes")
    value = int.from_bytes(data, "big")
    if value >= PRIME:
        raise ShareError("share outside the field")
    return value


def _evaluate(coefficients: list[int], x: int) -> int:
    """Horner's rule in GF(P)."""
    acc = 0
    for c in reversed(coefficients):
        acc = (acc * x + c) % PRIME
    return acc


def batch_inverse(values: list[int], prime: int = PRIME) -> list[int]:
    """The inverses mod `prime` (default P) of nonzero `values` with a single modular inverse
    (Montgomery's trick: prefix products, invert the last, walk back), instead of one inverse each."""
    prefix, acc = [], 1
    for v in values:
        acc = acc * v % prime
        prefix.append(acc)
    inverse = pow(acc, -1, prime)
    out = [0] * len(values)
    for i in range(len(values) - 1, 0, -1):
        out[i] = inverse * prefix[i - 1] % prime
        inverse = inverse * values[i] % prime
    if values:
        out[0] = inverse
    return out
