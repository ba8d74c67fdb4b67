"""Synthetic generators of the papers."""

from __future__ import annotations

import numpy as np


def romano2019(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Paper 000 section 5.1 (after Romano et al. 2019), with outliers.

    X ~ U[1, 5];  Y | X ~ Pois(sin^2(X) + 0.1) + 0.03 X eps_1 + 25 * 1{U < 0.01} eps_2,
    eps_1, eps_2 standard Gaussian, U uniform on [0, 1].
    """
    x = rng.uniform(1.0, 5.0, n)
    y = (rng.poisson(np.sin(x) ** 2 + 0.1)
         + 0.03 * x * rng.standard_normal(n)
         + 25.0 * (rng.uniform(size=n) < 0.01) * rng.standard_normal(n))
    return x[:, None], y


GENERATORS = {"romano2019": romano2019}
