"""Shamir secret sharing over the prime field GF(P), P = 2^521 - 1 (a Mersenne prime).

A secret s < P is the constant term of a random polynomial f of degree t - 1; holder x gets
(x, f(x)). Any t shares determine f and hence s = f(0) by Lagrange interpolation at zero; fewer
than t reveal nothing about s (Shamir, 'How to share a secret', CACM 1979). Secure aggregation
shares 32-byte secrets (X25519 private keys and mask seeds), which fit below P with room.
The coefficients come from the operating system's CSPRNG (`secrets`), never from a seeded PRNG.
"""

from __future__ import annotations

import secrets
from functools import lru_cache
from typing import Callable, Iterable, Mapping

PRIME = 2**521 - 1
SHARE_BYTES = (PRIME.bit_length() + 7) // 8  # 66


class ShareError(ValueError):
    """Shares that cannot give a secret: too few, repeated holders, or inconsistent values."""


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
    """f(0) from at least `threshold` shares; every share beyond the first t must lie on the
    same polynomial, so a corrupted share is detected rather than silently used.

    Lagrange interpolation in barycentric form (Berrut and Trefethen, "Barycentric Lagrange
    interpolation", SIAM Review 2004, eq. 3.3): through the base points (x_i, y_i),
        f(x) = l(x) sum_i c_i / (x - x_i),   l(x) = prod_j (x - x_j),   c_i = y_i b_i,
        b_i = 1 / prod_{j != i} (x_i - x_j),
    so the b_i come once per set of holders and each point checked costs t products; the
    inverses of the small differences x - x_i are cached (holders are small integers)."""
    if len(shares) < threshold:
        raise ShareError(f"{len(shares)} shares, {threshold} needed")
    points = sorted(shares.items())
    base, extra = points[:threshold], points[threshold:]
    xs = tuple(x for x, _ in base)
    c = [y * b % PRIME for (_, y), b in zip(base, _barycentric_weights(xs))]
    secret = _interpolate(xs, c, 0)
    for x, y in extra:
        if _interpolate(xs, c, x) != y % PRIME:
            raise ShareError(f"share of holder {x} does not lie on the polynomial of the others")
    return secret


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


def batch_inverse(values: list[int]) -> list[int]:
    """The inverses mod P of nonzero `values` with a single modular inverse (Montgomery's trick:
    prefix products, invert the last, walk back), instead of one inverse each."""
    prefix, acc = [], 1
    for v in values:
        acc = acc * v % PRIME
        prefix.append(acc)
    inverse = pow(acc, -1, PRIME)
    out = [0] * len(values)
    for i in range(len(values) - 1, 0, -1):
        out[i] = inverse * prefix[i - 1] % PRIME
        inverse = inverse * values[i] % PRIME
    if values:
        out[0] = inverse
    return out
