"""A site's local training in one federated round: plain cross-entropy (local-only training and
FedAvg) and FedType's epoch-level UARL (paper 002, algorithm 1).

Randomness is the site's numpy Generator (mini-batch order, the RAPS randomization u) and the
seeds it hands torch, so a round is a function of the site's seed and the weights it was sent.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from learning.nets import accuracy, logits
from learning.aggregators import moreau_step, proximal_term
from learning.uarl import (backward_kd_loss, calibration_penalty, consensus_weight, fit_conformal,
                           forward_kd_loss, symmetric_kd_loss, top_k_sets)

#: appendix C: a client's data split into local training, testing and conformal (validation) sets
SPLIT = (0.7, 0.2, 0.1)


@dataclass
class SiteData:
    """A site's three splits as torch tensors on its device."""

    X_train: "torch.Tensor"  # noqa: F821
    y_train: "torch.Tensor"  # noqa: F821
    X_test: "torch.Tensor"  # noqa: F821
    y_test: "torch.Tensor"  # noqa: F821
    X_val: "torch.Tensor"  # noqa: F821
    y_val: "torch.Tensor"  # noqa: F821

    @staticmethod
    def split(rows: np.ndarray, rng: np.random.Generator, device: str) -> "SiteData":
        """rows: (n, d + 1), the features then the class label (models.examples). A random 7:2:1
        split (appendix C); every split gets at least one point when n >= 3."""
        import torch

        rows = np.asarray(rows, dtype=np.float32)
        order = rng.permutation(len(rows))
        n_test = max(1, int(round(SPLIT[1] * len(rows)))) if len(rows) >= 3 else 0
        n_val = max(1, int(round(SPLIT[2] * len(rows)))) if len(rows) >= 3 else 0
        test, val, train = order[:n_test], order[n_test:n_test + n_val], order[n_test + n_val:]
        X = torch.as_tensor(rows[:, :-1], device=device)
        y = torch.as_tensor(rows[:, -1].astype(np.int64), device=device)
        pick = lambda idx: (X[torch.as_tensor(idx, dtype=torch.long, device=device)],  # noqa: E731
                            y[torch.as_tensor(idx, dtype=torch.long, device=device)])
        return SiteData(*pick(train), *pick(test), *pick(val))


@dataclass(frozen=True)
class TrainingConfig:
    """Local-update hyper-parameters (appendix F: Adam, batch 16, R = 5, lambda 0.5, k_reg 5,
    theta 0.1; the learning rate is the scenario's)."""

    lr: float
    batch_size: int
    local_epochs: int  # R of algorithm 1
    passes: int  # times algorithm 1 (or a cross-entropy pass over D_i) runs per round
    lam: float = 0.5
    k_reg: int = 5
    theta: float = 0.1
    backward_loss: str = "eq3"  # learning.uarl.BACKWARD_LOSSES
    #: beyond the paper (protocol.methods.fedtype_personal): the weight of a cross-entropy term for
    #: the proxy in eq. (2); 0 is the paper's objective, where the proxy learns only by eq. (1)
    proxy_ce: float = 0.0
    #: the ablations of table 2 and figure 3 (paper 002), each a switch off the paper's default:
    #: "uncertainty" (eq. 3) or "symmetric" (FedType_sym: plain KD from the proxy, learning.uarl.symmetric_kd_loss)
    backward_kd: str = "uncertainty"
    #: "conformal" (eq. 6) or "topk" (FedType_TopK: the top_k labels of each network, learning.uarl.top_k_sets)
    label_sets: str = "conformal"
    top_k: int = 3
    #: "eta" (eq. 8) or "one" (FedType_{eta=1})
    consensus: str = "eta"
    #: g1 (eq. 7), g2 (fixed lambda: FedType_{g=0.5}), g3, g4 (figure 3; learning.uarl.CALIBRATIONS)
    calibration: str = "g1"
    #: how the proxy is trained and averaged (learning.aggregators): fedavg, fedprox (mu), pfedme
    #: (pfedme_lam, pfedme_lr: lambda and eta of T Dinh et al.'s algorithm 1)
    aggregation: str = "fedavg"
    mu: float = 0.01
    pfedme_lam: float = 15.0
    pfedme_lr: float = 0.01
    #: pfedbayes (learning.aggregators.BayesianProxy): zeta, the KL weight, and the localized
    #: global distribution's learning rate
    zeta: float = 10.0
    pfedbayes_lr: float = 0.001


#: the options a method may add to the local updates (a site's request names them in its extra
#: keys): every field of TrainingConfig but the four every learning method sends
TRAINING_OPTIONS = frozenset(f.name for f in fields(TrainingConfig)) - {"lr", "batch_size", "local_epochs", "passes"}


def batches(indices: np.ndarray, batch_size: int):
    for start in range(0, len(indices), batch_size):
        yield indices[start:start + batch_size]


def aggregation_penalty(net, config: TrainingConfig, anchor=None, posterior=None):
    """What the config's aggregation (learning.aggregators) adds to a mini-batch loss of `net`, the
    network whose weights travel: FedProx's mu/2 ||w - w^t||^2 and pFedMe's lambda/2 ||theta - w_i||^2
    about `anchor`, pFedBayes's zeta/n KL(q_i || v_i) of `posterior`; None for FedAvg (nothing added).
    One place for uarl_round (FedType's proxy) and supervised_round (the plain fedavg method)."""
    terms = []
    if config.aggregation in ("fedprox", "pfedme"):
        terms.append(proximal_term(net, anchor, config.mu if config.aggregation == "fedprox" else config.pfedme_lam))
    if posterior is not None:
        terms.append(posterior.personal_penalty())
    return sum(terms[1:], terms[0]) if terms else None


def after_aggregation_step(net, config: TrainingConfig, anchor=None, posterior=None) -> None:
    """What the aggregation does after each optimizer step on `net`: pFedMe moves its local model
    w_i (`anchor`) by its Moreau update, pFedBayes the localized global distribution v_i."""
    if config.aggregation == "pfedme":
        moreau_step(anchor, net, config.pfedme_lr, config.pfedme_lam)
    if posterior is not None:
        posterior.global_step()


def supervised_round(net, optimizer, data: SiteData, config: TrainingConfig, rng: np.random.Generator,
                     anchor=None, posterior=None) -> None:
    """`passes` epochs of mini-batch cross-entropy on the training split. `optimizer` may be a
    tuple of optimizers (pFedBayes: with the posterior's rho optimizer); `anchor` and `posterior`
    are the aggregation's, as for uarl_round (aggregation_penalty, after_aggregation_step)."""
    import torch
    import torch.nn.functional as F

    optimizers = optimizer if isinstance(optimizer, (tuple, list)) else (optimizer,)
    net.train()
    for _ in range(config.passes):
        for batch in batches(rng.permutation(len(data.y_train)), config.batch_size):
            index = torch.as_tensor(batch, dtype=torch.long, device=data.y_train.device)
            for each in optimizers:
                each.zero_grad()
            x = data.X_train[index]
            loss = F.cross_entropy(net(x) if posterior is None else posterior.logits(x), data.y_train[index])
            penalty = aggregation_penalty(net, config, anchor, posterior)
            (loss if penalty is None else loss + penalty).backward()
            for each in optimizers:
                each.step()
            after_aggregation_step(net, config, anchor, posterior)
    net.eval()


@dataclass
class UARLState:
    """What FedType's site remembers between epochs and rounds: the proxy's last validation
    accuracy, for Delta of eq. (7)."""

    last_proxy_accuracy: float | None = None


def uarl_round(private, proxy, optimizers, data: SiteData, config: TrainingConfig, state: UARLState,
               rng: np.random.Generator, anchor=None, posterior=None, epochs: list | None = None) -> dict[str, float]:
    """Algorithm 1, `passes` times: the shuffled D_i in R parts; per part ("epoch") r, conformal
    models of both networks on D'_i (eq. 5) with g(Delta, lambda) (eq. 7), Delta the change of the
    proxy's validation accuracy since the last measurement; the sets S (proxy) and L (private) of
    eq. (6) and eta of eq. (8) for the part's points; then mini-batch steps on eq. (2),
    CE + forward KD (eq. 1, trains the proxy) + backward KD (eq. 3, trains the private model).
    Returns the mean |S|, |L| and eta over the points trained on, and the last g.

    The config's switches give table 2's and figure 3's variants (TrainingConfig); `anchor` (a
    list of tensors, learning.aggregators.anchor_of) is the global proxy for FedProx's proximal
    term, or pFedMe's local model w_i, moved after each step by its Moreau update; `posterior`
    (learning.aggregators.BayesianProxy, pFedBayes) makes the proxy's logits those of one sampled
    weight, adds its KL term, and moves the localized global distribution after each step (its
    rho optimizer must be among `optimizers`).

    `epochs` (a list, filled when given; appendix I / table 7): per part ("epoch") r of the last
    pass, {"epoch": r (1-based), "set_size": the mean |S| of that part's points (the sets it trained
    with, fitted at its start: the round's set_size is the mean of these over all points),
    "proxy_accuracy": the proxy's test accuracy at the part's end (the last part's is the round's
    proxy_accuracy)}. Measuring draws nothing from `rng` and trains nothing: the round is the same."""
    import torch
    import torch.nn.functional as F

    device = data.y_train.device
    val_labels = data.y_val.cpu().numpy()
    sizes_s, sizes_l, etas, g = [], [], [], config.lam
    for _ in range(config.passes):
        if epochs is not None:
            epochs.clear()  # the last pass's parts are the ones reported
        for number, part in enumerate(np.array_split(rng.permutation(len(data.y_train)), config.local_epochs), 1):
            if not len(part):
                continue
            private.eval(), proxy.eval()
            proxy_accuracy = accuracy(proxy, data.X_val, data.y_val)
            delta = 0.0 if state.last_proxy_accuracy is None or np.isnan(proxy_accuracy) else (
                proxy_accuracy - state.last_proxy_accuracy)
            state.last_proxy_accuracy = proxy_accuracy
            g = calibration_penalty(delta, config.lam, config.calibration)
            X_part = data.X_train[torch.as_tensor(part, dtype=torch.long, device=device)]
            if config.backward_kd == "symmetric":  # FedType_sym uses no sets: none are fitted (table 9's timing)
                S = L = eta = None
            elif config.label_sets == "topk":
                S = top_k_sets(logits(proxy, X_part).cpu().numpy(), config.top_k)
                L = top_k_sets(logits(private, X_part).cpu().numpy(), config.top_k)
            else:
                cp = fit_conformal(logits(proxy, data.X_val).cpu().numpy(), val_labels, config.theta, g, config.k_reg, rng)
                cw = fit_conformal(logits(private, data.X_val).cpu().numpy(), val_labels, config.theta, g, config.k_reg,
                                   rng)
                S = cp.sets(logits(proxy, X_part).cpu().numpy(), rng.uniform(size=len(part)))
                L = cw.sets(logits(private, X_part).cpu().numpy(), rng.uniform(size=len(part)))
            if S is not None:
                eta = consensus_weight(S, L) if config.consensus == "eta" else np.ones(len(part))
                sizes_s.append(S.sum(axis=1)), sizes_l.append(L.sum(axis=1)), etas.append(eta)
            private.train(), proxy.train()
            for batch in batches(rng.permutation(len(part)), config.batch_size):
                index = torch.as_tensor(part[batch], dtype=torch.long, device=device)
                x, y = data.X_train[index], data.y_train[index]
                zw, zp = private(x), (proxy(x) if posterior is None else posterior.logits(x))
                backward = (symmetric_kd_loss(zw, zp) if config.backward_kd == "symmetric"
                            else backward_kd_loss(zw, S[batch], eta[batch], config.backward_loss))
                loss = F.cross_entropy(zw, y) + forward_kd_loss(zw, zp) + backward
                if config.proxy_ce:
                    loss = loss + config.proxy_ce * F.cross_entropy(zp, y)
                penalty = aggregation_penalty(proxy, config, anchor, posterior)
                if penalty is not None:
                    loss = loss + penalty
                for optimizer in optimizers:
                    optimizer.zero_grad()
                loss.backward()
                for optimizer in optimizers:
                    optimizer.step()
                after_aggregation_step(proxy, config, anchor, posterior)
            if epochs is not None:
                proxy.eval()  # the next part (or the round's end) puts it in eval mode first anyway
                epochs.append({"epoch": number,
                               "set_size": float(S.sum(axis=1).mean()) if S is not None else float("nan"),
                               "proxy_accuracy": accuracy(proxy, data.X_test, data.y_test)})
    private.eval(), proxy.eval()
    mean = lambda parts: float(np.mean(np.concatenate(parts))) if parts else float("nan")  # noqa: E731
    return {"set_size": mean(sizes_s), "private_set_size": mean(sizes_l), "eta": mean(etas), "g": float(g)}


def set_coverage(proxy, data: SiteData, config: TrainingConfig, penalty: float,
                 rng: np.random.Generator) -> tuple[float, float]:
    """Test coverage and mean size of the proxy's conformal sets (eq. 6, calibrated on D'_i)."""
    if not len(data.y_test):
        return float("nan"), float("nan")
    cp = fit_conformal(logits(proxy, data.X_val).cpu().numpy(), data.y_val.cpu().numpy(), config.theta, penalty,
                       config.k_reg, rng)
    sets = cp.sets(logits(proxy, data.X_test).cpu().numpy(), rng.uniform(size=len(data.y_test)))
    labels = data.y_test.cpu().numpy()
    return float(np.mean(sets[np.arange(len(labels)), labels])), float(np.mean(sets.sum(axis=1)))
