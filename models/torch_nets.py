"""What the torch models share: device choice, a small MLP, batched inference, early stopping,
and pickling that survives a move between machines with and without CUDA.

Device: "auto" means CUDA when torch sees a GPU, else the CPU; the choice is made in each
process that computes (the harness to train, every site to score its own data), so a model
trained on a GPU is scored on the CPU of a site that has none, and the reverse.
"""

from __future__ import annotations

import copy
from abc import abstractmethod

import numpy as np

from models.base import Model, in_site_process

INFERENCE_BATCH = 8192


def resolve_device(requested: str) -> str:
    import torch

    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("model.device is 'cuda' but torch sees no CUDA device here")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def mlp(inputs: int, outputs: int, hidden: int, layers: int, dropout: float):
    import torch.nn as nn

    blocks, width = [], inputs
    for _ in range(layers):
        blocks += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(dropout)]
        width = hidden
    blocks.append(nn.Linear(width, outputs))
    return nn.Sequential(*blocks)


class TorchModel(Model):
    """A torch network plus the hyper-parameters to rebuild it; subclasses define build/loss."""

    #: model.dp_sgd of the scenario (models.dp_sgd.DP_SGD_FIELDS, set by world.trial), or None;
    #: after fit, training_privacy is DP-SGD's record: (epsilon, delta) as Opacus's accountant spent them
    dp_sgd: dict | None = None
    training_privacy: dict | None = None

    def _device(self) -> str:
        if not hasattr(self, "_resolved"):
            self._resolved = resolve_device(self.requested_device)
        return self._resolved

    @property
    def device(self) -> str:
        return self._device()

    def train(self, X, Y, loss_fn, rng: np.random.Generator):
        """Adam on mini-batches with early stopping on a held-out 10% (best weights kept); with
        model.dp_sgd, DP-SGD over every training row instead (models.dp_sgd)."""
        import torch

        p = self.params
        if self.dp_sgd:
            from models.dp_sgd import train_dp_sgd

            self.net, self.training_privacy = train_dp_sgd(
                self.net, X, Y, loss_fn, rng, self.dp_sgd, lr=self.dp_sgd["lr"] or p["lr"],
                weight_decay=p["weight_decay"], device=self._device())
            return
        torch.manual_seed(int(rng.integers(2**31 - 1)))
        device = self._device()
        order = rng.permutation(len(X))
        held = max(1, int(0.1 * len(X)))
        val, fit = order[:held], order[held:]
        to = lambda a: torch.as_tensor(a, dtype=torch.float32, device=device)  # noqa: E731
        X_fit, Y_fit, X_val, Y_val = to(X[fit]), to(Y[fit]), to(X[val]), to(Y[val])
        optimizer = torch.optim.Adam(self.net.parameters(), lr=p["lr"], weight_decay=p["weight_decay"])
        best, best_state, waited = float("inf"), None, 0
        for _ in range(p["epochs"]):
            self.net.train()
            shuffled = torch.as_tensor(rng.permutation(len(fit)), device=device)
            for start in range(0, len(fit), p["batch_size"]):
                batch = shuffled[start:start + p["batch_size"]]
                optimizer.zero_grad()
                loss_fn(self.net(X_fit[batch]), Y_fit[batch]).backward()
                optimizer.step()
            self.net.eval()
            with torch.no_grad():
                current = float(loss_fn(self.net(X_val), Y_val))
            if current < best - 1e-7:
                best, best_state, waited = current, copy.deepcopy(self.net.state_dict()), 0
            else:
                waited += 1
                if waited >= p["patience"]:
                    break
        if best_state is not None:
            self.net.load_state_dict(best_state)
        self.net.eval()

    def forward(self, X: np.ndarray) -> np.ndarray:
        """The network's output on X, computed in batches on this process's device."""
        import torch

        self.net.to(self._device())
        outputs = []
        with torch.no_grad():
            for start in range(0, len(X), INFERENCE_BATCH):
                # a copy: the rows may be a read-only view (torch warns on those), and float32 anyway
                rows = np.array(X[start:start + INFERENCE_BATCH], dtype=np.float32)
                chunk = torch.from_numpy(rows).to(self._device())
                outputs.append(self.net(chunk).float().cpu().numpy())
        return np.concatenate(outputs) if outputs else np.zeros((0, 1))

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("_resolved", None)  # each process chooses its own device
        net = state.pop("net", None)
        if net is not None:
            state["net_state"] = {k: v.detach().cpu() for k, v in net.state_dict().items()}
        return state

    def __setstate__(self, state):
        net_state = state.pop("net_state", None)
        self.__dict__.update(state)
        if net_state is not None:
            import torch

            if in_site_process():
                torch.set_num_threads(1)  # many site processes share few cores
            self.net = self.build()
            self.net.load_state_dict(net_state)
            self.net.eval()

    def seeded_build(self, rng: np.random.Generator):
        """A fresh network whose initial weights come from the trial's rng, not from whatever
        state torch's global generator was left in by earlier work in this process."""
        import torch

        torch.manual_seed(int(rng.integers(2**31 - 1)))
        return self.build()

    @abstractmethod
    def build(self):
        """A fresh network with this model's architecture (weights loaded separately)."""


TRAINING_PARAMS = {
    "hidden": {"type": "int", "min": 1, "default": 64},
    "layers": {"type": "int", "min": 1, "default": 2},
    "dropout": {"type": "float", "ge": 0, "lt": 1, "default": 0.1},
    "epochs": {"type": "int", "min": 1, "default": 200},
    "batch_size": {"type": "int", "min": 1, "default": 64},
    "lr": {"type": "float", "gt": 0, "default": 5e-4},
    "weight_decay": {"type": "float", "ge": 0, "default": 1e-6},
    "patience": {"type": "int", "min": 1, "default": 20},
}
