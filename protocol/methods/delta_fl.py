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
sampling m of n without replacement through dp-accounting (stats.rounds_privacy). Each site books
the round's unamplified rho, computed from the sigmas and C in the request it received, unless its
policy trusts the sampling.
"""

from __future__ import annotations

import math
from typing import Any

from protocol.accounting import Spend
from protocol.methods.base import CoordinatorHalf, Method, checked
from protocol.methods.learning_rounds import MAX_ROUNDS, PHASES
from protocol.methods.tail_rounds import (CURATOR_MODEL, MECHANISM, TailCoordinator, TailSite,
                                          histogram_sensitivity2, round_rho)
from results.learning import LearningRun

COMMON = {
    "classes": {"type": "int", "min": 2},
    "rounds": {"type": "int", "min": 1, "max": MAX_ROUNDS, "default": 1000},
    "clients_per_round": {"type": "int", "min": 1, "default": 100},
    "lr": {"type": "float", "gt": 0, "default": 0.1},
    "local_steps": {"type": "int", "min": 1, "max": 100, "default": 1},
    "weight_decay": {"type": "float", "ge": 0, "default": 0.0},
    "held_out": {"type": "int", "min": 0, "default": 0},
    # the first `validation` of the held-out sites are validation clients (hyperparameters are
    # tuned on their errors, appendix B.3), the rest test clients (the errors reported)
    "validation": {"type": "int", "min": 0, "default": 0},
}
TAIL = {"type": "float", "ge": 0, "lt": 1, "default": 0.75}
PRIVATE = {
    "epsilon": {"type": "float", "gt": 0},
    "delta": {"type": "float", "ge": 0, "lt": 1, "default": 0.0},  # 0: 1 / n, n the training sites
    "clip": {"type": "float", "gt": 0, "default": 1.1},
    "noise": {"type": "str", "choices": ["central"], "default": "central"},
}
QUANTILE = {
    "loss_bound": {"type": "float", "gt": 0, "default": 1.1},
    "bins": {"type": "int", "min": 2, "max": 4096, "default": 32},
    "histogram": {"type": "str", "choices": ["flat", "hierarchical"], "default": "flat"},
    "quantile_ratio": {"type": "float", "gt": 0, "default": 0.25},
}
class TailMethod(Method):
    """What the methods of this family share (no method itself): the phases, the halves, the
    spend of each request."""

    codec = "tensors"
    phases = PHASES
    data = "examples"
    result = LearningRun
    site_noise = False  # central noise is the coordinator's; a site draws nothing that protects
    private = False

    def __init__(self, alpha: float, **params: Any) -> None:
        super().__init__(alpha, **params)
        self.tail = float(self.params.get("tail", 0.0))

    @property
    def privacy(self):
        return {"epsilon": None, "model": "no differential privacy; losses and updates in the clear"}

    def coordinator(self, sizes, rng) -> CoordinatorHalf:
        return TailCoordinator(self, sorted(sizes), rng)

    def mechanism(self, population: int) -> dict | None:
        """The round's public mechanism (None: no privacy)."""
        return None

    @classmethod
    def spend(cls, phase, body):
        if getattr(phase, "name", phase) == "setup":
            return None
        if getattr(phase, "name", phase) == "evaluate":
            return Spend("none", model="the final model's test error on this site's data")
        mechanism = body.get("mechanism") if isinstance(body, dict) else None
        if mechanism is None:
            return Spend("none", model="the loss and local update in the clear")
        mechanism = checked(MECHANISM, mechanism, "request.mechanism")
        return Spend("zcdp", rho=round_rho(mechanism), model=CURATOR_MODEL, curator=True)

    def planned_spend(self, sites):
        if not self.private:
            return Spend("none", model=self.privacy["model"])
        return Spend("zcdp", rho=round_rho(self.mechanism(max(1, sites - self.params["held_out"]))),
                     model=CURATOR_MODEL, curator=True)

    @classmethod
    def site(cls, rows, rng, site_id):
        return TailSite(rows)


class DeltaFL(TailMethod):
    """Δ-FL (algorithm 3): each round the exact p-quantile of the sampled clients' losses and the
    unweighted mean of the updates at or above it. `tail: 0` is FedAvg on the same model (every
    sampled client, equal weights: appendix B.3's clients all hold 100 points)."""

    name = "delta_fl"
    PARAMS = {**COMMON, "tail": TAIL}


class PrivateTail(TailMethod):
    """The private members of the family: clipped updates, noise planned for (epsilon, delta)."""

    private = True

    @property
    def privacy(self):
        return {"epsilon": self.params["epsilon"], "model": CURATOR_MODEL}

    def target_delta(self, population: int) -> float:
        return self.params["delta"] or 1.0 / max(population, 1)

    def mechanism(self, population: int) -> dict:
        """sigma (on the update sum) and sigma_q for the whole training to meet (epsilon, delta)
        with sampling amplification (stats.rounds_privacy.sigma_for_epsilon)."""
        from stats.rounds_privacy import sigma_for_epsilon

        p = self.params
        ratio = p.get("quantile_ratio", 0.0) if self.tail > 0 else 0.0
        m = min(p["clients_per_round"], population)
        plan = sigma_for_epsilon(p["epsilon"], self.target_delta(population), p["rounds"], p["clip"], m, population,
                                 sampling="without_replacement", quantile_ratio=ratio)
        sigma, rho_quantile = plan["sigma"], plan["rho_quantile"]
        bins, hierarchical = p.get("bins", 2), p.get("histogram", "flat") == "hierarchical"
        sigma_q = math.sqrt(histogram_sensitivity2(bins, hierarchical) / (2.0 * rho_quantile)) if ratio > 0 else 0.0
        return {"clip": float(p["clip"]), "sigma_update": float(sigma), "tail": self.tail,
                "loss_bound": float(p.get("loss_bound", 1.0)), "bins": int(bins), "hierarchical": hierarchical,
                "sigma_histogram": float(sigma_q)}


class DPDeltaFL(PrivateTail):
    """DP-Δ-FL (algorithm 4) with the trusted curator's central noise (the paper's setting)."""

    name = "dp_delta_fl"
    PARAMS = {**COMMON, "tail": TAIL, **PRIVATE, **QUANTILE}


class DPFedAvg(PrivateTail):
    """DP-FedAvg (McMahan et al. 2018; paper 001 appendix B.3's baseline): every sampled client's
    clipped update, averaged, with the curator's Gaussian noise; no quantile (tail 0)."""

    name = "dp_fedavg"
    PARAMS = {**COMMON, **PRIVATE}


