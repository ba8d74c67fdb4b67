"""FedType (paper 002) and the two baselines it is judged against, as learning sessions
(protocol.methods.learning_rounds):

  local_only  each site trains its private model on its own data; nothing but metrics leaves it
  fedavg      every site trains the proxy architecture with cross-entropy; weights are averaged
  fedtype     each site trains a private model of its own architecture and a small proxy of a
              common one by UARL (algorithm 1); only the proxy's weights travel and are averaged

Private architectures are the scenario's list `private_models`, site j (in site-id order) taking
entry j mod its length. The private model is built and kept inside the site half; no answer of
any phase carries it (tests/test_fedtype.py checks the bytes on the wire).
"""

from __future__ import annotations


from learning.nets import accuracy, build_net, get_weights, parameter_count
from learning.aggregators import AGGREGATIONS
from learning.uarl import BACKWARD_LOSSES, CALIBRATIONS
from protocol.methods.base import RequestError
from protocol.methods.learning_rounds import (LEARNING_PARAMS, PRIVATE_MODELS, PROXY_MODEL, LearningMethod,
                                              LearningSite, PrivateModels, architecture_from)
from stats.conformal import smallest_calibration

UARL_PARAMS = {
    "lam": {"type": "float", "ge": 0, "default": 0.5},  # lambda of eq. (7)
    "k_reg": {"type": "int", "min": 0, "default": 5},  # kappa_reg of eq. (6)
    "theta": {"type": "float", "gt": 0, "lt": 1, "default": 0.1},  # miscoverage of eq. (4)
    # eq. (3) as printed, or the mass on S (learning.uarl.BACKWARD_LOSSES)
    "backward_loss": {"type": "str", "choices": list(BACKWARD_LOSSES), "default": "eq3"},
    # the ablations of table 2 and figure 3 (learning.train.TrainingConfig), the paper's method by default
    "backward_kd": {"type": "str", "choices": ["uncertainty", "symmetric"], "default": "uncertainty"},
    "label_sets": {"type": "str", "choices": ["conformal", "topk"], "default": "conformal"},
    "top_k": {"type": "int", "min": 1, "default": 3},
    "consensus": {"type": "str", "choices": ["eta", "one"], "default": "eta"},
    "calibration": {"type": "str", "choices": list(CALIBRATIONS), "default": "g1"},
    # the aggregation the proxies are trained and averaged with (tables 1, 4, 5; learning.aggregators)
    "aggregation": {"type": "str", "choices": list(AGGREGATIONS), "default": "fedavg"},
    "mu": {"type": "float", "ge": 0, "default": 0.01},  # FedProx's mu
    "pfedme_lam": {"type": "float", "gt": 0, "default": 15.0},  # pFedMe's lambda
    "pfedme_lr": {"type": "float", "gt": 0, "default": 0.01},  # pFedMe's eta (the local model's step)
}


class LocalOnly(PrivateModels, LearningMethod):
    name = "local_only"
    PARAMS = {**LEARNING_PARAMS, "private_models": PRIVATE_MODELS}
    uses_weights = False

    def setup_request(self, index):
        return self.private_request(super().setup_request(index), index)

    @classmethod
    def site(cls, rows, rng, site_id):
        return LocalOnlySite(rows, rng)

    @property
    def privacy(self):
        return {"epsilon": None, "model": "nothing but metrics leaves a site"}


class LocalOnlySite(LearningSite):
    extra_keys = ("private",)

    def build(self, body, features):
        self.private = build_net(architecture_from(body, "private"), features, self.classes, self.seed()).to(self.device)
        self.private_optimizer = self.optimizer(self.private)
        return {"private_parameters": parameter_count(self.private)}

    def train_round(self, weights):
        from learning.train import supervised_round

        if weights is not None:
            raise RequestError("local_only sites take no weights")
        supervised_round(self.private, self.private_optimizer, self.data, self.config, self.rng)
        return {}, {"private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test)}

    def evaluate(self, weights):
        return {"private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test)}


class FedAvg(LearningMethod):
    name = "fedavg"
    PARAMS = {**LEARNING_PARAMS, "proxy": PROXY_MODEL}
    primary = "global_accuracy"

    def setup_request(self, index):
        return {**super().setup_request(index), "proxy": self.params["proxy"]}

    def global_architecture(self):
        return self.params["proxy"]

    @classmethod
    def site(cls, rows, rng, site_id):
        return FedAvgSite(rows, rng)


class FedAvgSite(LearningSite):
    """The site's model is the proxy architecture; it starts each round from the global weights."""

    extra_keys = ("proxy",)

    def build(self, body, features):
        self.model = build_net(architecture_from(body, "proxy"), features, self.classes, self.seed()).to(self.device)
        return {"private_parameters": parameter_count(self.model), "proxy_parameters": parameter_count(self.model)}

    def train_round(self, weights):
        from learning.train import supervised_round

        self.load_global(self.model, weights)
        received = accuracy(self.model, self.data.X_test, self.data.y_test)
        supervised_round(self.model, self.optimizer(self.model), self.data, self.config, self.rng)
        return get_weights(self.model, self.precision), {
            "global_accuracy": received, "private_accuracy": accuracy(self.model, self.data.X_test, self.data.y_test)}

    def evaluate(self, weights):
        self.load_global(self.model, weights)
        return {"global_accuracy": accuracy(self.model, self.data.X_test, self.data.y_test)}


class FedType(PrivateModels, LearningMethod):
    name = "fedtype"
    PARAMS = {**LEARNING_PARAMS, "private_models": PRIVATE_MODELS, "proxy": PROXY_MODEL, **UARL_PARAMS}

    def setup_request(self, index):
        request = {**super().setup_request(index), "proxy": self.params["proxy"],
                   **{key: self.params[key] for key in UARL_PARAMS}}
        return self.private_request(request, index)

    def global_architecture(self):
        return self.params["proxy"]

    @classmethod
    def site(cls, rows, rng, site_id):
        return FedTypeSite(rows, rng)

    @property
    def privacy(self):
        return {"epsilon": None, "model": "proxy weights in the clear; private models stay at the sites"}


class FedTypeSite(LearningSite):
    extra_keys = ("private", "proxy", *UARL_PARAMS)

    def build(self, body, features):
        from learning.train import UARLState

        if body["backward_loss"] not in BACKWARD_LOSSES:
            raise RequestError(f"backward_loss must be one of {BACKWARD_LOSSES}, got {body['backward_loss']!r}")
        needed = smallest_calibration(self.config.theta)
        if len(self.data.y_val) < needed:
            raise RequestError(
                f"the conformal split holds {len(self.data.y_val)} points; theta = {self.config.theta} needs at least "
                f"{needed} (else tau = +inf, every set of eq. 6 holds all {self.classes} labels and the backward "
                f"distillation of eq. 3 carries nothing from the proxy); give this site more data or raise theta")
        self.private = build_net(architecture_from(body, "private"), features, self.classes, self.seed()).to(self.device)
        self.proxy = build_net(architecture_from(body, "proxy"), features, self.classes, self.seed()).to(self.device)
        self.private_optimizer = self.optimizer(self.private)
        self.state = UARLState()
        self.penalty = self.config.lam
        self.personalised = False  # pFedMe: theta_i starts from the first global proxy it is sent
        return {"private_parameters": parameter_count(self.private), "proxy_parameters": parameter_count(self.proxy)}

    def train_round(self, weights):
        from learning.aggregators import anchor_of, set_parameters
        from learning.train import uarl_round

        aggregation = self.config.aggregation
        # pFedMe: the personalised proxy theta_i persists at the site (from the first global model on)
        personal = anchor_of(self.proxy) if aggregation == "pfedme" and self.personalised else None
        self.load_global(self.proxy, weights)  # p_i^t = p_g^{t-1} (section 3.3)
        received = accuracy(self.proxy, self.data.X_test, self.data.y_test)
        anchor = anchor_of(self.proxy) if aggregation != "fedavg" else None  # FedProx's w^t, pFedMe's w_i
        if personal is not None:
            set_parameters(self.proxy, personal)
        self.personalised = True
        stats = uarl_round(self.private, self.proxy, (self.private_optimizer, self.optimizer(self.proxy)),
                           self.data, self.config, self.state, self.rng, anchor)
        self.penalty = stats["g"]
        metrics = {"global_accuracy": received, **stats,
                   "private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test),
                   "proxy_accuracy": accuracy(self.proxy, self.data.X_test, self.data.y_test)}
        if aggregation != "pfedme":
            return get_weights(self.proxy, self.precision), metrics
        theta = anchor_of(self.proxy)  # pFedMe sends its local model w_i and keeps theta_i
        set_parameters(self.proxy, anchor)
        sent = get_weights(self.proxy, self.precision)
        set_parameters(self.proxy, theta)
        return sent, metrics

    def evaluate(self, weights):
        from learning.train import set_coverage

        proxy_accuracy = accuracy(self.proxy, self.data.X_test, self.data.y_test)  # the site's own last proxy
        coverage, size = set_coverage(self.proxy, self.data, self.config, self.penalty, self.rng)
        self.load_global(self.proxy, weights)
        return {"private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test),
                "proxy_accuracy": proxy_accuracy, "set_coverage": coverage, "test_set_size": size,
                "global_accuracy": accuracy(self.proxy, self.data.X_test, self.data.y_test)}
