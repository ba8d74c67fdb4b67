"""Halves shared by methods whose sites' inputs are summed by secure aggregation.

`SecureSumCoordinator` runs the phases of protocol.secagg (five in the active mode, four in the
semi-honest one) and hands the sum of the
surviving sites' vectors to the method's `finish(aggregate)`; `SecureSumSite` answers the
phases, computing its input vector only when it masks. The secagg parameters, a fresh session
nonce (bound into every derived key and ciphertext) and the method's own public parameters
travel in the advertise request, so a site half is built from the request alone; the site checks
the method parameters (`check`) before it makes any key.

`before_unmask(inputs)` lets the method stop a session whose privacy was planned for more inputs
than the masked ones (DDG noise from too few sites, too few one-hot bins to hide among): it
returns the reason, and the session aborts before any site is asked to unmask, so the sum is
never revealed.

One question for every contributor (issue 47): each site computes the request digest of its
advertise request (`digest`: the method's Method.request_digest, whose release_shape leaves out
the per-site fields, e.g. a site's own quantile level) and binds its secure-aggregation half to it
(protocol.secagg.protocol: carried in its share ciphertexts, compared by its neighbours before
they mask, and bound into its mask keys). A site whose neighbour answers another question
refuses to mask, naming it; the coordinator half then ends the session with that reason instead
of unmasking anything.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import numpy as np

from protocol.methods.base import (CoordinatorHalf, Outcome, RequestError, Send, SiteHalf, per_site_removed,
                                   request_digest)
from protocol.secagg.graph import default_degree, default_threshold
from protocol.phases import PhaseStep, PhaseTable
from protocol.secagg.identity import SiteIdentity
from protocol.secagg.protocol import (ANSWER_KIND, DIFFERENT_QUESTIONS, FORGED, INCONSISTENT, LIES, MALFORMED,
                                      MASKED_INPUT, MODES, OTHER_GRAPH, PHASE_TABLE, QUESTION, REPLAYED, SHARES,
                                      SHORT_OF_CLAIM, Aggregate, SecAggClient, SecAggParams, SecAggRefusal,
                                      SecAggServer, names_survivors, phase_of, role_of)

def secure_sum_steps(prefix: str = "", then_last: tuple[str, ...] = (), then_any: tuple[str, ...] = (),
                     numbered: bool = False, opens: bool = False) -> list[PhaseStep]:
    """A secure sum's rows for a method's phase table, read from the one table of the protocol
    (protocol.secagg.protocol.PHASE_TABLE: each phase and what follows it in either mode, the
    consistency round between mask and unmask in the active mode only). `prefix` names a sum among
    several in one session ("loss" gives loss-advertise, ...); `then_last`: what may follow its last
    phase; `then_any`: what may follow any of its phases (a method that goes on when a sum stops);
    `numbered`, `opens`: a sum repeated each round, whose first phase opens the round."""
    steps = []
    for index, row in enumerate(PHASE_TABLE):
        following = (row.following(mode) for mode in MODES)
        nexts = tuple(dict.fromkeys(sum_phase(prefix, p) for p in following if p is not None))
        steps.append(PhaseStep(sum_phase(prefix, row.name), nexts + (then_last if not nexts else ()) + then_any,
                               numbered=numbered, opens=opens and index == 0))
    return steps


def sum_phase(prefix: str, phase: str) -> str:
    """A secure sum's phase as named among several sums of a session: "loss" and advertise give
    "loss-advertise"; without a prefix, the phase's own name."""
    return f"{prefix}-{phase}" if prefix else phase


def sum_parts(name: str) -> tuple[str, str]:
    """(prefix, SecAgg phase) of a name sum_phase made: "loss-advertise" gives ("loss", "advertise"),
    "advertise" gives ("", "advertise")."""
    prefix, dash, phase = name.partition("-")
    return (prefix, phase) if dash else ("", name)


#: a secure sum's phases as one session: the protocol's own table
SECURE_SUM_PHASES = PhaseTable(*secure_sum_steps())


#: the `secagg` parameter of a method that sums through SecAgg+ (its neighbour graph)
SECAGG_SPEC = {"type": "map", "fields": {
    "graph": {"type": "str", "choices": ["sparse", "full"], "default": "sparse"},
    "degree": {"type": "int", "min": 0, "default": 0},
    "threshold": {"type": "int", "min": 0, "default": 0},
    # active: signed keys and a consistency round (a coordinator that lies gets an abort);
    # semi-honest: the cheaper protocol, the coordinator trusted to relay faithfully
    "mode": {"type": "str", "choices": list(MODES), "default": "active"},
}}


def graph_shape(secagg: Mapping[str, Any], m: int) -> tuple[int, int]:
    """(degree, threshold) of a session's SecAgg+ graph over m sites, as the method's `secagg`
    parameter asks: every peer under `graph: full`, else its degree (default: the protocol's
    default for m), and its threshold (default: the protocol's for that degree and mode)."""
    degree = m - 1 if secagg["graph"] == "full" else min(m - 1, secagg["degree"] or default_degree(m))
    return degree, secagg["threshold"] or default_threshold(degree, secagg["mode"])


def advertise_shape(body: Any, own: tuple[str, ...] = ()) -> Any:
    """The release shape of a secure sum's advertise request: the secure-aggregation parameters
    (ring, vector length, graph degree and threshold), the session nonce and the method's public
    parameters less its per-site fields `own` (Method.release_shape)."""
    if not isinstance(body, Mapping) or not isinstance(body.get("method"), Mapping):
        return body
    return {**body, "method": per_site_removed(body["method"], own)}


def question_digest(method) -> Callable[[Mapping[str, Any]], bytes]:
    """The request digest of a secure sum's question (its advertise request) as `method` (a Method
    or its class) computes it (Method.request_digest): the `digest` of the halves below."""
    return lambda body: method.request_digest(phase_of(QUESTION), body)


def advertise_digest(body: Any) -> bytes:
    """The request digest of an advertise request of a secure sum with no per-site fields (the
    default of the halves below; a method passes its own Method.request_digest)."""
    return request_digest("secure_sum", phase_of(QUESTION), advertise_shape(body))


class SecureSumCoordinator(CoordinatorHalf):
    """`public`: the method's parameters every site gets; `own`: what one site alone needs
    ({site: {field: value}}, e.g. its quantile level), merged into its request only, so an
    advertise request stays the same size however many sites there are (a table of every
    site's level sent to each of 10,000 sites was 2 GB of requests)."""

    def __init__(self, params: SecAggParams, sites: list[str], rng: np.random.Generator,
                 public: dict, finish: Callable[[Aggregate], Outcome],
                 before_unmask: Callable[[int], str | None] = lambda inputs: None,
                 own: Mapping[str, dict] | None = None,
                 digest: Callable[[Mapping[str, Any]], bytes] = advertise_digest) -> None:
        """digest: the request digest of an advertise request, as the sites compute it (the
        method's `request_digest` for phase advertise)."""
        self.nonce = int(rng.integers(0, 2**62))
        self.server = SecAggServer(params, sites, self.nonce, rng)
        self.public, self.finish, self.before_unmask = public, finish, before_unmask
        self.own = own or {}
        self.digest = digest

    def start(self):
        requests = self.server.start()
        requests = {s: {**body, "nonce": self.nonce, "method": {**self.public, **self.own.get(s, {})}}
                    for s, body in requests.items()}
        if requests:  # the question every site is asked: one digest, whatever each site's own fields
            self.server.context = self.digest(next(iter(requests.values())))
        return Send(phase_of(QUESTION), requests)

    def advance(self, phase, answers, dropped):
        lies = {site: why for site, why in dropped.items() if any(lie in why for lie in LIES)}
        if lies:  # a site caught the coordinator's side lying: nothing more is asked, nothing unmasked
            return self.finish(Aggregate(None, sorted(self.server.masked), caught_lying(lies),
                                         {**self.server.lost, **{s: f"{phase}: {why}" for s, why in dropped.items()}}))
        expected = ANSWER_KIND[phase]
        good, lost = {}, dict(dropped)
        for site, (kind, value) in answers.items():
            if kind == expected:
                good[site] = value
            else:
                lost[site] = f"sent {kind!r} in phase {phase!r}"
        step = self.server.advance(phase, good, lost)
        if isinstance(step, Aggregate):
            return wrong_shares_named(self.finish(step), step)
        if role_of(phase) == MASKED_INPUT:
            reason = self.before_unmask(len(self.server.masked))
            if reason:
                masked = sorted(self.server.masked)
                return self.finish(Aggregate(None, masked, f"{reason}; the sum was not unmasked", dict(self.server.lost)))
        return Send(self.server.next_phase(phase), step)


def caught_lying(refusals: Mapping[str, str]) -> str:
    """Why a secure sum ends when sites caught a lie (protocol.secagg.protocol.LIES): different
    questions, keys not signed by the peer they are named for, or survivor sets that disagree.
    Nothing is unmasked; the first refusal of the first kind found is quoted, naming the forgery."""
    for lie, what in ((FORGED, "keys relayed in a peer's name that it did not sign"),
                      (INCONSISTENT, "survivor sets that disagree, or too few signed"),
                      (OTHER_GRAPH, "a graph other than the session's public one"),
                      (SHORT_OF_CLAIM, "fewer survivors than the noise was claimed for"),
                      (REPLAYED, "a session nonce the sites answered before"),
                      (MALFORMED, "requests no honest coordinator sends"),
                      (DIFFERENT_QUESTIONS, "different questions in one secure sum")):
        caught = sorted(site for site, why in refusals.items() if lie in why)
        if caught:
            site = caught[0]
            return (f"the coordinator's side was caught lying ({what}): {len(caught)} site(s) refused, e.g. {site}: "
                    f"{refusals[site].removeprefix('refused: ')[:240]}; nothing was unmasked (the sites' word: this "
                    f"half cannot check a refusal)")
    raise ValueError(f"no lie of {LIES} in {sorted(refusals)}")  # every lie has its words above


class SecureSumSite(SiteHalf):
    """make_vector(public method parameters, secagg params) -> this site's input on Z_M.

    `check(public)` is the method's own check of the parameters; the Spend it returns names how
    many noisy inputs the sum was planned (and booked) for. The site holds the coordinator to
    that claim wherever it can see (issues 35, 48): a claim of more inputs than the m sites the
    session's parameters say it asked is refused at once; under a full graph (every site its
    neighbour: degree >= m - 1, the same parameters for every site, in the request digest) it
    refuses to unmask a sum of fewer survivors than the claim, always; under a sparse graph a
    claim its own neighbourhood's survivors cover is verified, and one they do not cover is the
    coordinator's word (the global count), which its policy trusts or refuses (`unseen_claims`)."""

    def __init__(self, site_id: str, make_vector: Callable[[Mapping[str, Any], SecAggParams], np.ndarray],
                 check: Callable[[Mapping[str, Any]], Any] = lambda public: None,
                 digest: Callable[[Mapping[str, Any]], bytes] = advertise_digest,
                 identity: SiteIdentity | None = None) -> None:
        """digest: the request digest of the advertise request this site received (the method's
        `request_digest`), to which its secure-aggregation half is bound. identity: the site's
        signing key and the party registry (protocol.secagg.identity); its driver sets it
        (sites.local), as the site's, not the method's."""
        self.site_id, self.make_vector, self.check, self.digest = site_id, make_vector, check, digest
        self.identity = identity
        self.public: Mapping[str, Any] = {}
        self.client: SecAggClient | None = None
        self.claimed = 0  # the noisy inputs the sum was planned for (0: no claim)

    def answer(self, phase, body):
        role = role_of(phase)
        if role == QUESTION:
            if (not isinstance(body, dict) or set(body) != {"params", "nonce", "method"}
                    or not isinstance(body["method"], dict) or not isinstance(body["nonce"], int)):
                raise RequestError("advertise needs {params, nonce, method}")
            spend = self.check(body["method"])
            self.claimed = int(getattr(spend, "contributors", 0) or 0)
            self.public = body["method"]
            self.client = SecAggClient(self.site_id, body["nonce"],
                                       lambda params: self.make_vector(self.public, params), self.digest(body),
                                       self.identity)
            body = {"params": body["params"]}
        elif self.client is None:
            raise RequestError(f"phase {phase!r} before advertise")
        elif names_survivors(phase):
            self._hold_to_claim(body)
        elif role == SHARES and isinstance(body, dict):
            live = body.get("live")
            if self.claimed and isinstance(live, int) and not isinstance(live, bool) and live < self.claimed:
                raise RequestError(f"the share request says {live} sites advertised, {SHORT_OF_CLAIM} "
                                   f"({self.claimed}): refusing to share")
        try:
            value = self.client.answer(phase, body)
        except SecAggRefusal as exc:
            raise RequestError(str(exc)) from None
        params = getattr(self.client, "params", None)
        sites = params.sites if params is not None else 0
        if role == QUESTION and params is not None and not sites:  # every honest session says m
            raise RequestError("the secure-aggregation parameters do not say how many sites the session asked "
                               "(sites): this site cannot tell a full graph from a sparse one, nor check a claim")
        if role == QUESTION and sites and self.claimed > sites:
            raise RequestError(f"the sum's noise is claimed for {self.claimed} inputs, more than the {sites} sites "
                               f"the session asked: refusing to take part (the release would be weaker than "
                               f"this site would count)")
        if role == MASKED_INPUT:
            return ANSWER_KIND[phase], (self.client.params.modulus_bits, value)
        return ANSWER_KIND[phase], value

    def _seen_survivors(self, body) -> int | None:
        """How many survivors the unmask request names (in this site's neighbourhood: the whole
        session under a full graph), or None when it names none."""
        survivors = body.get("survivors") if isinstance(body, dict) else None
        return len({s for s in survivors if isinstance(s, str)}) if isinstance(survivors, list) else None

    def _full_graph(self) -> bool:
        params = getattr(self.client, "params", None)
        return params is not None and params.full

    def unseen_claim(self, phase, body):
        seen = self._seen_survivors(body) if names_survivors(phase) else None
        if seen is not None and self.claimed > seen and not self._full_graph():
            return (f"the sum's noise is claimed for {self.claimed} inputs, more than the {seen} survivors this "
                    f"site can see (itself and its neighbours, under a sparse graph): the global count is the "
                    f"coordinator's word")
        return None

    def _hold_to_claim(self, body) -> None:
        seen = self._seen_survivors(body)
        if self.claimed and seen is not None and self._full_graph() and seen < self.claimed:
            raise RequestError(f"only {seen} survivors named, {SHORT_OF_CLAIM} and booked ({self.claimed}): refusing "
                               f"to unmask (the release would be weaker than this site counted)")


def wrong_shares_named(outcome, aggregate: Aggregate):
    """The outcome with the holders whose unmask shares were off the other holders' polynomial
    named (robust unmasking, issue 48): in its details (`wrong_shares`: holder -> the sites whose
    secrets it sent a wrong share of) and, when it has a result, in a note on its reason (an
    abort's reason names them already)."""
    if not aggregate.wrong_shares or not isinstance(outcome, Outcome):
        return outcome
    outcome = outcome.with_details(wrong_shares=aggregate.wrong_shares)
    if outcome.status == "aborted":
        return outcome
    note = (f"unmask shares from {', '.join(sorted(aggregate.wrong_shares))} were off the other holders' polynomial: "
            f"corrected and left out (a share wrong in one secret only may have been dealt wrong by its owner)")
    return dataclasses.replace(outcome, reason="; ".join(r for r in (outcome.reason, note) if r))
