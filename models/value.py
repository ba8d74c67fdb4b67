"""No model: the score of a point is |y| itself, so a calibration threshold is a quantile of the
sites' values. This is paper 001's setting (each client holds a bounded scalar, e.g. a loss) and
makes the quantile methods usable on raw per-site values."""

from __future__ import annotations

import numpy as np

from models.base import Model


class Value(Model):
    kind = "value"
    score = "absolute_residual"
    PARAMS: dict = {}
    trains = False  # nothing is fitted

    def fit(self, X, y, alpha, rng):
        return self

    def base_predictions(self, X):
        return np.zeros(len(X))
