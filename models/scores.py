"""Conformity scores and the prediction sets they induce (paper 000, section 5).

A model's base prediction is an array: shape (n,) for a point regressor, (n, 2) for a pair of
quantile regressors (lower, upper). Scores and sets are pure functions of it.
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


SCORES = {
    "absolute_residual": (absolute_residual_score, absolute_residual_interval),
    "cqr": (cqr_score, cqr_interval),
}


def coverage_and_size(y, lower, upper) -> tuple[float, float]:
    """Empirical coverage of [lower, upper] on (x, y) test pairs and its mean length (0 if empty)."""
    y = np.asarray(y, dtype=float)
    covered = (lower <= y) & (y <= upper)
    with np.errstate(invalid="ignore"):
        length = np.maximum(upper - lower, 0.0)
    return float(np.mean(covered)), float(np.mean(length))
