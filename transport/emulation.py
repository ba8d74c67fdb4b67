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
