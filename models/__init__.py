"""Model registry: a new model kind is one module and one line here."""

from models.base import Model
from models.classifier import Classifier
from models.cqr_forest import CQRForest
from models.cqr_net import CQRNet
from models.examples import Examples
from models.ridge import Ridge
from models.two_sample import TwoSample
from models.value import Value

MODELS: dict[str, type[Model]] = {Ridge.kind: Ridge, CQRForest.kind: CQRForest, CQRNet.kind: CQRNet,
                                  Classifier.kind: Classifier, Value.kind: Value,
                                  TwoSample.kind: TwoSample, Examples.kind: Examples}

__all__ = ["MODELS", "Model"]
