"""The quantile regression forest of models.cqr_forest with a leaner `apply` (its own module so
that the forest pickles by name and `quantile_forest` is imported only when a forest is fitted).

scikit-learn's BaseForest.apply sends every tree through joblib and sklearn's config-copying
wrapper even at n_jobs=1: about 85 microseconds per tree and call, so 0.1 s per call of a
1,000-tree forest whatever the rows. A site scores its 10-100 calibration rows in one call, so
at m = 100 sites that overhead was most of a trial. With one job this calls each fitted tree's
`tree_.apply` directly on the same validated float32 rows: the same leaves, so the same
predictions (tests/test_cqr_forest.py checks them against the package's own path).
"""

from __future__ import annotations

import numpy as np
from quantile_forest import RandomForestQuantileRegressor


class LeanQuantileForest(RandomForestQuantileRegressor):
    def apply(self, X):
        if self.n_jobs not in (None, 1):
            return super().apply(X)
        X = self._validate_X_predict(X)
        return np.array([tree.tree_.apply(X) for tree in self.estimators_]).T
