"""Distributionally robust federated learning (paper 001, section 5 and appendix B) over the live
runtime: Δ-FL (algorithm 3), DP-Δ-FL (algorithm 4) and DP-FedAvg, with FedAvg as Δ-FL at p = 0,
on appendix B.3's model (a linear softmax model with intercept; learning.tail_fl holds the math).

Phases (the learning table, protocol.methods.learning_rounds.PHASES): `setup` (every site: the
class count; it answers with its feature count), `round` 0 .. T - 1 (the coordinator samples m of
the n training sites without replacement with its seeded Generator and sends each the global
weights; each computes its loss f_i(w) and one local update), `evaluate` (the held-out sites
score the final model: their misclassification errors give figure 3's mean and 90th percentile).
The last `held_out` sites in site order are test clients: never sampled, only evaluated.

Privacy (`dp_delta_fl`, `dp_fedavg`). Each sampled site clips its update to norm C (algorithm 4
line 10) and bins its loss, clipped to [0, B], into b bins. `noise: central` is the paper's own
setting: the coordinator is a trusted curator that sums the clipped updates and the loss
histogram and adds Gaussian noise itself (a site sends its clipped update and its loss bin in
the clear to it, so a site takes part only where its policy says `curator: allow`, and the
trust table says so). The noise scales come from the requested (epsilon, delta) over all T
rounds: each round is rho-zCDP (claim 13 corrected: rho = C^2 / (2 sigma^2) for the update sum,
plus the histogram's S^2 / (2 sigma_q^2), the quantile's share r times the update's), amplified by
sampling m of n without replacement through dp-accounting (protocol.rounds_privacy). Each site books
the round's unamplified rho, computed from the sigmas and C in the request it received, unless its
policy trusts the sampling.
"""

from __future__ import annotations

import math
from typing import Any

from protocol.accounting import Spend, request_key
from protocol.methods.base import CoordinatorHalf, Method, RequestError, checked
from protocol.methods.learning_rounds import MAX_ROUNDS
from protocol.methods.secure_sum import SECAGG_SPEC
from protocol.methods.tail_rounds import (CURATOR_MODEL, MECHANISM, TailCoordinator, TailSite,
                                          histogram_sensitivity2, round_rho)
from protocol.methods.tail_secagg import (DISTRIBUTED, DISTRIBUTED_MODEL, DistributedCoordinator, DistributedSite,
                                          asks_question, distributed_release_shape, distributed_round_rhos, distributed_spend,
                                          plan_distributed, tail_phase_table)
from results.robust_training import RobustTraining

COMMON = {
    "classes": {"type": "int", "min": 2},
    "rounds": {"type": "int", "min": 1, "max": MAX_ROUNDS, "default": 1000},
    "clients_per_round": {"type": "int", "min": 1, "default": 100},
    "lr": {"type": "float", "gt": 0, "default": 0.1},
    "local_steps": {"type": "int", "min": 1, "max": 100, "default": 1},
    "weight_decay": {"type": "float", "ge": 0, "default": 0.0},
    "held_out": {"type": "int", "min": 0, "default": 0},
    # each round m of the n training sites without replacement (algorithm 3 line 2), or each site
    # independently with probability m / n (poisson: what the paper's amplification bound [27] is for)
    "sampling": {"type": "str", "choices": ["without_replacement", "poisson"], "default": "without_replacement"},
    # the first `validation` of the held-out sites are validation clients (hyperparameters are
    # tuned on their errors, appendix B.3), the rest test clients (the errors reported)
    "validation": {"type": "int", "min": 0, "default": 0},
}
TAIL = {"type": "float", "ge": 0, "lt": 1, "default": 0.75}
PRIVATE = {
    "epsilon": {"type": "float", "gt": 0},
    "delta": {"type": "float", "ge": 0, "lt": 1, "default": 0.0},  # 0: 1 / n, n the training sites
    "clip": {"type": "float", "gt": 0, "default": 1.1},
    # central: the coordinator is a trusted curator that adds the noise (paper 001's setting; the
    # sites' policy must say curator: allow); distributed: each site adds discrete Gaussian noise
    # to its clipped, rounded update and the sums go through SecAgg+ (Quorum's threat model)
    "noise": {"type": "str", "choices": ["central", "distributed"], "default": "distributed"},
    "secagg": SECAGG_SPEC,
    "dropouts": {"type": "int", "min": 0, "default": 0},  # per round, the noise planned for m - dropouts
    "granularity": {"type": "float", "gt": 0, "default": 1024.0},  # C maps to this many integer units
}
QUANTILE = {
    "loss_bound": {"type": "float", "gt": 0, "default": 1.1},
    "bins": {"type": "int", "min": 2, "max": 4096, "default": 32},
    "histogram": {"type": "str", "choices": ["flat", "hierarchical"], "default": "flat"},
    "quantile_ratio": {"type": "float", "gt": 0, "default": 0.25},
}


def central_mechanism_spend(mechanism: dict, method: str) -> Spend:
    """A round to a trusted curator: its rho (claim 13 corrected, per record), its training's
    sampling as the request states it (the curator's word: it is trusted with the clear updates),
    the release marked as going in the clear to the curator."""
    if mechanism["sample"] > mechanism["population"] and mechanism["sampling"] != "poisson":
        raise RequestError(f"a sample of {mechanism['sample']} from a population of {mechanism['population']}")
    return Spend("zcdp", rho=round_rho(mechanism, records=True), model=CURATOR_MODEL, curator=True,
                 sampling=mechanism["sampling"], sample=mechanism["sample"], population=mechanism["population"],
                 rounds=mechanism["rounds"], key=request_key(method, "training", mechanism))


class TailMethod(Method):
    """What the methods of this family share (no method itself): the phases, the halves, the
    spend of each request."""

    codec = "tensors_secagg"
    phases = tail_phase_table(MAX_ROUNDS)
    data = "examples"
    result = RobustTraining
    site_noise = False  # Δ-FL's sites draw nothing that protects a release
    private = False
    sums: tuple[str, ...] = ()  # the secure sums a round of the method may hold (Δ-FL: none)

    def __init__(self, alpha: float, **params: Any) -> None:
        super().__init__(alpha, **params)
        self.tail = float(self.params.get("tail", 0.0))
        self.secagg = {"graph": "sparse", "degree": 0, "threshold": 0, "mode": "active",
                       **(self.params.get("secagg") or {})}

    @property
    def privacy(self):
        return {"epsilon": None, "model": "no differential privacy; losses and updates in the clear"}

    @property
    def distributed(self) -> bool:
        return self.private and self.params["noise"] == "distributed"

    def coordinator(self, sizes, rng) -> CoordinatorHalf:
        return (DistributedCoordinator if self.distributed else TailCoordinator)(self, sorted(sizes), rng)

    def mechanism(self, population: int) -> dict | None:
        """The round's public mechanism (None: no privacy)."""
        return None

    @staticmethod
    def round_cost(mechanism: dict) -> float:
        """One round's rho: claim 13 corrected (central), or its two DDG sums' (distributed)."""
        if mechanism.get("noise") == "distributed":
            return sum(distributed_round_rhos(mechanism))
        return round_rho(mechanism)

    @classmethod
    def spend(cls, phase, body):
        name = str(getattr(phase, "name", phase))
        if name == "setup":
            return None
        if name == "evaluate":
            return Spend("none", model="the final model's test error on this site's data")
        if name != "round":  # a secure sum's phase: its advertise books the sum, the others nothing new
            if not asks_question(name):
                return None
            return distributed_spend(name, body, cls.name, cls.sums)
        mechanism = body.get("mechanism") if isinstance(body, dict) else None
        if mechanism is None:
            if cls.private:  # a private method's round always states its noise
                raise RequestError(f"{cls.name}: a round with no mechanism would release the update in the clear")
            return Spend("none", model="the loss and local update in the clear")
        return central_mechanism_spend(checked(MECHANISM, mechanism, "request.mechanism"), cls.name)

    @classmethod
    def release_shape(cls, phase, body):
        name = str(getattr(phase, "name", phase))
        return body if name in ("setup", "round", "evaluate") else distributed_release_shape(phase, body)

    def planned_spend(self, sites):
        if not self.private:
            return Spend("none", model=self.privacy["model"])
        mechanism = self.mechanism(max(1, sites - self.params["held_out"]))
        if self.distributed:
            rho_loss, rho_update = distributed_round_rhos(mechanism)
            return Spend("zcdp", rho=max(rho_loss, rho_update), model=DISTRIBUTED_MODEL,
                         contributors=mechanism["inputs"])
        return central_mechanism_spend(mechanism, self.name)

    @classmethod
    def site(cls, rows, rng, site_id):
        half = TailSite(rows, rng, site_id, cls.name, cls.sums, sums_half=DistributedSite)
        half.digest = cls.request_digest
        return half


class DeltaFL(TailMethod):
    """Δ-FL (algorithm 3): each round the exact p-quantile of the sampled clients' losses and the
    unweighted mean of the updates at or above it. `tail: 0` is FedAvg on the same model (every
    sampled client, equal weights: appendix B.3's clients all hold 100 points)."""

    name = "delta_fl"
    PARAMS = {**COMMON, "tail": TAIL}


class PrivateTail(TailMethod):
    """The private members of the family: clipped updates, noise planned for (epsilon, delta) over
    all rounds, amplified by the sampling (protocol.rounds_privacy)."""

    private = True
    site_noise = True  # the random rounding of a site's update under distributed noise

    @property
    def privacy(self):
        return {"epsilon": self.params["epsilon"],
                "model": DISTRIBUTED_MODEL if self.distributed else CURATOR_MODEL}

    def target_delta(self, population: int) -> float:
        return self.params["delta"] or 1.0 / max(population, 1)

    def mechanism(self, population: int, features: int = 20) -> dict:
        """The noise for the whole training to meet (epsilon, delta) with sampling amplification
        (protocol.rounds_privacy.sigma_for_epsilon): central sigma (on the update sum) and sigma_q, or
        the distributed mechanism meeting the same per-round rho (tail_secagg.plan_distributed)."""
        from protocol.rounds_privacy import sigma_for_epsilon

        p = self.params
        ratio = p.get("quantile_ratio", 0.0) if self.tail > 0 else 0.0
        m = min(p["clients_per_round"], population)
        plan = sigma_for_epsilon(p["epsilon"], self.target_delta(population), p["rounds"], p["clip"], m, population,
                                 sampling=p["sampling"], quantile_ratio=ratio)
        bins, hierarchical = p.get("bins", 2), p.get("histogram", "flat") == "hierarchical"
        common = {"sampling": p["sampling"], "sample": m, "population": population, "rounds": p["rounds"]}
        if self.distributed:
            return plan_distributed(plan["rho_update"], plan["rho_quantile"], clip=p["clip"], tail=self.tail,
                                    loss_bound=p.get("loss_bound", 1.0), bins=bins, hierarchical=hierarchical,
                                    dimension=(features + 1) * p["classes"], sample=m, population=population,
                                    rounds=p["rounds"], dropouts=p["dropouts"], granularity=p["granularity"],
                                    sampling=p["sampling"])
        sigma_q = (math.sqrt(histogram_sensitivity2(bins, hierarchical) / (2.0 * plan["rho_quantile"]))
                   if ratio > 0 else 0.0)
        return {"clip": float(p["clip"]), "sigma_update": float(plan["sigma"]), "tail": self.tail,
                "loss_bound": float(p.get("loss_bound", 1.0)), "bins": int(bins), "hierarchical": hierarchical,
                "sigma_histogram": float(sigma_q), **common}


class DPDeltaFL(PrivateTail):
    """DP-Δ-FL (algorithm 4): the quantile of the losses by algorithm 1 / 2, the tail's clipped
    updates with noise, central (the paper's trusted curator) or distributed (SecAgg+)."""

    name = "dp_delta_fl"
    sums = ("loss", "update")
    PARAMS = {**COMMON, "tail": TAIL, **PRIVATE, **QUANTILE}


class DPFedAvg(PrivateTail):
    """DP-FedAvg (McMahan et al. 2018; paper 001 appendix B.3's baseline): every sampled client's
    clipped update, averaged, with noise (central or distributed); no quantile (tail 0)."""

    name = "dp_fedavg"
    sums = ("average",)
    PARAMS = {**COMMON, **PRIVATE}


