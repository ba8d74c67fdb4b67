"""Noise a site adds to what it releases, drawn from the operating system's CSPRNG.

Unlike the seeded randomness of the statistics (stats.randomness), this noise is what protects
a release, so nothing about it may be derivable from the scenario's seed: a reader who knows
the seed must learn nothing from it. Its distribution and privacy are in stats.ddg.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache

import numpy as np

from protocol.noise_fast import discrete_gaussian_vector

#: what a site's `noise` policy may be: the OS CSPRNG (private), or the scenario's seed
#: (reproducible experiments only: every output of such a run says its releases are not private)
NOISE_SOURCES = ("os", "seeded")
NOT_PRIVATE = "seeded noise: releases are NOT private (replayable from the scenario seed)"


class PrivacyNoise:
    """The randomness a site half draws to protect a release, from the operating system's CSPRNG
    (os.urandom): uniform floats on [0, 1) with 53 random bits each. It has the two calls the
    mechanisms use of a numpy Generator (`random`, `uniform`) and nothing that could be seeded,
    so no one who knows the scenario (its seed, the site id, the session) can replay a draw.
    Issue 35: the exponential mechanism's bin and the K-anonymous limits and buffers were drawn
    from a Generator seeded by the scenario, which made every "private" release replayable."""

    def random(self, size=None):
        count = 1 if size is None else int(np.prod(size))
        words = np.frombuffer(os.urandom(8 * count), dtype=np.uint64) >> np.uint64(11)
        values = words.astype(np.float64) * 2.0 ** -53
        return float(values[0]) if size is None else values.reshape(size)

    def uniform(self, low=0.0, high=1.0, size=None):
        return low + (high - low) * self.random(size)


class SeededNoise(np.random.Generator):
    """A seeded Generator marked as the explicit seeded mode (a site policy's `noise: seeded`):
    the one case where a release's noise may come from the scenario's seed, so that experiments
    reproduce; the run's outputs then say that its releases are not private."""


def release_noise(rng):
    """The noise source of a release made by the party holding the data (a trusted curator's
    central mechanism, private_cp): the OS CSPRNG, or `rng` itself when it is SeededNoise."""
    return rng if isinstance(rng, SeededNoise) else PrivacyNoise()


def coordinator_rng(generator: np.random.Generator, seeded: bool) -> np.random.Generator:
    """The coordinator half's Generator (its own choices: graphs, sampled sites), marked as
    SeededNoise in the explicit seeded mode so that a curator's release replays too."""
    return SeededNoise(generator.bit_generator) if seeded else generator


#: the largest |draw| the sampler's 64-bit integers leave room for (2^62: a draw plus c times a
#: count still fits in an int64 before the reduction mod M)
DRAW_LIMIT = 2 ** 62
#: how unlikely a draw beyond DRAW_LIMIT may be: 2^-128 per draw
TAIL_BITS = 128


def max_sigma2() -> float:
    """The largest sigma^2 whose draws stay within DRAW_LIMIT except with probability 2^-TAIL_BITS:
    the discrete Gaussian's tail obeys P(|X| >= t) <= 2 exp(-t^2 / (2 sigma^2)) (Canonne, Kamath
    and Steinke 2020, proposition 25 with the sub-Gaussian bound), so sigma^2 <= t^2 / (2 ln(2^129))."""
    return float(DRAW_LIMIT) ** 2 / (2.0 * (TAIL_BITS + 1) * math.log(2.0))


def _check_sigma2(sigma2: float) -> None:
    if not 0 < sigma2 <= max_sigma2():
        raise ValueError(f"sigma^2 must be in (0, {max_sigma2():.4g}] (draws must fit 64-bit integers), "
                         f"got {sigma2!r}")


def discrete_gaussian(sigma2: float, size: int) -> np.ndarray:
    """`size` i.i.d. draws of N_Z(0, sigma2): P(x) proportional to exp(-x^2 / (2 sigma2)) on the
    integers (paper 001, algorithm 1, line 3), sampled exactly from os.urandom by
    protocol.noise_fast (a vectorised Canonne-Kamath-Steinke 2020 style rejection sampler whose
    Bernoulli(exp(-a)) acceptances are decided exactly: no floating-point rounding of the
    distribution, so nothing to add to the accounting; over a million draws a second, issue 49).
    discrete_gaussian_reference is the slower exact sampler it is tested against. A sigma^2 above
    max_sigma2() is refused: its draws could be pinned at the integer type's limit (issue 35: on
    32-bit integers a sigma^2 of 1e19 put half the draws at +-2^31)."""
    _check_sigma2(sigma2)
    return discrete_gaussian_vector(sigma2, size)


@lru_cache(maxsize=32)
def _opendp_sampler(sigma: float):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp.m.make_gaussian(dp.vector_domain(dp.atom_domain(T="i64")), dp.l2_distance(T="i64"), scale=sigma)


def discrete_gaussian_reference(sigma2: float, size: int) -> np.ndarray:
    """The reference exact sampler (40,000-75,000 draws a second here): OpenDP's make_gaussian on 64-bit
    integers, which implements the Canonne-Kamath-Steinke 2020 sampler with no floating-point
    rounding of the distribution, from OpenDP's own CSPRNG. Kept for tests and bench/discrete_gaussian.py."""
    _check_sigma2(sigma2)
    return np.asarray(_opendp_sampler(math.sqrt(sigma2))([0] * int(size)), dtype=np.int64)


def gaussian(source, sigma: float, size: int) -> np.ndarray:
    """`size` draws of N(0, sigma^2) by the Box-Muller transform of `source.random` (the OS CSPRNG's
    PrivacyNoise, or a SeededNoise Generator in the explicit seeded mode, so the draws replay):
    the continuous Gaussian of a trusted curator's central release (DP-FedAvg's and DP-Δ-FL's
    update noise, McAfee et al. 2018; paper 001 algorithm 4 line 12). sigma 0: zeros."""
    count = int(size)
    if sigma <= 0 or count == 0:
        return np.zeros(count)
    pairs = (count + 1) // 2
    u = source.random(2 * pairs).reshape(2, pairs)
    radius = np.sqrt(-2.0 * np.log1p(-u[0]))  # 1 - u in (0, 1]: never log(0)
    values = np.concatenate([radius * np.cos(2 * math.pi * u[1]), radius * np.sin(2 * math.pi * u[1])])
    return sigma * values[:count]


def seeded_discrete_gaussian(rng: np.random.Generator, sigma2: float, size: int) -> np.ndarray:
    """N_Z(0, sigma2) from a seeded Generator, for the explicit seeded mode only (its releases say
    they are not private): Canonne, Kamath and Steinke 2020, algorithm 3 (a discrete Laplace
    proposal with scale t = floor(sigma) + 1, accepted with probability
    exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2))), in floating point."""
    _check_sigma2(sigma2)
    sigma, count = math.sqrt(sigma2), int(size)
    t = math.floor(sigma) + 1
    out = np.empty(0, dtype=np.int64)
    while out.size < count:
        batch = 2 * (count - out.size) + 16
        p = 1.0 - math.exp(-1.0 / t)
        magnitude = rng.geometric(p, batch) - 1  # |Y| of a discrete Laplace: P(k) proportional to exp(-k / t)
        sign = rng.integers(0, 2, batch) * 2 - 1
        keep = ~((sign < 0) & (magnitude == 0))  # 0 drawn once, not twice
        y = (sign * magnitude)[keep]
        accept = rng.random(y.size) < np.exp(-((np.abs(y) - sigma2 / t) ** 2) / (2.0 * sigma2))
        out = np.concatenate([out, y[accept].astype(np.int64)])
    return out[:count]


def site_discrete_gaussian(source, sigma2: float, size: int) -> np.ndarray:
    """The discrete Gaussian a site adds: exact from the OS CSPRNG (discrete_gaussian) when the site's
    noise source is the CSPRNG (PrivacyNoise), or from the seeded Generator a site half gets in the
    explicit seeded mode (its policy's `noise: seeded`: seeded_discrete_gaussian), so that such a run
    replays."""
    if isinstance(source, np.random.Generator):
        return seeded_discrete_gaussian(source, sigma2, size)
    return discrete_gaussian(sigma2, size)
