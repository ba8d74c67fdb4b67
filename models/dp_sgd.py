"""DP-SGD training of Quorum's torch models with Opacus (Abadi et al. 2016; paper 003 section 4.1
trains its private CIFAR-10 model the same way, with Opacus).

A scenario asks for it in its model spec (`model.dp_sgd`, validated with the scenario):

    model:
      kind: classifier
      params: {hidden: 128}
      dp_sgd: {epsilon: 8, delta: 1.0e-5, clip: 1.0, epochs: 30, batch_size: 64}

Each step Poisson-samples the training rows (rate batch_size / n), clips every per-sample
gradient to L2 norm `clip`, sums them and adds N(0, (sigma clip)^2) noise (Opacus's DPOptimizer
over the model's own optimizer, Adam). The noise multiplier sigma is not written anywhere: it is
the smallest one Opacus's accountant (`accountant`: prv, Opacus's default, rdp or gdp) finds for
(epsilon, delta) after epochs / sample rate steps (opacus.accountants.utils.get_noise_multiplier),
and the epsilon reported is what the accountant says was spent, at delta, after the steps taken.

What DP-SGD protects, and from whom (the trust sense). The model is trained by whoever holds the
training split: in Quorum the study (the harness, world.trial.build_trial), standing for the
party that gives the sites their predictor (paper 000 section 3.1: "the predictor is given"). That
party sees its training rows in the clear; DP-SGD protects them from everyone who gets the model
afterwards: the sites, which score their calibration data with it, the coordinator, and whoever
uses the prediction sets. The calibration data are a separate question, answered by the
methods' own privacy (private_cp, FedCP²-QQ, ...): the two guarantees are on different records
and are reported side by side (summary.json's `model` beside `privacy`), never composed. Training
uses the whole training split for all `epochs`: no held-out early stopping (choosing weights on
held-out rows would use them outside the accountant).

Where the noise comes from. `noise: os` (the default): Opacus's noise and its Poisson sampling
draw from torch generators seeded with 64 bits from the OS (os.urandom), never from the
scenario's seed, so nobody who knows the scenario can replay them; with the floating-point
mitigation of Opacus's secure mode (every noise draw the sum of four Gaussians, halved: Opacus's
_generate_noise). Opacus's full secure_mode needs torchcsprng, which cannot be installed here; so the
generator is torch's (Philox on CUDA, Mersenne Twister on the CPU), not a CSPRNG. (torchcsprng's
last release, 0.2.1 of 2021, was built for torch 1.8; the package registry offers no version of
it for this Python 3.11, and torch 2.13 stays pinned.)
`noise: seeded`: both generators seeded from the trial's rng: the model replays exactly, as a
site host rebuilding the trial from the seed needs (runtime.launcher.kind: ray), and the
outputs say the training noise is not private.
"""

from __future__ import annotations

import os
import warnings
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

import numpy as np

#: model.dp_sgd's fields (scenarios.scenario validates them and names a bad one)
DP_SGD_FIELDS = {
    "epsilon": {"type": "float", "gt": 0, "finite": True},
    "delta": {"type": "float", "gt": 0, "lt": 1},
    "clip": {"type": "float", "gt": 0, "finite": True, "default": 1.0},  # per-sample gradient L2 bound
    "epochs": {"type": "int", "min": 1, "default": 30},
    "batch_size": {"type": "int", "min": 1, "default": 64},  # the expected (Poisson) batch size
    "lr": {"type": "float", "gt": 0, "default": None},  # null: the model's own lr
    "accountant": {"type": "str", "choices": ["prv", "rdp", "gdp"], "default": "prv"},
    "noise": {"type": "str", "choices": ["os", "seeded"], "default": "os"},
}

NOT_PRIVATE_TRAINING = "seeded: replayable from the scenario's seed, the model's (epsilon, delta) is not a guarantee"


def opacus_version() -> str:
    try:
        return version("opacus")
    except PackageNotFoundError:  # pragma: no cover - pinned in requirements.txt
        return "unknown"


@lru_cache(maxsize=64)
def noise_multiplier(epsilon: float, delta: float, sample_rate: float, epochs: int, accountant: str) -> float:
    """The noise multiplier Opacus's accountant gives for (epsilon, delta) after `epochs` epochs
    at `sample_rate` (steps = epochs / sample_rate): its search keeps the epsilon spent within
    0.01 under the target. Kept per process (the PRV search takes seconds; every trial of a run
    asks the same question)."""
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the RDP analysis's "optimal order is the largest alpha"
        return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate,
                                          epochs=epochs, accountant=accountant))


def spent_epsilon(sigma: float, sample_rate: float, steps: int, delta: float, accountant: str) -> float:
    """What Opacus's accountant says `steps` steps of DP-SGD at (sigma, sample_rate) spend at
    delta: the check the tests make of a model's reported epsilon."""
    from opacus.accountants import create_accountant

    account = create_accountant(mechanism=accountant)
    account.history = [(sigma, sample_rate, steps)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(account.get_epsilon(delta))


def _generators(noise: str, device: str, rng: np.random.Generator):
    """(noise generator on `device`, sampling generator on the CPU): OS entropy, or the trial's rng."""
    import torch

    seeds = ([int.from_bytes(os.urandom(8), "little") for _ in range(2)] if noise == "os"
             else [int(rng.integers(2**63 - 1)) for _ in range(2)])
    noise_gen = torch.Generator(device=device)
    noise_gen.manual_seed(seeds[0])
    sample_gen = torch.Generator()
    sample_gen.manual_seed(seeds[1])
    return noise_gen, sample_gen


def train_dp_sgd(net, X: np.ndarray, Y: np.ndarray, loss_fn, rng: np.random.Generator, spec: dict, *,
                 lr: float, weight_decay: float, device: str, sigma: float | None = None):
    """Train `net` (in place) with DP-SGD on all rows of (X, Y); returns (net, privacy record).

    sigma: the noise multiplier, else the accountant's for spec's (epsilon, delta) (a test passes
    0 to compare with plain training)."""
    import torch
    from opacus import PrivacyEngine
    from opacus.data_loader import DPDataLoader
    from torch.utils.data import DataLoader, TensorDataset

    n = len(X)
    if n < 2:
        raise ValueError(f"DP-SGD needs at least 2 training rows, got {n}")
    batch = min(spec["batch_size"], n)
    dataset = TensorDataset(torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(Y, dtype=torch.float32))
    plain = DataLoader(dataset, batch_size=batch)
    sample_rate = 1.0 / len(plain)  # what Opacus uses: one expected batch per 1/sample_rate steps
    if sigma is None:
        sigma = noise_multiplier(spec["epsilon"], spec["delta"], sample_rate, spec["epochs"], spec["accountant"])
    noise_gen, sample_gen = _generators(spec["noise"], device, rng)
    loader = DPDataLoader.from_data_loader(plain, generator=sample_gen)  # Poisson sampling
    optimizer = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Secure RNG turned off": said in the docs and the record
        engine = PrivacyEngine(accountant=spec["accountant"])
        module, optimizer, loader = engine.make_private(
            module=net, optimizer=optimizer, data_loader=loader, noise_multiplier=sigma,
            max_grad_norm=spec["clip"], poisson_sampling=False, noise_generator=noise_gen)
    # the floating-point part of Opacus's secure mode (its CSPRNG part needs torchcsprng)
    optimizer.secure_mode = spec["noise"] == "os"
    module.train()
    steps = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(spec["epochs"]):
            for xb, yb in loader:
                optimizer.zero_grad()
                xb, yb = xb.to(device), yb.to(device)
                # an empty Poisson batch takes its step too (zero-size per-sample gradients: noise only)
                loss_fn(module(xb), yb).backward()
                optimizer.step()
                steps += 1
    optimizer.zero_grad(set_to_none=True)
    module.remove_hooks()  # the network goes back to being a plain one (scored, pickled, sent to sites)
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spent = float(engine.get_epsilon(spec["delta"])) if sigma > 0 else float("inf")
    record = {
        "training": "DP-SGD", "library": f"opacus {opacus_version()}", "epsilon": spent,
        "target_epsilon": float(spec["epsilon"]), "delta": float(spec["delta"]), "noise_multiplier": float(sigma),
        "sample_rate": sample_rate, "steps": steps, "epochs": spec["epochs"], "clip": float(spec["clip"]),
        "accountant": spec["accountant"], "noise": spec["noise"], "rows": n,
        "trained_by": "the study (harness), on the trial's training split",
    }
    if spec["noise"] == "seeded":
        record["warning"] = NOT_PRIVATE_TRAINING
    return module._module, record


def describe(record: dict | None) -> str:
    """'DP-SGD (epsilon 7.99, delta 1e-05)' or 'non-private' for a model's training record."""
    if not record:
        return "non-private"
    text = f"DP-SGD (epsilon {record['epsilon']:.4g}, delta {record['delta']:g})"
    if record.get("noise") == "seeded":
        text += " [seeded noise: not private]"
    return text


def model_summary(kind: str, records: list[dict | None], dp_sgd: dict | None = None) -> dict:
    """summary.json's `model`: its kind and how it was trained; with DP-SGD the (epsilon, delta)
    of the trials' models (the largest epsilon Opacus's accountant reports over the trials: each
    trial trains a fresh model on its own training split), with the noise multiplier and steps."""
    private = [r for r in records if r]
    if not private and dp_sgd:  # a resumed run whose trials were all done before: nothing trained now
        return {"kind": kind, "training": "DP-SGD", "epsilon": None, "delta": dp_sgd["delta"],
                "target_epsilon": dp_sgd["epsilon"], "noise": dp_sgd["noise"], "trials": 0,
                "note": "no model was trained in this invocation (a resumed run): epsilon is the trials' own, "
                        "not recorded here; target_epsilon is the scenario's"}
    if not private:
        return {"kind": kind, "training": "non-private", "epsilon": None, "delta": None}
    worst = max(private, key=lambda r: r["epsilon"])
    out = {"kind": kind, "training": "DP-SGD", "epsilon": worst["epsilon"], "delta": worst["delta"],
           **{key: worst[key] for key in ("target_epsilon", "noise_multiplier", "sample_rate", "steps", "epochs",
                                          "clip", "accountant", "noise", "library", "trained_by")},
           "trials": len(private),
           "per_trial": [{"epsilon": r["epsilon"], "noise_multiplier": r["noise_multiplier"], "steps": r["steps"],
                          "rows": r["rows"]} for r in private]}
    if worst.get("warning"):
        out["warning"] = worst["warning"]
    return out


def model_line(model: dict, calibration: str) -> str:
    """The terminal's line on the model's privacy beside the calibration's."""
    if model.get("training") == "DP-SGD" and model.get("epsilon") is None:
        return (f"model: DP-SGD (target epsilon {model['target_epsilon']:g}, delta {model['delta']:g}; "
                f"not trained in this invocation); calibration: {calibration}")
    text = f"model: {describe(model)}" if model.get("training") == "DP-SGD" else "model: non-private"
    if model.get("training") == "DP-SGD":
        text += (f", noise multiplier {model['noise_multiplier']:.4g}, {model['steps']} steps, clip {model['clip']:g}, "
                 f"{model['accountant']} accountant; trained by the study on each trial's training split")
    return f"{text}; calibration: {calibration}"
