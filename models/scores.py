"""Conformity scores and the prediction sets they induce.

A model's base prediction is an array: shape (n,) for a point regressor, (n, 2) for a pair of
quantile regressors (lower, upper), (n, K) class probabilities for a classifier. Scores and sets
are pure functions of it, and a set is always {y : s(x, y) <= q} for the same s, so that the
conformal guarantee on the score carries over to the set exactly.

Regression (paper 000 section 5): absolute residual (split CP) and CQR.
Classification: LAC (Sadinle et al. 2019; paper 003's experiments), APS (Romano, Sesia and
Candes 2020) and RAPS (Angelopoulos et al. 2021), the last two without randomization (sets are
then slightly conservative, never invalid).
"""

from __future__ import annotations

import numpy as np


def absolute_residual_score(y, prediction):
    """s(x, y) = |y - f(x)| (split CP, paper 000 section 5)."""
    return np.abs(np.asarray(y, dtype=float) - np.asarray(prediction, dtype=float))


def cqr_score(y, bounds):
    """s(x, y) = max(f_lo(x) - y, y - f_hi(x)) (CQR, Romano et al. 2019; paper 000 section 5)."""
    y = np.asarray(y, dtype=float)
    bounds = np.asarray(bounds, dtype=float)
    return np.maximum(bounds[:, 0] - y, y - bounds[:, 1])


def absolute_residual_interval(prediction, q: float):
    """[f(x) - q, f(x) + q]."""
    prediction = np.asarray(prediction, dtype=float)
    return prediction - q, prediction + q


def cqr_interval(bounds, q: float):
    """[f_lo(x) - q, f_hi(x) + q]; empty where q is so negative that lower > upper."""
    bounds = np.asarray(bounds, dtype=float)
    return bounds[:, 0] - q, bounds[:, 1] + q


def lac_score(y, probabilities):
    """s(x, y) = 1 - p_y(x) (least ambiguous set-valued classifier)."""
    probabilities = np.asarray(probabilities, dtype=float)
    return 1.0 - probabilities[np.arange(len(probabilities)), np.asarray(y, dtype=int)]


def lac_set(probabilities, q: float):
    return 1.0 - np.asarray(probabilities, dtype=float) <= q


def cumulative_mass(probabilities, penalty: float = 0.0, k_reg: int = 0) -> np.ndarray:
    """For every class, the probability mass of the classes ranked at or above it (APS), plus
    penalty * max(0, rank - k_reg) (RAPS); ranks are 1-based, ties broken by class index."""
    probabilities = np.asarray(probabilities, dtype=float)
    order = np.argsort(-probabilities, axis=1, kind="stable")
    sorted_mass = np.cumsum(np.take_along_axis(probabilities, order, axis=1), axis=1)
    ranks = np.arange(1, probabilities.shape[1] + 1)
    sorted_mass = sorted_mass + penalty * np.maximum(0, ranks - k_reg)
    out = np.empty_like(sorted_mass)
    np.put_along_axis(out, order, sorted_mass, axis=1)
    return out


def aps_score(y, probabilities, penalty: float = 0.0, k_reg: int = 0):
    mass = cumulative_mass(probabilities, penalty, k_reg)
    return mass[np.arange(len(mass)), np.asarray(y, dtype=int)]


def aps_set(probabilities, q: float, penalty: float = 0.0, k_reg: int = 0):
    return cumulative_mass(probabilities, penalty, k_reg) <= q


SCORES = {
    "absolute_residual": (absolute_residual_score, absolute_residual_interval),
    "cqr": (cqr_score, cqr_interval),
    "lac": (lac_score, lac_set),
    "aps": (aps_score, aps_set),
    "raps": (aps_score, aps_set),  # with penalty > 0 (models.classifier passes it)
}


def coverage_and_size(y, lower, upper) -> tuple[float, float]:
    """Empirical coverage of [lower, upper] on (x, y) test pairs and its mean length (0 if empty)."""
    y = np.asarray(y, dtype=float)
    covered = (lower <= y) & (y <= upper)
    with np.errstate(invalid="ignore"):
        length = np.maximum(upper - lower, 0.0)
    return float(np.mean(covered)), float(np.mean(length))
