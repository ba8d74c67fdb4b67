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
from typing import Any

import numpy as np

from data.heterogeneity import assign_sites, shift_response, site_shifts, treatment_group, treatment_shifts
from data.sources import SOURCES
from data.split import site_sizes, split_indices, standardize
from models import MODELS, Model
from protocol.accounting import record_ids
from stats.randomness import trial_rng


@dataclass(frozen=True)
class WorldSpec:
    """What every trial's world is made from, one value: the harness builds it, and so does a site
    host away from the harness (`run.py site --scenario`, a Ray actor) for its own sites."""

    seed: int
    alpha: float
    data: Mapping[str, Any]  # `source` and the source's own fields (data.sources)
    split: Mapping[str, float]  # train, calibration and test fractions
    sites: int  # how many sites: site-000 ... (`site_ids`)
    sizes: Any  # "equal", or each site's n_j (data.split.site_sizes)
    heterogeneity: Mapping[str, Any]  # `kind` and its own fields (data.heterogeneity)
    model: Mapping[str, Any]  # `kind`, `device`, `params` (models)

    @classmethod
    def of(cls, scenario: Mapping[str, Any]) -> "WorldSpec":
        """The world of a validated scenario (its data, split, sites, model, seed and alpha)."""
        sites = scenario["sites"]
        return cls(scenario["seed"], scenario["alpha"], scenario["data"], scenario["split"], sites["count"],
                   sites["sizes"], sites["heterogeneity"], scenario["model"])

    @property
    def site_ids(self) -> list[str]:
        return site_ids(self.sites)


@dataclass
class TrialWorld:
    trial: int
    model: Model
    shards: dict[str, tuple[np.ndarray, np.ndarray]]  # site id -> (X_cal_j, y_cal_j)
    y_test: np.ndarray
    test_base: np.ndarray  # the model's base predictions on the test set
    train: tuple[np.ndarray, np.ndarray] = field(repr=False, default=None)
    task: str = "regression"
    shifts: np.ndarray | None = None  # per-site alpha_j of location/scale heterogeneity
    X_test: np.ndarray | None = field(repr=False, default=None)
    heterogeneity: str = "none"  # the kind of sites.heterogeneity (location / scale shifts use `shifts`)
    #: site id -> each calibration row's record identity (protocol.accounting.record_ids of the raw
    #: row, before standardisation or shifts): what a site's privacy budget is keyed by
    record_ids: dict[str, np.ndarray] = field(repr=False, default_factory=dict)

    @cached_property
    def public(self) -> "PublicFacts":
        """Facts a scenario may use as public parameters (never from the calibration data)."""
        return PublicFacts(self)

    @cached_property
    def site_scores(self) -> dict[str, np.ndarray]:
        """Every site's conformity scores, computed here in one batch: the harness's omniscient
        view, for reports only (each site computes its own for the protocol)."""
        sites = list(self.shards)
        X = np.concatenate([self.shards[s][0] for s in sites])
        y = np.concatenate([self.shards[s][1] for s in sites])
        scores = self.model.scores(X, y) if len(y) else np.zeros(0)
        bounds = np.cumsum([0] + [len(self.shards[s][1]) for s in sites])
        return {s: scores[bounds[i]:bounds[i + 1]] for i, s in enumerate(sites)}

    @cached_property
    def calibration_scores(self) -> np.ndarray:
        """Every site's scores pooled (reports only)."""
        return np.concatenate(list(self.site_scores.values()))


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


def build_trial(spec: WorldSpec, trial: int) -> TrialWorld:
    """Trial `trial`'s world: a pure function of the spec and the trial (every draw from the seed)."""
    seed, data = spec.seed, spec.data
    source = SOURCES[data["source"]]
    params = {key: value for key, value in data.items() if key != "source"}
    dataset = source.load(params, trial_rng(seed, trial, "data"))
    split = spec.split
    train, cal, test = split_indices(len(dataset.y), split["train"], split["calibration"], split["test"],
                                     trial_rng(seed, trial, "split"))
    if dataset.X_test is not None:
        X_test, y_test = dataset.X_test, dataset.y_test
    else:
        X_test, y_test = dataset.X[test], dataset.y[test]
    # who the rows are, before any transform (a source that knows better says so: a CSV's whole row)
    cal_ids = record_ids(dataset.X[cal], dataset.y[cal]) if dataset.record_ids is None else dataset.record_ids[cal]
    X_train, X_cal, X_test = standardize(dataset.X[train], dataset.X[cal], X_test)
    y_train, y_cal = dataset.y[train], dataset.y[cal]
    if dataset.scale_response:  # paper 000's reference code: y / mean |y_train|
        scale = float(np.mean(np.abs(y_train))) or 1.0
        y_train, y_cal, y_test = y_train / scale, y_cal / scale, y_test / scale
    model = MODELS[spec.model["kind"]](device=spec.model["device"], **spec.model["params"])
    if spec.model.get("dp_sgd"):
        model.dp_sgd = dict(spec.model["dp_sgd"])  # trained with DP-SGD by whoever builds the world (models.dp_sgd)
    if dataset.task == "classification":
        labels = dataset.y if dataset.y_test is None else np.concatenate([dataset.y, dataset.y_test])
        model.n_classes = int(np.max(labels)) + 1
    model.fit(X_train, y_train, spec.alpha, trial_rng(seed, trial, "model"))
    ids = spec.site_ids
    sizes = site_sizes(spec.sizes, len(ids), len(cal))
    hetero = spec.heterogeneity
    parts = assign_sites(hetero, X_cal, y_cal, sizes, trial_rng(seed, trial, "partition"), dataset.exact_groups)
    shifts = site_shifts(hetero, len(ids), trial_rng(seed, trial, "heterogeneity"))
    betas = treatment_shifts(hetero, len(ids), trial_rng(seed, trial, "treatment"))
    shards = {site: (X_cal[part], shift_response(hetero["kind"], y_cal[part], alpha)
                     + beta * treatment_group(X_cal[part]))
              for site, part, alpha, beta in zip(ids, parts, shifts, betas)}
    records = {site: cal_ids[part] for site, part in zip(ids, parts)}
    test_base = model.base_predictions(X_test)
    return TrialWorld(trial, model.for_sites(), shards, y_test, test_base, (X_train, y_train),
                      task=model.task if model.task == "two_sample" else dataset.task, shifts=shifts,
                      X_test=X_test, heterogeneity=hetero["kind"], record_ids=records)
