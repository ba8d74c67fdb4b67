"""Data sources a scenario can name under `data.source`; each declares its parameters.

  synthetic  the papers' generators (data.synthetic)
  real       paper 000's five regression sets: bio, bike, community, star, concrete
  csv        any CSV file with a header and a target column
  sklearn    scikit-learn's bundled sets: diabetes (regression); digits, iris, wine,
             breast_cancer (classification)
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from data.real import DATASETS, DatasetMissing, csv_columns, default_directory, load_csv, load_real, missing_files
from data.synthetic import CLASSIFICATION_GENERATORS, GENERATORS
from specs.plugins import Registry, params_problem, subclass_problem

SKLEARN_SETS = {"diabetes": "regression", "digits": "classification", "iris": "classification",
                "wine": "classification", "breast_cancer": "classification"}


@dataclass
class Dataset:
    X: np.ndarray
    y: np.ndarray
    task: str = "regression"  # or "classification" (y holds class labels 0..K-1)
    X_test: np.ndarray | None = None  # a separately drawn test set, when the source has one
    y_test: np.ndarray | None = None
    scale_response: bool = False  # divide y by mean |y_train| (paper 000's reference code does)
    #: each row's identity where the source knows it better than the row's values do (a CSV's
    #: whole row, whatever features a study picks); None: protocol.accounting.record_ids of (X, y)
    record_ids: np.ndarray | None = None
    #: two-sample data whose sites must hold exactly half their n_j of each group
    #: (paper004_shift's exact_groups; data.split.group_partition)
    exact_groups: bool = False


class DataSource(ABC):
    """Where a scenario's rows come from: `name` (the scenario's data.source), PARAMS (the specs
    of its other data fields) and static functions of the validated fields."""

    name: ClassVar[str]
    PARAMS: ClassVar[dict[str, dict]] = {}
    #: whether every trial draws from the same records (a file: each trial re-splits the same
    #: people, so a site's budget composes over the trials) or makes new ones (a generator)
    fixed_records: ClassVar[bool] = True

    @staticmethod
    @abstractmethod
    def task(params) -> str:
        """"regression" or "classification"."""

    @staticmethod
    @abstractmethod
    def rows(params) -> int:
        """How many rows load() gives (the scenario checks the sites' calibration points against it)."""

    @staticmethod
    @abstractmethod
    def load(params: dict, rng: np.random.Generator) -> Dataset:
        """The data set, drawn with `rng` where it is random."""

    @staticmethod
    def check(params) -> tuple[str, str, object] | None:
        """(field, expectation, got) for fields that are wrong together, or None."""
        return None


class Synthetic(DataSource):
    name = "synthetic"
    fixed_records = False
    PARAMS = {
        "generator": {"type": "str", "choices": sorted(GENERATORS)},
        "n": {"type": "int", "min": 2},
        "n_test": {"type": "int", "min": 1, "default": None},
        # keyword arguments of the generator (e.g. paper004_shift's delta, paper004_gamma's shape)
        "options": {"type": "any", "default": {}},
    }

    @staticmethod
    def task(params) -> str:
        return "classification" if params["generator"] in CLASSIFICATION_GENERATORS else "regression"

    @staticmethod
    def check(params) -> tuple[str, str, object] | None:
        options = params.get("options") or {}
        if not isinstance(options, dict):
            return ("data.options", "a mapping of generator arguments", options)
        arguments = dict(list(inspect.signature(GENERATORS[params["generator"]]).parameters.items())[2:])
        allowed = list(arguments)
        for key, value in options.items():
            if key not in allowed:
                return (f"data.options.{key}", f"an argument of {params['generator']} ({', '.join(allowed) or 'none'})",
                        value)
            if isinstance(arguments[key].default, bool):  # a switch, e.g. paper004_shift's exact_groups
                if not isinstance(value, bool):
                    return (f"data.options.{key}", "true or false", value)
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                return (f"data.options.{key}", "a number", value)
        return None

    @staticmethod
    def rows(params) -> int:
        return params["n"]

    @staticmethod
    def load(params: dict, rng: np.random.Generator) -> Dataset:
        generate = GENERATORS[params["generator"]]
        options = params.get("options") or {}
        X, y = generate(params["n"], rng, **options)
        task = Synthetic.task(params)
        exact_groups = bool(options.get("exact_groups", False))
        if params.get("n_test"):
            X_test, y_test = generate(params["n_test"], rng, **options)
            return Dataset(X, y, task, X_test=X_test, y_test=y_test, exact_groups=exact_groups)
        return Dataset(X, y, task, exact_groups=exact_groups)


class Real(DataSource):
    name = "real"
    PARAMS = {
        "name": {"type": "str", "choices": list(DATASETS)},
        "dir": {"type": "str", "default": ""},  # default: ../shared/datasets or $QUORUM_DATASETS
        "scale_response": {"type": "bool", "default": True},
    }

    @staticmethod
    def task(params) -> str:
        return "regression"

    @staticmethod
    def check(params) -> tuple[str, str, object] | None:
        directory = Path(params["dir"]) if params["dir"] else default_directory()
        missing = missing_files(params["name"], directory)
        if missing:
            return ("data.dir", f"a directory holding {', '.join(missing)} (default ../shared/datasets or "
                    f"$QUORUM_DATASETS)", str(directory))
        return None

    @staticmethod
    def rows(params) -> int:
        return len(load_real(params["name"], params["dir"] or None)[1])

    @staticmethod
    def load(params: dict, rng: np.random.Generator) -> Dataset:
        X, y, ids = load_real(params["name"], params["dir"] or None, with_ids=True)
        return Dataset(X, y, scale_response=params["scale_response"], record_ids=ids)


class CSV(DataSource):
    name = "csv"
    PARAMS = {
        "path": {"type": "str"},
        "target": {"type": "str"},
        "features": {"type": "list", "of": {"type": "str"}, "default": []},
        "task": {"type": "str", "choices": ["regression", "classification"], "default": "regression"},
        "scale_response": {"type": "bool", "default": False},
    }

    @staticmethod
    def task(params) -> str:
        return params["task"]

    @staticmethod
    def check(params) -> tuple[str, str, object] | None:
        try:
            columns = csv_columns(params["path"])
        except DatasetMissing:
            return ("data.path", "an existing CSV file", params["path"])
        for field, names in (("data.target", [params["target"]]), ("data.features", params["features"])):
            unknown = [n for n in names if n not in columns]
            if unknown:
                return (field, f"column(s) of {params['path']} (it has: {', '.join(columns)})", unknown)
        return None

    @staticmethod
    def rows(params) -> int:
        return len(CSV.load(params, None).y)

    @staticmethod
    def load(params: dict, rng: np.random.Generator) -> Dataset:
        X, y, ids = load_csv(params["path"], params["target"], params["features"] or None,
                             classification=params["task"] == "classification", with_ids=True)
        return Dataset(X, y, params["task"], scale_response=params["scale_response"], record_ids=ids)


class SKLearn(DataSource):
    name = "sklearn"
    PARAMS = {"name": {"type": "str", "choices": sorted(SKLEARN_SETS)}}

    @staticmethod
    def task(params) -> str:
        return SKLEARN_SETS[params["name"]]

    @staticmethod
    def rows(params) -> int:
        return len(SKLearn.load(params, None).y)

    @staticmethod
    def load(params: dict, rng: np.random.Generator) -> Dataset:
        from sklearn import datasets

        bunch = getattr(datasets, f"load_{params['name']}")()
        return Dataset(np.asarray(bunch.data, dtype=float), np.asarray(bunch.target, dtype=float),
                       SKLEARN_SETS[params["name"]])




def check_source(cls: type) -> str | None:
    """What keeps `cls` from being a data source (None: nothing)."""
    return subclass_problem(cls, DataSource) or params_problem(cls.PARAMS)


#: Quorum's own data sources; others register under the entry-point group quorum.data (specs.plugins)
SOURCES = Registry("data source", "quorum.data", {
    "synthetic": "data.sources:Synthetic", "real": "data.sources:Real", "csv": "data.sources:CSV",
    "sklearn": "data.sources:SKLearn"}, key="name", check=check_source)
