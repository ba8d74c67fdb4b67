"""FedProto (Tan et al. 2022, "FedProto: federated prototype learning across heterogeneous
clients", AAAI 36, 8432-8440): sites exchange class prototypes, the mean embedding of each
class, instead of weights. A site's network is F_i = g_i o f_i: the representation layers f_i
(every layer of a learning.nets network but the last) and the decision layer g_i (the last
Linear). Architectures differ between sites; the embedding width must not, so FedProto's private
models end their hidden layers with the same `embedding` width (`with_embedding`).

Pure functions here; the round that trains with them is `prototype_round`.
"""

from __future__ import annotations

import numpy as np

from learning.train import SiteData, TrainingConfig, batches


def with_embedding(spec: dict, width: int) -> dict:
    """The architecture with one more hidden layer of `width` units: its output, after the ReLU,
    is the embedding f_i(x) whose class means are the prototypes."""
    return {**spec, "hidden": [*spec["hidden"], width]}


def embed(net, X):
    """f_i(phi_i; x): the network's output before its last (decision) layer."""
    return net[:-1](X)


def embeddings(net, X) -> np.ndarray:
    """f_i(x) for every row of a tensor, without gradients, as a numpy array."""
    import torch

    with torch.no_grad():
        return embed(net, X).cpu().numpy()


def local_prototypes(embeddings: np.ndarray, labels: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (3): C_i^(j) = (1 / |D_ij|) sum over (x, y) in D_ij of f_i(x), for every class j the site
    holds; returns the (classes, d) prototypes (zero rows for absent classes) and |D_ij|."""
    embeddings, labels = np.asarray(embeddings, dtype=np.float64), np.asarray(labels, dtype=int)
    counts = np.bincount(labels, minlength=classes).astype(np.float64)
    sums = np.zeros((classes, embeddings.shape[1]))
    np.add.at(sums, labels, embeddings)
    return np.divide(sums, counts[:, None], out=np.zeros_like(sums), where=counts[:, None] > 0), counts


def global_prototypes(prototypes: list[np.ndarray], counts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (6), the server's step: for each class j, the average of the sites' prototypes weighted by
    |D_ij| / N_j over the sites N_j that hold class j. (Eq. 6 as printed also divides by |N_j|;
    the weights |D_ij| / N_j already sum to one, so we read it as the weighted mean, which is
    what keeps a global prototype in the embedding space.) Classes nobody holds stay zero, count 0."""
    counts_ = np.sum([np.asarray(c, dtype=np.float64) for c in counts], axis=0)
    weighted = np.sum([np.asarray(p, dtype=np.float64) * np.asarray(c, dtype=np.float64)[:, None]
                       for p, c in zip(prototypes, counts)], axis=0)
    return np.divide(weighted, counts_[:, None], out=np.zeros_like(weighted), where=counts_[:, None] > 0), counts_


def prototype_loss(embeddings, labels, prototypes, known):
    """lambda's term of eq. (7): L_R of eq. (8) with d the squared L2 distance, per training point
    against the global prototype of its class, C-bar^(y); averaged over points and coordinates (the
    mean squared error of the authors' code). Points of classes without a global prototype yet
    (`known` False) add nothing."""
    import torch

    rows = known[labels]
    if not bool(rows.any()):
        return embeddings.sum() * 0.0
    return torch.mean((embeddings[rows] - prototypes[labels[rows]]) ** 2)


def prototype_round(net, optimizer, data: SiteData, config: TrainingConfig, prototypes, known, lam: float,
                    rng: np.random.Generator) -> None:
    """`passes` epochs of eq. (7): L_S (cross-entropy of F_i) + lambda * L_R (`prototype_loss`)."""
    import torch
    import torch.nn.functional as F

    net.train()
    for _ in range(config.passes):
        for batch in batches(rng.permutation(len(data.y_train)), config.batch_size):
            index = torch.as_tensor(batch, dtype=torch.long, device=data.y_train.device)
            x, y = data.X_train[index], data.y_train[index]
            h = embed(net, x)
            loss = F.cross_entropy(net[-1](h), y) + lam * prototype_loss(h, y, prototypes, known)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    net.eval()


def nearest_prototype_accuracy(net, X, y, prototypes, known) -> float:
    """Eq. (4), prototype-based inference: y-hat = argmin_j ||f(x) - C-bar^(j)||_2 over the classes
    with a global prototype; the share of test points it labels correctly (nan without points)."""
    import torch

    if len(y) == 0 or not bool(known.any()):
        return float("nan")
    with torch.no_grad():
        distances = torch.cdist(embed(net, X), prototypes)
    distances[:, ~known] = float("inf")
    return float((distances.argmin(dim=1) == y).float().mean())
