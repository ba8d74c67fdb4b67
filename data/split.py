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


def site_sizes(spec, m: int, n_calibration: int) -> list[int]:
    """The n_j of each site, fixed for the whole run.

    "equal": n_calibration // m each (the remainder is left unused); an integer n: n each (paper
    000 appendix B.1 uses m x n points of a larger calibration split); a list: as given; a
    distribution mapping: m draws from its own seed, rounded and clipped to [min, max]:
    lognormal(median, sigma) = round(median * exp(sigma * Z)), uniform(low, high) on integers.
    """
    if isinstance(spec, int):
        return [spec] * m
    if spec == "equal":
        n = n_calibration // m
        if n < 1:
            raise ValueError(f"{n_calibration} calibration points cannot give {m} sites one point each")
        return [n] * m
    if isinstance(spec, list):
        return list(spec)
    rng = np.random.default_rng([spec["seed"], 0x517E5])
    if spec["distribution"] == "lognormal":
        draws = np.rint(spec["median"] * np.exp(spec["sigma"] * rng.standard_normal(m)))
    else:
        draws = rng.integers(spec["low"], spec["high"] + 1, size=m)
    upper = spec["max"] if spec["max"] is not None else np.inf
    return [int(v) for v in np.clip(draws, spec["min"], upper)]


def partition(indices: np.ndarray, sizes: list[int], rng: np.random.Generator) -> list[np.ndarray]:
    """Split calibration indices across sites with the given sizes (see site_sizes)."""
    check_capacity(sizes, len(indices))
    shuffled = rng.permutation(indices)
    bounds = np.cumsum([0, *sizes])
    return [shuffled[bounds[j]:bounds[j + 1]] for j in range(len(sizes))]


def group_partition(indices: np.ndarray, groups: np.ndarray, sizes: list[int],
                    rng: np.random.Generator) -> list[np.ndarray]:
    """Split calibration indices across sites so that site j holds exactly n_j // 2 controls
    (groups False) and n_j - n_j // 2 treatments (groups True), each group's points drawn at
    random: paper 004 table 1's n_l values per group at centre l (section 4.6)."""
    check_capacity(sizes, len(indices))
    groups = np.asarray(groups, dtype=bool)
    pools = [rng.permutation(indices[~groups]), rng.permutation(indices[groups])]
    wanted = [[size // 2 for size in sizes], [size - size // 2 for size in sizes]]
    for name, pool, counts in zip(("control", "treatment"), pools, wanted):
        if sum(counts) > len(pool):
            raise ValueError(f"the sites need {sum(counts)} {name} points but the calibration split has {len(pool)}")
    bounds = [np.cumsum([0, *counts]) for counts in wanted]
    return [rng.permutation(np.concatenate([pools[g][bounds[g][j]:bounds[g][j + 1]] for g in (0, 1)]))
            for j in range(len(sizes))]  # the groups mixed within a site, as partition leaves them


def check_capacity(sizes: list[int], available: int) -> None:
    """The sites cannot hold more calibration points than the split has."""
    if sum(sizes) > available:
        raise ValueError(f"sites.sizes add up to {sum(sizes)} but the calibration split has {available} points")
