"""FedType (paper 002) and the two baselines it is judged against, as learning sessions
(protocol.methods.learning_rounds):

  local_only  each site trains its private model on its own data; nothing but metrics leaves it
  fedavg      every site trains the proxy architecture with cross-entropy; weights are averaged
              (its `aggregation` makes it FedProx, pFedMe or pFedBayes: AggregatedSite)
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
from protocol.methods.base import RequestError, checked
from protocol.methods.learning_rounds import (LEARNING_PARAMS, PRIVATE_MODELS, PROXY_MODEL, LearningMethod,
                                              LearningSite, PrivateModels, architecture_from, epoch_metrics)
from stats.conformal import smallest_calibration

#: the aggregation the shared network (FedType's proxy, fedavg's model) is trained and averaged with
#: (paper 002 tables 1, 4, 5; learning.aggregators), and each aggregation's options
AGGREGATION_PARAMS = {
    "aggregation": {"type": "str", "choices": list(AGGREGATIONS), "default": "fedavg"},
    "mu": {"type": "float", "ge": 0, "default": 0.01},  # FedProx's mu
    "pfedme_lam": {"type": "float", "gt": 0, "default": 15.0},  # pFedMe's lambda
    "pfedme_lr": {"type": "float", "gt": 0, "default": 0.01},  # pFedMe's eta (the local model's step)
    "zeta": {"type": "float", "ge": 0, "default": 10.0},  # pFedBayes's KL weight
    "pfedbayes_lr": {"type": "float", "gt": 0, "default": 0.001},  # pFedBayes's localized global step
}
#: the aggregations whose sites keep a personalised model (pFedMe's theta_i, pFedBayes's q_i) and send another
PERSONALISED = ("pfedme", "pfedbayes")
#: what a site accepts for them in a setup request, whatever the coordinator sends: AGGREGATION_PARAMS'
#: choices and bounds, every number finite (AggregatedSite.check_aggregation)
AGGREGATION_REQUEST = {"type": "map", "fields": {
    key: {**{k: v for k, v in spec.items() if k != "default"}, **({"finite": True} if spec["type"] == "float" else {})}
    for key, spec in AGGREGATION_PARAMS.items()}}

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
    **AGGREGATION_PARAMS,
}


class AggregatedMethod:
    """Mixin for a LearningMethod whose global network (global_architecture) is trained and
    averaged under the `aggregation` parameter (AGGREGATION_PARAMS, learning.aggregators)."""

    def initial_global(self, features, rng):
        """pFedBayes's global model is a distribution: the network's weights as means, and a rho per
        weight (learning.aggregators.with_rho); the other aggregations send the weights alone."""
        weights = super().initial_global(features, rng)
        if self.params["aggregation"] != "pfedbayes":
            return weights
        from learning.aggregators import with_rho

        return with_rho(weights, build_net(self.global_architecture(), features, self.params["classes"], seed=0))


class AggregatedSite:
    """Mixin for a LearningSite: the site's side of its config's aggregation for the network whose
    weights travel (FedType's proxy, fedavg's model), one way for every method that has one:
    `start_aggregation` in build, `receive` before the local update, `send` after it."""

    @staticmethod
    def check_aggregation(body) -> None:
        """The setup request's aggregation options (AGGREGATION_REQUEST), checked before anything is
        built: RequestError naming the field (an unknown aggregation, a negative, NaN or infinite
        mu, lambda, zeta or step), not a failure in a later round."""
        checked(AGGREGATION_REQUEST, {key: body[key] for key in AGGREGATION_PARAMS}, "setup request")

    def start_aggregation(self) -> None:
        self.personalised = False  # pFedMe: theta_i starts from the first global network it is sent
        self.rho = None  # pFedBayes: q_i's rhos, from the first global distribution's on

    def receive(self, net, weights):
        """Load the global weights into `net` (p_i^t = p_g^{t-1}, paper 002 section 3.3) and set up
        the local update: returns (the test accuracy of the received global network, the anchor
        (FedProx's w^t, pFedMe's w_i; None for FedAvg), the BayesianProxy (pFedBayes; else None)).
        pFedMe and pFedBayes put the site's personalised network (theta_i, q_i's means) back
        into `net` after scoring the global one."""
        import numpy as np
        import torch

        from learning.aggregators import BayesianProxy, anchor_of, set_parameters, split_posterior

        aggregation = self.config.aggregation
        personal = anchor_of(net) if aggregation in PERSONALISED and self.personalised else None
        if aggregation == "pfedbayes" and weights is not None:
            weights, global_rho = split_posterior(weights)
            shapes = {name: tuple(p.shape) for name, p in net.named_parameters()}
            got = {name: tuple(np.shape(r)) for name, r in global_rho.items()}
            if got != shapes:
                raise RequestError(f"pfedbayes: the global distribution needs one rho per parameter, of its shape: "
                                   f"expected {shapes}, got {got}")
        self.load_global(net, weights)
        received = accuracy(net, self.data.X_test, self.data.y_test)
        anchor = anchor_of(net) if aggregation != "fedavg" else None
        if personal is not None:
            set_parameters(net, personal)
        self.personalised = True
        posterior = None
        if aggregation == "pfedbayes":  # v_i = the global distribution; q_i's rho persists from round 1 on
            v_rho = [torch.from_numpy(np.array(global_rho[name], dtype=np.float32)).to(self.device)  # a copy: the wire's
                     # arrays are read-only views (torch warns on those)
                     for name, _ in net.named_parameters()]
            rho = self.rho if self.rho is not None else v_rho
            posterior = BayesianProxy(net, rho, anchor, v_rho, self.config.zeta, len(self.data.y_train),
                                      self.config.lr, self.config.pfedbayes_lr, self.seed())
        return received, anchor, posterior

    def send(self, net, anchor, posterior) -> dict:
        """The weights the site sends after its local update: `net`'s own (FedAvg, FedProx),
        pFedMe's local model w_i (theta_i stays in `net`), pFedBayes's v_i, means and rhos
        (q_i's (mu_i, rho_i) stay)."""
        from learning.aggregators import RHO, anchor_of, set_parameters

        if self.config.aggregation not in PERSONALISED:
            return finite_update(get_weights(net, self.precision))
        theta = anchor_of(net)
        set_parameters(net, anchor if posterior is None else posterior.v_mu)
        sent = get_weights(net, self.precision)
        set_parameters(net, theta)
        if posterior is not None:
            self.rho = [r.detach().clone() for r in posterior.rho]
            sent.update({name + RHO: r.detach().cpu().numpy().astype(self.precision)
                         for (name, _), r in zip(net.named_parameters(), posterior.v_rho)})
        return finite_update(sent)

    def global_means(self, weights):
        """The final global network's weights (pFedBayes: the distribution's means)."""
        if self.config.aggregation == "pfedbayes" and weights is not None:
            from learning.aggregators import split_posterior

            return split_posterior(weights)[0]
        return weights


def finite_update(sent: dict) -> dict:
    """What a site sends after its local update, or RequestError when a tensor is NaN or infinite
    (a learning rate, weight or global distribution that made the update diverge): named at the
    site, and nothing sent that the coordinator would have to refuse."""
    import numpy as np

    bad = sorted(name for name, value in sent.items() if not np.all(np.isfinite(value)))
    if bad:
        raise RequestError(f"the local update diverged under this request (NaN or infinite {', '.join(bad[:3])}"
                           f"{', ...' if len(bad) > 3 else ''}): nothing sent")
    return sent


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


class FedAvg(AggregatedMethod, LearningMethod):
    """Every site trains the proxy architecture with cross-entropy; the server averages. Its
    `aggregation` (AGGREGATION_PARAMS) makes it FedProx, pFedMe or pFedBayes instead, with the
    same site machinery as FedType's proxy (AggregatedSite): paper 002 table 5's homogeneous row."""

    name = "fedavg"
    PARAMS = {**LEARNING_PARAMS, "proxy": PROXY_MODEL, **AGGREGATION_PARAMS}
    primary = "global_accuracy"

    def setup_request(self, index):
        return {**super().setup_request(index), "proxy": self.params["proxy"],
                **{key: self.params[key] for key in AGGREGATION_PARAMS}}

    def global_architecture(self):
        return self.params["proxy"]

    @classmethod
    def site(cls, rows, rng, site_id):
        return FedAvgSite(rows, rng)


class FedAvgSite(AggregatedSite, LearningSite):
    """The site's model is the proxy architecture; it starts each round from the global weights
    (pFedMe, pFedBayes: from its personalised model, the global one its anchor / prior)."""

    extra_keys = ("proxy", *AGGREGATION_PARAMS)

    def build(self, body, features):
        self.check_aggregation(body)
        self.model = build_net(architecture_from(body, "proxy"), features, self.classes, self.seed()).to(self.device)
        self.start_aggregation()
        return {"private_parameters": parameter_count(self.model), "proxy_parameters": parameter_count(self.model)}

    def train_round(self, weights):
        from learning.train import supervised_round

        received, anchor, posterior = self.receive(self.model, weights)
        optimizer = self.optimizer(self.model)
        supervised_round(self.model, optimizer if posterior is None else (optimizer, posterior.rho_optimizer),
                         self.data, self.config, self.rng, anchor, posterior)
        return self.send(self.model, anchor, posterior), {
            "global_accuracy": received, "private_accuracy": accuracy(self.model, self.data.X_test, self.data.y_test)}

    def evaluate(self, weights):
        """The final global model's accuracy; under pFedMe / pFedBayes also the site's personalised
        model's (theta_i, q_i's means), as private_accuracy."""
        personal = ({"private_accuracy": accuracy(self.model, self.data.X_test, self.data.y_test)}
                    if self.config.aggregation in PERSONALISED else {})
        self.load_global(self.model, self.global_means(weights))
        return {"global_accuracy": accuracy(self.model, self.data.X_test, self.data.y_test), **personal}


class FedType(AggregatedMethod, PrivateModels, LearningMethod):
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


class FedTypeSite(AggregatedSite, LearningSite):
    extra_keys = ("private", "proxy", *UARL_PARAMS)

    def build(self, body, features):
        from learning.train import UARLState

        if body["backward_loss"] not in BACKWARD_LOSSES:
            raise RequestError(f"backward_loss must be one of {BACKWARD_LOSSES}, got {body['backward_loss']!r}")
        self.check_aggregation(body)
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
        self.start_aggregation()
        return {"private_parameters": parameter_count(self.private), "proxy_parameters": parameter_count(self.proxy)}

    def train_round(self, weights):
        from learning.train import uarl_round

        received, anchor, posterior = self.receive(self.proxy, weights)
        optimizers = (self.private_optimizer, self.optimizer(self.proxy))
        if posterior is not None:
            optimizers = (*optimizers, posterior.rho_optimizer)
        epochs = []  # per local epoch: the proxy's |S| and test accuracy (table 7; epochs.csv)
        stats = uarl_round(self.private, self.proxy, optimizers, self.data, self.config, self.state, self.rng,
                           anchor, posterior, epochs)
        self.penalty = stats["g"]
        metrics = {"global_accuracy": received, **stats,
                   "private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test),
                   "proxy_accuracy": accuracy(self.proxy, self.data.X_test, self.data.y_test),
                   **epoch_metrics(epochs)}
        return self.send(self.proxy, anchor, posterior), metrics

    def evaluate(self, weights):
        from learning.train import set_coverage

        proxy_accuracy = accuracy(self.proxy, self.data.X_test, self.data.y_test)  # the site's own last proxy
        coverage, size = set_coverage(self.proxy, self.data, self.config, self.penalty, self.rng)
        self.load_global(self.proxy, self.global_means(weights))
        return {"private_accuracy": accuracy(self.private, self.data.X_test, self.data.y_test),
                "proxy_accuracy": proxy_accuracy, "set_coverage": coverage, "test_set_size": size,
                "global_accuracy": accuracy(self.proxy, self.data.X_test, self.data.y_test)}
