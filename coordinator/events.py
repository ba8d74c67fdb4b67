"""events.jsonl: one JSON object per line for joins, dropouts, rejected messages, sessions, faults.

Each line is flushed as it is written, so a killed run keeps everything logged before the kill.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from protocol.wire import short

#: the longest reason an event keeps (refusals can quote a peer's own bytes; issue 36)
MAX_EVENT_REASON = 1000

class EventLog:
    def __init__(self, path: str | Path | None) -> None:
        self._handle = open(path, "a", buffering=1) if path is not None else None
        self.counts: dict[str, int] = {}
        self._lock = threading.Lock()  # a launcher's watcher thread writes too (runner.ray_hosts)

    def write(self, event: str, **fields: Any) -> None:
        if isinstance(fields.get("reason"), str):  # a reason may quote what a peer sent: kept short
            fields["reason"] = short(fields["reason"], MAX_EVENT_REASON)
        record = {"ts": round(time.time(), 6), "event": event, **fields}
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
    """JSON-safe copy: non-finite floats become "inf"/"-inf"/"nan", numpy scalars plain numbers."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)
