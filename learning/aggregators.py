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

pFedBayes (Zhang et al. 2022, variational Bayesian layers) is not here: see docs/papers/002.md.
"""

from __future__ import annotations

AGGREGATIONS = ("fedavg", "fedprox", "pfedme")


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
