"""What each site holds for a trial, on its own disk: its calibration shard and the trial's model.

The layout is defined here only; the harness writes with these functions and sites read with
them. A site reads nothing but its own shard and the shared model.

    WORKDIR/trial-0003/model.pkl
    WORKDIR/trial-0003/site-007.npz     (X, y of site-007's calibration data)
"""

from __future__ import annotations

import os
import pickle
import shutil
import uuid
from pathlib import Path

import numpy as np


def trial_dir(workdir: str | Path, trial: int) -> Path:
    return Path(workdir) / f"trial-{trial:04d}"


def shard_path(workdir, trial: int, site_id: str) -> Path:
    return trial_dir(workdir, trial) / f"{site_id}.npz"


def model_path(workdir, trial: int) -> Path:
    return trial_dir(workdir, trial) / "model.pkl"


def write_trial(workdir, trial: int, model, shards: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    """Write atomically: several site processes on one host may write the same trial's model
    at once (each builds the same world), so every writer uses a temporary file of its own."""
    directory = trial_dir(workdir, trial)
    directory.mkdir(parents=True, exist_ok=True)
    _atomic_write(model_path(workdir, trial), pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL))
    for site_id, (X, y) in shards.items():
        target = shard_path(workdir, trial, site_id)
        tmp = _private_temp(target, ".npz")
        np.savez(tmp, X=X, y=y)
        os.replace(tmp, target)


def read_shard(workdir, trial: int, site_id: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(shard_path(workdir, trial, site_id)) as data:
        return data["X"], data["y"]


def read_model(workdir, trial: int):
    # The model file is written by this run's own harness (see write_trial), never received.
    with open(model_path(workdir, trial), "rb") as handle:
        return pickle.load(handle)


def remove_trial(workdir, trial: int) -> None:
    shutil.rmtree(trial_dir(workdir, trial), ignore_errors=True)


def _atomic_write(path: Path, blob: bytes) -> None:
    tmp = _private_temp(path, ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)


def _private_temp(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}{suffix}")
