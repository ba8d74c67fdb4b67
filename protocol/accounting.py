"""A site's own privacy budget, sans I/O: what it has released, what it may still release.

Each site keeps a `SiteAccount`. Before its half of a method answers a request, the site asks
the account to `admit` the request's `Spend` (computed by the method from the request the site
itself received, never from a claim it cannot check); a request that would take the site past
its `Budget` is refused with the reason, and nothing is released. What was released is
`record`ed; the account's state is plain data, so the site can keep it on disk across restarts.

Two kinds of release are budgeted:

- differential privacy: (epsilon, delta) per answered request. Composition over the scope is
  stated in the budget: `basic` (epsilons and deltas add; Dwork and Roth 2014, theorem 3.16) or
  `pld` (optimal numerical composition of the events' privacy loss distributions, Google's
  dp_accounting library; Kairouz, Oh and Viswanath 2015 for (epsilon, delta) events), whose
  epsilon at the budget's delta is never above the basic sum.
- zero-concentrated DP (issue 49): a round of private federated training (DP-FedAvg, DP-Δ-FL)
  is a rho-zCDP release (`Spend(kind="zcdp", rho=...)`; paper 001 claim 13, corrected:
  protocol.rounds_privacy). The zCDP events of a record's history are composed in zCDP and
  converted to (epsilon, delta) ONCE: their rhos add (Bun and Steinke 2016, lemma 2.3), and the
  total's RDP curve alpha * rho (plus the curves of trainings booked with amplification, below)
  is converted by dp_accounting (Canonne, Kamath and Steinke 2020, proposition 12) into
  (epsilon_z, delta_z). Alone, delta_z is the budget's delta. With (epsilon, delta) events beside
  them, (epsilon_z, delta_z) joins them as one more (epsilon, delta) event, composed under the
  budget's rule at the budget's delta, with delta_z a quarter, half or three quarters of it
  (whichever gives the least epsilon: each is a valid (epsilon, delta) bound, so their minimum
  is). Sound because every step is: zCDP composition, one conversion, then (epsilon, delta)
  composition of two guarantees on the same data (basic: Dwork and Roth theorem 3.16; pld: the
  worst-case PLD of an (epsilon, delta) event, which dominates any mechanism with that guarantee).
  Booking each round as its own (epsilon, delta) event instead would cost far more (1,000 DDG
  rounds: epsilon 52-65 against 7; tests/test_rounds_accounting.py). By default a site books the
  UNAMPLIFIED rho of every round it takes part in: it cannot check the coordinator's sampling.
  A site whose policy says `trust_sampling: true` (protocol.policy) books a training that states
  its sampling (`sampling`, `sample`, `population`, `rounds`, and `key` naming the training) at
  its amplified cost: the whole training's `rounds` rounds, each subsampled, composed once per
  (trial, key, rho, sampling) however many of its rounds the site answers (at most `rounds`:
  more is refused), whether it was sampled or not; protocol.rounds_privacy gives the curve.
- K-anonymous tables (paper 004): the site releases at most `kanon_releases` distinct tables
  of the same data. A request identical to an earlier one on the same data gets the earlier
  release back, unchanged, so two answers can never be differenced; a different one beyond the
  budget is refused.

Methods that release raw values (a local quantile, every score to a trusted curator) are
recorded as `none` releases: no epsilon, listed so that a reader sees them.

A budget is keyed by the people, not by how their data is presented (issue 47). Each of a
site's records (a row of its raw data: features and label, before any standardisation, model or
score) has an identity, `record_ids`: a 64-bit digest of the row itself, so reordering the rows,
rescoring them with another model, transforming them, or naming another trial number changes
nothing. The scope says which releases compose:

- `records` (the default): a release composes with every earlier release that used any of the
  same records, per record: the site refuses a release that would take any one of its records
  past the budget (releases over disjoint records, e.g. each trial's freshly drawn data, do not
  compose; re-splits of one file overlap, and compose where they do);
- `dataset`: every release of the site composes, whatever records it used.

`trial` is the earlier name of `records` (scenarios that say it keep working).

The defaults protect in total: a site with no budget of its own may spend epsilon
DEFAULT_EPSILON at delta DEFAULT_DELTA per record (its per-release cap, protocol.policy, is no
higher). "unlimited" exists only when written.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

import msgpack
import numpy as np

SCOPES = ("records", "dataset", "trial")  # trial: the earlier name of records
#: The protective default budget (issue 47): epsilon 3 at delta 1e-6 for each record, over every
#: release the site makes from it. Why these: epsilon 3 bounds how much any one release set can
#: sharpen an attacker's odds about a person to a factor e^3 (about 20); it is at the low end of
#: what deployed systems spend per user (Apple's and Google's local-DP telemetry spend 2-8 a
#: day, the 2020 US Census about 17 in total) and covers a study's usual few releases per record
#: (FedCP2-QQ at epsilon 1 three times, or one secure-sum histogram at epsilon 1-2). Delta 1e-6 is
#: below 1/n for any site of up to a million records. A site whose study needs more writes it.
DEFAULT_EPSILON = 3.0
DEFAULT_DELTA = 1e-6
COMPOSITIONS = ("basic", "pld")
KINDS = ("dp", "zcdp", "kanon", "none")
#: the sampling a zCDP spend may state (protocol.rounds_privacy.SAMPLINGS); amplification is booked only
#: for the two whose accounting composes per training (with_replacement books unamplified)
SAMPLINGS = ("none", "poisson", "without_replacement", "with_replacement")
AMPLIFIED = ("poisson", "without_replacement")
#: the shares of the budget's delta tried for the zCDP part when (epsilon, delta) events are beside it
ZCDP_DELTA_SHARES = (0.25, 0.5, 0.75)
PRIVATE_KINDS = ("dp", "zcdp")
PLD_MAX_EPSILON = 30.0
#: the most inputs a claim may name (a shuffle's messages, a secure sum's noisy inputs): twice the
#: largest federation Quorum runs (50,000 sites), and the bound on the work a site's check of a
#: claim costs: FMT21's bound is computed over a range that grows with the count (about 2 s at
#: 100,000 messages, 19 s at a million, terabytes at 2^62; issue 36)
MAX_CLAIMED = 100_000


#: the scenario's `sites.budget` (scenarios.scenario validates against it)
BUDGET_FIELDS = {
    "scope": {"type": "str", "choices": list(SCOPES), "default": "records"},
    "epsilon": {"type": "float_or", "choices": ["unlimited"], "gt": 0, "default": DEFAULT_EPSILON},
    "delta": {"type": "float", "gt": 0, "lt": 1, "default": DEFAULT_DELTA},
    "composition": {"type": "str", "choices": list(COMPOSITIONS), "default": "pld"},
    "kanon_releases": {"type": "int", "min": 1, "default": 1},
}


class BudgetExceeded(ValueError):
    """A request the site's budget does not allow; str(error) is the site's reason."""


@dataclass(frozen=True)
class Spend:
    """What answering one request releases, as the site computes it from the request.

    kind "dp": an (epsilon, delta)-DP release (`model` says which guarantee: local, shuffled,
    securely summed); "kanon": a K-anonymous table, `key` the canonical request it answers;
    "none": a release with no formal privacy. `k`: a K-anonymous table's K; `contributors`: the
    fewest inputs a claim whose privacy rests on other sites' inputs was planned for (a shuffle's
    messages, a secure sum's noisy inputs; 0 when the release stands alone). The site's policy
    (protocol.policy) checks both.

    kind "zcdp": a rho-zCDP release (`rho`), e.g. one round of private federated training
    (protocol.rounds_privacy.round_rho). `sampling`, `sample`, `population`, `rounds`: what the
    request says of the training it belongs to (each round samples `sample` of `population`
    clients; "none": no sampling stated), with `key` naming the training; `trusted`: the site's
    policy trusts that sampling (protocol.policy.SitePolicy.booked sets it; methods never do), and
    only then is the training booked amplified. `curator`: the release goes in the clear to a
    coordinator trusted to add the noise (protocol.policy's `curator`)."""

    kind: str
    epsilon: float = 0.0
    delta: float = 0.0
    model: str = ""
    key: bytes = b""
    k: int = 0
    contributors: int = 0
    rho: float = 0.0
    sampling: str = "none"
    sample: int = 0
    population: int = 0
    rounds: int = 1
    trusted: bool = False
    curator: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"spend kind must be one of {KINDS}")
        if self.kind == "dp" and not (0 < self.epsilon < math.inf and 0 <= self.delta < 1):
            raise ValueError(f"a DP spend needs 0 < epsilon < inf and 0 <= delta < 1, got "
                             f"({self.epsilon!r}, {self.delta!r})")
        if self.kind == "zcdp":
            if not 0 < self.rho < math.inf:
                raise ValueError(f"a zCDP spend needs 0 < rho < inf, got {self.rho!r}")
            if self.sampling not in SAMPLINGS:
                raise ValueError(f"sampling must be one of {SAMPLINGS}, got {self.sampling!r}")
            if self.sampling != "none" and not (1 <= self.sample and 1 <= self.population and self.rounds >= 1
                                                and (self.sample <= self.population
                                                     or self.sampling == "with_replacement")):
                raise ValueError(f"a sampled zCDP spend needs 1 <= sample <= population and rounds >= 1, got "
                                 f"({self.sample!r}, {self.population!r}, {self.rounds!r})")

    @property
    def amplified(self) -> bool:
        """Booked at the amplified cost of its training (trusted sampling the account composes)."""
        return self.kind == "zcdp" and self.trusted and self.sampling in AMPLIFIED and bool(self.key)

    def release_epsilon(self, delta: float) -> float:
        """This release's own epsilon at `delta`: epsilon for "dp", one round's unamplified rho
        converted for "zcdp" (the per-release cap, protocol.policy's max_epsilon), 0 otherwise."""
        if self.kind == "dp":
            return self.epsilon
        if self.kind == "zcdp":
            from protocol.rounds_privacy import zcdp_epsilon

            return zcdp_epsilon(self.rho, delta)
        return 0.0


class ZcdpEvent(NamedTuple):
    """A zCDP release in a record's history: `rho` (per round when amplified); an amplified one
    carries its training's sampling and `group` ("trial:key"), and each group counts once."""

    rho: float
    sampling: str = "none"
    sample: int = 0
    population: int = 0
    rounds: int = 1
    group: str = ""

    @property
    def amplified(self) -> bool:
        return bool(self.group) and self.sampling in AMPLIFIED


def split_events(events) -> tuple[list[tuple[float, float]], list[ZcdpEvent]]:
    """((epsilon, delta) events, zCDP events) of a history."""
    dp, z = [], []
    for event in events:
        (z if isinstance(event, ZcdpEvent) else dp).append(event)
    return dp, z


def zcdp_composition(events: list[ZcdpEvent], delta: float) -> float:
    """The epsilon at `delta` of zCDP events composed in zCDP and converted once: unamplified
    rhos add; each amplified training (group) counts once, its `rounds` subsampled rounds' RDP
    curve added to the rest (protocol.rounds_privacy.combined_epsilon)."""
    from protocol.rounds_privacy import combined_epsilon

    plain = sum(e.rho for e in events if not e.amplified)
    trainings = {(e.group, e.rho, e.sampling, e.sample, e.population, e.rounds) for e in events if e.amplified}
    return combined_epsilon(plain, [(rho, rounds, sampling, sample, population)
                                    for _, rho, sampling, sample, population, rounds in sorted(trainings)], delta)


def event_of(record: dict):
    """A release record's composition event: (epsilon, delta), or a ZcdpEvent."""
    if record["kind"] == "zcdp":
        amplified = record.get("sampling", "none") in AMPLIFIED and record.get("trusted", False) and record.get("key")
        return ZcdpEvent(float(record["rho"]), record.get("sampling", "none"), int(record.get("sample", 0)),
                         int(record.get("population", 0)), int(record.get("rounds", 1)),
                         f"{record['trial']}:{bytes(record['key']).hex()}" if amplified else "")
    return (record["epsilon"], record["delta"])


def spend_event(spend: Spend, trial: int):
    """The composition event a spend would add (a release record's event_of)."""
    if spend.kind == "zcdp":
        return ZcdpEvent(float(spend.rho), spend.sampling, spend.sample, spend.population, spend.rounds,
                         f"{trial}:{spend.key.hex()}" if spend.amplified else "")
    return (spend.epsilon, spend.delta)


@dataclass(frozen=True)
class Budget:
    scope: str = "records"
    epsilon: float | None = DEFAULT_EPSILON  # None: no limit, only when written (spending is still recorded)
    delta: float = DEFAULT_DELTA
    composition: str = "pld"
    kanon_releases: int = 1

    @staticmethod
    def from_spec(spec: dict | None) -> "Budget":
        """From a validated `sites.budget` (None: the defaults)."""
        spec = dict(spec or {})
        if spec.get("epsilon") == "unlimited":
            spec["epsilon"] = None
        if spec.get("scope") == "trial":
            spec["scope"] = "records"
        return Budget(**spec)

    @property
    def per_record(self) -> bool:
        return self.scope != "dataset"


def request_key(*parts) -> bytes:
    """A canonical digest of a request's public parameters (for K-anonymous release reuse)."""
    return hashlib.sha256(msgpack.packb(list(parts), use_bin_type=True)).digest()


def record_ids(*columns) -> np.ndarray:
    """Each record's identity (uint64): the first 8 bytes of BLAKE2b over the record's own values,
    row by row across `columns` (e.g. the raw features X and the label y, before any
    standardisation, model or score). Independent of the rows' order; the same person's row gets
    the same identity in every trial, split or model (two identical rows share one identity,
    which can only make a budget stricter). Never sent anywhere: it stays in the site's account."""
    parts = [np.ascontiguousarray(np.asarray(c, dtype=float).reshape(len(np.asarray(c)), -1)) for c in columns]
    if not parts or len(parts[0]) == 0:
        return np.zeros(0, dtype=np.uint64)
    rows = np.ascontiguousarray(np.concatenate(parts, axis=1))
    view = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    return np.fromiter((int.from_bytes(hashlib.blake2b(row.tobytes(), digest_size=8).digest(), "little")
                        for row in view), dtype=np.uint64, count=len(view))


def record_set(ids) -> tuple[str, np.ndarray]:
    """(digest, sorted distinct identities) of a set of records: the digest names the set in the
    account whatever the order the records came in."""
    unique = np.unique(np.asarray(ids, dtype=np.uint64))
    return hashlib.sha256(unique.tobytes()).hexdigest()[:32], unique


def data_fingerprint(values) -> str:
    """Which records a release was made from, for data held without identities (each row of
    `values` is a record): the record set's digest (record_set)."""
    return record_set(record_ids(values))[0]


def basic_composition(events: list, delta: float = DEFAULT_DELTA) -> tuple[float, float]:
    """Dwork and Roth 2014, theorem 3.16: (sum epsilon_i, sum delta_i). zCDP events (ZcdpEvent)
    count as one (epsilon, delta) event, their zCDP composition converted once at `delta` (half of
    it when (epsilon, delta) events are beside them)."""
    dp, z = split_events(events)
    if z:
        share = delta / 2.0 if dp else delta
        dp = dp + [(zcdp_composition(z, share), share)]
    return float(sum(e for e, _ in dp)), float(sum(d for _, d in dp))


@lru_cache(maxsize=4096)
def _pld(epsilon: float, delta: float):
    from dp_accounting.pld import common, privacy_loss_distribution

    return privacy_loss_distribution.from_privacy_parameters(common.DifferentialPrivacyParameters(epsilon, delta))


def pld_composition(events: list[tuple[float, float]], delta: float) -> float:
    """The smallest epsilon such that the composition of the (epsilon_i, delta_i)-DP events is
    (epsilon, delta)-DP, by composing the events' worst-case privacy loss distributions
    (dp_accounting; optimal for (epsilon, delta) events, Kairouz, Oh and Viswanath 2015,
    computed with a pessimistic discretisation). inf when delta does not exceed the events'
    combined delta; 0 for no event. Events with epsilon above PLD_MAX_EPSILON (where the PLD
    gains nothing and its grid would not fit in memory) are added by the basic rule."""
    if not events:
        return 0.0
    if any(isinstance(e, ZcdpEvent) for e in events):
        raise TypeError("pld_composition takes (epsilon, delta) events; SiteAccount.composed converts zCDP ones")
    large = [(e, d) for e, d in events if e > PLD_MAX_EPSILON]
    if large:
        small = [(e, d) for e, d in events if e <= PLD_MAX_EPSILON]
        eps_large, delta_large = basic_composition(large)
        return eps_large + (pld_composition(small, delta - delta_large) if small else
                            (0.0 if delta_large < delta else math.inf))
    if delta <= 1.0 - math.prod(1.0 - d for _, d in events):
        return math.inf
    total = None
    for e, d in events:
        total = _pld(float(e), float(d)) if total is None else total.compose(_pld(float(e), float(d)))
    return float(min(total.get_epsilon_for_delta(delta), basic_composition(events)[0]))


class RecordLedger:
    """The record sets and releases of the accounts that share one data holder's records, indexed
    by record: a site host's sites (sites.trials.TrialCache), over which a study may re-split one
    file, moving a person from one site id to another between trials. A release composes with
    every release of any account of the ledger that used one of its records (red team, issue
    47: with a ledger per site id, 5 site ids re-split over 25 trials let one person's data into
    9 epsilon-1 releases under budgets of 3). An account alone has a ledger of its own."""

    def __init__(self) -> None:
        self.sets: dict[str, np.ndarray] = {}  # digest -> sorted record identities
        self.holding: dict[int, set[str]] = {}  # record identity -> the digests of the sets holding it
        self.releases: dict[str, list[dict]] = {}  # digest -> the releases (not refusals) made from it
        self._overlapping: dict[str, list[str]] = {}  # overlapping()'s answers until a new set comes

    def add_set(self, digest: str, ids: np.ndarray) -> None:
        if digest in self.sets:
            return
        self.sets[digest] = ids
        self._overlapping.clear()
        for identity in ids.tolist():
            self.holding.setdefault(identity, set()).add(digest)

    def add_release(self, record: dict) -> None:
        self.releases.setdefault(record["data"], []).append(record)

    def overlapping(self, digest: str) -> list[str]:
        """The digests of the sets sharing a record with `digest`'s (itself included)."""
        ids = self.sets.get(digest)
        if ids is None:  # a set of unknown identities (an account written before them): itself only
            return [digest]
        if digest not in self._overlapping:  # once per set and new set, not per request
            found: set[str] = set()
            for identity in ids.tolist():
                found |= self.holding.get(identity, set())
            self._overlapping[digest] = sorted(found)
        return self._overlapping[digest]


@dataclass
class SiteAccount:
    """One site's releases under one budget. `records` are the releases and refusals (plain
    data); `sets` the record sets they were made from ({digest: sorted identities}, kept in the
    account as entries of kind "records", written before the first release that uses them);
    `ledger` the record ledger it shares with the accounts of the same data holder (its own when
    None)."""

    budget: Budget
    records: list[dict] = field(default_factory=list)
    sets: dict[str, np.ndarray] = field(default_factory=dict)
    ledger: RecordLedger | None = None

    def __post_init__(self) -> None:
        entries, self.records = self.records, []
        for entry in entries:  # an account as read from storage: sets and releases interleaved
            if entry.get("kind") == "records":
                self.sets[entry["data"]] = np.frombuffer(entry["ids"], dtype=np.uint64)
            else:
                self.records.append(entry)
        if self.ledger is None:
            self.ledger = RecordLedger()
        for digest, ids in self.sets.items():
            self.ledger.add_set(digest, ids)
        for record in self.records:
            if record["kind"] != "refused":
                self.ledger.add_release(record)
        self._held: dict[str, np.ndarray] = {}  # sets held but not yet written
        self._unsaved: list[dict] = []

    def hold(self, ids) -> str:
        """The digest of the record set `ids` a site now serves from (known to the ledger from
        here on; written to the account with the first release made from it)."""
        digest, unique = record_set(ids)
        if digest not in self.sets:
            self._held[digest] = unique
        self.ledger.add_set(digest, unique)
        return digest

    def take_unsaved(self) -> list[dict]:
        """The entries made since the last call, in order, for the site's storage."""
        entries, self._unsaved = self._unsaved, []
        return entries

    def _in_scope(self, trial: int, data: str | None = None) -> list[dict]:
        """The records a new release from the record set `data` composes with: every release of
        this site (`dataset`), or every release of the ledger made from a set sharing any record
        with it (`records`); this site's by trial number only when no data is given (reports)."""
        if not self.budget.per_record:
            return list(self.records)
        if data is None:
            return [r for r in self.records if r["trial"] == trial]
        return [r for d in self.ledger.overlapping(data) for r in self.ledger.releases.get(d, ())]

    def dp_events(self, trial: int, data: str | None = None) -> list:
        """Every DP event in scope (a record of the set took part in at least one of them):
        (epsilon, delta) pairs and ZcdpEvents."""
        return [event_of(r) for r in self._in_scope(trial, data) if r["kind"] in PRIVATE_KINDS]

    def dp_groups(self, trial: int, data: str | None = None) -> list[list[tuple[float, float]]]:
        """The DP events each record of the set `data` took part in, one list per distinct history
        (records used by the same earlier releases share one): what a new release composes with,
        record by record. One list under `dataset`, or when the set's identities are unknown."""
        scope = [r for r in self._in_scope(trial, data) if r["kind"] in PRIVATE_KINDS]
        sets = self.ledger.sets
        mine = sets.get(data) if data is not None else None
        if not self.budget.per_record or mine is None or not scope:
            return [[event_of(r) for r in scope]]
        by_set: dict[str, list] = {}
        for r in scope:
            by_set.setdefault(r["data"], []).append(event_of(r))
        digests = list(by_set)
        member = np.stack([np.ones(len(mine), dtype=bool) if d == data else
                           np.isin(mine, sets[d], assume_unique=True) for d in digests], axis=1)
        return [[event for k in np.flatnonzero(pattern) for event in by_set[digests[k]]]
                for pattern in np.unique(member, axis=0)]

    def histories(self, records: list[dict] | None = None) -> list[list[tuple[float, float]]]:
        """The DP events of each record's history among `records` (default: all), one list per
        distinct history: under `records` what each person's data went into (reports take the
        worst); under `dataset` one list of every event. Releases from sets of unknown identities
        (an account written before identities) count as one record set each."""
        dp = [r for r in (self.records if records is None else records) if r["kind"] in PRIVATE_KINDS]
        if not self.budget.per_record or not dp:
            return [[event_of(r) for r in dp]]
        by_set: dict[str, list] = {}
        for r in dp:
            by_set.setdefault(r["data"], []).append(event_of(r))
        known = [d for d in by_set if d in self.sets]
        lists = [events for d, events in by_set.items() if d not in self.sets]
        if known:
            universe = np.unique(np.concatenate([self.sets[d] for d in known]))
            member = np.stack([np.isin(universe, self.sets[d], assume_unique=True) for d in known], axis=1)
            lists += [[e for k in np.flatnonzero(pattern) for e in by_set[known[k]]]
                      for pattern in np.unique(member, axis=0)]
        return lists

    def composed(self, events: list) -> float:
        """The epsilon the budget's composition rule gives these events at the budget's delta:
        zCDP events composed in zCDP and converted once (alone: at the budget's delta; beside
        (epsilon, delta) events: as one more such event, at the share of delta that gives the
        least epsilon; module docstring)."""
        dp, z = split_events(events)
        if not z:
            return self._composed_dp(dp, self.budget.delta)
        if not dp:
            return zcdp_composition(z, self.budget.delta)
        best = math.inf
        for share in ZCDP_DELTA_SHARES:
            part = share * self.budget.delta
            best = min(best, self._composed_dp(dp + [(zcdp_composition(z, part), part)], self.budget.delta))
        return best

    def _composed_dp(self, events: list[tuple[float, float]], delta: float) -> float:
        if self.budget.composition == "basic":
            eps, total = basic_composition(events)
            return eps if total <= delta else math.inf
        return pld_composition(events, delta)

    def cached_release(self, trial: int, data: str, spend: Spend):
        """The body of an earlier K-anonymous release answering the same request on the same
        records within the scope, or None."""
        for r in self.records:
            if r["kind"] == "kanon" and r["data"] == data and r["key"] == spend.key:
                return r["body"]
        return None

    def admit(self, trial: int, data: str, spend: Spend) -> None:
        """Raise BudgetExceeded when answering would take the site (under `records`: any one of
        the set's records) past its budget."""
        b = self.budget
        per = "record" if b.per_record else "dataset"
        if spend.kind == "kanon":
            made = {(r["data"], r["key"]) for r in self._in_scope(trial, data) if r["kind"] == "kanon"}
            if len(made) >= b.kanon_releases:
                raise BudgetExceeded(
                    f"privacy budget: this site has made {len(made)} K-anonymous release(s) of these records "
                    f"(at most {b.kanon_releases} per {per}); a different table could be differenced "
                    f"against {'it' if len(made) == 1 else 'them'}")
        elif spend.kind == "zcdp" and spend.amplified and self._participations(trial, data, spend) >= spend.rounds:
            raise BudgetExceeded(
                f"privacy budget: this site has answered {spend.rounds} round(s) of this training, all the "
                f"{spend.rounds} its amplified booking covers (sampling {spend.sample} of {spend.population})")
        elif spend.kind in PRIVATE_KINDS and b.epsilon is not None:
            worst, total = [], -1.0
            new = spend_event(spend, trial)
            for events in self.dp_groups(trial, data):
                composed = self.composed(events + [new])
                if composed > total:
                    worst, total = events, composed
            if total > b.epsilon * (1 + 1e-12):
                if spend.kind == "zcdp":
                    what = (f"rho {spend.rho:.4g} (zCDP; one round alone epsilon {spend.release_epsilon(b.delta):.4g} "
                            f"at delta {b.delta:g}" + (f"; booked amplified, {spend.rounds} rounds sampling "
                                                      f"{spend.sample} of {spend.population} ({spend.sampling})"
                                                      if spend.amplified else "; unamplified") + ")")
                else:
                    what = f"epsilon {spend.epsilon:.4g}, delta {spend.delta:.3g}"
                raise BudgetExceeded(
                    f"privacy budget: answering at {what} would "
                    f"bring this site's {b.composition} composition to epsilon {total:.4g} at delta {b.delta:g} "
                    f"per {per}, over its budget {b.epsilon:g} (spent so far: {self.composed(worst):.4g})")

    def _participations(self, trial: int, data: str, spend: Spend) -> int:
        """The rounds of the amplified training `spend` belongs to that this site has answered."""
        group = spend_event(spend, trial)
        return sum(1 for r in self._in_scope(trial, data) if r["kind"] == "zcdp" and event_of(r) == group)

    def _append(self, entry: dict) -> None:
        data = entry["data"]
        if data in self._held:  # the set is written before the first release made from it
            ids = self._held.pop(data)
            self.sets[data] = ids
            self._unsaved.append({"kind": "records", "data": data, "ids": ids.tobytes()})
        self.records.append(entry)
        self._unsaved.append(entry)
        if entry["kind"] != "refused":
            self.ledger.add_release(entry)

    def record(self, trial: int, session: int, method: str, data: str, spend: Spend, body=None,
               reused: bool = False, noise: str = "os") -> None:
        """A release made (`reused`: an earlier K-anonymous release sent again, nothing new;
        `noise`: where its privacy noise came from, protocol.policy)."""
        entry = {"trial": trial, "session": session, "method": method, "kind": spend.kind,
                 "epsilon": spend.epsilon if not reused else 0.0,
                 "delta": spend.delta if not reused else 0.0, "model": spend.model,
                 "data": data, "key": spend.key, "reused": reused, "reason": "", "noise": noise,
                 "body": body if spend.kind == "kanon" and not reused else None}
        if spend.kind == "zcdp":  # plain data, so the account keeps it on disk (sites.storage)
            entry.update({"rho": float(spend.rho), "sampling": spend.sampling, "sample": int(spend.sample),
                          "population": int(spend.population), "rounds": int(spend.rounds),
                          "trusted": bool(spend.amplified)})
        self._append(entry)

    def refusal(self, trial: int, session: int, method: str, reason: str) -> None:
        """A request the budget refused (nothing released), kept for the report."""
        self._append({"trial": trial, "session": session, "method": method, "kind": "refused",
                      "epsilon": 0.0, "delta": 0.0, "model": "", "data": "", "key": b"",
                      "reused": False, "reason": reason, "body": None})
