"""Networks a site trains in federated learning (paper 002): architectures from a scenario's
spec, weights as numpy arrays for the wire, and test accuracy.

An architecture spec is a mapping (validated by ARCHITECTURE_FIELDS):
  {kind: mlp, hidden: [256, 128]}                        fully connected, ReLU
  {kind: cnn, channels: [16, 32], image: [8, 8], hidden: [64]}
      3x3 convolutions (padding 1), each followed by ReLU and a 2x2 max-pool while the image is
      at least 2 pixels wide, then the hidden layers; the features are read as a one-channel
      image of the given height and width (8 x 8 for scikit-learn's digits)
No dropout or batch norm: every parameter is a weight that training changes and FedAvg averages.
"""

from __future__ import annotations

import math

import numpy as np

ARCHITECTURE_FIELDS = {
    "kind": {"type": "str", "choices": ["mlp", "cnn"], "default": "mlp"},
    "hidden": {"type": "list", "of": {"type": "int", "min": 1}, "default": []},
    "channels": {"type": "list", "of": {"type": "int", "min": 1}, "default": []},
    "image": {"type": "list", "of": {"type": "int", "min": 1}, "default": []},
}


class ArchitectureError(ValueError):
    """A spec this data cannot use (e.g. an image shape that does not match the features)."""


def check_architecture(spec: dict, features: int) -> None:
    if spec["kind"] == "cnn":
        if len(spec["image"]) != 2 or math.prod(spec["image"]) != features:
            raise ArchitectureError(f"cnn image {spec['image']} must be [height, width] with height x width = "
                                    f"{features} (the data's feature count)")
        if not spec["channels"]:
            raise ArchitectureError("cnn needs at least one entry in channels")


def build_net(spec: dict, features: int, classes: int, seed: int):
    """A freshly initialized network (torch's default init, seeded) for `features` inputs."""
    import torch
    import torch.nn as nn

    check_architecture(spec, features)
    torch.manual_seed(seed)
    layers: list = []
    width = features
    if spec["kind"] == "cnn":
        height, side = spec["image"]
        layers.append(nn.Unflatten(1, (1, height, side)))
        channels = 1
        for out in spec["channels"]:
            layers += [nn.Conv2d(channels, out, 3, padding=1), nn.ReLU()]
            if min(height, side) >= 2:
                layers.append(nn.MaxPool2d(2))
                height, side = height // 2, side // 2
            channels = out
        layers.append(nn.Flatten())
        width = channels * height * side
    for hidden in spec["hidden"]:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers)


def parameter_count(net) -> int:
    return int(sum(p.numel() for p in net.parameters()))


def get_weights(net, dtype: str = "float32") -> dict[str, np.ndarray]:
    """The network's parameters as numpy arrays in the wire precision ("float16" / "float32")."""
    return {name: value.detach().cpu().numpy().astype(dtype) for name, value in net.state_dict().items()}


def weight_shapes(net) -> dict[str, tuple[int, ...]]:
    return {name: tuple(value.shape) for name, value in net.state_dict().items()}


def set_weights(net, weights: dict[str, np.ndarray]) -> None:
    """Load arrays (any float precision) into the network; names and shapes must match exactly."""
    import torch

    expected = weight_shapes(net)
    got = {name: tuple(np.shape(array)) for name, array in weights.items()}
    if got != expected:
        raise ArchitectureError(f"weights do not fit the network: expected {expected}, got {got}")
    device = next(net.parameters()).device
    net.load_state_dict({name: torch.tensor(np.asarray(array, dtype=np.float32), device=device)
                         for name, array in weights.items()})


def logits(net, X) -> "torch.Tensor":  # noqa: F821
    """The network's outputs on a tensor, without gradients (evaluation mode)."""
    import torch

    with torch.no_grad():
        return net(X)


def accuracy(net, X, y) -> float:
    """Share of correctly classified points (nan without points)."""
    if len(y) == 0:
        return math.nan
    return float((logits(net, X).argmax(dim=1) == y).float().mean())
