"""What one OS process holds of the open trial for all the sites it serves.

A site host (sites.host) serves many sites; the in-process backend serves them all. Loading
the trial's model and reading a shard file once per site would make opening a trial for
thousands of sites cost thousands of unpickles: here the model is loaded once per trial and
process, the rows come from one memory-mapped file pair (sites.storage.read_rows), and each
site still scores only its own rows, with the model, in its own call.

A host started away from the harness (`run.py site --scenario S`) has no shard files: it
builds the trial's world from its world spec once (the world is a deterministic function of the
spec and the trial, world.trial) and keeps only its own sites' rows and the model.

The model is dropped when every site this process serves has scored (or at the next trial),
and while it is held the process holds one of the machine's model-loading slots
(sites.storage.model_slot), so that a hundred single-site processes do not all hold a large
forest at once.
"""

from __future__ import annotations

import gc
from contextlib import ExitStack
from typing import TYPE_CHECKING

import numpy as np

from protocol.accounting import RecordLedger
from sites.storage import model_slot, read_model, read_record_ids, read_rows, rows_path

if TYPE_CHECKING:  # a site process imports the world (data, models) only when it builds one
    from world.trial import WorldSpec


class TrialCache:
    def __init__(self, workdir, site_ids, world: WorldSpec | None = None) -> None:
        self.workdir, self.site_ids, self.world = workdir, set(site_ids), world
        self.trial: int | None = None
        self._model = None
        self._rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._ids: dict[str, np.ndarray] = {}  # each site's record identities (protocol.accounting.record_ids)
        #: the record ledger of every site this process serves: one data holder's records, which a
        #: study may re-split over its site ids from trial to trial (protocol.accounting.RecordLedger)
        self.ledger = RecordLedger()
        self._waiting: set[str] = set()  # sites that have not scored the open trial yet
        self._slot: ExitStack | None = None

    def site_rows(self, trial: int, site_id: str) -> tuple[np.ndarray, str]:
        """What site `site_id`'s methods work on in `trial` (the model's `scores` of its calibration
        rows: conformity scores, (value, group) rows or examples), and the device that computed them."""
        if trial != self.trial or self._model is None:
            self._load(trial)
        if site_id not in self._rows:
            raise LookupError(f"trial {trial} holds no calibration rows for {site_id}")
        X, y = self._rows[site_id]
        model = self._model
        scores = np.asarray(model.scores(np.asarray(X), np.asarray(y)), dtype=float)
        device = model.device  # resolved in this process: CUDA where this host has it
        self._waiting.discard(site_id)
        if not self._waiting:
            self.release()
        return scores, device

    def record_ids(self, trial: int, site_id: str) -> np.ndarray | None:
        """The identities of the records behind `site_id`'s rows in `trial` (None: the trial was
        written without them; each row is then identified by its values)."""
        return self._ids.get(site_id) if trial == self.trial else None

    def forget(self, site_id: str) -> None:
        """A site that will never score (it crashed): do not keep the model for it."""
        self.site_ids.discard(site_id)
        self._waiting.discard(site_id)
        if self._model is not None and not self._waiting:
            self.release()

    def release(self) -> None:
        """Drop the model (one full garbage collection per process and trial, not per site)."""
        if self._model is None:
            return
        self._model = None
        gc.collect()
        if self._slot is not None:
            self._slot.close()
            self._slot = None

    def _load(self, trial: int) -> None:
        self.release()
        self.trial, self._rows, self._ids = None, {}, {}
        if self.world is not None and not rows_path(self.workdir, trial).exists():
            from world.trial import build_trial

            world = build_trial(self.world, trial)
            model = world.model
            self._rows = {site: world.shards[site] for site in self.site_ids if site in world.shards}
            self._ids = {site: world.record_ids[site] for site in self._rows}
            del world
        else:
            self._slot = ExitStack()
            self._slot.enter_context(model_slot(self.workdir, trial))  # shared with the host's other processes
            model = read_model(self.workdir, trial)
            X, y, index = read_rows(self.workdir, trial)
            self._rows = {site: (X[start:end], y[start:end]) for site, (start, end) in index.items()
                          if site in self.site_ids}
            ids = read_record_ids(self.workdir, trial)
            if ids is not None:
                self._ids = {site: np.asarray(ids[start:end]) for site, (start, end) in index.items()
                             if site in self.site_ids}
        self.trial, self._model, self._waiting = trial, model, set(self._rows)
