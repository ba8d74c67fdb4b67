"""Secure aggregation as two sans-I/O state machines: `SecAggServer` (the coordinator's half)
and `SecAggClient` (a site's half). Bonawitz et al. 2017, figure 4 (the semi-honest protocol),
with SecAgg+'s neighbourhoods (Bell et al. 2020) when the graph is sparse.

Phases (each one request -> response between the coordinator and every live site):
  advertise  site u answers with two X25519 public keys (c_u for share encryption, s_u for masks).
  share      the coordinator sends u its neighbours' keys and Shamir indices; u draws a self-mask
             seed b_u, splits b_u and its mask key s_u^SK into shares for its neighbours and
             itself (threshold t), and answers with one AES-GCM ciphertext per neighbour.
  mask       the coordinator forwards to u the ciphertexts addressed to it (from neighbours that
             answered `share`, the set U2); u answers with
             y_u = x_u + PRG(b_u) + sum_{v in N(u) & U2} sign(u, v) PRG(s_uv)   (mod M).
  unmask     the coordinator names the survivors U3 (sent y) and the dropped U2 \\ U3 of u's
             neighbourhood; u answers with its share of b_v for each survivor and of s_d^SK for
             each dropped site, never both for the same site.
The server then rebuilds each survivor's b_v and each dropped site's s_d^SK from any t shares and
removes the masks: sum_{u in U3} x_u (mod M), exactly. Fewer than t live holders for any needed
secret, or fewer than t sites in a phase, ends the session with the reason. Shares that are off
the polynomial of the others are corrected while at most floor((n - t) / 2) of a secret's n are
(Reed-Solomon decoding, protocol.secagg.unmasking), and their holders named in
`Aggregate.wrong_shares`; such a holder's own input stays in the sum (taking it out would need its
mask key's shares, and with its self mask's already rebuilt that would reveal its input). More
wrong shares than that end the session, naming the holders found wrong in other secrets.

The coordinator sees public keys, ciphertexts it cannot open, and masked vectors; the pairwise
masks cancel only in the sum and the self masks only come off for sites whose y it holds.

One question for every contributor (issue 47): each site binds its half to the request digest
of the question it was asked (`context`, Method.request_digest of its advertise request, per-site
fields left out). The digest travels inside every share ciphertext it sends (authenticated by the
pair's AES-GCM key, which the coordinator does not hold), and a site opens the ciphertexts it
received before it masks: one whose digest differs from its own means the coordinator asked
the two of them different questions, and the site refuses to mask, naming it
(DIFFERENT_QUESTIONS), so no input of a mixed sum is ever computed. The digest also enters the
derivation of every pairwise mask key, so that even a site that did not check could not have its
answer cancel against a neighbour's answer to another question: the sum would not unmask.

Two modes (SecAggParams.mode, in the request digest: every site runs the same one):

  active       (the default) Bonawitz et al.'s protections against a server that lies (section 6,
               figure 4's malicious variant), with SecAgg+'s neighbourhoods. Each site signs the
               keys it advertises with its long-term key (protocol.secagg.identity), and checks
               every peer's signature against the party registry before it shares anything, so a
               key the coordinator made is refused, naming the peer (FORGED). The graph is drawn
               from a seed every site computes (graph.graph_seed), and each site checks that the
               peers it is sent are its neighbours in it. A consistency round comes between mask
               and unmask: each survivor signs its view (the status of itself and each neighbour:
               survived, dropped after sharing, or absent), and before it releases any unmasking
               share it checks the signatures of at least t of its neighbourhood on views that
               agree with its own wherever they overlap (under a full graph: the one survivor set),
               so a coordinator that names different survivors to different sites gets no share,
               and the session ends naming the disagreement (INCONSISTENT).
  semi-honest  Bonawitz et al.'s figure 4 without those: cheaper by one round and the signatures,
               with the server trusted to relay keys and survivor lists faithfully; only a study
               whose sites' policies take it (protocol.policy `secagg`) can use it.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from protocol.secagg import primitives as crypto
from protocol.secagg.graph import default_threshold, graph_seed, harary_by_index
from protocol.secagg.identity import SIGNATURE_BYTES, SiteIdentity
from protocol.secagg.shamir import SHARE_BYTES, share_from_bytes, share_to_bytes, split_secret
from protocol.secagg.unmasking import PairwiseMasks, Ring, SelfMask, unmask

#: What each phase of PHASE_TABLE is (its row's `role`): the halves ask the table for a phase's
#: role (`role_of`) or for the phase of a role (`phase_of`), never compare a phase's name.
#: the question: the request carries the secure-aggregation parameters, the session nonce and the
#: method's public parameters, which a site checks, books and binds its half to; it answers keys
QUESTION = "question"
#: the request names how many sites advertised (`live`) and the neighbours' keys; a site answers shares
SHARES = "shares"
#: a site answers with its masked input
MASKED_INPUT = "masked input"
#: the request names the survivors and a site signs its view of them (the active mode's consistency round)
SURVIVORS = "survivors"
#: a site answers with its shares of the survivors' self masks and of the dropped sites' mask keys
UNMASKING = "unmasking"


@dataclass(frozen=True)
class SecAggPhase:
    """One row of PHASE_TABLE: a phase's wire name, what it is (`role`), the kind of a site's
    answer in it, the phase after it in the active and in the semi-honest mode (None: the server
    has the sum), and whether its request may name the survivors (consistency's, and unmask's in
    the semi-honest mode, which has no consistency round), which a site holds to its claim."""

    name: str
    role: str
    answer: str
    active: str | None
    semi_honest: str | None
    names_survivors: bool = False

    def following(self, mode: str) -> str | None:
        """The phase after this one in `mode` (one of MODES), or None."""
        return {"active": self.active, "semi-honest": self.semi_honest}[mode]


#: SecAgg+ as a table (the protocol, read top to bottom): each phase, what it is, the kind of answer
#: a site sends in it, and the phase after it (None: the server has the sum). Dispatch follows it.
PHASE_TABLE = (
    #           phase          role          answer       next: active   semi-honest
    SecAggPhase("advertise",   QUESTION,     "keys",      "share",       "share"),
    SecAggPhase("share",       SHARES,       "shares",    "mask",        "mask"),
    SecAggPhase("mask",        MASKED_INPUT, "masked",    "consistency", "unmask"),
    SecAggPhase("consistency", SURVIVORS,    "signature", "unmask",      None, names_survivors=True),  # active only
    SecAggPhase("unmask",      UNMASKING,    "unmask",    None,          None, names_survivors=True),
)
MODES = ("active", "semi-honest")
ROWS = {row.name: row for row in PHASE_TABLE}
ANSWER_KIND = {row.name: row.answer for row in PHASE_TABLE}
NEXT_PHASE = {mode: {row.name: row.following(mode) for row in PHASE_TABLE} for mode in MODES}


def row_of(phase: str) -> SecAggPhase | None:
    """The row of PHASE_TABLE for a phase name, or None for anything the table lacks."""
    return ROWS.get(phase) if isinstance(phase, str) else None


def role_of(phase: str) -> str | None:
    """What a SecAgg phase is (its row's role: QUESTION, SHARES, ...), or None for a name the table lacks."""
    row = row_of(phase)
    return row.role if row is not None else None


def phase_of(role: str) -> str:
    """The name of the phase whose row has `role`, e.g. phase_of(QUESTION) == "advertise"."""
    return next(row.name for row in PHASE_TABLE if row.role == role)


def names_survivors(phase: str) -> bool:
    """Whether a phase's request may name the survivors (its row says so)."""
    row = row_of(phase)
    return row is not None and row.names_survivors


def mode_phases(mode: str) -> tuple[str, ...]:
    """A mode's phases in order: the table's first, then each row's next in that mode."""
    phases = [PHASE_TABLE[0].name]
    while NEXT_PHASE[mode][phases[-1]] is not None:
        phases.append(NEXT_PHASE[mode][phases[-1]])
    return tuple(phases)


#: each mode's phases in order
MODE_PHASES = {mode: mode_phases(mode) for mode in MODES}
PHASES = MODE_PHASES["active"]
MAX_LENGTH = 1 << 24
#: what a site's refusal to mask says when a neighbour's shares answer another question (the
#: coordinator half recognises it and ends the session with the reason)
DIFFERENT_QUESTIONS = "asked different questions"
#: a site's refusal when keys it was sent are not signed by the peer they are named for
FORGED = "forged keys"
#: a site's refusal when its neighbours signed other views of who survived, or not enough signed
INCONSISTENT = "survivor sets disagree"
#: a site's refusal when its peers are not its neighbours in the session's public graph
OTHER_GRAPH = "not my neighbours in the session's graph"
#: a site's refusal when it is named fewer survivors than the sum's noise was claimed for, where it
#: sees them all (protocol.methods.secure_sum; an honest coordinator stops before asking: before_unmask)
SHORT_OF_CLAIM = "fewer than the inputs the sum's noise was claimed for"
#: a site's refusal of a session nonce it has answered before (its signatures would replay)
REPLAYED = "a session nonce answered before"
#: a site's refusal of a request an honest coordinator never sends (wrong types, sizes, ranges)
MALFORMED = "a malformed secure-aggregation request"
#: refusals that mean the coordinator lied: the session ends with the first, nothing unmasked
LIES = (DIFFERENT_QUESTIONS, FORGED, INCONSISTENT, OTHER_GRAPH, SHORT_OF_CLAIM, REPLAYED, MALFORMED)
#: session nonces an honest coordinator draws: [0, 2^62)
NONCE_RANGE = 1 << 62
#: the most sites a session may name (protocol.engine.MAX_PLANNED_N): a site computes its own
#: neighbourhood in O(k) whatever the count, but a count is still refused past what any plan holds
MAX_SITES = 1_000_000
#: a view's statuses: survived (in U3), dropped after sharing (U2 \ U3), absent (not in U2)
SURVIVED, DROPPED, ABSENT = b"S", b"D", b"A"


class SecAggRefusal(ValueError):
    """A site refuses a secure-aggregation request (str(error) says why)."""


@dataclass(frozen=True)
class SecAggParams:
    """Public parameters: ring Z_M with M = 2^modulus_bits, vector length, neighbourhood size k
    (k >= m - 1: full graph), the threshold t of the Shamir sharing, and m, the sites the session
    asked (0: not said), and the mode (active or semi-honest). Every site is sent the same
    parameters (they are in the request digest), so every site knows whether the graph is full,
    and a claim of more inputs than m is a lie any site can see (issue 48)."""

    modulus_bits: int
    length: int
    degree: int
    threshold: int
    sites: int = 0
    mode: str = "active"

    def __post_init__(self):
        if not 1 <= self.modulus_bits <= 64:
            raise ValueError(f"modulus_bits must lie in [1, 64], got {self.modulus_bits}")
        if not 1 <= self.length <= MAX_LENGTH:
            raise ValueError(f"vector length must lie in [1, {MAX_LENGTH}], got {self.length}")
        if self.degree < 1 or self.threshold < 1:
            raise ValueError("degree and threshold must be positive")
        if self.threshold < majority(self.degree + 1):
            raise ValueError(f"threshold {self.threshold} is below a strict majority of the "
                             f"{self.degree + 1} holders of each secret ({majority(self.degree + 1)})")
        if self.threshold > self.degree + 1:
            raise ValueError(f"threshold {self.threshold} exceeds the {self.degree + 1} holders of each secret")
        if isinstance(self.sites, bool) or not isinstance(self.sites, int) or not 0 <= self.sites <= MAX_SITES:
            raise ValueError(f"sites must be a count up to {MAX_SITES}, got {self.sites!r}")
        if self.sites and self.degree > self.sites - 1:
            raise ValueError(f"degree {self.degree} exceeds the {self.sites - 1} other sites of the session")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.degree % 2 and not self.full:
            raise ValueError(f"degree {self.degree} is odd: a sparse graph joins each site to k / 2 on either side "
                             f"(an even k, or k >= m - 1 for the full graph)")
        if self.mode == "active" and self.threshold < default_threshold(self.degree, "active"):
            raise ValueError(f"threshold {self.threshold} is at most two thirds of the {self.degree + 1} holders of "
                             f"each secret: the active mode needs {default_threshold(self.degree, 'active')} or more "
                             f"(two survivor views signed by t holders each must share more than a third of them)")

    @property
    def active(self) -> bool:
        return self.mode == "active"

    @property
    def phases(self) -> tuple[str, ...]:
        return MODE_PHASES[self.mode]

    @property
    def full(self) -> bool:
        """Every site is every other's neighbour (the site sees the whole session)."""
        return bool(self.sites) and self.degree >= self.sites - 1

    @property
    def modulus(self) -> int:
        return 1 << self.modulus_bits

    def as_body(self) -> dict:
        return {"modulus_bits": self.modulus_bits, "length": self.length, "degree": self.degree,
                "threshold": self.threshold, "sites": self.sites, "mode": self.mode}


def majority(holders: int) -> int:
    return holders // 2 + 1


@dataclass
class Aggregate:
    """What secure aggregation returns: the sum of the survivors' inputs, or why there is none."""

    total: np.ndarray | None  # uint64 in [0, M), or None when aborted
    included: list[str]  # U3: the sites whose inputs are in the sum
    reason: str = ""
    dropped: dict[str, str] = field(default_factory=dict)  # site -> phase where it was lost
    #: holder -> the sites whose secrets it sent an unmask share of that was off the polynomial of
    #: the other holders' shares (corrected and left out: robust unmasking, issue 48)
    wrong_shares: dict[str, list[str]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.total is not None


def add_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """(a + b) mod 2^bits on uint64 (wrap-around of uint64 is mod 2^64, which 2^bits divides)."""
    out = a + b
    return out & np.uint64((1 << bits) - 1) if bits < 64 else out


def sub_mod(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    out = a - b
    return out & np.uint64((1 << bits) - 1) if bits < 64 else out


# --------------------------------------------------------------------------- server -----------

class SecAggServer:
    """The coordinator's half: `start()` gives the advertise requests; `advance(phase, answers,
    dropped)` gives the next phase's requests (a dict) or the final `Aggregate`."""

    def __init__(self, params: SecAggParams, sites: list[str], nonce: int, rng: np.random.Generator,
                 context: bytes = b"") -> None:
        """context: the request digest of the session's question, to which the sites bind their
        mask keys (needed to rebuild a dropped site's pairwise masks)."""
        self.params, self.sites, self.nonce, self.rng = params, sorted(sites), nonce, rng
        self.context = context
        self.keys: dict[str, dict[str, bytes]] = {}
        self.index: dict[str, int] = {}
        self.neighbours: dict[str, frozenset[str]] = {}
        self.shared: frozenset[str] = frozenset()  # U2: sent valid shares (their ciphertexts are forwarded, not kept)
        self.masked: dict[str, np.ndarray] = {}
        self.lost: dict[str, str] = {}
        self.full = False  # every live site is every other's neighbour

    def start(self) -> dict[str, dict]:
        return {s: {"params": self.params.as_body()} for s in self.sites}

    def advance(self, phase: str, answers: Mapping[str, Any], dropped: Mapping[str, str]):
        for site, reason in dropped.items():
            self.lost[site] = f"{phase}: {reason}"
        live = sorted(answers)
        t = self.params.threshold
        if len(live) < t:
            return self._abort(f"only {len(live)} sites completed the {phase} phase; the threshold is {t}")
        after = {QUESTION: self._after_advertise, SHARES: self._after_share, MASKED_INPUT: self._after_mask,
                 SURVIVORS: self._after_consistency, UNMASKING: self._after_unmask}  # a handler per role
        return after[role_of(phase)](answers)

    def next_phase(self, phase: str) -> str | None:
        return NEXT_PHASE[self.params.mode][phase]

    def _after_advertise(self, answers) -> dict[str, dict]:
        self.keys = {s: answers[s] for s in sorted(answers)}
        live = sorted(self.keys)
        self.index = {s: i + 1 for i, s in enumerate(live)}
        # the graph every site can recompute: its seed is public (the nonce and the question)
        arrangement = harary_by_index(len(live), min(self.params.degree, len(live) - 1),
                                      graph_seed(self.nonce, self.context))
        self.neighbours = {s: frozenset(live[j - 1] for j in arrangement.neighbours(self.index[s])) for s in live}
        self.full = arrangement.full
        return {u: {"index": self.index[u], "threshold": self.params.threshold, "live": len(live),
                    "peers": {v: {"index": self.index[v], **self.keys[v]} for v in sorted(self.neighbours[u])}}
                for u in live}

    def _after_share(self, answers) -> dict[str, dict]:
        for u, cts in answers.items():
            if set(cts) != set(self.neighbours[u]):
                self.lost[u] = "share: ciphertexts not addressed to exactly its neighbours"
        u2 = self.shared = frozenset(u for u in answers if u not in self.lost)
        if len(u2) < self.params.threshold:
            return self._abort(f"only {len(u2)} valid share sets; the threshold is {self.params.threshold}")
        # each ciphertext goes to its addressee; the server keeps none of them (the unmasking needs only U2)
        return {v: {"ciphertexts": {u: answers[u][v] for u in sorted(self.neighbours[v] & u2)}}
                for v in sorted(u2)}

    def _after_mask(self, answers) -> dict[str, dict]:
        """answers: site -> (ring bits, vector) as the codec decoded them. The survivors (U3) and
        the dropped of each neighbourhood: the consistency round's question (active), or the
        unmask request (semi-honest)."""
        for u, (bits, vector) in answers.items():
            if bits != self.params.modulus_bits or vector.shape != (self.params.length,):
                self.lost[u] = f"mask: a vector of {vector.size} elements on 2^{bits}, not the session's ring"
            else:
                self.masked[u] = vector
        if len(self.masked) < self.params.threshold:
            return self._abort(f"only {len(self.masked)} valid masked inputs; the threshold is {self.params.threshold}")
        u3, u2 = set(self.masked), self.shared
        lost_after_share = u2 - u3  # once, not per site: at 10,000 sites a set per site cost seconds
        return {v: {"survivors": sorted((self.neighbours[v] | {v}) & u3),
                    "dropped": sorted(self.neighbours[v] & lost_after_share)} for v in sorted(u3)}

    def _after_consistency(self, answers) -> dict[str, dict]:
        """answers: survivor -> its signature on its view (U4: the survivors that signed). Each
        signer is sent the signatures of its neighbourhood's signers and, under a sparse graph,
        their views (under a full graph every honest view is the same survivor set, which a site
        rebuilds from its own)."""
        signers = set(answers)
        unsigned = sorted(set(self.masked) - signers)
        if unsigned and not self.full:  # their neighbours would refuse (SecAggClient._check_consistency)
            return self._abort(f"{len(unsigned)} site(s) named surviving did not sign the survivor set (lost in the "
                               f"consistency round, or refusing to sign: fewer than t survivors around them), e.g. "
                               f"{unsigned[0]}: under a sparse graph no holder releases a "
                               f"share of a survivor's self mask without the survivor's own signature, so the sum "
                               f"cannot be unmasked; nothing was unmasked")
        out = {}
        for v in sorted(signers):
            near = sorted((self.neighbours[v] | {v}) & signers)
            body = {"signatures": {w: answers[w] for w in near}}
            if not self.full:
                body["views"] = {w: self.view(w) for w in near}
            out[v] = body
        return out

    def view(self, site: str) -> bytes:
        """What an honest `site` signs in the consistency round (SecAggClient._consistency): the
        status of every index of its neighbourhood and itself, in index order."""
        u3 = self.masked
        return b"".join(SURVIVED if w in u3 else DROPPED if w in self.shared else ABSENT
                        for w in sorted(self.neighbours[site] | {site}, key=self.index.__getitem__))

    def _after_unmask(self, answers) -> Aggregate:
        """The sum of the masked inputs less every survivor's self mask and the pairwise masks the
        survivors added against each dropped site, all rebuilt from the unmask answers' shares
        (protocol.secagg.unmasking: one job per mask, on two cores in a large session)."""
        bits, length = self.params.modulus_bits, self.params.length
        u2, u3 = self.shared, set(self.masked)
        total = np.zeros(length, dtype=np.uint64)
        for u in sorted(u3):
            total = add_mod(total, self.masked[u], bits)
        answered = set(answers)  # once: a set of every answer per survivor was O(m^2)
        jobs: list = [SelfMask(u, {self.index[v]: answers[v]["b"][u] for v in (self.neighbours[u] | {u}) & answered
                                   if u in answers[v]["b"]})
                      for u in sorted(u3)]
        jobs += [PairwiseMasks(d, {self.index[v]: answers[v]["s"][d] for v in self.neighbours[d] & answered
                                   if d in answers[v]["s"]}, self.keys[d]["s"],
                               tuple((self.keys[u]["s"], 1 if self.index[u] < self.index[d] else -1)
                                     for u in sorted(self.neighbours[d] & u3)))
                 for d in sorted(u2 - u3)]
        site_of = {i: s for s, i in self.index.items()}
        result = unmask(jobs, Ring(self.params.threshold, length, bits, self.nonce, self.context, site_of))
        wrong: dict[str, list[str]] = {}
        for position, holders in sorted(result.wrong.items()):
            for x in holders:
                wrong.setdefault(site_of[x], []).append(jobs[position].site)
        wrong = {holder: sorted(owners) for holder, owners in sorted(wrong.items())}
        if result.failure:
            found = ", ".join(f"{holder} ({len(owners)} secret{'s' * (len(owners) > 1)})" for holder, owners in wrong.items())
            aborted = self._abort(f"{result.failure}{f'; holders found sending wrong shares: {found}' if found else ''}")
            aborted.wrong_shares = wrong
            return aborted
        return Aggregate(sub_mod(total, result.total, bits), sorted(u3), dropped=dict(self.lost), wrong_shares=wrong)

    def _abort(self, reason: str) -> Aggregate:
        return Aggregate(None, sorted(self.masked), reason, dropped=dict(self.lost))


# --------------------------------------------------------------------------- client -----------

class SecAggClient:
    """A site's half. `vector()` gives its input in Z_M (uint64, the agreed length); it is called
    once, when the site masks, so a site that drops earlier never computes it."""

    def __init__(self, site_id: str, nonce: int, vector: Callable[[SecAggParams], np.ndarray],
                 context: bytes = b"", identity: SiteIdentity | None = None) -> None:
        """context: the request digest of the question this site answers (carried in its share
        ciphertexts, compared with its neighbours', and bound into its mask keys). identity: its
        signing key and the registry's keys of the others (protocol.secagg.identity); without one
        a site takes part in the semi-honest protocol only."""
        self.site_id, self.nonce, self.vector, self.context = site_id, nonce, vector, bytes(context)
        self.identity = identity
        self.params: SecAggParams | None = None
        self.c_key = self.s_key = None
        self.index = 0
        self.live = 0  # how many sites advertised (the graph's size), as the share request says
        self.arrangement = None  # the session's public graph over them (active mode, from the share phase)
        self.peers: dict[str, dict] = {}
        self.own_shares: tuple[int, int] | None = None  # (s share, b share) this site keeps
        self.self_seed = b""
        self.received: dict[str, bytes] = {}
        self.opened: dict[str, tuple[int, int]] = {}  # neighbour -> (s share, b share) it sent us
        self.share_keys: dict[str, bytes] = {}  # peer -> the AE key of our pair (the same both ways)
        self.done: set[str] = set()
        self.survivors: list[str] = []  # the view this site signed (active) or was sent (semi-honest)
        self.dropped: list[str] = []
        self.view = b""

    def answer(self, phase: str, body: Mapping[str, Any]):
        phases = self.params.phases if self.params is not None else MODE_PHASES["active"]
        if row_of(phase) is None:
            raise SecAggRefusal(f"secure aggregation has no phase {phase!r}")
        if phase in self.done:
            raise SecAggRefusal(f"phase {phase!r} was already answered in this session")
        expected = phases[len(self.done)] if len(self.done) < len(phases) else None
        if phase != expected:
            raise SecAggRefusal(f"phase {phase!r} out of order: {expected!r} comes next")
        handle = {QUESTION: self._advertise, SHARES: self._share, MASKED_INPUT: self._mask,
                  SURVIVORS: self._consistency, UNMASKING: self._unmask}  # a handler per role
        if not isinstance(body, Mapping):
            raise SecAggRefusal(f"{MALFORMED}: the {phase} request is not a map")
        try:
            result = handle[role_of(phase)](body)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, struct.error) as exc:
            if isinstance(exc, SecAggRefusal):
                raise
            raise SecAggRefusal(f"{MALFORMED} in phase {phase}: {type(exc).__name__}: {str(exc)[:120]}") from None
        self.done.add(phase)
        return result

    def _advertise(self, body):
        try:
            self.params = SecAggParams(**body["params"])
        except (TypeError, KeyError, ValueError) as exc:
            raise SecAggRefusal(f"bad secure-aggregation parameters: {exc}") from None
        if self.params.active and self.identity is None:
            raise SecAggRefusal("this site holds no signing key and no party registry: it cannot take part in the "
                                "actively secure protocol (a site's signing key comes with its CURVE key: a run "
                                "over plain TCP has none)")
        if not self.params.active and self.identity is not None and not self.identity.semi_honest:
            raise SecAggRefusal("site policy: secure sums in the semi-honest mode are not served (the coordinator "
                                "would be trusted to relay keys and survivors faithfully; policy `secagg: "
                                "semi-honest` takes part)")
        if not _is_int(self.nonce) or not 0 <= self.nonce < NONCE_RANGE:
            raise SecAggRefusal(f"{MALFORMED}: session nonce {self.nonce!r} is not in [0, 2^62)")
        if self.params.active and not self.identity.first_use(self.nonce):
            raise SecAggRefusal(f"{REPLAYED}: {self.nonce} (signatures made under it could be replayed): refusing "
                                f"to take part")
        self.c_key, self.s_key = crypto.new_private_key(), crypto.new_private_key()
        keys = {"c": crypto.public_bytes(self.c_key), "s": crypto.public_bytes(self.s_key)}
        if self.params.active:
            keys["sig"] = self.identity.sign(advertised(self.nonce, self.context, self.site_id, keys["c"], keys["s"]))
        return keys

    def _share(self, body):
        params = self.params
        index, threshold, peers = body.get("index"), body.get("threshold"), body.get("peers")
        if threshold != params.threshold:
            raise SecAggRefusal(f"threshold {threshold!r} differs from the advertised {params.threshold}")
        if not isinstance(peers, dict) or not _is_int(index) or index < 1:
            raise SecAggRefusal("share request needs an index and a map of peers")
        if not params.threshold - 1 <= len(peers) <= params.degree:
            raise SecAggRefusal(f"{len(peers)} peers: need between t - 1 = {params.threshold - 1} and "
                                f"k = {params.degree} (fewer holders than t could never rebuild my secrets)")
        fields = {"index", "c", "s", "sig"} if params.active else {"index", "c", "s"}
        sizes = {"c": crypto.KEY_BYTES, "s": crypto.KEY_BYTES, "sig": SIGNATURE_BYTES}
        indices = {index}
        for v, info in peers.items():
            if (not isinstance(v, str) or not isinstance(info, dict) or set(info) != fields
                    or not _is_int(info["index"]) or info["index"] < 1 or v == self.site_id
                    or any(not isinstance(info[f], bytes) or len(info[f]) != sizes[f] for f in fields - {"index"})):
                raise SecAggRefusal(f"{MALFORMED}: peer entry for {str(v)[:40]!r} (keys of 32 bytes, a signature of "
                                    f"64, a positive index)")
            indices.add(info["index"])
        if len(indices) != len(peers) + 1:
            raise SecAggRefusal("Shamir indices are not distinct")
        if params.active:
            self._check_peers(index, body.get("live"), peers)
        self.index, self.peers = index, dict(peers)
        self.self_seed = os.urandom(crypto.KEY_BYTES)
        holders = [index] + [info["index"] for info in peers.values()]
        s_shares = split_secret(int.from_bytes(crypto.private_bytes(self.s_key), "big"), params.threshold, holders)
        b_shares = split_secret(int.from_bytes(self.self_seed, "big"), params.threshold, holders)
        self.own_shares = (s_shares[index], b_shares[index])
        out = {}
        for v, info in sorted(peers.items()):
            try:
                key = self.share_keys[v] = crypto.agree(self.c_key, info["c"], b"share", self.nonce)
            except ValueError as exc:
                raise SecAggRefusal(f"bad public key of {v}: {exc}") from None
            plaintext = (struct.pack(">II", index, info["index"]) + share_to_bytes(s_shares[info["index"]])
                         + share_to_bytes(b_shares[info["index"]]) + self.context)
            out[v] = crypto.encrypt(key, plaintext, share_associated_data(self.nonce, self.site_id, v))
        return out

    def _check_peers(self, index: int, live, peers: Mapping[str, dict]) -> None:
        """Active mode, before any share leaves: every peer's keys are signed by that peer's
        registered key for this session and question (else FORGED, naming it), and the peers
        are exactly my neighbours in the session's public graph over `live` sites."""
        params = self.params
        for v, info in sorted(peers.items()):
            why = self.identity.verify(v, advertised(self.nonce, self.context, v, info["c"], info["s"]), info["sig"])
            if why is not None:
                raise SecAggRefusal(f"{FORGED}: the keys relayed for {v} were not signed by {v} for this session and "
                                    f"question ({why}): refusing to share")
        if not _is_int(live) or not params.threshold <= live <= (params.sites or live) or index > live:
            raise SecAggRefusal(f"the share request says {live!r} sites advertised: not a count between the "
                                f"threshold {params.threshold} and the {params.sites} sites asked, above my index")
        self.arrangement = harary_by_index(live, min(params.degree, live - 1), graph_seed(self.nonce, self.context))
        if {info["index"] for info in peers.values()} != self.arrangement.neighbours(index):
            raise SecAggRefusal(f"the peers I was sent are {OTHER_GRAPH} over {live} sites (its seed is the "
                                f"nonce's and the question's): refusing to share")
        self.live = live

    def _mask(self, body):
        params = self.params
        cts = body.get("ciphertexts")
        if not isinstance(cts, dict) or not set(cts) <= set(self.peers):
            raise SecAggRefusal("ciphertexts from sites that are not my neighbours")
        if len(cts) < params.threshold - 1:
            raise SecAggRefusal(f"only {len(cts)} neighbours hold my shares; t - 1 = {params.threshold - 1} needed")
        self.received = dict(cts)
        # every share first, before any input is computed: a neighbour asked another question
        # (or a ciphertext altered on the way) ends this site's part here
        self.opened = {v: self._open(v) for v in sorted(cts)}
        x = np.asarray(self.vector(params), dtype=np.uint64)
        if x.shape != (params.length,) or (params.modulus_bits < 64 and (x >> np.uint64(params.modulus_bits)).any()):
            raise SecAggRefusal(f"my input is not a vector of {params.length} elements of Z_M")
        bits = params.modulus_bits
        y = add_mod(x, crypto.mask_vector(self.self_seed, params.length, bits), bits)
        for v in sorted(cts):
            try:
                seed = crypto.agree(self.s_key, self.peers[v]["s"], b"mask", self.nonce, self.context)
            except ValueError as exc:
                raise SecAggRefusal(f"bad public key of {v}: {exc}") from None
            mask = crypto.mask_vector(seed, params.length, bits)
            y = add_mod(y, mask, bits) if self.index < self.peers[v]["index"] else sub_mod(y, mask, bits)
        return y

    def _take_view(self, body) -> None:
        """The survivors and dropped of my neighbourhood as the coordinator names them, checked:
        disjoint, me among the survivors, every one of them a neighbour whose shares I hold, at
        least t survivors; in active mode every neighbour whose shares I hold is named one or the
        other (so that my view says what I will answer for each)."""
        survivors, dropped = body.get("survivors"), body.get("dropped")
        if (not isinstance(survivors, list) or not isinstance(dropped, list)
                or not all(isinstance(v, str) for v in survivors + dropped)):
            raise SecAggRefusal("the request needs lists of survivors and dropped sites")
        if set(survivors) & set(dropped):
            raise SecAggRefusal("a site is named both surviving and dropped: answering would reveal its input")
        if self.site_id not in survivors:
            raise SecAggRefusal("I sent my masked input but am not named among the survivors")
        unknown = (set(survivors) | set(dropped)) - set(self.received) - {self.site_id}
        if unknown:
            raise SecAggRefusal(f"no share received from {sorted(unknown)}")
        if len(set(survivors)) < self.params.threshold:
            raise SecAggRefusal(f"only {len(set(survivors))} survivors in my neighbourhood, threshold "
                                f"{self.params.threshold}: refusing to unmask")
        if self.params.active and set(self.received) - set(survivors) - set(dropped):
            raise SecAggRefusal(f"{INCONSISTENT}: neighbours whose shares I hold are named neither surviving nor "
                                f"dropped: {sorted(set(self.received) - set(survivors) - set(dropped))[:5]}")
        self.survivors, self.dropped = sorted(set(survivors)), sorted(set(dropped))

    def _consistency(self, body):
        """Active mode: sign my view of the survivors (Bonawitz et al.'s ConsistencyCheck round)."""
        self._take_view(body)
        status = {self.site_id: SURVIVED, **{v: SURVIVED for v in self.survivors},
                  **{v: DROPPED for v in self.dropped}}
        order = sorted([(self.index, self.site_id)] + [(info["index"], v) for v, info in self.peers.items()])
        self.view = b"".join(status.get(v, ABSENT) for _, v in order)
        return self.identity.sign(consistency(self.nonce, self.context, self.live, self.index, self.view))

    def _unmask(self, body):
        if self.params.active:
            self._check_consistency(body)
        else:
            self._take_view(body)
        b_out, s_out = {self.site_id: share_to_bytes(self.own_shares[1])}, {}
        for v in self.survivors + self.dropped:
            if v == self.site_id:
                continue
            s_share, b_share = self.opened[v]
            if v in self.dropped:
                s_out[v] = share_to_bytes(s_share)
            else:
                b_out[v] = share_to_bytes(b_share)
        return {"b": b_out, "s": s_out}

    def _check_consistency(self, body) -> None:
        """Active mode, before any unmasking share leaves: at least t signatures, each by a survivor
        of my view, each on a view that agrees with mine wherever the two neighbourhoods overlap
        (under a full graph: on my own view, the one survivor set: Bonawitz et al.'s check, where
        a survivor that did not sign still has its self mask rebuilt); under a sparse graph the
        signature of every survivor of my view. Anything else: INCONSISTENT, naming the site.

        Under a full graph t > 2m/3 signatures on one survivor set suffice: a coordinator that
        wanted one site's input would have to name its mask partners (at least t - 1, all of
        whose ciphertexts it holds) dropped, and they and the site refuse that set, leaving at
        most m - t < t signers.

        Why every survivor's own signature (red team round 4): a share of v's self mask leaves a
        holder only with v's signature on a view agreeing with the holder's, so every holder that
        releases one agrees with v's own view, in which each of v's mask partners is a survivor
        or dropped as v saw it. A partner r that released shares of v's self mask itself holds t
        signatures of its own neighbourhood on r surviving; taking r's mask key out would need t
        more of the same k + 1 holders signing r dropped, and an honest site signs one view per
        session (its nonce is never answered twice): 2t > k + 1 + colluders forbids it. Without
        this rule a coordinator that withheld some of v's ciphertexts and showed each site its
        own view read v's input with no colluder under a sparse graph. Its price: under a sparse
        graph a survivor lost in the consistency round ends the session (explained)."""
        signatures, views = body.get("signatures"), body.get("views")
        if not isinstance(signatures, dict) or (views is not None and not isinstance(views, dict)):
            raise SecAggRefusal("the unmask request needs the survivors' signatures")
        threshold = self.params.threshold
        if len(signatures) < threshold:
            raise SecAggRefusal(f"{INCONSISTENT}: only {len(signatures)} of my neighbourhood signed the survivor set, "
                                f"threshold {threshold}: refusing to unmask")
        if self.site_id not in signatures:
            raise SecAggRefusal(f"{INCONSISTENT}: my own signature is not among those relayed")
        others = set(signatures) - set(self.survivors)
        if others:
            raise SecAggRefusal(f"{INCONSISTENT}: signatures from sites I was not told survived: "
                                f"{sorted(map(str, others))[:5]}")
        unsigned = set(self.survivors) - set(signatures)
        if unsigned and self.live - 1 > self.params.degree:
            # sparse: a share of v's self mask leaves only with v's own signature on a view agreeing with mine
            raise SecAggRefusal(f"{INCONSISTENT}: {sorted(unsigned)[0]}, named surviving, did not sign the survivor "
                                f"set: refusing to unmask")
        arrangement = self.arrangement  # the session's graph, as checked when I shared
        mine = dict(zip(sorted(arrangement.neighbours(self.index) | {self.index}), self.view))
        for v in sorted(signatures, key=str):
            index = self.index if v == self.site_id else self.peers[v]["index"]
            view = self.view if arrangement.full or v == self.site_id else (views or {}).get(v)
            if not isinstance(view, bytes):
                raise SecAggRefusal(f"{INCONSISTENT}: no view of {v}'s relayed with its signature")
            theirs = sorted(arrangement.neighbours(index) | {index})
            if len(view) != len(theirs):
                raise SecAggRefusal(f"{INCONSISTENT}: the view relayed for {v} does not cover its neighbourhood")
            disagree = [i for i, status in zip(theirs, view) if i in mine and mine[i] != status]
            if disagree:
                raise SecAggRefusal(f"{INCONSISTENT}: {v} was shown another survivor set (it disagrees with mine on "
                                    f"{len(disagree)} site(s)): refusing to unmask")
            why = self.identity.verify(v, consistency(self.nonce, self.context, self.live, index, view), signatures[v])
            if why is not None:
                raise SecAggRefusal(f"{INCONSISTENT}: {v} did not sign the survivor set relayed for it ({why}): "
                                    f"refusing to unmask")

    def _open(self, sender: str) -> tuple[int, int]:
        key = self.share_keys[sender]  # agreed in the share phase: X25519 is symmetric
        try:
            plain = crypto.decrypt(key, self.received[sender], share_associated_data(self.nonce, sender, self.site_id))
        except crypto.DecryptionError as exc:
            raise SecAggRefusal(f"the share ciphertext from {sender} does not open: {exc}") from None
        shares = 8 + 2 * SHARE_BYTES
        if len(plain) < shares:
            raise SecAggRefusal(f"the share from {sender} has the wrong length")
        if struct.unpack(">II", plain[:8]) != (self.peers[sender]["index"], self.index):
            raise SecAggRefusal(f"the share from {sender} is addressed to another pair")
        theirs = plain[shares:]
        if theirs != self.context:
            raise SecAggRefusal(f"{DIFFERENT_QUESTIONS}: the shares from {sender} answer request "
                                f"{theirs[:4].hex() or 'none'}, mine {self.context[:4].hex() or 'none'} (the "
                                f"coordinator asked us different questions; our answers would be summed as one): "
                                f"refusing to mask")
        return (share_from_bytes(plain[8:8 + SHARE_BYTES]),
                share_from_bytes(plain[8 + SHARE_BYTES:8 + 2 * SHARE_BYTES]))


def _framed(*parts: bytes) -> bytes:
    """Parts joined unambiguously (each after its 4-byte length): what a site signs."""
    return b"".join(struct.pack(">I", len(part)) + part for part in parts)


def advertised(nonce: int, context: bytes, site: str, c_public: bytes, s_public: bytes) -> bytes:
    """What a site signs in the advertise round (Bonawitz et al. figure 4, round 0, active):
    its two public keys, bound to its name, the session nonce and the question."""
    return _framed(b"quorum-secagg/advertise", str(int(nonce)).encode(), bytes(context), site.encode(),
                   bytes(c_public), bytes(s_public))


def consistency(nonce: int, context: bytes, live: int, index: int, view: bytes) -> bytes:
    """What a survivor signs in the consistency round (figure 4, round 3, active): the status of
    each site of its neighbourhood (`view`, in index order), its own index and the graph's size,
    bound to the session nonce and the question."""
    return _framed(b"quorum-secagg/consistency", str(int(nonce)).encode(), bytes(context),
                   str(int(live)).encode(), str(int(index)).encode(), bytes(view))


def share_associated_data(nonce: int, sender: str, receiver: str) -> bytes:
    """The AEAD associated data of a key share sent from `sender` to `receiver` (Bonawitz et al. 2017,
    round ShareKeys): binds the ciphertext to the session and to both ends, so the coordinator cannot
    replay a share into another session or hand it to another site."""
    return f"secagg|{nonce}|{sender}|{receiver}".encode()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def masked_bytes_width(modulus_bits: int) -> int:
    """Bytes per element of a masked vector on the wire: 1, 2, 4 or 8."""
    return 1 << max(0, math.ceil(math.log2(max(1, math.ceil(modulus_bits / 8)))))
