"""The communication ledger: every message the coordinator's socket sends or receives, with its
size on the wire, tagged with trial, session, method, codec, phase, site and direction.

Sizes are ZMTP 3 wire sizes (RFC 23): each frame costs a flags byte, a 1-byte length (8 bytes
above 255) and its body; the ROUTER's routing-identity frame never travels. Every connection
first exchanges a 64-byte greeting and a READY command carrying Socket-Type and Identity
properties (`null_handshake_bytes`); the ledger records that once per site as `handshake`.
TCP/IP headers are below this layer and not counted. `tests/test_ledger.py` checks these figures
against the bytes a TCP proxy actually relays.

In the star topology every message passes the coordinator's socket, so one ledger there sees
all traffic that reaches it; a message lost before reaching it is, by definition, not carried.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

GREETING_BYTES = 64
LEDGER_COLUMNS = ["trial", "session", "method", "codec", "phase", "site", "direction", "type", "bytes",
                  "info_bits", "accepted"]


def frame_bytes(length: int) -> int:
    """A ZMTP 3 frame: flags, a short (1-byte) or long (8-byte) size, then the body."""
    return 1 + (1 if length <= 255 else 8) + length


def message_wire_bytes(frame_lengths) -> int:
    """Wire size of one message made of frames with these body lengths."""
    return sum(frame_bytes(n) for n in frame_lengths)


def null_handshake_bytes(socket_type: str, identity: bytes) -> int:
    """Greeting plus READY under the NULL mechanism: READY's body is the command name
    (1 + 5 bytes) and each property as name-length (1), name, value-length (4), value."""
    properties = [(b"Socket-Type", socket_type.encode()), (b"Identity", identity)]
    body = 1 + len(b"READY") + sum(1 + len(k) + 4 + len(v) for k, v in properties)
    return GREETING_BYTES + frame_bytes(body)


@dataclass
class Ledger:
    """Rows in memory (for the report) and, when `path` is set, in ledger.csv as well."""

    path: Path | None = None
    rows: list[dict] = field(default_factory=list)
    context: dict = field(default_factory=dict)  # trial, session, method, codec, phase of the moment

    def record(self, *, site: str, direction: str, mtype: str, nbytes: int, info_bits: int = 0,
               accepted: bool = True, **override) -> dict:
        """Add one row (tags from `context`, then `override`); returns it for later updates."""
        row = {"trial": "", "session": "", "method": "", "codec": "", "phase": "", **self.context,
               **override, "site": site, "direction": direction, "type": mtype, "bytes": int(nbytes),
               "info_bits": int(info_bits), "accepted": int(bool(accepted))}
        self.rows.append(row)
        self._pending.append(row)
        return row

    def flush(self) -> None:
        """Append the rows recorded since the last flush to ledger.csv and force them to disk."""
        if self.path is None or not self._pending:
            self._pending.clear()
            return
        new = not self.path.exists()
        with open(self.path, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=LEDGER_COLUMNS)
            if new:
                writer.writeheader()
            writer.writerows(self._pending)
            handle.flush()
            os.fsync(handle.fileno())
        self._pending.clear()

    def __post_init__(self) -> None:
        self._pending: list[dict] = []
