"""Secure aggregation bodies (protocol.secagg): what a site may send in each of its phases.

  advertise  {"keys": {"c": 32 bytes, "s": 32 bytes,           two X25519 public keys, and in the
                       "sig": 64 bytes}}                       active mode their Ed25519 signature
  share      {"shares": {site: ciphertext}}                    AES-GCM, one per neighbour
  mask       {"masked": {"bits": k, "data": bytes}}            the masked vector y_u: elements
                                                               of Z_M, M = 2^k, little-endian,
                                                               1, 2, 4 or 8 bytes each
  consistency {"signature": 64 bytes}                          (active) the site's signed view
  unmask     {"unmask": {"b": {site: 33 bytes}, "s": {...}}}   Shamir shares of seeds and keys
The payload information is length * log2(M) bits for the masked vector (what the sum needs);
keys and shares are the protocol's overhead, shown apart by phase in the ledger.
"""

from __future__ import annotations

import numpy as np

from protocol.codecs.base import Codec, PayloadError
from protocol.secagg.identity import SIGNATURE_BYTES
from protocol.secagg.primitives import KEY_BYTES, NONCE_BYTES
from protocol.secagg.protocol import masked_bytes_width
from protocol.secagg.shamir import SHARE_BYTES, PRIME

KINDS = ("keys", "shares", "masked", "signature", "unmask")
MAX_CIPHERTEXT = 1024


class SecAggDDG(Codec):
    name = "secagg_ddg"

    def __init__(self, length: int | None = None) -> None:
        self.length = length  # the vector length; the ring is checked against the session's by the server

    def encode(self, value) -> dict:
        kind, payload = value
        if kind == "masked":
            bits, vector = payload
            width = masked_bytes_width(bits)
            return {"masked": {"bits": int(bits), "data": np.asarray(vector, dtype=np.uint64).astype(f"<u{width}").tobytes()}}
        return {kind: payload}

    def decode(self, body):
        if not isinstance(body, dict) or len(body) != 1 or next(iter(body)) not in KINDS:
            raise PayloadError(f"{self.name}: expected one of {KINDS} as the only key")
        kind, payload = next(iter(body.items()))
        return kind, getattr(self, f"_decode_{kind}")(payload)

    def _decode_keys(self, payload):
        if not isinstance(payload, dict) or set(payload) not in ({"c", "s"}, {"c", "s", "sig"}):
            raise PayloadError(f"{self.name}: keys must be {{c, s}} or {{c, s, sig}}")
        if any(not isinstance(payload[k], bytes) or len(payload[k]) != KEY_BYTES for k in ("c", "s")):
            raise PayloadError(f"{self.name}: a public key is {KEY_BYTES} bytes")
        if "sig" in payload:
            self._decode_signature(payload["sig"])
        return dict(payload)

    def _decode_signature(self, payload):
        if not isinstance(payload, bytes) or len(payload) != SIGNATURE_BYTES:
            raise PayloadError(f"{self.name}: a signature is {SIGNATURE_BYTES} bytes")
        return payload

    def _decode_shares(self, payload):
        if not isinstance(payload, dict) or not all(isinstance(k, str) for k in payload):
            raise PayloadError(f"{self.name}: shares must map site ids to ciphertexts")
        if any(not isinstance(v, bytes) or not NONCE_BYTES + 16 <= len(v) <= MAX_CIPHERTEXT for v in payload.values()):
            raise PayloadError(f"{self.name}: a share ciphertext must be bytes of sensible length")
        return dict(payload)

    def _decode_masked(self, payload):
        if not isinstance(payload, dict) or set(payload) != {"bits", "data"}:
            raise PayloadError(f"{self.name}: masked must be {{bits, data}}")
        bits, data = payload["bits"], payload["data"]
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 64:
            raise PayloadError(f"{self.name}: ring bits must be an integer in [1, 64]")
        if self.length is None:
            raise PayloadError(f"{self.name}: the vector length is not known to this decoder")
        width = masked_bytes_width(bits)
        if not isinstance(data, bytes) or len(data) != width * self.length:
            raise PayloadError(f"{self.name}: a masked vector is {self.length} x {width} bytes")
        vector = np.frombuffer(data, dtype=f"<u{width}").astype(np.uint64)
        if bits < 64 and (vector >> np.uint64(bits)).any():
            raise PayloadError(f"{self.name}: an element lies outside Z_M, M = 2^{bits}")
        return bits, vector

    def _decode_unmask(self, payload):
        if not isinstance(payload, dict) or set(payload) != {"b", "s"}:
            raise PayloadError(f"{self.name}: unmask must be {{b, s}}")
        out = {}
        for part in ("b", "s"):
            shares = payload[part]
            if not isinstance(shares, dict) or not all(isinstance(k, str) for k in shares):
                raise PayloadError(f"{self.name}: unmask {part} must map site ids to shares")
            out[part] = {}
            for site, data in shares.items():
                if not isinstance(data, bytes) or len(data) != SHARE_BYTES:
                    raise PayloadError(f"{self.name}: a share is {SHARE_BYTES} bytes")
                value = int.from_bytes(data, "big")
                if value >= PRIME:
                    raise PayloadError(f"{self.name}: a share lies outside the field")
                out[part][site] = value
        return out

    def information_bits(self, value) -> int:
        kind, payload = value
        if kind == "masked":
            bits, vector = payload
            return len(vector) * bits
        if kind == "keys":
            return 8 * sum(len(v) for v in payload.values())
        if kind == "signature":
            return 8 * SIGNATURE_BYTES
        if kind == "shares":
            return 8 * sum(len(v) for v in payload.values())
        return 8 * SHARE_BYTES * (len(payload["b"]) + len(payload["s"]))
