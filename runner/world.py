"""The simulated world of one trial: the data, its split, the model, and what each site holds.

This is the harness, not the protocol: it plays the data holders' side of reality (paper 000,
section 3.1: the predictor is given in advance, here trained on the training split) and keeps
the test set for evaluation. The coordinator never sees any of it; sites get their shard and
the model through sites.storage, and score the shard themselves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from data.sources import SOURCES
from data.split import partition, site_sizes, split_indices, standardize
from models import MODELS, Model
from protocol.randomness import trial_rng


@dataclass
class TrialWorld:
    trial: int
    model: Model
    shards: dict[str, tuple[np.ndarray, np.ndarray]]  # site id -> (X_cal_j, y_cal_j)
    y_test: np.ndarray
    test_base: np.ndarray  # the model's base predictions on the test set
    train: tuple[np.ndarray, np.ndarray] = field(repr=False, default=None)

    @cached_property
    def public(self) -> "PublicFacts":
        """Facts a scenario may use as public parameters (never from the calibration data)."""
        return PublicFacts(self)

    @cached_property
    def calibration_scores(self) -> np.ndarray:
        """Every site's scores pooled: the harness's omniscient view, for reports only."""
        return np.concatenate([self.model.scores(X, y) for X, y in self.shards.values()])


class PublicFacts(Mapping):
    """score_min / score_max: the extreme conformity scores of the model on its own training
    split, known to whoever trained it. Computed on first use."""

    KEYS = ("score_min", "score_max")

    def __init__(self, world: TrialWorld) -> None:
        self._world, self._values = world, None

    def __getitem__(self, key):
        if key not in self.KEYS:
            raise KeyError(key)
        if self._values is None:
            scores = self._world.model.scores(*self._world.train)
            self._values = {"score_min": float(np.min(scores)), "score_max": float(np.max(scores))}
        return self._values[key]

    def __iter__(self):
        return iter(self.KEYS)

    def __len__(self):
        return len(self.KEYS)


def site_ids(count: int) -> list[str]:
    width = max(3, len(str(count - 1)))
    return [f"site-{j:0{width}d}" for j in range(count)]


def build_trial(scenario: dict, trial: int) -> TrialWorld:
    seed, data = scenario["seed"], scenario["data"]
    source = SOURCES[data["source"]]
    params = {key: value for key, value in data.items() if key != "source"}
    dataset = source.load(params, trial_rng(seed, trial, "data"))
    split = scenario["split"]
    train, cal, test = split_indices(len(dataset.y), split["train"], split["calibration"], split["test"],
                                     trial_rng(seed, trial, "split"))
    if dataset.X_test is not None:
        X_test, y_test = dataset.X_test, dataset.y_test
    else:
        X_test, y_test = dataset.X[test], dataset.y[test]
    X_train, X_cal, X_test = standardize(dataset.X[train], dataset.X[cal], X_test)
    spec = scenario["model"]
    model = MODELS[spec["kind"]](**spec["params"]).fit(X_train, dataset.y[train], scenario["alpha"],
                                                       trial_rng(seed, trial, "model"))
    ids = site_ids(scenario["sites"]["count"])
    sizes = site_sizes(scenario["sites"]["sizes"], len(ids), len(cal))
    parts = partition(np.arange(len(cal)), sizes, trial_rng(seed, trial, "partition"))
    shards = {site: (X_cal[part], dataset.y[cal][part]) for site, part in zip(ids, parts)}
    test_base = model.base_predictions(X_test)
    return TrialWorld(trial, model.for_sites(), shards, y_test, test_base, (X_train, dataset.y[train]))
