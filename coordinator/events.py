"""events.jsonl: one JSON object per line for joins, dropouts, rejected messages, sessions, faults.

Each line is flushed as it is written, so a killed run keeps everything logged before the kill.
Every string of an event, keys included, is inert (protocol.inert): a reason, a site's device or
a plain-mode routing id may be what a peer chose, and stays one bounded line of printable text
wherever the event is shown (trace.json, timeline.png, a terminal tailing the file).
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from protocol.inert import MAX_SHOWN_CHARS, inert

#: the longest string an event keeps (refusals can quote a peer's own bytes; issues 36 and 47)
MAX_EVENT_REASON = MAX_SHOWN_CHARS


class EventLog:
    def __init__(self, path: str | Path | None) -> None:
        self._handle = open(path, "a", buffering=1) if path is not None else None
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()  # a launcher's watcher thread writes too (runner.ray_hosts)
        #: the Unix time of now: the pump's clock sets it (a virtual clock's network time, transport.clock)
        self.wall_clock = time.time

    def write(self, event: str, **fields: Any) -> None:
        record = {"ts": round(self.wall_clock(), 6), "event": event, **fields}
        line = json.dumps(_jsonable(record), allow_nan=False) + "\n"
        with self._lock:
            self.counts[event] = self.counts.get(event, 0) + 1
            if self._handle is None:
                return
            self._handle.write(line)
            self._handle.flush()

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _jsonable(value):
    """JSON-safe copy: non-finite floats become "inf"/"-inf"/"nan", numpy scalars plain numbers,
    strings inert (what a peer sent may be among them)."""
    if isinstance(value, str):
        return inert(value, MAX_EVENT_REASON)
    if isinstance(value, dict):
        return {inert(k, MAX_EVENT_REASON): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (int, float, bool)):
        return value
    return inert(value, MAX_EVENT_REASON)
