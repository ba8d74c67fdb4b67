"""Noise a site adds to what it releases, drawn from the operating system's CSPRNG.

Unlike the seeded randomness of the statistics (stats.randomness), this noise is what protects
a release, so nothing about it may be derivable from the scenario's seed: a reader who knows
the seed must learn nothing from it. Its distribution and privacy are in stats.ddg.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=32)
def _opendp_sampler(sigma: float):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T=int)), dp.l2_distance(T=int), scale=sigma)


def discrete_gaussian(sigma2: float, size: int) -> np.ndarray:
    """`size` i.i.d. draws of N_Z(0, sigma2): P(x) proportional to exp(-x^2 / (2 sigma2)) on the
    integers (paper 001, algorithm 1, line 3), sampled exactly (OpenDP's make_gaussian on an
    integer domain, which implements the Canonne-Kamath-Steinke 2020 sampler with no
    floating-point rounding of the distribution)."""
    if sigma2 <= 0:
        raise ValueError("sigma^2 must be positive")
    return np.asarray(_opendp_sampler(math.sqrt(sigma2))([0] * int(size)), dtype=np.int64)
