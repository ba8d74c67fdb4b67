"""Ridge regression with the regularization chosen by cross-validation; split CP with |y - f(x)|.

Paper 000 section 5.2, method (i).
"""

from __future__ import annotations

import numpy as np

from models.base import Model


class Ridge(Model):
    kind = "ridge"
    score = "absolute_residual"
    PARAMS = {"alphas": {"type": "list", "of": {"type": "float", "gt": 0},
                         "default": [float(a) for a in np.logspace(-3, 3, 13)]}}

    def fit(self, X, y, alpha, rng):
        from sklearn.linear_model import RidgeCV

        self.regressor = RidgeCV(alphas=self.params["alphas"]).fit(X, y)
        return self

    def base_predictions(self, X):
        return self.regressor.predict(X)
