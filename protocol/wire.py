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

What a peer can make large is bounded before it is used (issues 36 and 47): each message type's
size on the raw bytes, before the body is decoded (MAX_BYTES_BY_TYPE; an envelope laid out
otherwise than `encode` lays it out is held to the smallest of them), and every free string a
peer sends: a site's `device` is a short name (DEVICE_PATTERN), names and reasons have a length
(MAX_FIELD_CHARS). Where such a string is shown, it is also escaped (protocol.inert).
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
#: 36): a small control message can never be large, whatever a peer sends. Every type has one
#: (issue 47: `sealed`, `request`, `response` and `batch` had none), sized from what the protocol
#: really sends, with room to spare:
#:   hello, join, open, batch_ready   a few integers, a phase name (64 characters), a device
#:                                    name (32): under 200 bytes
#:   close, shutdown                  an empty payload: about 40 bytes
#:   error                            a phase name and a reason of at most 1,000 characters
#:                                    (MAX_FIELD_CHARS; up to 4 bytes each in UTF-8): under 4.4 KB
#:   sealed                           one ciphertext for the shuffler (protocol.shuffle:
#:                                    MAX_CIPHERTEXT, 4,096 bytes) and its 16-byte claim: under 4.4 KB
#:   batch_open, batch_lost           a site id (64) per site, and a short reason each when lost:
#:                                    about 100 bytes a site, 10,000 sites in 1 MiB
#:   request, response, batch         the bodies, bounded only by the message limit: a K-anonymous
#:                                    table's limits (up to 2^20 bins of float64, 8 MiB), FedType's
#:                                    and FedAvg's model weights (protocol.codecs.tensors), a secure
#:                                    sum's shares (a 33-byte Shamir share or a 1 KiB ciphertext
#:                                    per neighbour) and masked vectors, every site's ciphertext
#:                                    in a shuffled batch; the sockets refuse more anyway
#:                                    (transport.channel: ZMQ_MAXMSGSIZE)
#: tests/test_wire.py checks that every type has a limit and that the largest legitimate message
#: of each small type fits under it.
MAX_BYTES_BY_TYPE = {"hello": 1024, "join": 1024, "open": 1024, "batch_ready": 1024, "close": 256, "shutdown": 256,
                     "error": 8192, "sealed": 8192, "batch_open": 1 << 20, "batch_lost": 1 << 20,
                     "request": MAX_MESSAGE_BYTES, "response": MAX_MESSAGE_BYTES, "batch": MAX_MESSAGE_BYTES}
#: an envelope not laid out as `encode` lays it out ("v" then "t" first) has no type to read before
#: decoding: it is held to the smallest limit of any type, so that it is within its own type's
#: limit whatever that type turns out to be (a `join` with its keys in another order once skipped
#: the limit of `join` altogether)
MAX_BYTES_UNCANONICAL = min(MAX_BYTES_BY_TYPE.values())
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
#: a site's `device` at join (where it scored its data: "cpu", "cuda", "cuda:0"): a short name,
#: never free text, since it is shown in events.jsonl, summary.json and the terminal (issue 47)
DEVICE_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,32}$")
#: the most characters of each free-text field a peer may send (issue 47: a reason or a name is
#: bounded on the wire, not only where it is shown); `phase` and `method` are names, printable
#: characters only. The strings inside the lists and maps of the shuffler's messages (site ids,
#: reasons) are held to MAX_TEXT_CHARS each.
MAX_FIELD_CHARS = {"device": 32, "phase": 64, "method": 64, "reason": 1000, "withheld": 1000}
NAME_FIELDS = frozenset({"phase", "method"})
MAX_TEXT_CHARS = 1000
#: fields whose contents the method's codec checks (bodies, a sealed message's claim)
OPAQUE_FIELDS = frozenset({"body", "claim"})

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
    if mtype is None and len(data) > MAX_BYTES_UNCANONICAL:
        raise WireError(f"message of {len(data)} bytes is not laid out as encode lays it out (a map of 6 "
                        f"entries, \"v\" and \"t\" first), and such a message may hold at most "
                        f"{MAX_BYTES_UNCANONICAL} bytes")
    if mtype is not None and mtype not in MAX_BYTES_BY_TYPE:
        raise WireError(short(f"unknown message type {mtype!r}"))
    if mtype is not None and len(data) > MAX_BYTES_BY_TYPE[mtype]:
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
    if mtype is not None and obj["t"] != mtype:  # a key repeated after the first "t" (then not 6 keys either)
        raise WireError(short(f"envelope's type {obj['t']!r} is not the {mtype!r} its first bytes say"))
    _validate(obj["t"], obj["s"], obj["f"], obj["n"], obj["p"])
    return Envelope(obj["t"], obj["s"], obj["f"], obj["n"], obj["p"])


def peek_type(packed: bytes) -> str | None:
    """The message type of an envelope as `encode` lays it out (a map of 6 whose first entries
    are "v": version and "t": type), read from its first bytes without decoding the rest; None
    for anything laid out otherwise (`decode` then holds it to MAX_BYTES_UNCANONICAL)."""
    if packed[:3] != b"\x86\xa1v" or len(packed) < 6 or packed[4:6] != b"\xa1t":
        return None
    size = packed[6] - 0xA0 if len(packed) > 6 and 0xA0 <= packed[6] <= 0xBF else -1
    if size < 0 or len(packed) < 7 + size:
        return None
    return packed[7:7 + size].decode("ascii", "replace")


def short(reason: str, limit: int = MAX_REASON_CHARS) -> str:
    """A reason cut to `limit` characters (it may quote what a peer sent)."""
    return reason if len(reason) <= limit else reason[:limit - 3] + "..."


def refusal(phase: str, reason: str) -> dict:
    """An `error` payload, its reason cut to what the wire admits (MAX_FIELD_CHARS): a site's
    reason may quote a long exception, and `encode` would refuse it whole."""
    return {"phase": phase, "reason": short(reason, MAX_FIELD_CHARS["reason"])}


def device_name(device) -> str:
    """A device name as the wire admits it at join (DEVICE_PATTERN): the name itself when it is
    one ("cpu", "cuda:0"), else its characters outside the pattern made "_" and cut short (a
    model may name its device freely; the coordinator shows it, so it travels as a short name)."""
    name = re.sub(r"[^A-Za-z0-9_.:-]", "_", str(device))[:MAX_FIELD_CHARS["device"]]
    return name or "unknown"


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
        if isinstance(value, str):
            _check_text(mtype, name, value)
        elif isinstance(value, (list, dict)) and name not in OPAQUE_FIELDS:
            _check_texts(mtype, name, value)


def _check_text(mtype: str, name: str, value: str) -> None:
    """A free-text field a peer sent: at most MAX_FIELD_CHARS[name] characters; a name printable;
    a device a short name (DEVICE_PATTERN). The reason quotes the value escaped and cut short."""
    limit = MAX_FIELD_CHARS.get(name, MAX_TEXT_CHARS)
    if len(value) > limit:
        raise WireError(f"{mtype}: field {name!r} is {len(value)} characters, more than the {limit} allowed")
    if name == "device" and not DEVICE_PATTERN.match(value):
        raise WireError(short(f"{mtype}: field 'device' must match {DEVICE_PATTERN.pattern}, got {value!r}"))
    if name in NAME_FIELDS and not value.isprintable():
        raise WireError(short(f"{mtype}: field {name!r} must be printable characters, got {value!r}"))


def _check_texts(mtype: str, name: str, value: list | dict) -> None:
    """The site ids and reasons in a list or map field of the shuffler's messages: each string
    (a key or an item) at most MAX_TEXT_CHARS characters."""
    items = [*value, *value.values()] if isinstance(value, dict) else value
    for item in items:
        if isinstance(item, str) and len(item) > MAX_TEXT_CHARS:
            raise WireError(f"{mtype}: a string in field {name!r} is {len(item)} characters, more than the "
                            f"{MAX_TEXT_CHARS} allowed")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reject_ext(code, data):
    raise WireError(f"msgpack extension type {code} is not allowed")
