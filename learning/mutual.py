"""Federated Mutual Learning (FML; Shen et al. 2023, "Federated mutual learning: a collaborative
machine learning method for heterogeneous data, models, and objectives", FITEE 24(10), section 3;
arXiv:2006.16765): every site keeps a private model of its own architecture and a copy of the
shared "meme" model; in each round the meme starts from the global one, the two are trained
together by deep mutual learning on the site's data, and only the meme's weights are sent back
and averaged (FedAvg).

Paper 002 compares FedType with FML as the one baseline in its own setting (section 4.1).
"""

from __future__ import annotations

import numpy as np

from learning.train import SiteData, TrainingConfig, batches


def mutual_losses(private_logits, meme_logits, labels, alpha: float, beta: float):
    """FML's two local objectives (section 3.2, the local update; eqs. 1-2 of the arXiv version):

        L_local = alpha * L_C(p_local, y) + (1 - alpha) * D_KL(p_meme || p_local)
        L_meme  = beta  * L_C(p_meme, y)  + (1 - beta)  * D_KL(p_local || p_meme)

    L_C the cross-entropy, p_* = softmax of the logits, D_KL(p || q) = sum_k p_k log(p_k / q_k),
    averaged over the batch. As in deep mutual learning, each KL term trains only its student:
    the other model's distribution is a constant (detached). Returns (L_local, L_meme)."""
    import torch.nn.functional as F

    kl = lambda student, teacher: F.kl_div(F.log_softmax(student, dim=1),  # noqa: E731
                                           F.softmax(teacher.detach(), dim=1), reduction="batchmean")
    local = alpha * F.cross_entropy(private_logits, labels) + (1 - alpha) * kl(private_logits, meme_logits)
    meme = beta * F.cross_entropy(meme_logits, labels) + (1 - beta) * kl(meme_logits, private_logits)
    return local, meme


def mutual_round(private, meme, optimizers, data: SiteData, config: TrainingConfig, alpha: float, beta: float,
                 rng: np.random.Generator) -> None:
    """`passes` epochs over the training split; per mini-batch both models see the same points and
    each takes an Adam step on its own objective of `mutual_losses` (the two losses touch disjoint
    parameters, so one backward pass of their sum gives each model its own gradient)."""
    import torch

    private.train(), meme.train()
    for _ in range(config.passes):
        for batch in batches(rng.permutation(len(data.y_train)), config.batch_size):
            index = torch.as_tensor(batch, dtype=torch.long, device=data.y_train.device)
            x, y = data.X_train[index], data.y_train[index]
            local, shared = mutual_losses(private(x), meme(x), y, alpha, beta)
            for optimizer in optimizers:
                optimizer.zero_grad()
            (local + shared).backward()
            for optimizer in optimizers:
                optimizer.step()
    private.eval(), meme.eval()
