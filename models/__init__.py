"""Model registry: a new model kind is one module and one line here."""

from models.base import Model
from models.cqr_forest import CQRForest
from models.ridge import Ridge

MODELS: dict[str, type[Model]] = {Ridge.kind: Ridge, CQRForest.kind: CQRForest}

__all__ = ["MODELS", "Model"]
