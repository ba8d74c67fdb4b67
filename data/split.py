"""Train / calibration / test splits and partitions of the calibration data across sites.

Paper 000 section 5.2: a fresh random split per trial, features standardized with statistics
from the training split only.
"""

from __future__ import annotations

import numpy as np


def split_indices(n: int, train: float, calibration: float, test: float, rng: np.random.Generator):
    """Random disjoint index sets with the given fractions of n (rounded down)."""
    if train + calibration + test > 1.0 + 1e-9:
        raise ValueError(f"split fractions add up to {train + calibration + test} > 1")
    order = rng.permutation(n)
    n_train, n_cal, n_test = int(train * n), int(calibration * n), int(test * n)
    return (order[:n_train], order[n_train:n_train + n_cal],
            order[n_train + n_cal:n_train + n_cal + n_test])


def standardize(X_train: np.ndarray, *others: np.ndarray):
    """Zero mean, unit variance with the training split's statistics (constant columns left at 0)."""
    mean = X_train.mean(axis=0)
    scale = X_train.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    return tuple((X - mean) / scale for X in (X_train, *others))


def partition(indices: np.ndarray, m: int, sizes, rng: np.random.Generator) -> list[np.ndarray]:
    """Split calibration indices across m sites.

    sizes = "equal": n = len(indices) // m points each (the remainder is left unused);
    sizes = [n_1, ..., n_m]: explicit sizes, which must fit in the calibration split.
    """
    shuffled = rng.permutation(indices)
    if sizes == "equal":
        n = len(indices) // m
        if n < 1:
            raise ValueError(f"{len(indices)} calibration points cannot give {m} sites one point each")
        sizes = [n] * m
    if len(sizes) != m:
        raise ValueError(f"sites.sizes lists {len(sizes)} sizes for {m} sites")
    if sum(sizes) > len(indices):
        raise ValueError(f"sites.sizes add up to {sum(sizes)} but the calibration split has {len(indices)} points")
    bounds = np.cumsum([0, *sizes])
    return [shuffled[bounds[j]:bounds[j + 1]] for j in range(m)]
