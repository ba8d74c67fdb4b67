"""CQR with a neural network for the two conditional quantiles (paper 000 section 5.2, method
(iii); Romano et al. 2019, after Taylor 2000): an MLP with two outputs trained on the pinball
loss of the nominal levels (Romano et al. ask for [0.1, 0.9] and let conformalization widen),
Adam, dropout, early stopping on a held-out 10%; outputs are sorted so that lower <= upper
(rearrangement)."""

from __future__ import annotations

import numpy as np

from models.torch_nets import TRAINING_PARAMS, TorchModel, mlp


def pinball_loss(predicted, target, levels):
    """Mean over samples and levels of max(tau (y - q), (tau - 1)(y - q))."""
    residual = target.unsqueeze(1) - predicted
    return (residual * (levels - (residual < 0).float())).mean()


class CQRNet(TorchModel):
    kind = "cqr_net"
    score = "cqr"
    PARAMS = {**TRAINING_PARAMS,
              "quantiles": {"type": "list", "of": {"type": "float", "gt": 0, "lt": 1}, "min_len": 2,
                            "max_len": 2, "default": [0.1, 0.9]}}

    def build(self):
        return mlp(self.inputs, 2, self.params["hidden"], self.params["layers"], self.params["dropout"]).to(self._device())

    def fit(self, X, y, alpha, rng):
        import torch

        self.inputs = X.shape[1]
        self.net = self.seeded_build(rng)
        levels = torch.as_tensor(self.params["quantiles"], dtype=torch.float32, device=self._device())
        self.train(X, y, lambda out, target: pinball_loss(out, target, levels), rng)
        return self

    def base_predictions(self, X):
        return np.sort(self.forward(X), axis=1)  # rearrangement: lower <= upper
