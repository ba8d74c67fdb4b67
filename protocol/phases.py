"""Session phases as one table, in the manner of h11's state table.

Every exchange between the coordinator and the sites is a phase: the coordinator sends one
message type to a set of sites and accepts, from each of them and at most once, one answer type
(or an `error` saying why the site cannot answer). The table below is the single source of the
phase names and what each admits; the drivers, the fault injector and the ledger read it.

Run-level phases:      hello (sites announce themselves), join (a trial opens; sites load their
                       data, score it, and answer with their calibration size n_j).
Method-level phases:   each method's own `PhaseTable` (`Method.phases`): its phases, which may
                       follow which, and which carry a round number; all use request -> response.

A phase that repeats carries its round as data: `Phase("round", 17)` is named "round-17" on the
wire (and in the ledger, events and fault rules) and has `.name` "round" and `.round` 17; its
table turns a wire name back into a Phase (`PhaseTable.parse`), so no method parses a name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

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


class Phase(str):
    """A method phase: its wire name (this string) with the name of its table row and, for a
    phase that repeats, its round number. Phase("setup") is "setup"; Phase("round", 3) is "round-3"."""

    name: str
    round: int | None

    def __new__(cls, name: str, round: int | None = None) -> "Phase":
        text = name if round is None else f"{name}-{round}"
        phase = super().__new__(cls, text)
        phase.name, phase.round = name, round
        return phase

    def __reduce__(self):
        return Phase, (self.name, self.round)


@dataclass(frozen=True)
class PhaseStep:
    """One row of a method's phase table: a phase, the phases that may follow it (a session may
    end after any), and whether it repeats with a round number (0, 1, ... one more each time).

    A round may hold several numbered phases (DP-Δ-FL's two secure sums a round): a numbered
    phase after another numbered phase keeps its round, unless it follows itself or `opens` a
    round (the first phase of each round), which takes the next number."""

    name: str
    then: tuple[str, ...] = ()
    numbered: bool = False
    opens: bool = False


class PhaseTable:
    """A method's phases and transitions, as a table the reader sees and the engine follows
    (protocol.engine.Session refuses a step the table does not allow). `rounds`: how many times
    a numbered phase may repeat. A plain tuple of names (`phases = ("advertise", "share")`)
    declares phases that follow one another in that order, each once (`PhaseTable.of`)."""

    def __init__(self, *steps: PhaseStep, rounds: int = 0) -> None:
        if not steps:
            raise ValueError("a phase table needs at least one phase")
        self.steps = {step.name: step for step in steps}
        self.first = steps[0].name
        self.rounds = rounds
        for step in steps:
            unknown = set(step.then) - set(self.steps)
            if unknown:
                raise ValueError(f"phase {step.name!r} is followed by {sorted(unknown)}, which the table lacks")
            if step.numbered and rounds < 1:
                raise ValueError(f"phase {step.name!r} is numbered: give the table its rounds")

    @classmethod
    def of(cls, phases: "PhaseTable | Iterable[str]") -> "PhaseTable":
        """A method's `phases` as a table: a table as it is, a tuple of names in order."""
        if isinstance(phases, PhaseTable):
            return phases
        names = list(phases)
        if not names or not all(isinstance(name, str) and name for name in names) or len(set(names)) < len(names):
            raise ValueError(f"phases must be distinct non-empty names, got {phases!r}")
        return cls(*(PhaseStep(name, tuple(names[i + 1:i + 2])) for i, name in enumerate(names)))

    def opening(self) -> Phase:
        """The first phase of a session."""
        return Phase(self.first, 0 if self.steps[self.first].numbered else None)

    def parse(self, text: str) -> Phase | None:
        """The Phase a wire name stands for, or None when the method has no such phase."""
        if not isinstance(text, str):
            return None
        if text in self.steps and not self.steps[text].numbered:
            return Phase(text)
        name, _, number = text.rpartition("-")
        step = self.steps.get(name)
        if step is None or not step.numbered or not number.isdigit() or number != str(int(number)):
            return None
        return Phase(name, int(number)) if int(number) < self.rounds else None

    def __contains__(self, text) -> bool:
        return self.parse(text) is not None

    def follows(self, previous: Phase | None, phase: Phase) -> str | None:
        """Why `phase` may not come next after `previous` (None at a session's start), or None."""
        if previous is None:
            return None if phase == self.opening() else f"a session opens with {self.opening()}, not {phase}"
        step = self.steps[previous.name]
        if phase.name not in step.then:
            return f"{previous} is followed by {self.describe(step.then)}, not {phase}"
        step_now = self.steps[phase.name]
        if step_now.numbered:
            if previous.round is None:
                expected = 0
            elif phase.name == previous.name or step_now.opens:
                expected = previous.round + 1
            else:
                expected = previous.round
            if phase.round != expected:
                return f"after {previous} comes {Phase(phase.name, expected)}, not {phase}"
        return None

    def describe(self, names: Iterable[str] | None = None) -> str:
        """The phases in words, e.g. "setup, round-N (N < 1000), evaluate"."""
        names = list(self.steps) if names is None else list(names)
        if not names:
            return "nothing (the session ends)"
        return ", ".join(f"{n}-N (N < {self.rounds})" if self.steps[n].numbered else n for n in names)


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
