"""What each site holds for a trial, on its own disk: its calibration shard and the trial's model.

The layout is defined here only; the harness writes with these functions and sites read with
them. A site reads nothing but its own shard and the shared model.

    WORKDIR/trial-0003/model.pkl
    WORKDIR/trial-0003/site-007.npz     (X, y of site-007's calibration data)
    WORKDIR/locks/load-N                (model_slot's lock files)
    WORKDIR/privacy/site-007.msgpack    (site-007's privacy account: every release it made, so
                                         that a restarted site keeps counting against its budget)
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import msgpack
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


MODEL_MEMORY_FACTOR = 3  # memory a loaded model takes, per byte of its pickle, with head room
MAX_SLOTS = 64


def load_slots(model_bytes: int, available: int | None = None) -> int:
    """How many processes of this host may hold a model of `model_bytes` at once: as many as
    fit in half the memory available now (at least one)."""
    if available is None:
        available = _available_memory()
    if available is None:
        return MAX_SLOTS
    return int(max(1, min(MAX_SLOTS, available // 2 // max(1, MODEL_MEMORY_FACTOR * model_bytes))))


@contextmanager
def model_slot(workdir, trial: int):
    """Hold one of the host's model-loading slots (an flock'ed file under WORKDIR/locks).

    Every site process on a host loads the trial's model at the same moment; a forest of a few
    hundred MB times a hundred sites would swap the host to a halt. Sites queue here instead
    and free the model before they leave the slot."""
    slots = load_slots(model_path(workdir, trial).stat().st_size)
    locks = Path(workdir) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    while True:
        for index in range(slots):
            fd = os.open(locks / f"load-{index}", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        time.sleep(0.02)


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def account_path(workdir, site_id: str) -> Path:
    return Path(workdir) / "privacy" / f"{site_id}.msgpack"


def read_account(workdir, site_id: str) -> list[dict]:
    """The records of a site's privacy account (protocol.accounting.SiteAccount), [] if none yet."""
    path = account_path(workdir, site_id)
    if not path.exists():
        return []
    return msgpack.unpackb(path.read_bytes(), raw=False)


def write_account(workdir, site_id: str, records: list[dict]) -> None:
    path = account_path(workdir, site_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write(path, msgpack.packb(records, use_bin_type=True))


def remove_trial(workdir, trial: int) -> None:
    shutil.rmtree(trial_dir(workdir, trial), ignore_errors=True)


def _atomic_write(path: Path, blob: bytes) -> None:
    tmp = _private_temp(path, ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)


def _private_temp(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}{suffix}")
