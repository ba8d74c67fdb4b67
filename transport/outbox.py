"""Sending through the fault injector: what leaves now, what leaves later, what is held back.

Both drivers send every message through an Outbox. Without faults it sends at once. With a
FaultInjector it sends what the injector lets through, keeps delayed and held messages until
their time, and reports each message that actually left (its destination, type and wire size,
and when it was handed over) to `on_sent`, so the ledger counts what travelled rather than what
was meant to. With `link(peer, data, due)` (transport.emulation, a scenario's network) each
message leaves when the peer's link delivers it (None: the link dropped it).
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable

from transport.faults import FaultInjector


class Outbox:
    def __init__(self, send_raw: Callable[[str | None, bytes], int | None], faults: FaultInjector | None = None,
                 on_sent: Callable[[str | None, str, int, float], None] | None = None,
                 link: Callable[[str | None, bytes, float], float | None] | None = None,
                 now: Callable[[], float] = time.monotonic) -> None:
        """now: the clock messages are due by (the pump's: transport.clock)."""
        self._send_raw, self.faults, self.on_sent, self.link, self.now = send_raw, faults, on_sent, link, now
        #: a heap of (due, order, data, peer, type, handed over): thousands of messages held on their
        #: links cost a log per message, not a scan per wake-up
        self.queue: list[tuple[float, int, bytes, str | None, str, float]] = []
        self._order = itertools.count()

    def send(self, data: bytes, mtype: str, *, peer=None, trial=None, phase=None, session=None, delay=0.0) -> bool:
        """Queue or send one packed message; False if it could not leave at once (not connected).
        trial, phase and session say which scripted faults concern it."""
        now = self.now()
        if self.faults is None:
            items = [(now + delay, data, peer)]
        else:
            items = self.faults.transform(data, now + delay, trial, phase, session, peer)
        ok = True
        for due, payload, destination in items:
            if self.link is not None:
                handed, due = due, self.link(destination, payload, due)
                if due is None:  # the link dropped it: it never arrives
                    continue
            else:
                handed = due
            if due <= now:
                ok = self._emit(destination, payload, mtype, handed) and ok
            else:
                heapq.heappush(self.queue, (due, next(self._order), payload, destination, mtype, handed))
        return ok

    def flush(self) -> None:
        now = self.now()
        ready = []
        while self.queue and self.queue[0][0] <= now:
            ready.append(heapq.heappop(self.queue))
        if self.faults is not None:
            ready += [(t, -1, d, p, "held", t) for t, d, p in self.faults.due(now)]
        for _, _, data, peer, mtype, handed in sorted(ready, key=lambda item: item[:2]):
            self._emit(peer, data, mtype, handed)

    def next_due(self) -> float | None:
        times = [self.queue[0][0]] if self.queue else []
        if self.faults is not None and self.faults.next_release() is not None:
            times.append(self.faults.next_release())
        return min(times, default=None)

    def timeout(self, default: float) -> float:
        due = self.next_due()
        return default if due is None else max(0.0, min(default, due - self.now()))

    def _emit(self, peer, data, mtype, handed: float) -> bool:
        nbytes = self._send_raw(peer, data)
        if nbytes is None:
            return False
        if self.on_sent is not None:
            self.on_sent(peer, mtype, nbytes, handed)
        return True
