"""The links of transport.links, applied at one socket (the coordinator's, the shuffler's).

What is sent to a site leaves the socket when it would arrive at the site (`downlink`); what a
site sends is held after the socket receives it until it would have arrived (`uplink`): on
loopback the socket sees a message as the site sends it, so the hold is the link's whole delay.
Each direction of a site's link is a FIFO queue (transport.links: serialization at its
bandwidth, latency, jitter, never reordered), a lost message never arrives, and the network's
clock says whether a site is online. Times are the pump's clock (transport.clock: real
time.monotonic() seconds, or a virtual clock's network time); the emulator keeps each
direction's state (when it is free, its last arrival) and its seeded draws.

Under `network: {mode: kernel}` the kernel's qdiscs delay the messages (transport.kernel_links):
the emulator then delays nothing and keeps what stays with the coordinator in both modes, each
site's profile name and whether it is online.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Any

from protocol.wire import SHUFFLER_ID
from transport.base import Incoming
from transport.ledger import message_wire_bytes
from transport.links import Network, serialization_seconds


class LinkEmulator:
    def __init__(self, network: Network, started: float | None = None) -> None:
        self.network = network
        self.started = time.monotonic() if started is None else started
        self._free: dict[tuple[str, str], float] = {}
        self._last: dict[tuple[str, str], float] = {}
        self._rngs: dict[tuple[str, str], Any] = {}
        self.lost = 0  # messages the links dropped
        self.delays = network.mode != "kernel"  # False: the kernel's links delay the messages, not we

    def at(self, now: float) -> float:
        """The network clock (trace seconds) at monotonic time `now`."""
        return self.network.clock(now - self.started)

    def online(self, site: str, now: float) -> bool:
        return self.network.online(site, self.at(now))

    def link(self, site: str, now: float) -> str:
        """The name of the site's profile at `now` (its trace's step, or its profile)."""
        return self.network.profile(site, self.at(now)).name

    def arrival(self, site: str, direction: str, nbytes: int, now: float, lossless: bool = False) -> float | None:
        """When a message of `nbytes` wire bytes handed to the site's `direction` ("up" or
        "down") at monotonic `now` arrives; None when the link drops it (never when `lossless`)."""
        profile = self.network.profile(site, self.at(now))
        if not profile.emulated or not self.delays:
            return now
        key = (site, direction)
        rng = self._rngs.get(key)
        if rng is None:
            rng = self._rngs[key] = self.network.rng(site, direction)
        if profile.loss and rng.random() < profile.loss and not lossless:
            self.lost += 1
            return None
        start = max(now, self._free.get(key, now))
        free = start + serialization_seconds(nbytes, profile.rate(direction))
        self._free[key] = free
        jitter = max(-profile.latency, rng.normal(0.0, profile.jitter)) if profile.jitter else 0.0
        arrival = max(free + profile.latency + jitter, self._last.get(key, 0.0))
        self._last[key] = arrival
        return arrival


class Held:
    """Messages held until their arrival time (a heap by arrival, first come first out on ties)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()

    def put(self, due: float, item: Any) -> None:
        heapq.heappush(self._heap, (due, next(self._order), item))

    def pop_due(self, now: float) -> Any | None:
        if self._heap and self._heap[0][0] <= now:
            return heapq.heappop(self._heap)[2]
        return None

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)


class SocketLinks:
    """The scenario's links as one socket applies them (the coordinator's): the arrival of what it
    sends to a site, the hold on what a site sent until its uplink would have delivered it, lost
    messages (reported through `on_lost(site, direction)`), whether a site is online and its
    link's name; times on the pump's clock (`now`). The shuffler is on the coordinator's own
    network: no link of a site's applies to it."""

    def __init__(self, emulator: LinkEmulator, now, on_lost) -> None:
        self.emulator, self.now, self.on_lost = emulator, now, on_lost
        self.held = Held()  # what sites sent, held until their link delivers it: (incoming, when received)

    def downlink(self, peer: str, data: bytes, due: float, curve: bool) -> float | None:
        """When a message handed over at `due` reaches `peer` (None: its link dropped it)."""
        if peer == SHUFFLER_ID:
            return due
        arrival = self.emulator.arrival(peer, "down", message_wire_bytes([len(data)], curve), due)
        if arrival is None:
            self.on_lost(peer, "down")
        return arrival

    def uplink(self, incoming: Incoming | None) -> Incoming | None:
        """What the socket just received, if its link has delivered it by now; else None (held
        until then, or lost). A hello is the connection coming up (TCP's, reliable): delayed by
        the link, never lost."""
        if incoming is None or incoming.peer == SHUFFLER_ID:
            return incoming
        received = self.now()
        hello = incoming.envelope is not None and incoming.envelope.type == "hello"
        arrival = self.emulator.arrival(incoming.peer, "up", incoming.nbytes, received, lossless=hello)
        if arrival is None:
            self.on_lost(incoming.peer, "up")
            return None
        if arrival > self.now():
            self.held.put(arrival, (incoming, received))
            return None
        return incoming

    def link_name(self, site: str, at: float) -> str:
        return "" if site == SHUFFLER_ID else self.emulator.link(site, at)

    def offline(self, site: str) -> bool:
        """The site's link says it is offline now (a scenario's network availability)."""
        return site != SHUFFLER_ID and not self.emulator.online(site, self.now())
