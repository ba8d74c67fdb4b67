"""A torch MLP classifier (softmax probabilities) with the LAC, APS or RAPS conformity score
(models.scores), trained with cross-entropy, Adam and early stopping on a held-out 10%."""

from __future__ import annotations

import numpy as np

from models.torch_nets import TRAINING_PARAMS, TorchModel, mlp


class Classifier(TorchModel):
    kind = "classifier"
    task = "classification"
    PARAMS = {**TRAINING_PARAMS,
              "hidden": {"type": "int", "min": 1, "default": 128},
              "epochs": {"type": "int", "min": 1, "default": 100},
              "lr": {"type": "float", "gt": 0, "default": 1e-3},
              "score": {"type": "str", "choices": ["lac", "aps", "raps"], "default": "lac"},
              "raps_lambda": {"type": "float", "ge": 0, "default": 0.01},
              "raps_k": {"type": "int", "min": 0, "default": 5}}

    @property
    def score(self) -> str:
        return self.params["score"]

    def score_params(self) -> dict:
        if self.params["score"] == "raps":
            return {"penalty": self.params["raps_lambda"], "k_reg": self.params["raps_k"]}
        if self.params["score"] == "aps":
            return {"penalty": 0.0, "k_reg": 0}
        return {}

    def build(self):
        return mlp(self.inputs, self.classes, self.params["hidden"], self.params["layers"],
                   self.params["dropout"]).to(self._device())

    def fit(self, X, y, alpha, rng):
        import torch.nn.functional as F

        # every class of the data set gets an output, also one the training split happens to lack
        self.inputs, self.classes = X.shape[1], max(int(np.max(y)) + 1, self.n_classes or 0)
        self.net = self.seeded_build(rng)
        self.train(X, y, lambda out, target: F.cross_entropy(out, target.long()), rng)
        return self

    def base_predictions(self, X):
        logits = self.forward(X)
        logits = logits - logits.max(axis=1, keepdims=True)
        probabilities = np.exp(logits)
        return probabilities / probabilities.sum(axis=1, keepdims=True)
