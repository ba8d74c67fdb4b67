"""Sealed messages for the shuffler (paper 000 section 4; protocol.shuffle).

The coordinator makes a fresh X25519 key pair per session and sends its public key with each
request: {"shuffle": {"seal_to": 32 bytes, "inner": codec name}, "request": method body}. The
site encodes its answer with the inner codec (e.g. exp_mech_bins), packs it with msgpack and
seals it by HPKE (RFC 9180, base mode: X25519, HKDF-SHA256, ChaCha20-Poly1305, from
`cryptography`): an anonymous-sender public-key sealed box, authenticated encryption whose
ciphertext only the session key opens and no one can alter unnoticed. The ciphertext goes to
the shuffler, which never holds the key; the coordinator opens each message of the permuted
batch with `decode`. A ciphertext from another session (another key) or another purpose (the
HPKE info string) does not open.
"""

from __future__ import annotations

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from protocol.codecs.base import Codec, PayloadError

SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
INFO = b"quorum shuffle v1"
KEY_BYTES = 32
OVERHEAD = 32 + 16  # encapsulated key + AEAD tag
PAD = 64  # plaintexts are padded to a multiple of this, so that lengths say nothing of the value
MAX_SEALED = 4096


class Shuffle(Codec):
    name = "shuffle"
    route = "shuffler"

    def __init__(self, inner: Codec | None = None, seal_to: bytes | None = None) -> None:
        self.inner = inner
        self._private = X25519PrivateKey.generate() if seal_to is None else None
        self._public = X25519PublicKey.from_public_bytes(seal_to) if seal_to is not None else None

    @property
    def public_key(self) -> bytes:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        key = self._private.public_key() if self._private is not None else self._public
        return key.public_bytes(Encoding.Raw, PublicFormat.Raw)

    def wrap_request(self, body: dict) -> dict:
        return {"shuffle": {"seal_to": self.public_key, "inner": self.inner.name}, "request": body}

    @classmethod
    def for_site(cls, body: dict) -> tuple[Codec, dict]:
        from protocol.codecs import CODECS

        if not isinstance(body, dict) or set(body) != {"shuffle", "request"}:
            raise PayloadError("shuffle: a request must be {shuffle, request}")
        spec = body["shuffle"]
        if not isinstance(spec, dict) or set(spec) != {"seal_to", "inner"}:
            raise PayloadError("shuffle: expected {seal_to, inner}")
        key, inner = spec["seal_to"], spec["inner"]
        if not isinstance(key, bytes) or len(key) != KEY_BYTES:
            raise PayloadError(f"shuffle: seal_to must be a {KEY_BYTES}-byte X25519 public key")
        if inner not in CODECS or CODECS[inner].route != "direct":
            raise PayloadError(f"shuffle: cannot seal with inner codec {inner!r}")
        inner_codec, request = CODECS[inner].for_site(body["request"])
        return cls(inner_codec, seal_to=key), request

    def encode(self, value) -> bytes:
        return SUITE.encrypt(pad(msgpack.packb(self.inner.encode(value), use_bin_type=True)), self._public,
                             info=INFO)

    def decode(self, body) -> object:
        if self._private is None:
            raise PayloadError("shuffle: this codec holds no key to open messages")
        if not isinstance(body, bytes) or not OVERHEAD < len(body) <= MAX_SEALED:
            raise PayloadError("shuffle: a sealed message is bytes of sensible length")
        try:
            plaintext = SUITE.decrypt(body, self._private, info=INFO)
        except (InvalidTag, ValueError) as exc:
            raise PayloadError(f"shuffle: the ciphertext does not open with this session's key "
                               f"({type(exc).__name__})") from None
        try:
            inner_body = msgpack.unpackb(unpad(plaintext), raw=False, strict_map_key=True)
        except Exception as exc:  # noqa: BLE001 -- msgpack raises several types for bad input
            raise PayloadError(f"shuffle: the opened message is not msgpack: {exc}") from None
        return self.inner.decode(inner_body)

    def information_bits(self, value) -> int:
        return self.inner.information_bits(value)


def pad(data: bytes) -> bytes:
    """A 2-byte length, the data, zeros up to a multiple of PAD: every small answer seals to a
    ciphertext of the same length (a bin index would otherwise show in 1, 2 or 3 bytes)."""
    framed = len(data).to_bytes(2, "big") + data
    return framed + bytes(-len(framed) % PAD)


def unpad(plaintext: bytes) -> bytes:
    size = int.from_bytes(plaintext[:2], "big")
    if len(plaintext) % PAD or size > len(plaintext) - 2 or any(plaintext[2 + size:]):
        raise ValueError("bad padding")
    return plaintext[2:2 + size]
