"""The shuffler's side of the protocol, sans-I/O: what it does with each message, and when.

`ShufflerCore` holds the open batches (protocol.shuffle.ShuffleBatch) and the sequence guards:
a `batch_open` from the coordinator opens a batch and is answered `batch_ready`; `batch_lost`
stops a batch waiting for the sites it names (their connection closed, or they refused), and
refuses what they send after; a site's `sealed` message is offered to its batch
(or refused, with the reason); a batch is forwarded as one `batch` when complete or at its
deadline, and closed (a later sealed message for it is refused as late). The shuffler process
(shuffler.driver) runs it over ZeroMQ in real time; the in-memory shuffler (shuffler.memory) over
the in-memory transport, on the pump's clock: one behaviour for both backends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from protocol.phases import SequenceGuard
from protocol.shuffle import ShuffleBatch
from protocol.wire import COORDINATOR_TO_SHUFFLER, SITE_TO_SHUFFLER, Envelope

FORGET_AFTER = 10_000  # forwarded (session, phase) pairs remembered to call late messages late


@dataclass
class ShufflerCore:
    open_batches: dict[tuple[int, str], tuple[ShuffleBatch, float]] = field(default_factory=dict)
    forwarded: list[tuple[int, str]] = field(default_factory=list)
    site_guard: SequenceGuard = field(default_factory=SequenceGuard)
    coordinator_guard: SequenceGuard = field(default_factory=SequenceGuard)
    log: list[str] = field(default_factory=list)  # what it did and refused, for the driver's log

    def from_coordinator(self, envelope: Envelope | None, reason: str | None, now: float) -> tuple[str, list]:
        """A coordinator message: ("shutdown" | "refused" | "ok", messages to send up: (type, session, payload))."""
        if envelope is not None and envelope.type not in COORDINATOR_TO_SHUFFLER:
            reason = f"message type {envelope.type!r} is not sent to the shuffler"
        if envelope is not None and reason is None:
            reason = self.coordinator_guard.check(envelope)
        if reason:
            self.log.append(f"refused a coordinator message: {reason}")
            return "refused", []
        if envelope.type == "shutdown":
            return "shutdown", []
        if envelope.type == "batch_lost":
            opened = self.open_batches.get((envelope.session, envelope.payload["phase"]))
            for site, why in envelope.payload["sites"].items():
                if opened is not None and isinstance(site, str):
                    opened[0].lose(site, str(why))
            self.log.append(f"session {envelope.session}, phase {envelope.payload['phase']}: "
                            f"{len(envelope.payload['sites'])} sites' connections lost (the coordinator says)")
            return "ok", []
        p = envelope.payload
        expected = frozenset(s for s in p["expected"] if isinstance(s, str))
        self.open_batches[(envelope.session, p["phase"])] = (
            ShuffleBatch(envelope.session, p["phase"], expected, int(p["minimum"])), now + float(p["deadline"]))
        self.log.append(f"batch open: session {envelope.session}, phase {p['phase']}, {len(expected)} sites, "
                        f"at least {int(p['minimum'])} messages, {float(p['deadline']):.1f} s")
        return "ok", [("batch_ready", envelope.session, {"phase": p["phase"]})]

    def from_site(self, incoming) -> str | None:
        """A site's message (transport.base.Incoming): None when its batch took it, else why not."""
        envelope, reason = incoming.envelope, incoming.reason
        if envelope is not None and reason is None:
            key = (envelope.session, envelope.payload.get("phase"))
            if envelope.type not in SITE_TO_SHUFFLER:
                reason = f"message type {envelope.type!r} is not sent to the shuffler"
            elif envelope.sender != incoming.peer:
                reason = (f"connection authenticated as {incoming.peer!r} (by its key) sent as {envelope.sender!r}"
                          if incoming.user_id else
                          f"sender field says {envelope.sender!r} but the message came from {incoming.peer!r}")
            elif incoming.user_id is not None and incoming.user_id != incoming.peer:
                reason = f"connection authenticated as {incoming.user_id!r} sent as {incoming.peer!r}"
            elif key in self.forwarded:  # checked before the sequence: a late message is refused as late
                reason = f"late: the batch of session {key[0]}, phase {key[1]} was already forwarded"
            else:
                reason = self.site_guard.check(envelope)
            if reason is None:
                if key in self.open_batches:
                    reason = self.open_batches[key][0].offer(envelope.sender, key[1], envelope.payload["ciphertext"],
                                                             incoming.nbytes, envelope.payload["claim"])
                else:
                    reason = f"no batch is open for session {key[0]}, phase {key[1]}"
        if reason:
            self.log.append(f"refused a message of {incoming.nbytes} bytes from {incoming.peer}: {reason}")
        else:
            self.log.append(f"sealed message of {incoming.nbytes} bytes from {envelope.sender} "
                            f"(session {envelope.session})")
        return reason

    def next_due(self) -> float | None:
        """The earliest deadline of an open batch."""
        return min((deadline for _, deadline in self.open_batches.values()), default=None)

    def due(self, now: float) -> list[tuple[str, int, dict]]:
        """The batches to forward now (complete, or past their deadline), as `batch` messages."""
        out = []
        for key, (batch, deadline) in list(self.open_batches.items()):
            if batch.complete or now >= deadline:
                payload = batch.forward()
                out.append(("batch", batch.session, payload))
                del self.open_batches[key]
                self.forwarded.append(key)
                del self.forwarded[:-FORGET_AFTER]
                self.log.append(f"batch forwarded: session {key[0]}, phase {key[1]}, {len(payload['senders'])} of "
                                f"{len(batch.expected)} sealed messages"
                                f"{'' if batch.complete else ' (deadline passed)'}"
                                f"{'; ciphertexts ' + payload['withheld'] if payload['withheld'] else ''}")
        return out
