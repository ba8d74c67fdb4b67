"""Session phases as one table, in the manner of h11's state table.

Every exchange between the coordinator and the sites is a phase: the coordinator sends one
message type to a set of sites and accepts, from each of them and at most once, one answer type
(or an `error` saying why the site cannot answer). The table below is the single source of the
phase names and what each admits; the drivers, the fault injector and the ledger read it.

Run-level phases:      hello (sites announce themselves), join (a trial opens; sites load their
                       data, score it, and answer with their calibration size n_j).
Method-level phases:   named by each method (`Method.phases`); all use request -> response.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from protocol.wire import Envelope


@dataclass(frozen=True)
class PhaseSpec:
    sent: str | None  # what the coordinator sends to open the phase (None: sites speak first)
    answer: str  # the one answer type admitted, besides `error`


RUN_PHASES: dict[str, PhaseSpec] = {
    "hello": PhaseSpec(sent=None, answer="hello"),
    "join": PhaseSpec(sent="open", answer="join"),
}
METHOD_PHASE = PhaseSpec(sent="request", answer="response")


def phase_spec(phase: str) -> PhaseSpec:
    """The table row for a phase: a run-level phase by name, else a method phase."""
    return RUN_PHASES.get(phase, METHOD_PHASE)


@dataclass
class PhaseCollector:
    """Accepts the answers of one phase of one session and says why it refuses anything else.

    `offer` returns None for an accepted message, else the reason to log. Accepted answers land
    in `answers` (site -> payload) and accepted errors in `refusals` (site -> reason); `lose`
    records a site whose connection was lost (the driver learnt it from the transport), which
    the phase stops waiting for.
    """

    session: int
    phase: str
    expected: frozenset[str]
    answers: dict[str, dict[str, Any]] = field(default_factory=dict)
    refusals: dict[str, str] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)

    def offer(self, envelope: Envelope) -> str | None:
        spec = phase_spec(self.phase)
        if envelope.session != self.session:
            return f"{envelope.type} for session {envelope.session}, but session {self.session} is open"
        if envelope.type not in (spec.answer, "error"):
            return f"{envelope.type!r} is not allowed in phase {self.phase!r} (expects {spec.answer!r})"
        if envelope.sender not in self.expected:
            return f"{envelope.sender} is not a member of phase {self.phase!r} of session {self.session}"
        if envelope.sender in self.answers or envelope.sender in self.refusals:
            return f"second answer from {envelope.sender} in phase {self.phase!r}"
        if envelope.sender in self.lost:
            return f"{envelope.sender} was counted as dropped when its connection was lost"
        if envelope.payload.get("phase", self.phase) != self.phase:
            return (f"{envelope.type} for phase {envelope.payload['phase']!r} "
                    f"while phase {self.phase!r} is open")
        if envelope.type == "error":
            self.refusals[envelope.sender] = envelope.payload["reason"]
        else:
            self.answers[envelope.sender] = envelope.payload
        return None

    def lose(self, site: str, reason: str) -> bool:
        """True when `site` was still awaited (it is now dropped with `reason`)."""
        if site not in self.expected or site in self.answers or site in self.refusals or site in self.lost:
            return False
        self.lost[site] = reason
        return True

    @property
    def complete(self) -> bool:
        return len(self.answers) + len(self.refusals) + len(self.lost) >= len(self.expected)

    def missing(self) -> list[str]:
        return sorted(self.expected - set(self.answers) - set(self.refusals) - set(self.lost))


class SequenceGuard:
    """Rejects replays: each sender's sequence numbers must strictly increase."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def check(self, envelope: Envelope) -> str | None:
        last = self._last.get(envelope.sender, -1)
        if envelope.seq <= last:
            return f"replayed or reordered message from {envelope.sender}: seq {envelope.seq} <= {last}"
        self._last[envelope.sender] = envelope.seq
        return None

    def forget(self, sender: str) -> None:
        """A restarted process starts its sequence again."""
        self._last.pop(sender, None)
