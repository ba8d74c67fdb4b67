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
    same polynomial, so a corrupted share is detected rather than silently used."""
    if len(shares) < threshold:
        raise ShareError(f"{len(shares)} shares, {threshold} needed")
    points = sorted(shares.items())
    base, extra = points[:threshold], points[threshold:]
    xs = tuple(x for x, _ in base)
    secret = sum(w * y for w, (_, y) in zip(_lagrange_weights(xs, 0), base)) % PRIME
    for x, y in extra:
        if sum(w * yb for w, (_, yb) in zip(_lagrange_weights(xs, x), base)) % PRIME != y % PRIME:
            raise ShareError(f"share of holder {x} does not lie on the polynomial of the others")
    return secret


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


@lru_cache(maxsize=4096)
def _lagrange_weights(xs: tuple[int, ...], at: int) -> tuple[int, ...]:
    """w_i with f(at) = sum_i w_i f(x_i) for every polynomial f of degree < len(xs); cached, as
    secure aggregation rebuilds many secrets from the same holders."""
    weights = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * (at - xj) % PRIME
                den = den * (xi - xj) % PRIME
        weights.append(num * pow(den, -1, PRIME) % PRIME)
    return tuple(weights)
