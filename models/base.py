"""What a model is to Quorum: fitted once per trial on the training split, then held by the sites.

A site calls `scores(X, y)` on its own calibration data; the harness calls `base_predictions`
once on the test set and `evaluate` for each method's threshold. Regression models give
intervals, classifiers label sets; both are {y : s(x, y) <= threshold} for their score s.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from models.scores import SCORES, coverage_and_size


class Model(ABC):
    kind: ClassVar[str]
    task: ClassVar[str] = "regression"  # or "classification"
    score: ClassVar[str]  # a key of models.scores.SCORES (classifiers may choose per instance)
    PARAMS: ClassVar[dict[str, dict]] = {}
    #: what sites hold for methods: "scores" (conformity scores of this model), "two_sample" or
    #: "examples" (labelled rows for federated learning); protocol.methods' Method.data must match
    data: ClassVar[str] = "scores"
    n_classes: int | None = None  # classification: classes in the whole data set (set by the harness)

    def __init__(self, device: str = "auto", **params: Any) -> None:
        self.requested_device = device
        self.params = params

    @property
    def device(self) -> str:
        """Where this model computes: scikit-learn models always on the CPU."""
        return "cpu"

    #: whether `fit` trains anything (False: a model that only shapes the rows, runner.devices)
    trains: ClassVar[bool] = True

    @property
    def training_device(self) -> str:
        """Where the harness's `fit` computed: this model's device, or "none" for a model that
        fits nothing (summary.json's devices.model_training, runner.devices)."""
        return self.device if self.trains else "none"

    @abstractmethod
    def fit(self, X: np.ndarray, y: np.ndarray, alpha: float, rng: np.random.Generator) -> "Model": ...

    @abstractmethod
    def base_predictions(self, X: np.ndarray) -> np.ndarray:
        """(n,) point predictions, (n, 2) lower/upper quantiles, or (n, K) class probabilities."""

    def scores(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        score_fn, _ = SCORES[self.score]
        return score_fn(y, self.base_predictions(X), **self.score_params())

    def score_params(self) -> dict:
        return {}

    def evaluate(self, base: np.ndarray, y: np.ndarray, threshold: float) -> tuple[float, float]:
        """Test coverage and mean size of the prediction sets {y : s(x, y) <= threshold}."""
        _, set_fn = SCORES[self.score]
        if self.task == "classification":
            members = set_fn(base, threshold, **self.score_params())
            labels = np.asarray(y, dtype=int)
            return float(np.mean(members[np.arange(len(labels)), labels])), float(np.mean(members.sum(axis=1)))
        lower, upper = set_fn(base, threshold)
        return coverage_and_size(y, lower, upper)

    def for_sites(self) -> "Model":
        """Adjust for use inside a site process (e.g. one thread); returns self."""
        return self


class DataOnly(Model):
    """No model: sites hold their rows as `scores()` shapes them, and methods compute statistics
    or train their own networks from them (models.two_sample, models.examples). Nothing is fitted
    centrally and there are no central prediction sets to evaluate (`no_sets`: why)."""

    PARAMS: ClassVar[dict[str, dict]] = {}
    no_sets: ClassVar[str]
    trains = False

    def fit(self, X, y, alpha, rng):
        return self

    def base_predictions(self, X):
        return np.zeros(len(X))

    def evaluate(self, base, y, threshold):
        raise ValueError(self.no_sets)


def in_site_process() -> bool:
    return os.environ.get("QUORUM_SITE") == "1"
