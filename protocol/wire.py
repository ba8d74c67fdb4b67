"""The wire format: a versioned msgpack envelope with a CRC-32 trailer, validated on decode.

Envelope (a msgpack map with one-letter keys to keep small messages small):

    v  protocol version (int)         t  message type (str)
    s  session id (int)               f  sender id (str)
    n  sender's sequence number (int) p  payload (a map whose fields depend on t)

followed by 4 bytes: the CRC-32 of the packed map (little-endian). The trailer makes corruption
in transit and truncation detectable even in plain mode, where nothing else would notice a
flipped bit inside a float; CurveZMQ's MAC covers the same ground when it is on.

`decode` accepts exactly this shape and the payload fields listed in PAYLOADS; anything else
raises WireError with a reason meant for the event log. Codec-specific values inside a
response body are checked by the codec, not here.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: the largest message of each type, checked on the raw bytes before the body is decoded (issue
#: 36): the small control messages can never be large, whatever a peer sends
MAX_BYTES_BY_TYPE = {"hello": 1024, "join": 1024, "error": 8192, "open": 1024, "close": 256, "shutdown": 256,
                     "batch_ready": 1024, "batch_lost": 1 << 20, "batch_open": 1 << 20}
#: decoding limits: no string, byte string, array or map longer than these, and no more maps
#: and arrays in one message than MAX_CONTAINERS (8 MiB of empty maps decoded to about 590 MiB
#: of Python objects before; the containers a message may build are now bounded)
MAX_CONTAINERS = 200_000
DECODE_LIMITS = {"max_str_len": 1 << 20, "max_bin_len": MAX_MESSAGE_BYTES, "max_array_len": 1 << 20,
                 "max_map_len": 1 << 16}
#: how much of a refusal reason is kept (a reason may quote what the peer sent)
MAX_REASON_CHARS = 300
MAX_SEQUENCE = 2**63 - 1
CHECKSUM_BYTES = 4
SENDER_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")

#: Payload fields per message type: name -> accepted Python types.
PAYLOADS: dict[str, dict[str, tuple[type, ...]]] = {
    # site -> coordinator
    "hello": {"pid": (int,)},
    "join": {"n": (int,), "device": (str,)},  # calibration size; where the site scored its data
    "response": {"phase": (str,), "body": (object,)},
    "error": {"phase": (str,), "reason": (str,)},  # the phase whose message could not be served
    # coordinator -> site
    "open": {"trial": (int,), "seed": (int,)},
    "request": {"method": (str,), "phase": (str,), "body": (dict,)},
    "close": {},
    "shutdown": {},
    # the shuffler's three hops (protocol.shuffle): site -> shuffler, coordinator <-> shuffler
    # claim: {messages, key} the shuffler checks (protocol.shuffle.sealing_claim)
    "sealed": {"phase": (str,), "ciphertext": (bytes,), "claim": (dict,)},
    "batch_open": {"phase": (str,), "expected": (list,), "deadline": (int, float), "minimum": (int,)},
    "batch_ready": {"phase": (str,)},  # the shuffler holds the batch open: now the sites may be asked
    "batch_lost": {"phase": (str,), "sites": (dict,)},  # {site: reason}: connections the coordinator saw close
    "batch": {"phase": (str,), "ciphertexts": (list,), "senders": (list,), "refused": (dict,), "received": (dict,),
              "withheld": (str,)},
}
SITE_TO_COORDINATOR = frozenset({"hello", "join", "response", "error"})
COORDINATOR_TO_SITE = frozenset({"open", "request", "close", "shutdown"})
SITE_TO_SHUFFLER = frozenset({"sealed"})
COORDINATOR_TO_SHUFFLER = frozenset({"batch_open", "batch_lost", "shutdown"})
SHUFFLER_TO_COORDINATOR = frozenset({"hello", "batch_ready", "batch"})
SHUFFLER_ID = "shuffler"


class WireError(ValueError):
    """A message that cannot be accepted; str(error) is the reason."""


@dataclass(frozen=True)
class Envelope:
    type: str
    session: int
    sender: str
    seq: int
    payload: dict[str, Any] = field(default_factory=dict)


def encode(envelope: Envelope) -> bytes:
    """Serialize an envelope (validating it first, so that we never send what we would reject)."""
    _validate(envelope.type, envelope.session, envelope.sender, envelope.seq, envelope.payload)
    return seal(msgpack.packb(
        {"v": PROTOCOL_VERSION, "t": envelope.type, "s": envelope.session, "f": envelope.sender,
         "n": envelope.seq, "p": envelope.payload},
        use_bin_type=True,
    ))


def seal(packed: bytes) -> bytes:
    """Append the CRC-32 trailer to packed envelope bytes."""
    return packed + zlib.crc32(packed).to_bytes(CHECKSUM_BYTES, "little")


def decode(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Envelope:
    """Parse and validate one message; raise WireError with a reason on anything unexpected."""
    if len(data) > max_bytes:
        raise WireError(f"message of {len(data)} bytes exceeds the limit of {max_bytes}")
    if len(data) <= CHECKSUM_BYTES:
        raise WireError(f"message of {len(data)} bytes is too short to hold an envelope")
    packed, trailer = data[:-CHECKSUM_BYTES], data[-CHECKSUM_BYTES:]
    if zlib.crc32(packed).to_bytes(CHECKSUM_BYTES, "little") != trailer:
        raise WireError("checksum mismatch: the message was corrupted or truncated in transit")
    mtype = peek_type(packed)
    if mtype in MAX_BYTES_BY_TYPE and len(data) > MAX_BYTES_BY_TYPE[mtype]:
        raise WireError(f"{mtype} message of {len(data)} bytes exceeds its limit of {MAX_BYTES_BY_TYPE[mtype]}")
    budget = [MAX_CONTAINERS]

    def count(container):
        budget[0] -= 1
        if budget[0] < 0:
            raise WireError(f"more than {MAX_CONTAINERS} maps and arrays in one message")
        return container

    try:
        obj = msgpack.unpackb(packed, raw=False, strict_map_key=True, ext_hook=_reject_ext, object_hook=count,
                              list_hook=count, **DECODE_LIMITS)
    except WireError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise WireError(short(f"not a msgpack message: {type(exc).__name__}: {exc}")) from None
    if not isinstance(obj, dict):
        raise WireError(f"envelope must be a map, got {type(obj).__name__}")
    if set(obj) != {"v", "t", "s", "f", "n", "p"}:
        raise WireError(f"envelope keys must be v,t,s,f,n,p; got {sorted(map(str, obj))}")
    version = obj["v"]
    if not _is_int(version) or version != PROTOCOL_VERSION:
        raise WireError(f"unsupported protocol version {version!r} (this build speaks {PROTOCOL_VERSION})")
    _validate(obj["t"], obj["s"], obj["f"], obj["n"], obj["p"])
    return Envelope(obj["t"], obj["s"], obj["f"], obj["n"], obj["p"])


def peek_type(packed: bytes) -> str | None:
    """The message type of an envelope as `encode` lays it out (a map of 6 whose first entries
    are "v": version and "t": type), read from its first bytes without decoding the rest; None
    for anything laid out otherwise (the full decode then says what is wrong)."""
    if packed[:3] != b"\x86\xa1v" or len(packed) < 6 or packed[4:6] != b"\xa1t":
        return None
    size = packed[6] - 0xA0 if len(packed) > 6 and 0xA0 <= packed[6] <= 0xBF else -1
    if size < 0 or len(packed) < 7 + size:
        return None
    return packed[7:7 + size].decode("ascii", "replace")


def short(reason: str, limit: int = MAX_REASON_CHARS) -> str:
    """A reason cut to `limit` characters (it may quote what a peer sent)."""
    return reason if len(reason) <= limit else reason[:limit - 3] + "..."


def _validate(mtype, session, sender, seq, payload) -> None:
    if not isinstance(mtype, str) or mtype not in PAYLOADS:
        raise WireError(short(f"unknown message type {mtype!r}"))
    if not _is_int(session) or not 0 <= session <= MAX_SEQUENCE:
        raise WireError(f"{mtype}: session must be a non-negative integer, got {session!r}")
    if not isinstance(sender, str) or not SENDER_PATTERN.match(sender):
        raise WireError(short(f"{mtype}: sender must match {SENDER_PATTERN.pattern}, got {sender!r}"))
    if not _is_int(seq) or not 0 <= seq <= MAX_SEQUENCE:
        raise WireError(f"{mtype}: sequence number must be a non-negative integer, got {seq!r}")
    if not isinstance(payload, dict):
        raise WireError(f"{mtype}: payload must be a map, got {type(payload).__name__}")
    expected = PAYLOADS[mtype]
    if set(payload) != set(expected):
        raise WireError(short(f"{mtype}: payload fields must be {sorted(expected)}, got {sorted(map(str, payload))}"))
    for name, types in expected.items():
        value = payload[name]
        if types == (int,) and not _is_int(value):
            raise WireError(f"{mtype}: field {name!r} must be an integer, got {type(value).__name__}")
        if not isinstance(value, types):
            raise WireError(f"{mtype}: field {name!r} has type {type(value).__name__}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reject_ext(code, data):
    raise WireError(f"msgpack extension type {code} is not allowed")
