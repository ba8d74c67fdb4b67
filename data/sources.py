"""Data sources a scenario can name under `data.source`; each declares its parameters."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from data.synthetic import GENERATORS


@dataclass
class Dataset:
    X: np.ndarray
    y: np.ndarray
    X_test: np.ndarray | None = None  # a separately drawn test set, when the source has one
    y_test: np.ndarray | None = None


class Synthetic:
    PARAMS = {
        "generator": {"type": "str", "choices": sorted(GENERATORS)},
        "n": {"type": "int", "min": 2},
        "n_test": {"type": "int", "min": 1, "default": None},
    }

    @staticmethod
    def load(params: dict, rng: np.random.Generator) -> Dataset:
        generate = GENERATORS[params["generator"]]
        X, y = generate(params["n"], rng)
        if params.get("n_test"):
            X_test, y_test = generate(params["n_test"], rng)
            return Dataset(X, y, X_test, y_test)
        return Dataset(X, y)


SOURCES = {"synthetic": Synthetic}
