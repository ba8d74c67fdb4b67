"""Who is in the run, and the run-level checks of every envelope that reaches the coordinator, sans-I/O.

Before any session looks at an envelope, the coordinator checks that it speaks for the peer it
came from (under CURVE the key names the peer: a site cannot speak for another), that its type
is one that peer may send (transport direction: protocol.wire), and that its sequence number
follows the peer's last (SequenceGuard: no replay, no reordering). A `hello` makes its sender a
member (the shuffler's makes the run's shuffler present) and restarts its sequence.
"""

from __future__ import annotations

from protocol.exchange import SessionEvent
from protocol.phases import SequenceGuard
from protocol.wire import SHUFFLER_ID, SHUFFLER_TO_COORDINATOR, SITE_TO_COORDINATOR, Envelope


class Membership:
    def __init__(self) -> None:
        self.members: dict[str, int] = {}  # site id -> the pid it reported
        self.shuffler_pid: int | None = None  # set when the shuffler said hello
        self.guard = SequenceGuard()

    def check(self, peer: str, envelope: Envelope, curve: bool) -> str | None:
        """None when `envelope`, received from `peer`, may go on to a session; else why not."""
        if curve and envelope.sender != peer:
            return (f"connection authenticated as {peer!r} (by its key) sent as {envelope.sender!r}: "
                    f"a site cannot speak for another")
        if envelope.sender != peer:
            return f"sender field says {envelope.sender!r} but the message came from {peer!r}"
        if envelope.sender == SHUFFLER_ID:
            if envelope.type not in SHUFFLER_TO_COORDINATOR:
                return f"message type {envelope.type!r} is not sent by the shuffler"
        elif envelope.type not in SITE_TO_COORDINATOR:
            return f"message type {envelope.type!r} is not sent by sites"
        if envelope.type == "hello":
            self.guard.forget(envelope.sender)  # a (re)started site numbers from zero again
        return self.guard.check(envelope)

    def hello(self, envelope: Envelope) -> tuple[bool, SessionEvent]:
        """A checked hello: (whether its sender is new to the run, the `hello` event)."""
        pid = envelope.payload["pid"]
        if envelope.sender == SHUFFLER_ID:
            new, self.shuffler_pid = self.shuffler_pid is None, pid
        else:
            new = envelope.sender not in self.members
            self.members[envelope.sender] = pid
        return new, SessionEvent("hello", {"site": envelope.sender, "pid": pid})
