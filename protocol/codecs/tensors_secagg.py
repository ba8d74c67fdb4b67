"""The bodies of a method that trains in the clear phases and sums by secure aggregation in others
(DP-Δ-FL and DP-FedAvg with distributed noise, protocol.methods.tail_secagg): a `tensors` body
({tensors, metrics}: setup, evaluation, a round to a trusted curator) or one secure-aggregation
body (protocol.codecs.secagg_ddg: keys, shares, a masked vector, a signature, unmask shares).
A masked vector may have either of the session's lengths (the loss histogram's, the update's);
the secure-aggregation server checks it against the sum it belongs to."""

from __future__ import annotations

from protocol.codecs.base import Codec, PayloadError
from protocol.codecs.secagg_ddg import SecAggDDG
from protocol.codecs.tensors import Tensors
from protocol.secagg.protocol import MAX_LENGTH, masked_bytes_width


class SecAggAnyLength(SecAggDDG):
    """SecAggDDG whose masked vectors may have any length up to the protocol's MAX_LENGTH."""

    def _decode_masked(self, payload):
        if isinstance(payload, dict) and isinstance(payload.get("bits"), int) and isinstance(payload.get("data"), bytes) \
                and 1 <= payload["bits"] <= 64:
            width = masked_bytes_width(payload["bits"])
            if len(payload["data"]) % width or not 1 <= len(payload["data"]) // width <= MAX_LENGTH:
                raise PayloadError(f"{self.name}: a masked vector is a whole number (1 to {MAX_LENGTH}) of "
                                   f"{width}-byte elements")
            self.length = len(payload["data"]) // width
        return super()._decode_masked(payload)


class TensorsSecAgg(Codec):
    name = "tensors_secagg"

    def encode(self, value):
        return SecAggDDG().encode(value) if isinstance(value, tuple) else Tensors().encode(value)

    def decode(self, body):
        if isinstance(body, dict) and set(body) == {"tensors", "metrics"}:
            return Tensors().decode(body)
        return SecAggAnyLength().decode(body)

    def information_bits(self, value) -> int:
        return SecAggDDG().information_bits(value) if isinstance(value, tuple) else Tensors().information_bits(value)
