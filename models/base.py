"""What a model is to Quorum: fitted once per trial on the training split, then held by the sites.

A site calls `scores(X, y)` on its own calibration data; the harness calls `base_predictions`
once on the test set and `interval` for each method's threshold.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import numpy as np

from models.scores import SCORES


class Model(ABC):
    kind: ClassVar[str]
    score: ClassVar[str]  # a key of models.scores.SCORES
    PARAMS: ClassVar[dict[str, dict]] = {}
    device: str = "cpu"

    def __init__(self, **params: Any) -> None:
        self.params = params

    @abstractmethod
    def fit(self, X: np.ndarray, y: np.ndarray, alpha: float, rng: np.random.Generator) -> "Model": ...

    @abstractmethod
    def base_predictions(self, X: np.ndarray) -> np.ndarray:
        """(n,) point predictions or (n, 2) lower/upper quantile predictions."""

    def scores(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        score_fn, _ = SCORES[self.score]
        return score_fn(y, self.base_predictions(X))

    def interval(self, base: np.ndarray, threshold: float):
        _, set_fn = SCORES[self.score]
        return set_fn(base, threshold)

    def for_sites(self) -> "Model":
        """Adjust for use inside a site process (e.g. one thread); returns self."""
        return self
