"""One phase of a session on the wire, sans-I/O: what to send, what came in, who was lost, when
the deadline passed, and the events that say so.

A `PhaseExchange` is told the messages of a phase (site -> (type, payload)) and its timeout; it
hands the pump what to send (`take`), accepts or refuses each envelope that arrives (`receive`:
None, or the reason, which the pump writes as a `rejected` event), stops waiting for sites the
pump says are unreachable or lost (`not_sent`, `lose`), and ends at the deadline (`tick`). Its
`events` (dropouts, sorted by site, so that every backend writes them in one order) and its
`answers` / `dropped` are what the session goes on with.

A shuffled phase (route "shuffler") is three steps, all decided here: first `batch_open` to the
shuffler (the sites it expects, the deadline, the batch's minimum), then, once the shuffler says
`batch_ready` for this session and phase, the requests to the sites (so that no sealed answer can
reach the shuffler before its batch, whatever the load), and a `batch_lost` to the shuffler for
each site whose connection closes while it waits; the phase ends with the shuffler's `batch`,
whose anonymous answers and dropouts `batch_answers` reads. Nothing here knows a socket or a clock:
times are numbers the pump passes in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from protocol.inert import inert
from protocol.phases import PhaseCollector
from protocol.shuffle import anonymous_label
from protocol.wire import SHUFFLER_ID, Envelope

#: seconds the coordinator waits for the shuffler's batch beyond the phase deadline
BATCH_GRACE = 5.0


@dataclass(frozen=True)
class Outgoing:
    """A message the pump is to send: to whom, its type, its payload."""

    peer: str
    mtype: str
    payload: dict


@dataclass(frozen=True)
class SessionEvent:
    """An event of the run's log (coordinator.events), decided by a session: any pump writes it."""

    name: str
    fields: dict


@dataclass
class PhaseExchange:
    session: int
    phase: str
    sends: Mapping[str, tuple[str, dict]]  # site -> (message type, payload)
    timeout: float  # seconds the sites have to answer
    now: float  # when the phase opens (the pump's clock)
    route: str = "direct"  # or "shuffler"
    minimum: int = 0  # a shuffled batch's floor
    shuffler: bool = True  # False: no shuffler is connected to the run (a shuffled phase asks no one)
    also_expected: tuple[str, ...] = ()  # senders the batch also expects (the sybil attack's forged ones)
    forged: dict[str, dict] = field(default_factory=dict)  # their sealed payloads, sent once the batch is open
    codec: str = ""  # the codec its answers are read with, for the ledger ("": the session's)
    extra: bool = False  # asked by an attack beside the method's own phases
    outbox: list[Outgoing] = field(default_factory=list)
    events: list[SessionEvent] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    done: bool = False

    def __post_init__(self) -> None:
        self.collector = PhaseCollector(self.session, self.phase, frozenset(self.sends))
        self.batch: dict | None = None
        self.decoded = None  # the session's decoding of the answers (protocol.engine.Decoded), once read
        if self.route == "shuffler" and not self.shuffler:
            self.stage, self.deadline = "asking", self.now
            self.dropped.update({site: "no shuffler is connected to this run" for site in self.sends})
            self.done = True
            self._log()
        elif self.route == "shuffler":
            self.stage = "opening"  # waiting for the shuffler's batch_ready
            self.deadline = self.now + self.timeout
            self.outbox.append(Outgoing(SHUFFLER_ID, "batch_open", {
                "phase": self.phase, "expected": sorted([*self.sends, *self.also_expected]), "deadline": self.timeout,
                "minimum": int(self.minimum)}))
        else:
            self._ask(self.now)

    # -- what the pump does --------------------------------------------------------------------

    def take(self) -> list[Outgoing]:
        """The messages to send now (each once)."""
        out, self.outbox = self.outbox, []
        return out

    def not_sent(self, site: str, reason: str) -> None:
        """A request could not leave (the site is offline, or not connected): a dropout."""
        self.lose(site, reason)

    def lose(self, site: str, reason: str) -> None:
        """The site's connection closed while it was awaited: stop waiting (and tell the shuffler,
        whose batch need not wait for it either)."""
        if not self.collector.lose(site, reason):
            return
        if self.stage == "asking" and self.route == "shuffler":
            self.outbox.append(Outgoing(SHUFFLER_ID, "batch_lost", {"phase": self.phase,
                                                                    "sites": {site: inert(reason)}}))
        self._check_complete()

    def release(self, senders: list[str], reason: str) -> None:
        """Tell the shuffler its batch need not wait for `senders` (who will send nothing more)."""
        if senders:
            self.outbox.append(Outgoing(SHUFFLER_ID, "batch_lost", {
                "phase": self.phase, "sites": {name: inert(reason) for name in senders}}))

    def receive(self, envelope: Envelope, now: float) -> str | None:
        """None when the envelope belongs to this phase and is taken (at `now`), else why it is refused."""
        if self.done:
            return f"{envelope.type!r} after phase {self.phase!r} of session {self.session} ended"
        if self.stage == "opening":
            if (envelope.type == "batch_ready" and envelope.session == self.session
                    and envelope.payload["phase"] == self.phase):
                self._ask(now)
                return None
            return (f"{envelope.type!r} while waiting for the shuffler to open session {self.session}, "
                    f"phase {self.phase!r}")
        if envelope.type == "batch":
            if self.route != "shuffler":
                return f"a batch in phase {self.phase!r}, whose answers come directly"
            if envelope.session != self.session or envelope.payload["phase"] != self.phase:
                return (f"batch for session {envelope.session}, phase {envelope.payload['phase']!r}, while "
                        f"session {self.session}, phase {self.phase!r} is open")
            self.batch = envelope.payload
            self._finish()
            return None
        reason = self.collector.offer(envelope)
        if reason is None and envelope.type == "error" and self.route == "shuffler":
            self.release([envelope.sender], "refused")  # its batch need not wait for what it will not send
        if reason is None:
            self._check_complete()
        return reason

    @property
    def wake_at(self) -> float:
        """When the pump must call `tick` if nothing arrives before."""
        return self.deadline

    def tick(self, now: float) -> None:
        """The pump's clock moved to `now`: the phase ends when its deadline passed."""
        if self.done or now < self.deadline:
            return
        if self.stage == "opening":
            for site in self.sends:
                self.dropped[site] = (f"not asked: the shuffler did not confirm the batch within "
                                      f"{self.timeout:g} s")
            self.done = True
            self._log()
            return
        self._finish()

    # -- what the session reads --------------------------------------------------------------

    @property
    def answers(self) -> dict[str, Any]:
        """{site or anonymous label: the received payload's body} (a shuffled phase: the batch's)."""
        if self.route == "shuffler":
            bodies, _ = batch_answers(self.batch, list(self.sends), self.timeout + BATCH_GRACE)
            return bodies
        return {site: payload["body"] for site, payload in self.collector.answers.items()}

    @property
    def payloads(self) -> dict[str, dict]:
        """The accepted answers' whole payloads (a join's {n, device})."""
        return dict(self.collector.answers)

    # -- inside --------------------------------------------------------------------------------

    def _ask(self, opened: float) -> None:
        self.stage = "asking"
        self.deadline = opened + self.timeout + (BATCH_GRACE if self.route == "shuffler" else 0.0)
        gone = sorted(self.collector.lost)  # lost while the shuffler opened the batch: not asked
        self.release(gone, "connection lost before it was asked")
        for site, (mtype, payload) in self.sends.items():
            if site not in self.collector.lost:
                self.outbox.append(Outgoing(site, mtype, payload))
        if not self.sends and self.route != "shuffler":
            self._finish()

    def _check_complete(self) -> None:
        if self.route != "shuffler" and self.collector.complete:
            self._finish()

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        dropped = {site: f"refused: {inert(reason)}" for site, reason in self.collector.refusals.items()}
        dropped.update(self.collector.lost)
        if self.route == "shuffler":
            for site in self.collector.answers:  # a site that sent its answer past the shuffler
                dropped[site] = "answered the coordinator directly in a shuffled phase"
            _, lost = batch_answers(self.batch, list(self.sends), self.timeout + BATCH_GRACE)
            dropped = {**{site: inert(reason) for site, reason in lost.items()}, **dropped}
            if self.batch is not None and not self.batch["withheld"]:
                for site in self.batch["senders"]:  # its sealed message is in the batch: it answered,
                    dropped.pop(site, None)  # whatever else it told the coordinator
        else:
            for site in self.collector.missing():
                dropped[site] = f"no answer within the {self.phase} deadline ({self.timeout:g} s)"
        self.dropped.update(dropped)
        self._log()

    def _log(self) -> None:
        for site in sorted(self.dropped):
            self.events.append(SessionEvent("dropout", {"site": site, "session": self.session,
                                                        "phase": self.phase, "reason": self.dropped[site]}))


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
