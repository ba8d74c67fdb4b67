"""Explicit randomness: every random choice draws from a Generator derived from the scenario seed.

Keys are (seed, trial, purpose...) so that a run is reproducible and the same in-process and
across processes. Session ids are derived the same way, so both backends agree on them.
"""

from __future__ import annotations

import zlib

import numpy as np

#: Sessions per trial: session 0 of a trial is its join, method i gets session i + 1.
SESSIONS_PER_TRIAL = 1000


def stable_key(text: str) -> int:
    """A stable 32-bit integer for a name (Python's hash() is salted per process)."""
    return zlib.crc32(text.encode("utf-8"))


def trial_rng(seed: int, trial: int, purpose: str) -> np.random.Generator:
    return np.random.default_rng([seed, trial, stable_key(purpose)])


def site_rng(seed: int, trial: int, session: int, site_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, trial, session, stable_key(site_id)])


def join_session(trial: int) -> int:
    return trial * SESSIONS_PER_TRIAL


def method_session(trial: int, method_index: int) -> int:
    if not 0 <= method_index < SESSIONS_PER_TRIAL - 1:
        raise ValueError(f"at most {SESSIONS_PER_TRIAL - 1} methods per scenario")
    return trial * SESSIONS_PER_TRIAL + method_index + 1
