"""The clock a pump keeps its deadlines by (trio's Clock, for Quorum): `now` and `sleep_until`.

`RealClock` is time.monotonic(): deadlines pass as the machine's time passes, and what the
ledger calls "sent" and "arrived" is Unix time. `VirtualClock` is the network's own time: it
stands still while the harness computes and moves only when the pump, having nothing left to
deliver before an instant, advances it there (the in-memory transport does, transport.memory).
Links then delay messages without anyone waiting, so a study of many sites on slow links takes
the time its computation takes, not the time its network would (FedScale's virtual clock), and
two runs with the same seed see the same events in the same order.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod


class Clock(ABC):
    #: True when time moves only as the pump advances it (no sleeping, no wall-clock deadlines)
    virtual: bool = False

    @abstractmethod
    def now(self) -> float:
        """The current instant, in seconds (an origin of the clock's own)."""

    @abstractmethod
    def sleep_until(self, instant: float) -> None:
        """Return at `instant` (at once when it has passed)."""

    @abstractmethod
    def wall(self, instant: float) -> float:
        """The Unix time of a clock instant (the ledger's `sent` and `arrived` columns)."""


class RealClock(Clock):
    def now(self) -> float:
        return time.monotonic()

    def sleep_until(self, instant: float) -> None:
        time.sleep(max(0.0, instant - time.monotonic()))

    def wall(self, instant: float) -> float:
        return time.time() - (time.monotonic() - instant)


class VirtualClock(Clock):
    """Network time: starts at 0.0 and stands at the Unix time it was made, moves only forward."""

    virtual = True

    def __init__(self, start_wall: float | None = None) -> None:
        self._now = 0.0
        self._wall0 = time.time() if start_wall is None else start_wall

    def now(self) -> float:
        return self._now

    def advance_to(self, instant: float) -> None:
        """Move time forward to `instant` (never back)."""
        if instant > self._now:
            self._now = instant

    def sleep_until(self, instant: float) -> None:
        self.advance_to(instant)

    def wall(self, instant: float) -> float:
        return self._wall0 + instant
