"""The communication ledger: every message the coordinator's socket sends or receives, with its
size on the wire, tagged with trial, session, method, codec, phase, site and direction.

Sizes are ZMTP 3 wire sizes (RFC 23): each frame costs a flags byte, a 1-byte length (8 bytes
above 255) and its body; the ROUTER's routing-identity frame never travels. Under CurveZMQ
(RFC 26) each frame travels inside a MESSAGE command: the command name (8 bytes), a nonce (8),
the box's flags byte (1) and MAC (16) add 33 bytes. Every connection first exchanges a 64-byte
greeting and the mechanism's handshake, whose metadata carry Socket-Type and Identity
(`handshake_bytes`); the ledger records that once per site as `handshake`. TCP/IP headers are
below this layer and not counted. `tests/test_ledger.py` checks these figures against the bytes
a TCP proxy actually relays, in both modes.

In the star topology every message passes the coordinator's socket, so one ledger there sees
all traffic that reaches it; a message lost before reaching it is, by definition, not carried.
"""

from __future__ import annotations

import csv
import os
import time
from typing import Callable
from dataclasses import dataclass, field
from pathlib import Path

from protocol.inert import MAX_NAME_CHARS, inert

GREETING_BYTES = 64
CURVE_MESSAGE_OVERHEAD = 33
#: ts: Unix time the message left or arrived at the coordinator's socket (s, to 1 us); sent and
#: arrived: when it was handed to its link and when the link delivered it (equal to ts at the
#: socket's end; apart under a scenario's network), link: the site's profile (transport.links)
LEDGER_COLUMNS = ["trial", "session", "method", "codec", "phase", "site", "direction", "type", "bytes",
                  "info_bits", "accepted", "ts", "sent", "arrived", "link"]


def frame_bytes(length: int) -> int:
    """A ZMTP 3 frame: flags, a short (1-byte) or long (8-byte) size, then the body."""
    return 1 + (1 if length <= 255 else 8) + length


def message_wire_bytes(frame_lengths, curve: bool = False) -> int:
    """Wire size of one message made of frames with these body lengths."""
    extra = CURVE_MESSAGE_OVERHEAD if curve else 0
    return sum(frame_bytes(n + extra) for n in frame_lengths)


def _metadata(socket_type: str, identity: bytes) -> int:
    """Socket-Type and Identity properties: name-length (1), name, value-length (4), value."""
    properties = [(b"Socket-Type", socket_type.encode()), (b"Identity", identity)]
    return sum(1 + len(k) + 4 + len(v) for k, v in properties)


def null_handshake_bytes(socket_type: str, identity: bytes) -> int:
    """Greeting plus READY under the NULL mechanism (READY's body: "\x05READY" and metadata)."""
    return GREETING_BYTES + frame_bytes(1 + len(b"READY") + _metadata(socket_type, identity))


def handshake_bytes(curve: bool, socket_type: str, identity: bytes, client: bool) -> int:
    """Bytes one side sends to set up a connection. CURVE (RFC 26): the client sends HELLO
    (200-byte body) and INITIATE (257 bytes plus its metadata), then its presence (an empty
    message, 35 bytes: transport.channel.DealerChannel, issue 48), the server WELCOME (168) and
    READY (30 bytes plus its metadata)."""
    if not curve:
        return null_handshake_bytes(socket_type, identity)
    if client:
        return (GREETING_BYTES + frame_bytes(200) + frame_bytes(257 + _metadata(socket_type, identity))
                + frame_bytes(CURVE_MESSAGE_OVERHEAD))
    return GREETING_BYTES + frame_bytes(168) + frame_bytes(30 + _metadata(socket_type, identity))


@dataclass
class Ledger:
    """Rows in ledger.csv (when `path` is set) and, with `keep_rows`, in memory as well; the bytes
    of every (trial, method label, phase, direction) are summed as rows are flushed, so a run of
    many sites need not hold its rows (issue 40: 10,000 sites and 5 trials made 450,000 row dicts,
    and summing a session's bytes scanned them all)."""

    path: Path | None = None
    rows: list[dict] = field(default_factory=list)
    context: dict = field(default_factory=dict)  # trial, session, method, codec, phase of the moment
    keep_rows: bool = True
    #: the Unix time of now: the pump's clock (transport.clock: a virtual clock's network time)
    wall_clock: Callable[[], float] = time.time

    def record(self, *, site: str, direction: str, mtype: str, nbytes: int, info_bits: int = 0,
               accepted: bool = True, **override) -> dict:
        """Add one row (tags from `context`, then `override`); returns it for later updates. The
        site is inert (protocol.inert): in plain mode it is whatever routing id the peer chose."""
        now = round(self.wall_clock(), 6)
        row = {"trial": "", "session": "", "method": "", "codec": "", "phase": "", "link": "", **self.context,
               **override, "site": inert(site, MAX_NAME_CHARS), "direction": direction, "type": mtype,
               "bytes": int(nbytes),
               "info_bits": int(info_bits), "accepted": int(bool(accepted)), "ts": now, "arrived": now}
        row["sent"] = round(row.get("sent", now), 6)
        if direction == "down":  # the coordinator's socket is where a message to a site leaves
            row["ts"] = row["sent"]
        if self.keep_rows:
            self.rows.append(row)
        self._pending.append(row)
        return row

    def session_wire(self, trial, label: str) -> dict[tuple[str, str], int]:
        """(phase, "up" | "down") -> bytes of one session (its trial and method label), as flushed."""
        return dict(self._bytes.get((str(trial), label), {}))

    def flush(self) -> None:
        """Append the rows recorded since the last flush to ledger.csv and force them to disk (their
        rows are final by then: a caller may complete a row until the flush)."""
        for row in self._pending:
            sums = self._bytes.setdefault((str(row.get("trial")), row.get("method")), {})
            key = (str(row["phase"]), row["direction"])
            sums[key] = sums.get(key, 0) + int(row["bytes"])
        if self.path is None or not self._pending:
            self._pending.clear()
            return
        new = not self.path.exists()
        if self._columns is None:  # a run resumed from an older ledger keeps that ledger's columns
            self._columns = LEDGER_COLUMNS
            if not new:
                with open(self.path, newline="") as handle:
                    self._columns = next(csv.reader(handle), None) or LEDGER_COLUMNS
        columns = self._columns
        with open(self.path, "a", newline="") as handle:
            writer = csv.writer(handle)
            if new:
                writer.writerow(columns)
            # a row's values in the file's column order, with no per-row dict of DictWriter
            # (which cost 3 s of a 77,000-row flush at 10,000 sites); a column a row lacks is empty
            writer.writerows([row.get(column, "") for column in columns] for row in self._pending)
            handle.flush()
            os.fsync(handle.fileno())
        self._pending.clear()

    def __post_init__(self) -> None:
        self._pending: list[dict] = []
        self._bytes: dict[tuple[str, str], dict[tuple[str, str], int]] = {}  # (trial, label) -> session_wire
        self._columns: list[str] | None = None  # ledger.csv's header, read once


def read_ledger(path: Path) -> list[dict]:
    """ledger.csv's rows (all of a run's, across resumes), or none."""
    if not Path(path).exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))
