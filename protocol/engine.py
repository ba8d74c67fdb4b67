"""One method session, sans-I/O: the engine every backend runs (h11's Connection, for Quorum).

A `Session` owns everything about one session of a method that is not a socket or a clock: it
builds the coordinator half (a half that fails on what the sites sent ends the session, not the
run), wraps each request with the codec, decodes each answer (an undecodable body is a dropout
with its reason, and a `rejected` event), counts rounds, and keeps the transcript: each phase's
requests, decoded answers and dropouts. `WireSession` puts it on the wire: each phase the half
asks for becomes a `PhaseExchange` (protocol.exchange: what to send, what to accept, who
dropped out, the shuffler's batch), and the events it decides (session_start, dropout, rejected,
session_end) wait for the pump to write them:

    wire = WireSession(Session(method, sizes, rng), session_id)
    wire.begin(trial, label)
    while (exchange := wire.next_exchange(timeout, clock.now(), shuffler=...)) is not None:
        ... move exchange.take() out, exchange.receive(envelope, now) in, exchange.tick(now) ...
        wire.finished(exchange)
    wire.close(); write(wire.take_events())

The pump (coordinator/driver.py) runs it over any transport and clock, for both backends; the
join is a session of its own (`JoinSession`), by one rule (`join_problem`). protocol/inprocess.py
steps a bare Session with no wire at all (`start`, `decode`, `advance`), for method unit tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from protocol.codecs import PayloadError
from protocol.exchange import PhaseExchange, SessionEvent
from protocol.inert import MAX_NAME_CHARS, inert
from protocol.methods.base import Method, Outcome, Send, guarded
from protocol.sessions import join_session


#: the largest n_j a session plans with (issue 48): eq. (5)'s order-statistic quadrature settles up
#: to here and not at 2 x 10^6 (stats.orderstats), so a larger announced size would abort every
#: FedCP-QQ-family session, everyone's; `runtime.max_n` may only lower it, and a join above it is a
#: dropout with the reason (join_problem). Up to it, what sites announce cannot stall planning:
#: eq. (6) searches about 2 sqrt(n alpha (1 - alpha)) Phi^{-1}(1 - 1/(m + 1)) rows at most (some
#: 2,200 at n = 10^6 and 10,000 sites), FedCP²-QQ's gamma grid stops at the first gamma no later
#: one can beat, the unequal quadratures hold a few hundred nodes' laws at a time, and the
#: optimized planner's search stops at stats.optimizer.DESCENT_WORK; what is left grows with the
#: number of sites, the study's, not with a peer's size. Measured (bench/plan_time.py
#: `at_the_bound`: 2 to 10,000 sites all at the bound, one at it among sites of 20, half and half,
#: sizes drawn up to it; every FedCP-QQ-family method, a process each, 2 cores): at most 21 s and
#: 287 MiB (FedCP-QQ's optimized planner at 10,000 unequal sites), where the same cases took up
#: to 216 s and 1.1 GiB, and FedCP²-QQ over 10,000 sites at the bound did not finish in 300 s.
MAX_PLANNED_N = 1_000_000


def join_problem(n: Any, max_n: int) -> str | None:
    """Why a site that joined a trial with `n` calibration points is a dropout (None: it is in):
    fewer than one, or more than `runtime.max_n` (at most MAX_PLANNED_N, what the planners hold):
    a size no method should plan with, which costs the site its place, not the session."""
    max_n = min(max_n, MAX_PLANNED_N)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= max_n:
        return (f"joined with n={n} calibration points (accepted: 1 to runtime.max_n = {max_n}, at most the "
                f"{MAX_PLANNED_N} the planners hold)")
    return None


@dataclass(frozen=True)
class Requests:
    """What the driver sends in one phase: each site's request payload as it goes on the wire."""

    phase: str
    requests: dict[str, dict]  # site -> the half's request body (before the codec wraps it)
    messages: dict[str, dict]  # site -> {"method", "phase", "body"}: the `request` payload
    minimum: int  # the fewest answers the phase's privacy was planned for (a shuffled batch's floor)
    route: str  # "direct", or "shuffler": answers come back as the shuffler's batch


@dataclass(frozen=True)
class PhaseRecord:
    """One phase of the transcript."""

    phase: str
    requests: dict[str, dict]
    answers: dict[str, Any]  # label (a site, or an anonymous batch label) -> decoded value
    dropped: dict[str, str]  # site or label -> reason


@dataclass
class Decoded:
    """Answers of one phase after the codec: values, bodies refused, information bits of each."""

    values: dict[str, Any] = field(default_factory=dict)
    undecodable: dict[str, str] = field(default_factory=dict)
    info_bits: dict[str, int] = field(default_factory=dict)


class Session:
    def __init__(self, method: Method, sizes: Mapping[str, int], rng: np.random.Generator,
                 keep_transcript: bool = True) -> None:
        """keep_transcript: keep each phase's requests and answers in the transcript (False: only
        its phase and dropouts, so that a phase's messages are freed once the half has them)."""
        self.keep_transcript = keep_transcript
        self.method = method
        self.sizes = dict(sizes)
        self.rng = rng
        self.codec = method.make_codec()
        self.phases = method.phase_table()
        self.transcript: list[PhaseRecord] = []
        self.half = None
        self.step: Send | Outcome | None = None
        self.events: list[SessionEvent] = []  # decided here, written by whichever pump runs the session

    @property
    def rounds(self) -> int:
        """Phases asked so far."""
        return len(self.transcript) + (1 if isinstance(self.step, Send) else 0)

    @property
    def outcome(self) -> Outcome | None:
        return self.step if isinstance(self.step, Outcome) else None

    def start(self) -> Requests | Outcome:
        half = guarded(self.method.coordinator, self.sizes, self.rng)
        if isinstance(half, Outcome):
            self.step = half
        else:
            self.half = half
            self.step = guarded(half.start)
        return self._next()

    def ask(self, requests: Mapping[str, dict], minimum: int | None = None) -> Requests:
        """The phase now open, asking `requests` instead of the half's own (an adversarial
        coordinator's rewrite, coordinator.adversary); the transcript records what was asked."""
        assert isinstance(self.step, Send), "no phase is open"
        self.step = Send(self.step.phase, dict(requests), self.step.minimum if minimum is None else minimum)
        return self._next()

    def _next(self) -> Requests | Outcome:
        if not isinstance(self.step, Send):
            return self.step
        step = self.step = self._on_table(self.step)
        if not isinstance(step, Send):
            return step
        messages = {site: {"method": self.method.name, "phase": step.phase, "body": self.codec.wrap_request(body)}
                    for site, body in step.requests.items()}
        return Requests(step.phase, dict(step.requests), messages, int(step.minimum), self.codec.route)

    def _on_table(self, step: Send) -> Send | Outcome:
        """The half's Send with its phase as the table's Phase, or the aborted outcome when the
        method's phase table does not allow that phase next: dispatch follows the table."""
        phase = self.phases.parse(step.phase)
        if phase is None:
            return Outcome.aborted(f"the coordinator half asked for phase {step.phase!r}, which {self.method.name} "
                                   f"does not have (its phases: {self.phases.describe()})")
        previous = self.transcript[-1].phase if self.transcript else None
        problem = self.phases.follows(previous, phase)
        if problem:
            return Outcome.aborted(f"the coordinator half left {self.method.name}'s phase table: {problem}")
        return Send(phase, step.requests, step.minimum)

    def decode(self, bodies: Mapping[str, Any]) -> Decoded:
        """The phase's received bodies through the codec, in label order (the same order in every
        backend); a body the codec refuses is named with the reason."""
        decoded = Decoded()
        for label, body in sorted(bodies.items()):
            try:
                value = self.codec.decode(body)
            except PayloadError as exc:
                decoded.undecodable[label] = f"undecodable {self.codec.name} body: {exc}"
                continue
            decoded.values[label] = value
            decoded.info_bits[label] = self.codec.information_bits(value)
        return decoded

    def exchange(self, step: Requests, session: int, timeout: float, now: float, shuffler: bool = True,
                 also_expected: tuple[str, ...] = ()) -> PhaseExchange:
        """The phase `step` opens, on the wire (protocol.exchange): its requests, its deadline
        `timeout` seconds from `now`, and through the shuffler when the codec says so."""
        sends = {site: ("request", message) for site, message in step.messages.items()}
        return PhaseExchange(session, step.phase, sends, timeout, now, route=step.route, minimum=step.minimum,
                             shuffler=shuffler, also_expected=tuple(also_expected))

    def take_answers(self, exchange: PhaseExchange) -> Decoded:
        """A finished phase's answers through the codec; its dropouts, then each body the codec
        refused, become the session's events (`dropout`, `rejected`)."""
        decoded = self.decode(exchange.answers)
        self.events.extend(exchange.events)
        for label, reason in decoded.undecodable.items():
            self.events.append(SessionEvent("rejected", {"site": label, "session": exchange.session,
                                                         "phase": exchange.phase, "reason": reason}))
        return decoded

    def take_events(self) -> list[SessionEvent]:
        """The events decided since the last call, for the pump to write."""
        events, self.events = self.events, []
        return events

    def advance(self, decoded: Decoded, dropped: Mapping[str, str]) -> Requests | Outcome:
        """The half's next step from this phase's decoded answers and dropouts."""
        assert isinstance(self.step, Send), "no phase is open"
        dropped = {**dict(dropped), **decoded.undecodable}
        kept, phase = self.keep_transcript, self.step.phase
        self.transcript.append(PhaseRecord(phase, dict(self.step.requests) if kept else {},
                                           dict(decoded.values) if kept else {}, dropped))
        self.step = None  # the phase's requests are freed while the half works out the next
        self.step = guarded(self.half.advance, phase, decoded.values, dropped)
        return self._next()

    def opening(self, trial: int, session: int, label: str) -> dict:
        """The `session_start` event's fields, the same in every backend."""
        return {"trial": trial, "session": session, "method": self.method.name, "label": label, "sites": len(self.sizes)}

    def closing(self, trial: int, session: int, label: str) -> dict:
        """The `session_end` event's fields, the same in every backend."""
        outcome = self.outcome
        return {"trial": trial, "session": session, "method": self.method.name, "label": label,
                "status": outcome.status, **outcome.event_fields(), "reason": outcome.reason,
                "rounds": self.rounds}

    def end(self, outcome: Outcome) -> Outcome:
        """End the session with an outcome the driver decided (an attack that replaced the method)."""
        self.step = outcome
        return outcome


class JoinSession:
    """A trial's join as a session of its own: `open` to every present site, `join` ({n, device})
    back; a site that sends a size no method should plan with is a dropout (join_problem), and the
    `trial_open` event says who joined with what, where they scored, and how long it took."""

    def __init__(self, trial: int, seed: int, sites, max_n: int) -> None:
        self.trial, self.seed, self.max_n = trial, seed, max_n
        self.session = join_session(trial)
        self.sites = list(sites)
        self.events: list[SessionEvent] = []

    def exchange(self, timeout: float, now: float) -> PhaseExchange:
        sends = {site: ("open", {"trial": self.trial, "seed": self.seed}) for site in self.sites}
        return PhaseExchange(self.session, "join", sends, timeout, now)

    def finish(self, exchange: PhaseExchange, seconds: float) -> tuple[dict[str, int], dict[str, str], dict[str, str]]:
        """(sizes of the sites that joined, dropouts with reasons, each joined site's device)."""
        self.events.extend(exchange.events)
        dropped, sizes = dict(exchange.dropped), {}
        # shown in events, summary.json and the terminal: a short name on the wire, inert here too
        devices = {site: inert(payload["device"], MAX_NAME_CHARS) for site, payload in exchange.payloads.items()}
        for site, payload in sorted(exchange.payloads.items()):
            problem = join_problem(payload["n"], self.max_n)
            if problem:
                dropped[site] = problem
                self.events.append(SessionEvent("dropout", {"site": site, "session": self.session, "phase": "join",
                                                            "reason": problem}))
            else:
                sizes[site] = payload["n"]
        self.events.append(SessionEvent("trial_open", {
            "trial": self.trial, "session": self.session, "sizes": sizes, "dropped": dropped,
            "devices": sorted(set(devices.values())), "seconds": round(seconds, 6)}))
        return sizes, dropped, devices

    def take_events(self) -> list[SessionEvent]:
        events, self.events = self.events, []
        return events


class WireSession:
    """A method Session as the exchanges a pump carries, one after another: `next_exchange` opens
    the phase the half asks for (protocol.exchange.PhaseExchange), `finished` reads its answers
    through the codec and advances the half; the events it decided wait in `take_events`. An
    attack wraps it with the same three calls (coordinator.attacked)."""

    def __init__(self, session: Session, session_id: int) -> None:
        self.session, self.session_id = session, session_id
        self.step: Requests | Outcome | None = None

    def begin(self, trial: int, label: str, start: bool = True) -> None:
        """The session opens (its `session_start` event); the half's first phase, unless `start` is
        False (an attack that never asks the method's own phases)."""
        self.trial, self.label = trial, label
        self.session.events.append(SessionEvent("session_start", self.session.opening(trial, self.session_id, label)))
        if start:
            self.step = self.session.start()

    def close(self) -> None:
        """The session's `session_end` event, once its outcome is known."""
        self.session.events.append(SessionEvent("session_end", self.session.closing(self.trial, self.session_id,
                                                                                     self.label)))

    def next_exchange(self, timeout: float, now: float, shuffler: bool) -> PhaseExchange | None:
        """The next phase on the wire, or None when the session has its outcome."""
        if not isinstance(self.step, Requests):
            return None
        return self.session.exchange(self.step, self.session_id, timeout, now, shuffler=shuffler)

    def finished(self, exchange: PhaseExchange) -> None:
        exchange.decoded = self.session.take_answers(exchange)
        self.step = None  # the phase's requests are freed while the half works out the next
        self.step = self.session.advance(exchange.decoded, exchange.dropped)

    def take_events(self) -> list[SessionEvent]:
        return self.session.take_events()

    @property
    def outcome(self) -> Outcome:
        return self.session.outcome
