"""FML, Federated Mutual Learning (Shen et al. 2023; learning.mutual), as a learning session: the
baseline paper 002 names as the only one in its own setting (heterogeneous private models, no
public data; section 4.1).

Each site builds a private model of its own architecture (`private_models[j mod len]`, as
FedType) and a meme model of the common architecture `meme` (the same size as FedType's proxy
in our scenarios, as the paper's comparison has it). Per round the meme starts from the global
meme, both models train by mutual distillation (`private_ce_weight` and `meme_ce_weight`, the alpha
and beta of FML's local and meme losses; 0.5 each by default), and only the meme's weights are sent and averaged by n_j (FedAvg).
The private model never leaves the site.
"""

from __future__ import annotations

from learning.nets import accuracy, build_net, get_weights, parameter_count
from protocol.methods.learning_rounds import (LEARNING_PARAMS, PRIVATE_MODELS, PROXY_MODEL, LearningMethod,
                                              LearningSite, PrivateModels, architecture_from)

MUTUAL_PARAMS = {
    # alpha and beta of FML's two losses (learning.mutual.mutual_losses): each one's weight on
    # cross-entropy, the rest on distillation from the other model
    "private_ce_weight": {"type": "float", "ge": 0, "le": 1, "default": 0.5},
    "meme_ce_weight": {"type": "float", "ge": 0, "le": 1, "default": 0.5},
}


class FML(PrivateModels, LearningMethod):
    name = "fml"
    PARAMS = {**LEARNING_PARAMS, "private_models": PRIVATE_MODELS, "meme": PROXY_MODEL, **MUTUAL_PARAMS}

    def setup_request(self, index):
        request = {**super().setup_request(index), "meme": self.params["meme"],
                   **{key: self.params[key] for key in MUTUAL_PARAMS}}
        return self.private_request(request, index)

    def global_architecture(self):
        return self.params["meme"]

    @classmethod
    def site(cls, rows, rng, site_id):
        return FMLSite(rows, rng)

    @property
    def privacy(self):
        return {"epsilon": None, "model": "meme weights in the clear; private models stay at the sites"}


class FMLSite(LearningSite):
    extra_keys = ("private", "meme", *MUTUAL_PARAMS)

    def build(self, body, features):
        self.alpha, self.beta = float(body["private_ce_weight"]), float(body["meme_ce_weight"])
        if not (0 <= self.alpha <= 1 and 0 <= self.beta <= 1):
            raise ValueError(f"private_ce_weight and meme_ce_weight must lie in [0, 1], got {self.alpha} and {self.beta}")
        self.private = build_net(architecture_from(body, "private"), features, self.classes, self.seed()).to(self.device)
        self.meme = build_net(architecture_from(body, "meme"), features, self.classes, self.seed()).to(self.device)
        self.private_optimizer = self.optimizer(self.private)
        return {"private_parameters": parameter_count(self.private), "proxy_parameters": parameter_count(self.meme)}

    def train_round(self, weights):
        from learning.mutual import mutual_round

        self.load_global(self.meme, weights)  # the meme starts every round from the global meme
        received = accuracy(self.meme, self.data.X_test, self.data.y_test)
        mutual_round(self.private, self.meme, (self.private_optimizer, self.optimizer(self.meme)), self.data,
                     self.config, self.alpha, self.beta, self.rng)
        return get_weights(self.meme, self.precision), {
            "global_accuracy": received, "private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test),
            "proxy_accuracy": accuracy(self.meme, self.data.X_test, self.data.y_test)}

    def evaluate(self, weights):
        meme_accuracy = accuracy(self.meme, self.data.X_test, self.data.y_test)  # the site's own last meme
        self.load_global(self.meme, weights)
        return {"private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test),
                "proxy_accuracy": meme_accuracy, "global_accuracy": accuracy(self.meme, self.data.X_test, self.data.y_test)}
