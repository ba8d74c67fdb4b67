"""One method session, sans-I/O: the engine every backend runs (h11's Connection, for Quorum).

A `Session` owns everything about one session of a method that is not a socket or a clock: it
builds the coordinator half (a half that fails on what the sites sent ends the session, not the
run), wraps each request with the codec, decodes each answer (an undecodable body is a dropout
with its reason), turns a shuffler's batch into answers and dropouts (a short or withheld batch
forwards nothing), counts rounds, and keeps the transcript: each phase's requests, decoded
answers and dropouts. Events in (answers, dropouts, a batch), messages out (`Requests`, or the
`Outcome`):

    session = Session(method, sizes, rng)
    step = session.start()
    while isinstance(step, Requests):
        ... send step.messages (to the shuffler first when step.route == "shuffler"), collect ...
        decoded = session.decode(bodies)           # undecodable bodies become dropouts
        step = session.advance(decoded, dropped)
    outcome = step

The socket driver (coordinator/driver.py) adds sockets, deadlines, the ledger, faults and events;
the in-process backend (protocol/inprocess.py) is a short pump over the same Session. Joining a
trial follows one rule in both, `join_problem`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from protocol.codecs import PayloadError
from protocol.methods.base import Method, Outcome, Send, guarded
from protocol.shuffle import anonymous_label


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


def batch_answers(batch: Mapping[str, Any] | None, asked: list[str], waited: float) -> tuple[dict, dict]:
    """The shuffler's `batch` payload (protocol.shuffle.ShuffleBatch.forward), or None when none
    came within `waited` seconds, as the phase's answers ({anonymous label: sealed body}) and
    dropouts ({site: reason}) of the sites `asked`: a site is a dropout when the shuffler forwarded
    nothing from it (with the shuffler's reason: a refusal, no message, or a withheld batch)."""
    dropped: dict[str, str] = {}
    if batch is None:
        return {}, {site: f"no batch from the shuffler within {waited:g} s" for site in asked}
    answers = {anonymous_label(i): body for i, body in enumerate(batch["ciphertexts"])}
    for site in asked:
        if batch["withheld"] and site in batch["senders"]:
            dropped[site] = f"nothing forwarded by the shuffler: {batch['withheld']}"
        elif site not in batch["senders"]:
            dropped[site] = ("nothing forwarded by the shuffler: "
                             f"{batch['refused'].get(site, 'no sealed message by its deadline')}")
    return answers, dropped
