"""A site as a peer of the in-memory transport (transport.memory): the in-process backend's site.

The same site as a site process's agent (sites.agent) in everything the protocol can see: it
checks every message (envelope, direction, sequence), answers through the one reply function
(sites.reply: policy, account, method half), numbers its own envelopes, and applies the
scenario's scripted faults on its side (transport.faults: crash, straggle, delay; messages
dropped, duplicated, held back or corrupted). A crash ends it (the transport reports it lost);
`kill_host` ends it too (in-process, each site is its own host).
"""

from __future__ import annotations

import logging
import os

from protocol.phases import SequenceGuard
from protocol.wire import COORDINATOR_TO_SITE, SHUFFLER_ID, WireError, decode
from sites.local import SiteLocal
from sites.reply import SHUFFLER, site_replies, where
from transport.faults import FaultInjector
from transport.memory import COORDINATOR_ID, MemoryPeer, Outbound, Packer


class MemorySite(MemoryPeer):
    def __init__(self, local: SiteLocal, faults: FaultInjector | None = None, shuffler: bool = False) -> None:
        self.name, self.local, self.faults, self.shuffler = local.site_id, local, faults, shuffler
        self.log = logging.getLogger(f"quorum.site.{self.name}")
        self.guard = SequenceGuard()
        self.packers = {COORDINATOR_ID: Packer(self.name), SHUFFLER_ID: Packer(self.name)}
        self.alive, self.crashed = True, False
        self.wakes = faults is not None  # a reorder fault holds messages back until their time

    def hello(self, now: float) -> list[Outbound]:
        return [Outbound(now, COORDINATOR_ID, self.packers[COORDINATOR_ID].pack("hello", 0, {"pid": os.getpid()}))]

    def deliver(self, sender: str, data: bytes, nbytes: int, now: float) -> list[Outbound]:
        try:
            envelope = decode(data)
        except WireError as exc:
            self.log.warning("rejected a message of %d bytes: %s", nbytes, exc)
            return []
        reason = (f"message type {envelope.type!r} is not sent by the coordinator"
                  if envelope.type not in COORDINATOR_TO_SITE else self.guard.check(envelope))
        if reason:
            self.log.warning("rejected a message of %d bytes: %s", nbytes, reason)
            return []
        if envelope.type == "shutdown":
            self.alive = False
            return []
        trial, phase, _ = where(envelope) if envelope.type != "close" else (None, None, None)
        delay = 0.0
        behaviour = self.faults.behaviour(trial, phase, envelope.session) if (
            self.faults is not None and envelope.type != "close") else None
        if behaviour is not None:
            action, seconds = behaviour
            self.log.warning("scripted fault: %s in trial %s, phase %s", action, trial, phase)
            if action in ("crash", "kill_host"):
                self.alive, self.crashed = False, True
                self.local.trials.forget(self.name)
                return []
            if action == "straggle":
                return []
            delay = seconds
        out = []
        for to, mtype, body in site_replies(self.local, envelope, self.shuffler, self.log):
            destination = SHUFFLER_ID if to == SHUFFLER else COORDINATOR_ID
            packed = self.packers[destination].pack(mtype, envelope.session, body)
            items = [(now + delay, packed, None)] if self.faults is None else self.faults.transform(
                packed, now + delay, trial, phase, envelope.session)
            out += [Outbound(at, destination, message) for at, message, _ in items]
        return out

    def next_wake(self) -> float | None:
        return self.faults.next_release() if self.faults is not None else None

    def wake(self, now: float) -> list[Outbound]:
        """Messages a `reorder` fault held back, released (to the coordinator, as the agent's first outbox does)."""
        return [Outbound(now, COORDINATOR_ID, message) for _, message, _ in self.faults.due(now)]
