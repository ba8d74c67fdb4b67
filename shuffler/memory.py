"""The shuffler as a peer of the in-memory transport (transport.memory): the in-process backend's.

The same behaviour as the shuffler process (shuffler.driver), from the same sans-I/O core
(shuffler.core), on the pump's clock: batches opened, sealed messages offered, a batch forwarded
when complete or at its deadline, a sender's uplink applied (a scenario's network). Its peers are
the run's registered sites: a message from anyone else is refused, as the process's CURVE
allow-list refuses a key the registry does not hold (the sybil attack's forged senders); with
`runtime.security: plain` there is no registry (admitted None) and anyone is heard.
"""

from __future__ import annotations

import logging
import os

from protocol.wire import SHUFFLER_ID
from shuffler.core import ShufflerCore
from transport.emulation import Held, LinkEmulator
from transport.memory import COORDINATOR_ID, MemoryPeer, Outbound, Packer, unpack

log = logging.getLogger("quorum.shuffler")


class MemoryShuffler(MemoryPeer):
    name = SHUFFLER_ID
    wakes = True  # a batch's deadline, a held sealed message

    def __init__(self, admitted: frozenset[str] | None, links: LinkEmulator | None = None, curve: bool = False) -> None:
        """curve: messages sized as the shuffler's CurveZMQ socket would receive them."""
        self.curve = curve
        self.admitted, self.links = admitted, links if links is not None and links.network.emulated else None
        self.core, self.held, self.packer = ShufflerCore(), Held(), Packer(SHUFFLER_ID)
        self.alive, self.crashed = True, False
        self.refused_strangers = 0  # messages from parties the registry does not hold

    def hello(self, now: float) -> list[Outbound]:
        return [Outbound(now, COORDINATOR_ID, self.packer.pack("hello", 0, {"pid": os.getpid()}))]

    def deliver(self, sender: str, data: bytes, nbytes: int, now: float) -> list[Outbound]:
        incoming = unpack(sender, data, self.curve)
        if sender == COORDINATOR_ID:
            status, replies = self.core.from_coordinator(incoming.envelope, incoming.reason, now)
            if status == "shutdown":
                self.alive = False
            return [Outbound(now, COORDINATOR_ID, self.packer.pack(*reply)) for reply in replies] + self._due(now)
        if self.admitted is not None and sender not in self.admitted:
            self.refused_strangers += 1
            log.warning("refused a connection from %s: its key is not in the party registry", sender)
            return []
        arrival = now if self.links is None else self.links.arrival(sender, "up", incoming.nbytes, now)
        if arrival is None:
            log.info("a message of %d bytes from %s was lost on its link", incoming.nbytes, sender)
        elif arrival > now:
            self.held.put(arrival, incoming)
        else:
            self.core.from_site(incoming)
        return self._due(now)

    def next_wake(self) -> float | None:
        times = [t for t in (self.core.next_due(), self.held.next_due()) if t is not None]
        return min(times, default=None)

    def wake(self, now: float) -> list[Outbound]:
        while (released := self.held.pop_due(now)) is not None:
            self.core.from_site(released)
        return self._due(now)

    def _due(self, now: float) -> list[Outbound]:
        out = [Outbound(now, COORDINATOR_ID, self.packer.pack(*batch)) for batch in self.core.due(now)]
        for line in self.core.log:
            log.info("%s", line)
        self.core.log.clear()
        return out
