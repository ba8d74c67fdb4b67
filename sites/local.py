"""A site's local work, shared by the site process and the in-process backend.

Opening a trial loads the site's shard and the model, and scores the shard locally; a request
then goes to the method's site half, built once per session, whose value the codec encodes.
"""

from __future__ import annotations

import numpy as np

from protocol.codecs import CODECS
from protocol.methods import METHODS, RequestError
from protocol.randomness import SESSIONS_PER_TRIAL, site_rng
from sites.storage import read_model, read_shard


class SiteLocal:
    def __init__(self, site_id: str, workdir) -> None:
        self.site_id, self.workdir = site_id, workdir
        self.trial: int | None = None
        self.seed = 0
        self.scores = np.empty(0)
        self.device = "cpu"
        self._halves: dict[int, object] = {}

    def open_trial(self, trial: int, seed: int) -> int:
        """Load and score this site's calibration data for `trial`; return n_j."""
        X, y = read_shard(self.workdir, trial, self.site_id)
        model = read_model(self.workdir, trial)
        self.scores = np.asarray(model.scores(X, y), dtype=float)
        self.device = model.device
        self.trial, self.seed, self._halves = trial, seed, {}
        return int(self.scores.size)

    def answer(self, session: int, method_name: str, phase: str, body: dict):
        """The encoded response body for one request (RequestError if it cannot be served)."""
        if self.trial is None:
            raise RequestError("no trial is open at this site")
        if session // SESSIONS_PER_TRIAL != self.trial:
            raise RequestError(f"session {session} does not belong to the open trial {self.trial}")
        method = METHODS.get(method_name)
        if method is None:
            raise RequestError(f"unknown method {method_name!r}")
        if phase not in method.phases:
            raise RequestError(f"{method_name} has no phase {phase!r}")
        half = self._halves.get(session)
        if half is None:
            rng = site_rng(self.seed, self.trial, session, self.site_id)
            half = self._halves[session] = method.site(self.scores, rng)
        return CODECS[method.codec]().encode(half.answer(phase, body))

    def close_session(self, session: int) -> None:
        self._halves.pop(session, None)
