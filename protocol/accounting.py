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
- K-anonymous tables (paper 004): the site releases at most `kanon_releases` distinct tables
  of the same data. A request identical to an earlier one on the same data gets the earlier
  release back, unchanged, so two answers can never be differenced; a different one beyond the
  budget is refused.

Methods that release raw values (a local quantile, every score to a trusted curator) are
recorded as `none` releases: no epsilon, listed so that a reader sees them.

The scope is `trial` (each trial's data are fresh: the account starts again for data it has
released nothing from; records are matched by the fingerprint of the data they came from, never
by the trial number a coordinator names, so naming a new trial over the same data resets
nothing) or `dataset` (one data set behind every trial, e.g. re-splits of the same file: every
release of the run counts).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import lru_cache

import msgpack
import numpy as np

SCOPES = ("trial", "dataset")
COMPOSITIONS = ("basic", "pld")
KINDS = ("dp", "kanon", "none")
PLD_MAX_EPSILON = 30.0
#: the most inputs a claim may name (a shuffle's messages, a secure sum's noisy inputs): twice the
#: largest federation Quorum runs (50,000 sites), and the bound on the work a site's check of a
#: claim costs: FMT21's bound is computed over a range that grows with the count (about 2 s at
#: 100,000 messages, 19 s at a million, terabytes at 2^62; issue 36)
MAX_CLAIMED = 100_000


#: the scenario's `sites.budget` (scenarios.scenario validates against it)
BUDGET_FIELDS = {
    "scope": {"type": "str", "choices": list(SCOPES), "default": "trial"},
    "epsilon": {"type": "float_or", "choices": ["unlimited"], "gt": 0, "default": "unlimited"},
    "delta": {"type": "float", "gt": 0, "lt": 1, "default": 1e-5},
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
    (protocol.policy) checks both."""

    kind: str
    epsilon: float = 0.0
    delta: float = 0.0
    model: str = ""
    key: bytes = b""
    k: int = 0
    contributors: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"spend kind must be one of {KINDS}")
        if self.kind == "dp" and not (0 < self.epsilon < math.inf and 0 <= self.delta < 1):
            raise ValueError(f"a DP spend needs 0 < epsilon < inf and 0 <= delta < 1, got "
                             f"({self.epsilon!r}, {self.delta!r})")


@dataclass(frozen=True)
class Budget:
    scope: str = "trial"
    epsilon: float | None = None  # None: no limit (spending is still recorded and reported)
    delta: float = 1e-5
    composition: str = "pld"
    kanon_releases: int = 1

    @staticmethod
    def from_spec(spec: dict | None) -> "Budget":
        """From a validated `sites.budget` (None: the defaults)."""
        spec = dict(spec or {})
        if spec.get("epsilon") == "unlimited":
            spec["epsilon"] = None
        return Budget(**spec)


def request_key(*parts) -> bytes:
    """A canonical digest of a request's public parameters (for K-anonymous release reuse)."""
    return hashlib.sha256(msgpack.packb(list(parts), use_bin_type=True)).digest()


def data_fingerprint(values) -> str:
    """Which data a release was made from: a digest of the site's values (never sent anywhere)."""
    array = np.ascontiguousarray(np.asarray(values, dtype=float))
    return hashlib.sha256(repr(array.shape).encode() + array.tobytes()).hexdigest()[:32]


def basic_composition(events: list[tuple[float, float]]) -> tuple[float, float]:
    """Dwork and Roth 2014, theorem 3.16: (sum epsilon_i, sum delta_i)."""
    return float(sum(e for e, _ in events)), float(sum(d for _, d in events))


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


@dataclass
class SiteAccount:
    """One site's releases under one budget; `records` is the whole state (plain data)."""

    budget: Budget
    records: list[dict] = field(default_factory=list)

    def _in_scope(self, trial: int, data: str | None = None) -> list[dict]:
        """The records a new release composes with: every one (`dataset`), or under `trial` those
        of the same data (its fingerprint: issue 36, a trial number named by the coordinator no
        longer resets a budget whose data did not change), or of the trial when no data is given."""
        if self.budget.scope == "dataset":
            return list(self.records)
        if data is not None:
            return [r for r in self.records if r["data"] == data]
        return [r for r in self.records if r["trial"] == trial]

    def dp_events(self, trial: int, data: str | None = None) -> list[tuple[float, float]]:
        return [(r["epsilon"], r["delta"]) for r in self._in_scope(trial, data) if r["kind"] == "dp"]

    def composed(self, events: list[tuple[float, float]]) -> float:
        """The epsilon the budget's composition rule gives these events at the budget's delta."""
        if self.budget.composition == "basic":
            eps, delta = basic_composition(events)
            return eps if delta <= self.budget.delta else math.inf
        return pld_composition(events, self.budget.delta)

    def cached_release(self, trial: int, data: str, spend: Spend):
        """The body of an earlier K-anonymous release answering the same request on the same
        data within the scope, or None."""
        for r in self._in_scope(trial, data):
            if r["kind"] == "kanon" and r["data"] == data and r["key"] == spend.key:
                return r["body"]
        return None

    def admit(self, trial: int, data: str, spend: Spend) -> None:
        """Raise BudgetExceeded when answering would take the site past its budget."""
        b = self.budget
        if spend.kind == "kanon":
            made = {(r["data"], r["key"]) for r in self._in_scope(trial, data) if r["kind"] == "kanon"}
            if len(made) >= b.kanon_releases:
                raise BudgetExceeded(
                    f"privacy budget: this site has made {len(made)} K-anonymous release(s) "
                    f"(at most {b.kanon_releases} per {b.scope}); a different table could be differenced "
                    f"against {'it' if len(made) == 1 else 'them'}")
        elif spend.kind == "dp" and b.epsilon is not None:
            events = self.dp_events(trial, data) + [(spend.epsilon, spend.delta)]
            total = self.composed(events)
            if total > b.epsilon * (1 + 1e-12):
                spent = self.composed(events[:-1])
                raise BudgetExceeded(
                    f"privacy budget: answering at epsilon {spend.epsilon:.4g}, delta {spend.delta:.3g} would "
                    f"bring this site's {b.composition} composition to epsilon {total:.4g} at delta {b.delta:g} "
                    f"per {b.scope}, over its budget {b.epsilon:g} (spent so far: {spent:.4g})")

    def record(self, trial: int, session: int, method: str, data: str, spend: Spend, body=None,
               reused: bool = False, noise: str = "os") -> None:
        """A release made (`reused`: an earlier K-anonymous release sent again, nothing new;
        `noise`: where its privacy noise came from, protocol.policy)."""
        self.records.append({"trial": trial, "session": session, "method": method, "kind": spend.kind,
                             "epsilon": spend.epsilon if not reused else 0.0,
                             "delta": spend.delta if not reused else 0.0, "model": spend.model,
                             "data": data, "key": spend.key, "reused": reused, "reason": "", "noise": noise,
                             "body": body if spend.kind == "kanon" and not reused else None})

    def refusal(self, trial: int, session: int, method: str, reason: str) -> None:
        """A request the budget refused (nothing released), kept for the report."""
        self.records.append({"trial": trial, "session": session, "method": method, "kind": "refused",
                             "epsilon": 0.0, "delta": 0.0, "model": "", "data": "", "key": b"",
                             "reused": False, "reason": reason, "body": None})
