"""FedType's uncertainty-based asymmetrical reciprocity learning (paper 002, section 3), as pure
functions: the conformal models of section 3.2.2 (temperature scaling and RAPS, appendix B), the
dynamic prediction sets of eq. (6) with the calibration function g of eq. (7), the consensus
weight of eq. (8), and the forward / backward distillation losses of eqs. (1) and (3).

Sets are boolean (n, K) arrays: row j holds the labels in the set of point j.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.scores import cumulative_mass
from stats.conformal import split_conformal_threshold

#: appendix F (after Angelopoulos et al. 2020): temperature scaling by L-BFGS, lr 0.01, 10 iterations
TEMPERATURE_LR = 0.01
TEMPERATURE_ITERATIONS = 10
TEMPERATURE_START = 1.3


#: the calibration functions of section 4.2.4 / figure 3 for Delta < 0 (all give lambda for
#: Delta >= 0): g1 the paper's eq. (7), g2 = lambda fixed (table 2's FedType_{g=0.5}), g3 and g4
#: the two quadratic alternatives
CALIBRATIONS = ("g1", "g2", "g3", "g4")


def calibration_penalty(delta: float, lam: float, form: str = "g1") -> float:
    """g(Delta, lambda) of eq. (7) (form g1): lambda * Delta - Delta + lambda when the proxy's
    validation accuracy fell (Delta < 0), else lambda. For lambda < 1 a drop raises the RAPS
    penalty, so sets shrink when the proxy got worse. Section 4.2.4's alternatives for Delta < 0:
    g2 = lambda, g3 = lambda * Delta^2 + lambda, g4 = -lambda * Delta^2 - Delta + lambda."""
    if form not in CALIBRATIONS:
        raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {form!r}")
    if delta >= 0 or form == "g2":
        return lam
    if form == "g1":
        return lam * delta - delta + lam
    if form == "g3":
        return lam * delta ** 2 + lam
    return -lam * delta ** 2 - delta + lam


def top_k_sets(logits: np.ndarray, k: int) -> np.ndarray:
    """Table 2's FedType_{TopK}: the k labels of largest logit per point (ties to the lower label),
    in place of the conformal sets of eq. (6)."""
    logits = np.asarray(logits, dtype=float)
    k = min(int(k), logits.shape[1])
    order = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    sets = np.zeros(logits.shape, dtype=bool)
    np.put_along_axis(sets, order, True, axis=1)
    return sets


def fit_temperature(logits: np.ndarray, labels: np.ndarray, iterations: int = TEMPERATURE_ITERATIONS) -> float:
    """Temperature scaling (Guo et al. 2017; the 'Platt scaling' of appendix F): the T > 0 that
    minimizes the validation negative log-likelihood of softmax(logits / T), by L-BFGS from 1.3
    with learning rate 0.01 and at most `iterations` (10) iterations, as the RAPS reference code
    does; with a few hundred it reaches the minimum (bench/paper003_fig3.py asks for that)."""
    import torch

    z = torch.as_tensor(np.asarray(logits, dtype=np.float32))
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    temperature = torch.full((1,), TEMPERATURE_START, requires_grad=True)
    optimizer = torch.optim.LBFGS([temperature], lr=TEMPERATURE_LR, max_iter=iterations)

    def closure():
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(z / temperature.clamp_min(0.05), y)
        loss.backward()
        return loss

    if len(y):
        optimizer.step(closure)
    return float(temperature.detach().clamp_min(0.05))


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    z = np.asarray(logits, dtype=float) / temperature
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def raps_scores(probabilities: np.ndarray, u: np.ndarray, penalty: float, k_reg: int) -> np.ndarray:
    """The left side of eq. (6) for every label: pi(y) * u + rho(y) + penalty * (o(y) - k_reg)^+,
    rho(y) the mass of the labels ranked above y and o(y) its 1-based rank (randomized RAPS,
    Angelopoulos et al. 2020). u: one uniform per point."""
    probabilities = np.asarray(probabilities, dtype=float)
    inclusive = cumulative_mass(probabilities, penalty, k_reg)  # rho(y) + pi(y) + penalty term
    return inclusive - (1.0 - np.asarray(u, dtype=float)[:, None]) * probabilities


@dataclass(frozen=True)
class ConformalModel:
    """Cmodel of eq. (5): a network's temperature and the RAPS threshold tau fitted on D'_i."""

    temperature: float
    threshold: float
    penalty: float
    k_reg: int

    def sets(self, logits: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Eq. (6): {y : pi(y) u + rho(y) + g (o(y) - k_reg)^+ <= tau}."""
        return raps_scores(softmax(logits, self.temperature), u, self.penalty, self.k_reg) <= self.threshold


def fit_conformal(logits: np.ndarray, labels: np.ndarray, theta: float, penalty: float, k_reg: int,
                  rng: np.random.Generator) -> ConformalModel:
    """Algorithm 3 (appendix B.2): temperature scaling on the validation split, each validation
    point's score at its true label, and tau = the ceil((1 - theta)(n + 1))-th smallest score
    (+inf when the split is too small: every label is then in every set)."""
    labels = np.asarray(labels, dtype=int)
    temperature = fit_temperature(logits, labels)
    scores = raps_scores(softmax(logits, temperature), rng.uniform(size=len(labels)), penalty, k_reg)
    true_scores = scores[np.arange(len(labels)), labels]
    return ConformalModel(temperature, split_conformal_threshold(true_scores, theta), penalty, k_reg)


def consensus_weight(proxy_sets: np.ndarray, private_sets: np.ndarray) -> np.ndarray:
    """eta_j of eq. (8): |S ∩ L| / |S ∪ L| when |S| >= |L|, else |S ∩ L| / |S| (S the proxy's set,
    L the private model's). 0 where the denominator is empty."""
    S, L = np.asarray(proxy_sets, dtype=bool), np.asarray(private_sets, dtype=bool)
    both = (S & L).sum(axis=1).astype(float)
    size_s = S.sum(axis=1)
    denominator = np.where(size_s >= L.sum(axis=1), (S | L).sum(axis=1), size_s).astype(float)
    return np.divide(both, denominator, out=np.zeros_like(both), where=denominator > 0)


def symmetric_kd_loss(private_logits, proxy_logits):
    """Table 2's FedType_{sym}: the backward loss of eq. (3) replaced by traditional distillation,
    KL(p(x) || w(x)) per point, averaged, the proxy the (fixed) teacher and the private model the
    student: the mirror of eq. (1), hence "symmetrical reciprocity learning"."""
    return forward_kd_loss(proxy_logits, private_logits)


def forward_kd_loss(private_logits, proxy_logits):
    """Eq. (1) per point, averaged: KL(w(x) || p(x)), the private model the (fixed) teacher and the
    proxy the student."""
    import torch.nn.functional as F

    teacher = F.softmax(private_logits.detach(), dim=1)
    return F.kl_div(F.log_softmax(proxy_logits, dim=1), teacher, reduction="batchmean")


#: readings of eq. (3): "eq3" as printed, -sum_{k in S} log softmax_k (every label of S pulled up on
#: its own, which with large sets pulls towards uniform over S); "set_mass", -log sum_{k in S}
#: softmax_k (the mass on S raised, with no order among S's labels: the section's stated aim)
BACKWARD_LOSSES = ("eq3", "set_mass")


def backward_kd_loss(private_logits, proxy_sets, eta, form: str = "eq3"):
    """Eq. (3) per point, averaged, as a loss to minimize: -eta_j * sum_{k in S_j} log(exp(w_k) / Phi_j),
    Phi_j the sum of exp over all labels (S_j and its complement V_j): the private model is pushed
    to give the proxy's confident labels mass. form="set_mass": -eta_j * log(sum_{k in S_j}
    exp(w_k) / Phi_j) instead (0 for an empty set)."""
    import torch
    import torch.nn.functional as F

    log_p = F.log_softmax(private_logits, dim=1)
    members = torch.as_tensor(proxy_sets, dtype=log_p.dtype, device=log_p.device)
    weight = torch.as_tensor(eta, dtype=log_p.dtype, device=log_p.device)
    if form == "set_mass":
        mass = torch.logsumexp(log_p.masked_fill(members == 0, float("-inf")), dim=1)
        mass = torch.where(members.sum(dim=1) > 0, mass, torch.zeros_like(mass))
        return -(weight * mass).mean()
    if form != "eq3":
        raise ValueError(f"backward loss must be one of {BACKWARD_LOSSES}, got {form!r}")
    return -(weight * (members * log_p).sum(dim=1)).mean()
