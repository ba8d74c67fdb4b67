"""Server aggregation methods that FedType's proxies may be trained and averaged with (paper 002,
section 3.3 and tables 1, 4, 5: "any existing data-free aggregation approach"), as the small
pieces each adds to a site's local update. FedAvg (McMahan et al. 2017) adds nothing: the server
averages the proxies (protocol.methods.learning_rounds.weighted_average).

  fedprox  Li et al. 2020, "Federated optimization in heterogeneous networks" (MLSys), eq. (2):
           the site minimizes h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2, w^t the global model it
           was sent; the server averages as FedAvg does.
  pfedme   T Dinh et al. 2020, "Personalized federated learning with Moreau envelopes" (NeurIPS),
           eqs. (2)-(3) and algorithm 1: the site keeps a personalised model theta_i, the
           approximate minimizer of f_i(theta) + lambda/2 ||theta - w_i||^2 (the Moreau envelope
           of f_i at w_i), and moves its local copy of the global model by
           w_i <- w_i - eta * lambda * (w_i - theta_i) (line 8); it sends w_i, and the server
           averages them (beta = 1 of line 11: w <- (1 - beta) w + beta * mean_i w_i).
           In FedType the personalised model is the proxy p_i (what is reported as the proxy),
           w_i its anchor.

  pfedbayes Zhang et al. 2022, "Personalized federated learning via variational Bayesian
           inference" (ICML), eqs. (5)-(8) and algorithm 1: the site keeps a personalised mean-field
           Gaussian posterior q_i(w) = N(mu_i, sigma_i^2) over the proxy's weights, sigma =
           log(1 + exp(rho)), and a localized copy v_i = (mu_v, rho_v) of the global distribution.
           Per mini-batch it takes a step on the personalised objective
               E_{q_i}[loss(w)] + zeta / n_i * KL(q_i || v_i)
           (the paper's -sum_n log p(D_i | w) + zeta KL, divided by n_i as our losses are batch
           means), the expectation by the reparameterisation trick w = mu + sigma * eps, then a
           step on zeta * KL(q_i || v_i) over v_i (q_i fixed); it sends v_i's (mu, rho), and the
           server averages them as FedAvg does (beta = 1 of the paper's server update).
           Simplifications, said plainly: one weight sample per step; the closed-form KL between
           diagonal Gaussians (`gaussian_kl`) instead of a sampled one; both steps by Adam at the
           scenario's learning rate (q_i) and pfedbayes_lr (v_i), one v_i step per mini-batch;
           q_i's predictions (the proxy reported and used for the conformal sets of UARL) are
           those of its mean mu_i, not an average over samples; every sigma starts at SIGMA0
           (rho = log(exp(sigma) - 1), `rho_of`).
"""

from __future__ import annotations

import math

AGGREGATIONS = ("fedavg", "fedprox", "pfedme", "pfedbayes")

#: pFedBayes: every weight's starting standard deviation (their code's rho offset of -3)
SIGMA0 = math.log1p(math.exp(-3.0))
#: pFedBayes: the suffix of the rho tensors that travel beside the means (parameter name + RHO)
RHO = ".rho"


def anchor_of(net) -> list:
    """A detached copy of `net`'s parameters (the w^t of FedProx, the w_i of pFedMe)."""
    return [p.detach().clone() for p in net.parameters()]


def proximal_term(net, anchor, weight: float):
    """weight / 2 * ||theta - anchor||^2 over all parameters: FedProx's mu/2 ||w - w^t||^2 (eq. 2
    of Li et al.) with weight = mu, pFedMe's lambda/2 ||theta - w_i||^2 (eq. 3 of T Dinh et al.)
    with weight = lambda."""
    return 0.5 * weight * sum(((p - a) ** 2).sum() for p, a in zip(net.parameters(), anchor))


def moreau_step(anchor, net, lr: float, lam: float) -> None:
    """pFedMe's local update of algorithm 1, line 8, in place: w_i <- w_i - eta lambda (w_i - theta_i),
    theta_i the personalised model `net` after its inner step."""
    import torch

    with torch.no_grad():
        for a, p in zip(anchor, net.parameters()):
            a.sub_(lr * lam * (a - p.detach()))


def set_parameters(net, anchor) -> None:
    """Copy the anchor into `net`'s parameters (to send w_i, or to start theta_i from it)."""
    import torch

    with torch.no_grad():
        for p, a in zip(net.parameters(), anchor):
            p.copy_(a)


def rho_of(sigma: float) -> float:
    """The rho with softplus(rho) = log(1 + exp(rho)) = sigma: rho = log(exp(sigma) - 1)."""
    return math.log(math.expm1(sigma))


def gaussian_kl(mu_q, rho_q, mu_p, rho_p):
    """KL(N(mu_q, sigma_q^2) || N(mu_p, sigma_p^2)) summed over independent coordinates, sigma =
    softplus(rho), in closed form: sum log(sigma_p / sigma_q) + (sigma_q^2 + (mu_q - mu_p)^2) /
    (2 sigma_p^2) - 1/2 (the KL term of pFedBayes's eq. 5 for mean-field Gaussians)."""
    import torch.nn.functional as F

    s_q, s_p = F.softplus(rho_q), F.softplus(rho_p)
    return (s_p.log() - s_q.log() + (s_q ** 2 + (mu_q - mu_p) ** 2) / (2 * s_p ** 2) - 0.5).sum()


def split_posterior(weights: dict) -> tuple[dict, dict]:
    """A global model of pFedBayes as (the means, a state dict; the rhos by parameter name)."""
    mu = {k: v for k, v in weights.items() if not k.endswith(RHO)}
    return mu, {k[:-len(RHO)]: v for k, v in weights.items() if k.endswith(RHO)}


def with_rho(weights: dict, net, sigma: float = SIGMA0) -> dict:
    """A state dict with a rho tensor for each of `net`'s parameters, all sigma (the first global
    distribution of pFedBayes)."""
    import numpy as np

    return {**weights, **{name + RHO: np.full(tuple(p.shape), rho_of(sigma), dtype=np.float32)
                          for name, p in net.named_parameters()}}


class BayesianProxy:
    """pFedBayes at a site (algorithm 1 of Zhang et al. 2022): the personalised posterior q_i, its
    means the proxy `net`'s own parameters and its rhos `rho` (trained by `rho_optimizer`), and
    the localized global distribution v_i = (v_mu, v_rho) moved by `global_step`."""

    def __init__(self, net, rho, v_mu, v_rho, zeta: float, n: int, lr: float, global_lr: float,
                 seed: int) -> None:
        import torch

        self.net, self.zeta, self.n = net, zeta, max(1, n)
        self.rho = [r.detach().clone().requires_grad_(True) for r in rho]
        self.v_mu = [m.detach().clone().requires_grad_(True) for m in v_mu]
        self.v_rho = [r.detach().clone().requires_grad_(True) for r in v_rho]
        self.rho_optimizer = torch.optim.Adam(self.rho, lr=lr)  # the means' optimizer is the proxy's own
        self.v_optimizer = torch.optim.Adam(self.v_mu + self.v_rho, lr=global_lr)
        self.generator = torch.Generator(device=next(net.parameters()).device).manual_seed(seed)

    def logits(self, x):
        """The proxy's logits under one sample w = mu + softplus(rho) * eps (reparameterisation)."""
        import torch
        import torch.nn.functional as F
        from torch.func import functional_call

        noise = lambda mu: torch.randn(mu.shape, generator=self.generator, device=mu.device)  # noqa: E731
        sample = {name: mu + F.softplus(rho) * noise(mu)
                  for (name, mu), rho in zip(self.net.named_parameters(), self.rho)}
        return functional_call(self.net, sample, (x,))

    def kl(self):
        """KL(q_i || v_i), v_i held fixed (the personalised step's regulariser)."""
        return sum(gaussian_kl(m, r, vm.detach(), vr.detach())
                   for m, r, vm, vr in zip(self.net.parameters(), self.rho, self.v_mu, self.v_rho))

    def personal_penalty(self):
        """zeta / n_i * KL(q_i || v_i): the personalised objective's prior term per training point."""
        return self.zeta / self.n * self.kl()

    def global_step(self) -> None:
        """One step on zeta * KL(q_i || v_i) over v_i, q_i fixed (the localized global update)."""
        self.v_optimizer.zero_grad()
        pairs = zip(self.net.parameters(), self.rho, self.v_mu, self.v_rho)
        loss = self.zeta * sum(gaussian_kl(m.detach(), r.detach(), vm, vr) for m, r, vm, vr in pairs)
        loss.backward()
        self.v_optimizer.step()
