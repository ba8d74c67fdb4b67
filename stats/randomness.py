"""Explicit randomness: every seeded random choice draws from a Generator derived from the
scenario seed, never from global state.

Keys are (seed, trial, purpose...) so that a run is reproducible and the same in-process and
across processes. (Noise that protects a release is not seeded: it comes from the operating
system's CSPRNG, see protocol.noise.)
"""

from __future__ import annotations

import zlib

import numpy as np


def stable_key(text: str) -> int:
    """A stable 32-bit integer for a name (Python's hash() is salted per process)."""
    return zlib.crc32(text.encode("utf-8"))


def trial_rng(seed: int, trial: int, purpose: str) -> np.random.Generator:
    """The Generator of one trial's `purpose` (data, split, model, ...), independent of the others."""
    return np.random.default_rng([seed, trial, stable_key(purpose)])


def site_rng(seed: int, trial: int, session: int, site_id: str) -> np.random.Generator:
    """The Generator of one site in one session (the same in-process and in the site's process)."""
    return np.random.default_rng([seed, trial, session, stable_key(site_id)])


def data_rng(values: np.ndarray, purpose: str) -> np.random.Generator:
    """A Generator that is a function of the data alone (its float64 bytes) and the purpose: a
    site's split of its own rows comes out the same in every session, so every method of a trial
    trains and tests on the same points (a paired comparison pairs them)."""
    data = np.ascontiguousarray(np.asarray(values, dtype=np.float64))
    return np.random.default_rng([zlib.crc32(data.tobytes()), stable_key(purpose)])
