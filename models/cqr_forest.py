"""CQR with a quantile regression forest (Meinshausen 2006; `quantile-forest` package).

Paper 000 sections 5.1-5.2, method (ii), with the hyper-parameters of Romano et al. (2019):
1000 trees, min_samples_leaf=1, all features per split, every training response kept in the
leaves. The nominal quantile pair is tuned on the training data as Romano et al. do, except
that we score candidates on out-of-bag predictions instead of a held-out 10%: from a grid
running from narrower to wider than `quantiles`, keep the narrowest pair whose out-of-bag
coverage reaches coverage_factor * (1 - alpha) (the widest if none does). CQR then calibrates
whatever pair is chosen, so coverage does not depend on this choice, only the set size.
"""

from __future__ import annotations

import numpy as np

from models.base import Model


class CQRForest(Model):
    kind = "cqr_forest"
    score = "cqr"
    PARAMS = {
        "n_estimators": {"type": "int", "min": 1, "default": 1000},
        "min_samples_leaf": {"type": "int", "min": 1, "default": 1},
        "max_features": {"type": "float", "gt": 0, "le": 1, "default": 1.0},
        "quantiles": {"type": "list", "of": {"type": "float", "gt": 0, "lt": 1}, "min_len": 2,
                      "default": [0.05, 0.95]},
        "tune": {"type": "bool", "default": True},
        "tune_range": {"type": "float", "ge": 0, "lt": 0.5, "default": 0.05},
        "tune_steps": {"type": "int", "min": 2, "default": 5},
        "coverage_factor": {"type": "float", "gt": 0, "le": 1, "default": 0.85},
        "n_jobs": {"type": "int", "min": 1, "default": 2},
    }

    def fit(self, X, y, alpha, rng):
        from models.lean_forest import LeanQuantileForest

        p = self.params
        self.forest = LeanQuantileForest(
            n_estimators=p["n_estimators"], min_samples_leaf=p["min_samples_leaf"],
            max_features=p["max_features"], max_samples_leaf=None, n_jobs=p["n_jobs"],
            random_state=int(rng.integers(2**31 - 1)),
        ).fit(X, y)
        self.quantile_pair = self._tune(X, y, alpha) if p["tune"] else tuple(p["quantiles"][:2])
        return self

    def _tune(self, X, y, alpha):
        p = self.params
        lo0, hi0 = p["quantiles"][:2]
        r = p["tune_range"]
        lows = np.linspace(min(lo0 + r, 0.49), max(lo0 - r, 0.005), p["tune_steps"])
        highs = np.linspace(max(hi0 - r, 0.51), min(hi0 + r, 0.995), p["tune_steps"])
        levels = sorted({*np.round(lows, 6), *np.round(highs, 6)})
        oob = np.asarray(self.forest.predict(X, quantiles=levels, oob_score=True))
        column = {q: i for i, q in enumerate(levels)}
        target = p["coverage_factor"] * (1.0 - alpha)
        for lo, hi in zip(np.round(lows, 6), np.round(highs, 6)):
            lower, upper = oob[:, column[lo]], oob[:, column[hi]]
            if np.mean((lower <= y) & (y <= upper)) >= target:
                return float(lo), float(hi)
        return float(lows[-1]), float(highs[-1])

    def base_predictions(self, X):
        return np.asarray(self.forest.predict(X, quantiles=list(self.quantile_pair)), dtype=float)

    def for_sites(self):
        self.forest.n_jobs = 1
        return self
