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
    "zeta": {"type": "float", "ge": 0, "default": 10.0},  # pFedBayes's KL weight
    "pfedbayes_lr": {"type": "float", "gt": 0, "default": 0.001},  # pFedBayes's localized global step
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

    def initial_global(self, features, rng):
        """pFedBayes's global model is a distribution: the proxy's weights as means, and a rho per
        weight (learning.aggregators.with_rho); the other aggregations send the weights alone."""
        weights = super().initial_global(features, rng)
        if self.params["aggregation"] != "pfedbayes":
            return weights
        from learning.aggregators import with_rho
        from learning.nets import build_net

        return with_rho(weights, build_net(self.params["proxy"], features, self.params["classes"], seed=0))

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
        self.rho = None  # pFedBayes: q_i's rhos, from the first global distribution's on
        return {"private_parameters": parameter_count(self.private), "proxy_parameters": parameter_count(self.proxy)}

    def train_round(self, weights):
        import numpy as np
        import torch

        from learning.aggregators import RHO, BayesianProxy, anchor_of, set_parameters, split_posterior
        from learning.train import uarl_round

        aggregation = self.config.aggregation
        # pFedMe, pFedBayes: the personalised proxy (theta_i, q_i's means) persists at the site
        keeps = aggregation in ("pfedme", "pfedbayes") and self.personalised
        personal = anchor_of(self.proxy) if keeps else None
        if aggregation == "pfedbayes" and weights is not None:
            weights, global_rho = split_posterior(weights)
        self.load_global(self.proxy, weights)  # p_i^t = p_g^{t-1} (section 3.3)
        received = accuracy(self.proxy, self.data.X_test, self.data.y_test)
        anchor = anchor_of(self.proxy) if aggregation != "fedavg" else None  # FedProx's w^t, pFedMe's w_i
        if personal is not None:
            set_parameters(self.proxy, personal)
        self.personalised = True
        optimizers, posterior = (self.private_optimizer, self.optimizer(self.proxy)), None
        if aggregation == "pfedbayes":  # v_i = the global distribution; q_i's rho persists from round 1 on
            v_rho = [torch.as_tensor(np.asarray(global_rho[name], dtype=np.float32), device=self.device)
                     for name, _ in self.proxy.named_parameters()]
            rho = self.rho if self.rho is not None else v_rho
            posterior = BayesianProxy(self.proxy, rho, anchor, v_rho, self.config.zeta, len(self.data.y_train),
                                      self.config.lr, self.config.pfedbayes_lr, self.seed())
            optimizers = (*optimizers, posterior.rho_optimizer)
        stats = uarl_round(self.private, self.proxy, optimizers, self.data, self.config, self.state, self.rng,
                           anchor if aggregation != "pfedbayes" else None, posterior)
        self.penalty = stats["g"]
        metrics = {"global_accuracy": received, **stats,
                   "private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test),
                   "proxy_accuracy": accuracy(self.proxy, self.data.X_test, self.data.y_test)}
        if aggregation not in ("pfedme", "pfedbayes"):
            return get_weights(self.proxy, self.precision), metrics
        theta = anchor_of(self.proxy)  # pFedMe sends its local model w_i and keeps theta_i
        set_parameters(self.proxy, anchor if posterior is None else posterior.v_mu)  # pFedBayes: v_i's means
        sent = get_weights(self.proxy, self.precision)
        set_parameters(self.proxy, theta)
        if posterior is not None:  # and v_i's rhos; q_i's (mu_i, rho_i) stay
            self.rho = [r.detach().clone() for r in posterior.rho]
            sent.update({name + RHO: r.detach().cpu().numpy().astype(self.precision)
                         for (name, _), r in zip(self.proxy.named_parameters(), posterior.v_rho)})
        return sent, metrics

    def evaluate(self, weights):
        from learning.train import set_coverage

        proxy_accuracy = accuracy(self.proxy, self.data.X_test, self.data.y_test)  # the site's own last proxy
        coverage, size = set_coverage(self.proxy, self.data, self.config, self.penalty, self.rng)
        if self.config.aggregation == "pfedbayes" and weights is not None:  # the global distribution's means
            from learning.aggregators import split_posterior

            weights = split_posterior(weights)[0]
        self.load_global(self.proxy, weights)
        return {"private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test),
                "proxy_accuracy": proxy_accuracy, "set_coverage": coverage, "test_set_size": size,
                "global_accuracy": accuracy(self.proxy, self.data.X_test, self.data.y_test)}
