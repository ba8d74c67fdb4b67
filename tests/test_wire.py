"""The envelope: round trips, size, and rejection of everything malformed."""

import math

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codecs import CODECS, PayloadError
from protocol.wire import PROTOCOL_VERSION, Envelope, WireError, decode, encode, seal


def response(body, session=19001, sender="site-049", seq=7):
    return Envelope("response", session, sender, seq, {"phase": "respond", "body": body})


def raw(**overrides):
    obj = {"v": PROTOCOL_VERSION, "t": "join", "s": 3, "f": "site-001", "n": 1, "p": {"n": 20, "device": "cpu"}}
    obj.update(overrides)
    return seal(msgpack.packb(obj, use_bin_type=True))


def test_round_trip():
    env = response(0.123456789)
    assert decode(encode(env)) == env


def test_any_flipped_bit_is_detected():
    data = bytearray(encode(response(0.5)))
    for position in range(len(data)):
        for bit in range(8):
            damaged = bytearray(data)
            damaged[position] ^= 1 << bit
            with pytest.raises(WireError):
                decode(bytes(damaged))


def test_small_responses_are_lean():
    # A raw-quantile answer and a bin index must each be well under 100 bytes on the wire; the
    # ZMTP frame adds 2 bytes to these envelopes (69 and 61 bytes, CRC trailer included).
    assert len(encode(response(CODECS["raw_quantile"]().encode(1.2345)))) <= 69
    assert len(encode(response(57))) <= 61


@pytest.mark.parametrize("data,fragment", [
    (seal(b"\xc1garbage"), "not a msgpack message"),
    (b"\xc1garbage", "checksum mismatch"),
    (raw()[:-1], "checksum mismatch"),
    (b"abc", "too short"),
    (seal(msgpack.packb([1, 2, 3])), "envelope must be a map"),
    (raw(v=2), "unsupported protocol version 2"),
    (raw(v="1"), "unsupported protocol version"),
    (raw(t="launch"), "unknown message type"),
    (raw(s=-1), "session must be a non-negative integer"),
    (raw(s=True), "session must be a non-negative integer"),
    (raw(f="site 1"), "sender must match"),
    (raw(f=""), "sender must match"),
    (raw(n=1.5), "sequence number"),
    (raw(p=[1]), "payload must be a map"),
    (raw(p={"n": 20, "device": "cpu", "extra": 1}), "payload fields must be"),
    (raw(p={"n": "20", "device": "cpu"}), "field 'n' must be an integer"),
    (raw(p={"n": True, "device": "cpu"}), "field 'n' must be an integer"),
    (seal(msgpack.packb({"v": 1, "t": "join"})), "envelope keys must be"),
    (seal(msgpack.packb(msgpack.ExtType(5, b"x"))), "extension type 5"),
])
def test_rejects_malformed_messages_with_a_reason(data, fragment):
    with pytest.raises(WireError) as excinfo:
        decode(data)
    assert fragment in str(excinfo.value)


def test_rejects_oversized_messages():
    with pytest.raises(WireError, match="exceeds the limit"):
        decode(encode(response(b"x" * 2000)), max_bytes=1000)


def test_encode_refuses_what_decode_would_refuse():
    with pytest.raises(WireError):
        encode(Envelope("join", 1, "site-001", 0, {"n": "many", "device": "cpu"}))


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_raise_only_wire_errors(data):
    try:
        decode(data)
    except WireError:
        pass


@pytest.mark.parametrize("body", ["1.0", None, True, [1.0], math.nan, -math.inf, 3])
def test_raw_quantile_codec_rejects_non_quantiles(body):
    with pytest.raises(PayloadError):
        CODECS["raw_quantile"]().decode(body)


def test_raw_quantile_codec_keeps_infinity():
    assert CODECS["raw_quantile"]().decode(math.inf) == math.inf


def test_raw_scores_codec():
    codec = CODECS["raw_scores"]()
    assert list(codec.decode(codec.encode([1.5, -2.0]))) == [1.5, -2.0]
    for body in [b"1234567", "scores", [1.0, 2.0], codec.encode([math.nan])]:
        with pytest.raises(PayloadError):
            codec.decode(body)


def test_a_map_bomb_is_refused_before_it_costs_memory():
    """Issue 36: 8 MiB of empty maps inside a valid envelope decoded to about 590 MiB of Python
    objects; now the decode stops at MAX_CONTAINERS maps and arrays, in bounded time and memory."""
    import time
    import tracemalloc
    import zlib

    import msgpack

    from protocol.wire import MAX_CONTAINERS, WireError, decode

    bombs = [{}] * (4 * 1024 * 1024)  # packs to about 4 MiB: one byte per empty map
    packed = msgpack.packb({"v": 1, "t": "response", "s": 1, "f": "site-000", "n": 0,
                            "p": {"phase": "respond", "body": [bombs[i:i + 65536] for i in range(0, len(bombs), 65536)]}},
                           use_bin_type=True)
    data = packed + zlib.crc32(packed).to_bytes(4, "little")
    tracemalloc.start()
    began = time.monotonic()
    with pytest.raises(WireError, match=f"more than {MAX_CONTAINERS} maps and arrays"):
        decode(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert time.monotonic() - began < 2 and peak < 64 * 2**20


def test_a_control_message_is_bounded_by_its_type_before_decoding():
    import zlib

    import msgpack

    from protocol.wire import MAX_BYTES_BY_TYPE, WireError, decode, short

    packed = msgpack.packb({"v": 1, "t": "join", "s": 1, "f": "site-000", "n": 0,
                            "p": {"n": 5, "device": "x" * 100_000}}, use_bin_type=True)
    with pytest.raises(WireError, match=f"join message of .* exceeds its limit of {MAX_BYTES_BY_TYPE['join']}"):
        decode(packed + zlib.crc32(packed).to_bytes(4, "little"))
    assert len(short("x" * 10_000)) == 300


# -- issue 47, point 6: every type has a limit, whatever the key order; free strings are bounded --


def _packed(obj: dict) -> bytes:
    return seal(msgpack.packb(obj, use_bin_type=True))


def test_every_message_type_has_a_size_limit_within_the_message_limit():
    from protocol.wire import MAX_BYTES_BY_TYPE, MAX_BYTES_UNCANONICAL, MAX_MESSAGE_BYTES, PAYLOADS

    assert set(MAX_BYTES_BY_TYPE) == set(PAYLOADS)
    assert all(0 < limit <= MAX_MESSAGE_BYTES for limit in MAX_BYTES_BY_TYPE.values())
    assert MAX_BYTES_UNCANONICAL == min(MAX_BYTES_BY_TYPE.values())


@pytest.mark.parametrize("order", [["p", "n", "f", "s", "t", "v"], ["t", "v", "s", "f", "n", "p"],
                                   ["v", "s", "t", "f", "n", "p"]])
def test_a_reordered_envelope_over_its_types_limit_is_refused_before_its_body_is_decoded(order, monkeypatch):
    """A `join` of 2,000 bytes (its limit is 1,024) with its keys in another order than `encode`
    lays them out once passed as a message of unknown type; now it is refused on its length,
    and msgpack never decodes it."""
    import protocol.wire as wire

    fields = {"v": PROTOCOL_VERSION, "t": "join", "s": 1, "f": "site-001", "n": 0,
              "p": {"n": 5, "device": "x" * 2000}}
    data = _packed({key: fields[key] for key in order})
    assert len(data) > wire.MAX_BYTES_BY_TYPE["join"]

    def never(*args, **kwargs):
        raise AssertionError("the body was decoded")

    monkeypatch.setattr(wire.msgpack, "unpackb", never)
    with pytest.raises(WireError, match="not laid out as encode lays it out"):
        decode(data)


def test_a_reordered_envelope_within_the_smallest_limit_still_decodes():
    """What `decode` accepts did not change for small messages: the key order is free there."""
    env = Envelope("close", 4, "coordinator", 2, {})
    data = _packed({"p": {}, "n": 2, "f": "coordinator", "s": 4, "t": "close", "v": PROTOCOL_VERSION})
    assert decode(data) == env


@pytest.mark.parametrize("mtype", ["request", "response", "sealed", "batch", "error"])
def test_every_type_is_held_to_its_own_limit(mtype):
    from protocol.wire import MAX_BYTES_BY_TYPE

    limit = MAX_BYTES_BY_TYPE[mtype]
    packed = msgpack.packb({"v": PROTOCOL_VERSION, "t": mtype, "s": 1, "f": "site-001", "n": 0,
                            "p": {"pad": b"x" * limit}}, use_bin_type=True)
    with pytest.raises(WireError, match=f"{mtype} message of .* exceeds its limit of {limit}"):
        decode(seal(packed), max_bytes=2 * limit)


def test_the_largest_legitimate_small_messages_fit_their_limits():
    """What the protocol really sends at the top of each bounded field passes its type's limit:
    the longest reason and phase in 4-byte UTF-8, a maximal device, a sealed message with the
    largest ciphertext the shuffler takes, all integers at their largest."""
    from protocol.shuffle import MAX_CIPHERTEXT
    from protocol.wire import MAX_BYTES_BY_TYPE, MAX_FIELD_CHARS, MAX_SEQUENCE

    wide, top = "\U0001F600", MAX_SEQUENCE
    phase = "p" * MAX_FIELD_CHARS["phase"]
    messages = [
        Envelope("error", top, "s" * 64, top, {"phase": wide * MAX_FIELD_CHARS["phase"],
                                               "reason": wide * MAX_FIELD_CHARS["reason"]}),
        Envelope("join", top, "s" * 64, top, {"n": top, "device": "d" * MAX_FIELD_CHARS["device"]}),
        Envelope("hello", top, "s" * 64, top, {"pid": top}),
        Envelope("open", top, "coordinator", top, {"trial": top, "seed": top}),
        Envelope("batch_ready", top, "shuffler", top, {"phase": phase}),
        # a claim larger than protocol.shuffle.sealing_claim's (a count and two digests of 16 and 32 bytes)
        Envelope("sealed", top, "s" * 64, top, {"phase": phase, "ciphertext": b"c" * MAX_CIPHERTEXT,
                                                "claim": {"messages": top, "key": b"k" * 64, "request": b"r" * 64}}),
    ]
    for envelope in messages:
        assert decode(encode(envelope)) == envelope
        assert len(encode(envelope)) <= MAX_BYTES_BY_TYPE[envelope.type] * 0.75  # room to spare


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:15", "mps"])
def test_the_devices_sites_report_pass(device):
    env = Envelope("join", 1, "site-001", 0, {"n": 5, "device": device})
    assert decode(encode(env)) == env


@pytest.mark.parametrize("device", ["[bold red]site-002 joined[/]", "cpu\nsite-009 joined", "cpu\x1b[2J", "",
                                    "c" * 33, "cuda (A100)"])
def test_a_device_that_is_not_a_short_name_is_refused_naming_the_field(device):
    with pytest.raises(WireError, match="join: field 'device'"):
        decode(raw(p={"n": 20, "device": device}))
    with pytest.raises(WireError, match="join: field 'device'"):
        encode(Envelope("join", 1, "site-001", 0, {"n": 5, "device": device}))


def test_a_free_string_is_bounded_with_a_reason_naming_the_type_and_field():
    from protocol.wire import MAX_FIELD_CHARS, MAX_TEXT_CHARS

    cases = [
        ("error", {"phase": "respond", "reason": "r" * (MAX_FIELD_CHARS["reason"] + 1)}, "error: field 'reason'"),
        ("error", {"phase": "x" * 65, "reason": "no"}, "error: field 'phase'"),
        ("error", {"phase": "respond\nsite-003 answered", "reason": "no"}, "error: field 'phase' must be printable"),
        ("response", {"phase": "respond\x1b[2J", "body": 1.0}, "response: field 'phase' must be printable"),
        ("request", {"method": "m" * 65, "phase": "respond", "body": {}}, "request: field 'method'"),
        ("batch", {"phase": "respond", "ciphertexts": [], "senders": [], "received": {},
                   "refused": {"site-001": "r" * (MAX_TEXT_CHARS + 1)}, "withheld": ""},
         "batch: a string in field 'refused'"),
        ("batch_lost", {"phase": "respond", "sites": {"s" * (MAX_TEXT_CHARS + 1): "gone"}},
         "batch_lost: a string in field 'sites'"),
    ]
    for mtype, payload, fragment in cases:
        sender = {"request": "coordinator", "batch": "shuffler", "batch_lost": "coordinator"}.get(mtype, "site-001")
        data = _packed({"v": PROTOCOL_VERSION, "t": mtype, "s": 1, "f": sender, "n": 0, "p": payload})
        with pytest.raises(WireError, match=fragment):
            decode(data)


def test_a_reason_may_hold_any_text_within_its_bound():
    """A refusal may quote an exception over several lines: the wire keeps it (bounded), and the
    outputs escape it (protocol.inert)."""
    env = Envelope("error", 1, "site-001", 0, {"phase": "respond", "reason": "line 1\nline 2\x1b[31m"})
    assert decode(encode(env)) == env


def test_a_site_cuts_its_own_reason_and_device_to_what_the_wire_takes():
    from protocol.wire import MAX_FIELD_CHARS, device_name, refusal

    payload = refusal("respond", "long exception " * 500)
    assert len(payload["reason"]) == MAX_FIELD_CHARS["reason"]
    encode(Envelope("error", 1, "site-001", 0, payload))
    assert device_name("cuda:0") == "cuda:0"
    assert device_name("NVIDIA A100 [80GB]\n" * 3) == "NVIDIA_A100__80GB__NVIDIA_A100__"
    assert device_name("") == "unknown"
    encode(Envelope("join", 1, "site-001", 0, {"n": 1, "device": device_name("cuda (A100)\x1b")}))
