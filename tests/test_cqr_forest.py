"""models.lean_forest: the lean `apply` gives the package's own leaves and predictions, so
CQRForest's numbers do not depend on it (nor on n_jobs)."""

import pickle

import numpy as np
from quantile_forest import RandomForestQuantileRegressor

from models.cqr_forest import CQRForest
from models.lean_forest import LeanQuantileForest


def data(seed=0, n=300):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    return X, X[:, 0] + rng.standard_t(3, n)


def test_lean_apply_equals_the_packages_apply_and_predictions():
    X, y = data()
    kw = dict(n_estimators=30, min_samples_leaf=5, max_samples_leaf=None, random_state=3, n_jobs=1)
    lean, plain = LeanQuantileForest(**kw).fit(X, y), RandomForestQuantileRegressor(**kw).fit(X, y)
    Xq = data(1, 57)[0]
    assert np.array_equal(lean.apply(Xq), plain.apply(Xq))
    assert np.array_equal(lean.apply(Xq), RandomForestQuantileRegressor.apply(lean, Xq))
    for rows in (Xq, Xq[:1], Xq[:10]):
        assert np.array_equal(lean.predict(rows, quantiles=[0.05, 0.95]), plain.predict(rows, quantiles=[0.05, 0.95]))
    assert pickle.loads(pickle.dumps(lean)).apply(Xq[:3]).shape == (3, 30)


def test_cqr_forest_same_numbers_whatever_the_jobs_and_batching():
    X, y = data()
    Xq, yq = data(2, 40)
    defaults = {k: v["default"] for k, v in CQRForest.PARAMS.items()}  # what validation fills in
    fits = [CQRForest(**{**defaults, "n_estimators": 25, "min_samples_leaf": 5, "n_jobs": j}).fit(X, y, 0.1, np.random.default_rng(7))
            for j in (1, 2)]
    assert fits[0].quantile_pair == fits[1].quantile_pair
    whole = fits[0].scores(Xq, yq)
    assert np.array_equal(whole, fits[1].scores(Xq, yq))
    # a site scoring its own 10 rows gets the rows' scores of one batch call
    assert np.array_equal(whole, np.concatenate([fits[0].for_sites().scores(Xq[i:i + 10], yq[i:i + 10])
                                                 for i in range(0, 40, 10)]))
