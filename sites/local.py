"""A site's local work, shared by the site process and the in-process backend.

Opening a trial scores the site's own calibration rows with the trial's model, both taken
from its process's TrialCache (sites.trials: loaded once per process and trial, however many
sites the process serves); a request then goes to the method's site half, built once per
session, whose value the codec encodes.

Every request passes the site's own policy (protocol.policy: the methods it serves, the smallest
K, the largest epsilon per release, releases without formal privacy, the fewest co-contributors
behind a claim) and then its privacy account (protocol.accounting) before the method's half may
answer: the method says what the answer would release (`Method.spend`, from the
request the site received), the account refuses what the site's budget does not allow, returns
an earlier K-anonymous release unchanged for an identical request on the same data, and records
what was released. The account lives on the site's storage, so a restarted site keeps it.

A session belongs to the first method asked in it: its half is built once per (session, method)
and a request for another method in the same session is refused. The half of a method whose
randomness protects a release draws from the OS CSPRNG (protocol.noise.PrivacyNoise); only a
policy of `noise: seeded` gives it the Generator replayable from the scenario seed.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import numpy as np

from models.base import in_site_process
from protocol.accounting import Budget, BudgetExceeded, SiteAccount, record_ids, request_key
from protocol.codecs import PayloadError
from protocol.methods import METHODS, RequestError
from protocol.noise import PrivacyNoise
from protocol.policy import SitePolicy
from protocol.sessions import SESSIONS_PER_TRIAL
from sites.storage import AccountCorrupt, GroupCommit, account_path, append_account, read_account
from sites.trials import TrialCache
from specs.plugins import PluginError
from stats.randomness import site_rng


class SiteLocal:
    def __init__(self, site_id: str, workdir, budget: dict | None = None, trials: TrialCache | None = None,
                 policy: dict | None = None, commit: GroupCommit | None = None, identity=None) -> None:
        """commit: the host's group commit (sites.storage.GroupCommit): account records are made
        durable by its next flush, which the answer must wait for; None: fsync'ed at once.
        identity: the site's signing key and party registry (protocol.secagg.identity), which its
        secure sums need in the active mode; None: it takes part in none of those."""
        self.site_id, self.workdir, self.trials, self.commit = site_id, workdir, trials, commit
        self.trial: int | None = None
        self.seed = 0
        self.rows = np.empty(0)  # what the site's methods work on: scores, (value, group) rows or examples
        self.fingerprint = ""
        self.device = "cpu"
        self._halves: dict[int, tuple[str, object]] = {}  # session -> (its method, the half)
        self._owners: dict[int, str] = {}  # session -> the method it belongs to (kept after close)
        # session -> what its halves keep across rebuilds (SiteHalf.session_memory; kept after close
        # and reopened trials, like _owners: a bound on a session's answers must outlive its half)
        self._memory: dict[int, dict] = {}
        try:
            records, self.broken = read_account(workdir, site_id, repair=True), None
        except AccountCorrupt as exc:  # fail closed: a budget that forgot releases could be spent twice
            records, self.broken = [], str(exc)
        self.policy = SitePolicy.from_spec(policy)
        self.identity = None if identity is None else identity.with_policy(
            self.policy.secagg == "semi-honest", ledger=account_path(workdir, site_id).with_name(f"{site_id}.secagg-nonces"))
        # the accounts of the sites this process serves share one record ledger (sites.trials)
        self.account = SiteAccount(Budget.from_spec(budget), records,
                                   ledger=trials.ledger if trials is not None else None)

    def open_trial(self, trial: int, seed: int) -> int:
        """Score this site's calibration data for `trial` with the trial's model; return n_j."""
        refusal = self.policy.trial_refusal(trial)
        if refusal is not None:  # nothing built, nothing scored
            raise RequestError(refusal)
        rows, self.device = self.trials.site_rows(trial, self.site_id)
        return self.hold(trial, seed, rows, self.trials.record_ids(trial, self.site_id))

    def hold(self, trial: int, seed: int, rows: np.ndarray, records: np.ndarray | None = None) -> int:
        """Serve `trial` with these rows (what open_trial computed); return n_j. `records`: the
        identities of the records behind the rows (protocol.accounting.record_ids of the raw
        data), which key the budget; None: each row is a record, identified by its values."""
        # a reopened trial starts its sessions' halves afresh (a resumed coordinator asks them again
        # from their first phase; the account, not the half, decides what may be released again);
        # _owners is never cleared: session numbers are the run's (protocol.sessions), so a session
        # keeps its method across closes and reopened trials
        self.trial, self.seed, self._halves = trial, seed, {}
        self.rows = np.asarray(rows, dtype=float)
        if records is None:
            records = record_ids(self.rows)
        elif len(records) != len(self.rows):
            raise ValueError(f"{self.site_id}: {len(records)} record identities for {len(self.rows)} rows")
        self.fingerprint = self.account.hold(records)
        return int(len(self.rows))

    def answer(self, session: int, method_name: str, phase: str, body: dict):
        """The encoded response body for one request (RequestError if it cannot be served)."""
        if self.broken is not None:
            raise RequestError(f"this site's privacy account cannot be read: {self.broken}")
        if self.trial is None:
            raise RequestError("no trial is open at this site")
        if session // SESSIONS_PER_TRIAL != self.trial:
            raise RequestError(f"session {session} does not belong to the open trial {self.trial}")
        try:
            method = METHODS.get(method_name)
        except PluginError as exc:  # an installed plugin that does not load here
            raise RequestError(str(exc)) from None
        if method is None:
            raise RequestError(f"unknown method {method_name!r}")
        named, phase = phase, method.phase_table().parse(phase)
        if phase is None:
            raise RequestError(f"{method_name} has no phase {named!r}")
        try:
            encoder, body = method.codec_class().for_site(body)
        except PayloadError as exc:
            raise RequestError(str(exc)) from None
        owner = self._owners.setdefault(session, method_name)
        if owner != method_name:
            self._refuse(session, method_name, f"session {session} belongs to {owner}; a session never "
                                               f"changes its method")
        bound = self._halves.get(session)
        try:
            spend = method.spend(phase, body)
        except RequestError as exc:  # a claim the site cannot back: refused, and kept in its account
            self._refuse(session, method_name, str(exc))
        # a training's round is booked amplified by its sampling only if this site's policy trusts it,
        # and a training is one session's: the same mechanism in another session is another training
        spend = self.policy.booked(spend)
        if spend is not None and spend.kind == "zcdp" and spend.key:
            spend = replace(spend, key=request_key(spend.key, "session", session))
        refusal = self.policy.refusal(method_name, spend, self.account.budget.delta)
        if refusal is not None:
            self._refuse(session, method_name, refusal)
        if spend is not None and spend.kind == "kanon":
            earlier = self.account.cached_release(self.trial, self.fingerprint, spend)
            if earlier is not None:  # the same table again: nothing new leaves the site
                self._record(session, method_name, spend, reused=True)
                return encoder.encode(from_plain(earlier))
        if spend is not None:
            try:
                self.account.admit(self.trial, self.fingerprint, spend)
            except BudgetExceeded as exc:
                self._refuse(session, method_name, str(exc))
        if bound is None:
            rng = (PrivacyNoise() if method.site_noise and not self.policy.seeded
                   else site_rng(self.seed, self.trial, session, self.site_id))
            bound = self._halves[session] = (method_name, method.site(self.rows, rng, self.site_id))
            bound[1].identity = self.identity
            bound[1].session_memory = self._memory.setdefault(session, {})
        half = bound[1]
        unseen = half.unseen_claim(phase, body)
        if unseen is not None and self.policy.unseen_claims == "refuse":
            self._refuse(session, method_name, f"site policy: {unseen} (unseen_claims: refuse)")
        one_torch_thread()
        value = half.answer(phase, body)
        if spend is not None:
            self._record(session, method_name, spend, body=to_plain(value) if spend.kind == "kanon" else None)
        return encoder.encode(value)

    def _refuse(self, session: int, method_name: str, reason: str):
        """Refuse a request: the reason goes to the account (privacy.csv) and back to the coordinator."""
        self.account.refusal(self.trial, session, method_name, reason)
        self._save()
        raise RequestError(reason)

    def _record(self, session: int, method_name: str, spend, body=None, reused: bool = False) -> None:
        self.account.record(self.trial, session, method_name, self.fingerprint, spend, body=body, reused=reused,
                            noise=self.policy.noise)
        self._save()

    def _save(self) -> None:
        append_account(self.workdir, self.site_id, self.account.take_unsaved(), self.commit)

    @staticmethod
    def sealing_claim(method_name: str, phase: str, body: dict) -> dict:
        """What this site's sealed answer to an (already answered) request claims outside its
        ciphertext (Method.sealing_claim)."""
        return METHODS.get(method_name).sealing_claim(phase, body)

    @staticmethod
    def route(method_name: str) -> str:
        """Where this method's answers go: 'direct' (the coordinator) or 'shuffler'."""
        try:
            method = METHODS.get(method_name)
        except PluginError:
            return "direct"  # answer() refuses the request with the reason
        return method.codec_class().route if method is not None else "direct"

    def close_session(self, session: int) -> None:
        self._halves.pop(session, None)


def one_torch_thread() -> None:
    """Many site processes share few cores: in a site process that has loaded torch (a learning
    method, a torch model), torch computes on one thread. The driver decides this, never a
    sans-I/O half (which reads no environment)."""
    if in_site_process() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def to_plain(value: dict) -> dict:
    """A K-anonymous release (a dict of numpy arrays) as msgpack-able data, to keep in the account."""
    return {key: [str(array.dtype), array.tolist()] for key, array in value.items()}


def from_plain(value: dict) -> dict:
    return {key: np.asarray(items, dtype=dtype) for key, (dtype, items) in value.items()}
