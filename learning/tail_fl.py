"""Distributionally robust federated learning by tail aggregation: the math of Δ-FL and DP-Δ-FL
(paper 001, section 5 and appendix B: algorithms 3 and 4) and of FedAvg / DP-FedAvg on the same
model, as small pure numpy functions.

The model is paper 001 appendix B.3's: a linear model with intercept on d features and k classes
(weights W of shape (d + 1, k), the last row the intercept) and the multinomial logistic
(cross-entropy) loss per client. Every function takes a leading batch axis of clients where it
says so, so that the live site half (one client) and the fast in-process path (many clients at
once, bench/paper001_fig3.py) run the same arithmetic.
"""

from __future__ import annotations

import math

import numpy as np


def with_intercept(X: np.ndarray) -> np.ndarray:
    """[X, 1]: the features with a constant column for the intercept (..., n, d + 1)."""
    X = np.asarray(X, dtype=np.float64)
    return np.concatenate([X, np.ones(X.shape[:-1] + (1,))], axis=-1)


def initial_weights(features: int, classes: int) -> np.ndarray:
    """w^(0): zeros (the paper does not say; a linear softmax model's loss is convex)."""
    return np.zeros((features + 1, classes))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def client_losses(W: np.ndarray, X1: np.ndarray, y: np.ndarray) -> np.ndarray:
    """f_i(w): each client's mean cross-entropy (appendix B.3's per-client objective).
    W (d + 1, k); X1 (clients, n, d + 1) with the intercept column; y (clients, n) integer labels."""
    logp = _log_softmax(X1 @ W)
    picked = np.take_along_axis(logp, y[..., None].astype(np.int64), axis=-1)[..., 0]
    return -picked.mean(axis=-1)


def client_gradients(W: np.ndarray, X1: np.ndarray, y: np.ndarray) -> np.ndarray:
    """grad f_i(w) for each client: X^T (softmax(X W) - onehot(y)) / n, shape (clients, d + 1, k).
    W: one model (d + 1, k) or one per client (clients, d + 1, k)."""
    probabilities = np.exp(_log_softmax(X1 @ W))
    probabilities[np.arange(y.shape[0])[:, None], np.arange(y.shape[1])[None, :], y.astype(np.int64)] -= 1.0
    return (np.swapaxes(X1, -1, -2) @ probabilities) / y.shape[1]


def local_updates(W: np.ndarray, X1: np.ndarray, y: np.ndarray, lr: float, steps: int = 1,
                  weight_decay: float = 0.0) -> np.ndarray:
    """Algorithm 3 lines 6-9 for each client: tau full-gradient steps
    w_{k+1} = (1 - gamma lambda) w_k - gamma grad f_i(w_k) from w_0 = w; returns the updates
    w_tau - w (clients, d + 1, k). Appendix B.3: one step (tau = 1) at gamma = 0.1."""
    local = np.broadcast_to(W, (X1.shape[0],) + W.shape)
    for _ in range(steps):
        local = (1.0 - lr * weight_decay) * local - lr * client_gradients(local, X1, y)
    return local - W


def clip_updates(updates: np.ndarray, clip: float) -> np.ndarray:
    """Algorithm 4 line 10: delta_i = C u_i / max(C, ||u_i||_2) per client (clients, ...);
    clip = inf leaves the updates as they are."""
    if math.isinf(clip):
        return updates
    norms = np.sqrt((updates.reshape(len(updates), -1) ** 2).sum(axis=1))
    scale = clip / np.maximum(clip, norms)
    return updates * scale.reshape((-1,) + (1,) * (updates.ndim - 1))


def loss_bins(losses: np.ndarray, bound: float, bins: int) -> np.ndarray:
    """Each loss clipped to [0, B] (section 5: 'losses clipped to a tuned bound B') and binned
    into b equal bins of [0, B]; the index of its bin (0 .. b - 1)."""
    clipped = np.clip(np.asarray(losses, dtype=np.float64), 0.0, bound)
    return np.minimum((clipped / bound * bins).astype(np.int64), bins - 1)


def tail_start_bin(cdf: np.ndarray, p: float) -> int:
    """The first loss bin (0-based) of the tail from an estimated CDF over the bins: eq. (1)'s
    quantile bin j* (stats.ddg.quantile_index, 1-based) holds the p-quantile, and the tail is the
    clients in it and above (0-based bins j* - 1, j*, ...), i.e. f_i >= Q^(t) with Q^(t) the
    quantile bin's left edge. So, as the bins get finer and the noise smaller, the tail is
    algorithm 3's {i : f_i >= Q_p} exactly (tested); the right edge l_j* would leave out the
    client at the quantile. p = 0 (FedAvg): every client, bin 0."""
    from stats.ddg import quantile_index

    if p <= 0:
        return 0
    cdf = np.asarray(cdf, dtype=np.float64)
    if not np.all(np.isfinite(cdf)):
        return 0  # an empty (or all-negative noisy) histogram: no quantile, every client
    return quantile_index(cdf, p) - 1


def tail_quantile_exact(losses: np.ndarray, p: float) -> float:
    """Algorithm 3 line 3 without privacy: the p-quantile of the sampled clients' losses (the
    ceil(p m)-th smallest; p = 0: the smallest)."""
    ordered = np.sort(np.asarray(losses, dtype=np.float64))
    return float(ordered[max(0, math.ceil(p * len(ordered)) - 1)])


def superquantile(values: np.ndarray, p: float) -> float:
    """S_p(Z) = E[Z | Z >= Q_p(Z)] of an empirical distribution (section 5; Rockafellar and
    Uryasev): the mean of the values at or above the p-quantile, the last atom weighted so that
    exactly a (1 - p) share of mass is averaged (the closed form of appendix A's eq. (9)-(10))."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))[::-1]
    n = len(ordered)
    mass = (1.0 - p) * n
    whole = math.floor(mass + 1e-12)
    total = ordered[:whole].sum()
    if whole < n and mass - whole > 1e-12:
        total += (mass - whole) * ordered[whole]
    return float(total / mass)


def tail_average(updates: np.ndarray, in_tail: np.ndarray) -> np.ndarray:
    """Δ-FL's server step (appendix B.1): w+ - w = (1 / |S_p|) sum_{i in S_p} (w_i+ - w)."""
    chosen = updates[np.asarray(in_tail, dtype=bool)]
    return chosen.mean(axis=0) if len(chosen) else np.zeros(updates.shape[1:])


def noisy_tail_step(clipped_sum: np.ndarray, tail_count: int, noise: np.ndarray) -> np.ndarray:
    """Algorithm 4 line 12 with the noise on the sum: (sum_{i in S} delta_i + xi) / m^(t), where
    xi ~ N(0, sigma^2 I) with sigma the noise on the sum (= m^(t) sigma_w of the paper's noise on
    the average); m^(t) = 0 gives no step."""
    if tail_count <= 0:
        return np.zeros_like(clipped_sum)
    return (clipped_sum + noise) / float(tail_count)


def misclassification(W: np.ndarray, X1: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each client's test error: the share of its points whose argmax class is wrong (clients,)."""
    return (np.argmax(X1 @ W, axis=-1) != y).mean(axis=-1)


def error_summary(errors: np.ndarray) -> dict[str, float]:
    """Figure 3's two numbers over clients: the mean error and the 90th percentile of the
    per-client errors (numpy's linear interpolation)."""
    errors = np.asarray(errors, dtype=np.float64)
    return {"mean_error": float(errors.mean()), "p90_error": float(np.percentile(errors, 90))}


def noisy_loss_cdf(bins_of_clients: np.ndarray, bins: int, hierarchical: bool, noise: np.ndarray) -> np.ndarray:
    """The estimated CDF over the loss bins from the clients' bins plus the release's noise
    (one value per histogram entry): algorithm 1 option 1 (flat: b entries) or algorithm 2
    (hierarchical: 2b - 2 entries, the CDF summed over dyadic nodes), normalised by the noisy
    total (the count estimated, not sent)."""
    from stats.ddg import estimated_cdf, hierarchical_cumulative, hierarchical_from_flat

    flat = np.bincount(np.asarray(bins_of_clients, dtype=np.int64), minlength=bins).astype(np.float64)
    if hierarchical:
        cumulative = hierarchical_cumulative(hierarchical_from_flat(flat) + noise, bins)
        total = cumulative[-1]
        return cumulative / total if total > 0 else np.full(bins, np.nan)
    return estimated_cdf(flat + noise, "estimated")


def histogram_length(bins: int, hierarchical: bool) -> int:
    """How many entries the loss histogram released each round has."""
    return 2 * bins - 2 if hierarchical else bins


def private_round_step(bins_of_clients: np.ndarray, clipped: np.ndarray, p: float, bins: int, hierarchical: bool,
                       histogram_noise: np.ndarray | None, update_noise: np.ndarray) -> tuple[np.ndarray, dict]:
    """One server step of DP-Δ-FL (algorithm 4 lines 3-4 and 12) or DP-FedAvg (p = 0: no quantile,
    every sampled client): the tail from the noisy loss histogram, then the noisy mean of the tail's
    clipped updates. Returns (the step to add to w, what the round decided)."""
    if p > 0:
        start = tail_start_bin(noisy_loss_cdf(bins_of_clients, bins, hierarchical, histogram_noise), p)
    else:
        start = 0
    in_tail = np.asarray(bins_of_clients) >= start
    tail_count = int(in_tail.sum())
    total = clipped[in_tail].sum(axis=0) if tail_count else np.zeros(clipped.shape[1:])
    return noisy_tail_step(total, tail_count, update_noise), {"tail_bin": start, "tail": tail_count}


def plain_round_step(losses: np.ndarray, updates: np.ndarray, p: float) -> tuple[np.ndarray, dict]:
    """One server step of Δ-FL (algorithm 3 lines 3-5 and appendix B.1's aggregation) or FedAvg
    (p = 0): the exact p-quantile of the sampled clients' losses, the mean of the updates at or
    above it."""
    losses = np.asarray(losses, dtype=np.float64)
    in_tail = losses >= tail_quantile_exact(losses, p) if p > 0 else np.ones(len(losses), dtype=bool)
    return tail_average(updates, in_tail), {"tail": int(in_tail.sum())}
