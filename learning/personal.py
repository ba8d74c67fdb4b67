"""A personalised head for FedType (beyond paper 002; protocol.methods.fedtype_personal): the site
predicts with a mixture of its two networks' class probabilities,

    q(y | x) = w * softmax(w_i(x))_y + (1 - w) * softmax(p_i(x))_y,

w_i the private model and p_i the site's proxy (the global proxy after the site's last local
round: federated knowledge, personalised). w is the site's own, chosen on its conformal
(validation) split D'_i by the mean log-likelihood over a grid, so a site whose proxy does not
help keeps w = 1, its private model alone. Nothing here leaves the site.
"""

from __future__ import annotations

import numpy as np

#: the weights w the site chooses among (w = 1: the private model alone)
MIXTURE_GRID = tuple(np.round(np.linspace(0.0, 1.0, 11), 2))


def label_prior(labels: np.ndarray, classes: int) -> np.ndarray:
    """The site's label distribution by Laplace's rule of succession, (n_k + 1) / (n + K): every
    class keeps some mass, so a class the site never saw is unlikely but not impossible."""
    counts = np.bincount(np.asarray(labels, dtype=int), minlength=classes).astype(float)
    return (counts + 1.0) / (counts.sum() + classes)


def shift_by_prior(net, prior: np.ndarray):
    """Make `net` output z(x) + log prior at this site (a forward hook: nothing in its weights).

    Label skew across sites is label shift, p_i(x | y) = p(x | y) with p_i(y) the site's own: a
    softmax over z(x) + log p_i(y) trained by cross-entropy on the site's labels is the
    logit-adjusted loss of Menon et al. 2021 (Long-tail learning via logit adjustment, ICLR,
    section 4, tau = 1) with the site's prior. Its minimiser has z(x) = log p(x | y) + c(x), the same
    at every site, so averaging the z-networks across sites is consistent, and adding the site's
    own log prior back gives its Bayes posterior p_i(y | x). Returns the hook's handle."""
    import torch

    shift = torch.as_tensor(np.log(prior), dtype=torch.float32, device=next(net.parameters()).device)
    return net.register_forward_hook(lambda module, inputs, output: output + shift)


def mixture(private_probabilities: np.ndarray, proxy_probabilities: np.ndarray, weight: float) -> np.ndarray:
    """q = w * private + (1 - w) * proxy, row by row."""
    return weight * np.asarray(private_probabilities) + (1.0 - weight) * np.asarray(proxy_probabilities)


def mixture_weight(private_probabilities: np.ndarray, proxy_probabilities: np.ndarray, labels: np.ndarray,
                   grid=MIXTURE_GRID) -> float:
    """The w of `grid` with the highest mean log-likelihood of the labels under `mixture` (ties go to
    the larger w, the private model); 1.0 without validation points."""
    labels = np.asarray(labels, dtype=int)
    if not len(labels):
        return 1.0
    rows = np.arange(len(labels))
    best, best_score = 1.0, -np.inf
    for weight in sorted(grid, reverse=True):
        q = mixture(private_probabilities, proxy_probabilities, weight)[rows, labels]
        score = float(np.mean(np.log(np.clip(q, 1e-12, None))))
        if score > best_score + 1e-12:
            best, best_score = float(weight), score
    return best


def mixture_accuracy(private_probabilities, proxy_probabilities, labels, weight: float) -> float:
    """Share of points whose most probable label under `mixture` is the true one (nan without points)."""
    labels = np.asarray(labels, dtype=int)
    if not len(labels):
        return float("nan")
    return float(np.mean(mixture(private_probabilities, proxy_probabilities, weight).argmax(axis=1) == labels))
