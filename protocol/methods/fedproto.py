"""FedProto (Tan et al. 2022; learning.prototypes) as a learning session: the second baseline
paper 002 compares FedType with (section 4.1). Sites send class prototypes, not weights.

Each site builds its private model (`private_models[j mod len]`, as FedType) with one more hidden
layer of `embedding` units, the common width of f_i(x) that prototypes need. Round t: the site
trains on eq. (7), cross-entropy + `lam` times the distance of its embeddings to the global
prototypes it was sent, then sends its prototypes (eq. 3) and class counts |D_ij|; the server
averages them per class (eq. 6) and sends the global prototypes with the next round. Reported:
the private model's own (classifier) accuracy, and the accuracy of eq. (4)'s nearest-prototype
rule as `prototype_accuracy`.

What leaves a site: (classes x embedding) prototypes and its class counts (as the method
requires: eq. 6 weighs by them), never a weight.
"""

from __future__ import annotations

import numpy as np

from learning.nets import accuracy, build_net, parameter_count
from protocol.methods.base import RequestError
from protocol.methods.learning_rounds import (LEARNING_PARAMS, PRIVATE_MODELS, LearningMethod, LearningSite,
                                              PrivateModels, architecture_from)

PROTOTYPE_PARAMS = {
    "embedding": {"type": "int", "min": 1, "default": 64},  # the width of f_i(x), common to all sites
    "lam": {"type": "float", "ge": 0, "default": 1.0},  # lambda of eq. (7); 1 is the paper's best (its fig. 6)
}


class FedProto(PrivateModels, LearningMethod):
    name = "fedproto"
    PARAMS = {**LEARNING_PARAMS, "private_models": PRIVATE_MODELS, **PROTOTYPE_PARAMS}

    def setup_request(self, index):
        request = {**super().setup_request(index), "embedding": self.params["embedding"],
                   "prototype_weight": self.params["lam"]}
        return self.private_request(request, index)

    def initial_global(self, features, rng):
        """Round 0 sends no prototype yet: zeros with every class count 0 (no class known)."""
        classes, width = self.params["classes"], self.params["embedding"]
        return {"prototypes": np.zeros((classes, width), np.float32), "counts": np.zeros(classes, np.float32)}

    def aggregate(self, tensors, sizes):
        from learning.prototypes import global_prototypes

        prototypes, counts = global_prototypes([t["prototypes"] for t in tensors], [t["counts"] for t in tensors])
        return {"prototypes": prototypes.astype(np.float32), "counts": counts.astype(np.float32)}

    @classmethod
    def site(cls, rows, rng, site_id):
        return FedProtoSite(rows, rng)

    @property
    def privacy(self):
        return {"epsilon": None, "model": "class prototypes and class counts in the clear; no weight leaves a site"}


class FedProtoSite(LearningSite):
    extra_keys = ("private", "embedding", "prototype_weight")

    def build(self, body, features):
        from learning.prototypes import with_embedding

        self.width, self.lam = int(body["embedding"]), float(body["prototype_weight"])
        if self.width < 1 or self.lam < 0:
            raise ValueError(f"embedding must be >= 1 and lam >= 0, got {self.width} and {self.lam}")
        spec = with_embedding(architecture_from(body, "private"), self.width)
        self.private = build_net(spec, features, self.classes, self.seed()).to(self.device)
        self.private_optimizer = self.optimizer(self.private)
        return {"private_parameters": parameter_count(self.private)}

    def _global(self, weights):
        """The global prototypes as tensors on the site's device, and which classes have one."""
        import torch

        if weights is None or set(weights) != {"prototypes", "counts"}:
            raise RequestError("fedproto rounds need the global prototypes and counts")
        prototypes, counts = np.asarray(weights["prototypes"], np.float32), np.asarray(weights["counts"])
        if prototypes.shape != (self.classes, self.width) or counts.shape != (self.classes,):
            raise RequestError(f"prototypes must be ({self.classes}, {self.width}) with {self.classes} counts, got "
                               f"{prototypes.shape} and {counts.shape}")
        return (torch.tensor(prototypes, device=self.device),
                torch.as_tensor(counts > 0, device=self.device))

    def train_round(self, weights):
        from learning.prototypes import embeddings, local_prototypes, nearest_prototype_accuracy, prototype_round

        prototypes, known = self._global(weights)
        received = nearest_prototype_accuracy(self.private, self.data.X_test, self.data.y_test, prototypes, known)
        prototype_round(self.private, self.private_optimizer, self.data, self.config, prototypes, known, self.lam,
                        self.rng)
        mine, counts = local_prototypes(embeddings(self.private, self.data.X_train), self.data.y_train.cpu().numpy(),
                                        self.classes)
        metrics = {"private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test)}
        if not np.isnan(received):  # round 0: no global prototype yet
            metrics["global_accuracy"] = received
        return {"prototypes": mine.astype(self.precision), "counts": counts.astype(np.float32)}, metrics

    def evaluate(self, weights):
        from learning.prototypes import nearest_prototype_accuracy

        prototypes, known = self._global(weights)
        metrics = {"private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test)}
        by_prototype = nearest_prototype_accuracy(self.private, self.data.X_test, self.data.y_test, prototypes, known)
        if not np.isnan(by_prototype):
            metrics["global_accuracy"] = by_prototype
        return metrics
