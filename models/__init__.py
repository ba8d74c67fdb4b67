"""Model registry: a model kind is a class named by an import path. Quorum's own are listed here (a
new one is one module and one line); another package's are entry points in the group
`quorum.models` or import paths in a scenario's model.kind (specs.plugins)."""

from models.base import Model
from specs.plugins import Registry, params_problem, subclass_problem

TASKS = ("regression", "classification", "two_sample")
DATA_KINDS = ("scores", "two_sample", "examples")


def check_model(cls: type) -> str | None:
    """What keeps `cls` from being a model kind (None: nothing): the interface of models.base.Model."""
    problem = subclass_problem(cls, Model) or params_problem(cls.PARAMS)
    if problem:
        return problem
    if cls.task not in TASKS:
        return f"task must be one of {TASKS}, got {cls.task!r}"
    if cls.data not in DATA_KINDS:
        return f"data must be one of {DATA_KINDS}, got {cls.data!r}"
    return None


MODELS = Registry("model kind", "quorum.models", {
    "ridge": "models.ridge:Ridge", "cqr_forest": "models.cqr_forest:CQRForest", "cqr_net": "models.cqr_net:CQRNet",
    "classifier": "models.classifier:Classifier", "value": "models.value:Value",
    "two_sample": "models.two_sample:TwoSample", "examples": "models.examples:Examples",
}, key="kind", check=check_model)

__all__ = ["MODELS", "Model", "check_model"]
