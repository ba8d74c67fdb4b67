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
