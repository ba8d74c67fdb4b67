"""One raw score per site: a local order statistic, sent as a msgpack float64 (9 bytes).
Decoding accepts a float only (an integer there would be a damaged message, not a quantile)."""

from __future__ import annotations

import math

from protocol.codecs.base import Codec, PayloadError


class RawQuantile(Codec):
    name = "raw_quantile"

    def encode(self, value: float) -> float:
        return float(value)

    def decode(self, body) -> float:
        if not isinstance(body, float):  # the encoder always sends float64; anything else is damage
            raise PayloadError(f"{self.name}: expected a float, got {type(body).__name__}")
        value = body
        if math.isnan(value):
            raise PayloadError(f"{self.name}: NaN is not a quantile")
        if value == -math.inf:
            raise PayloadError(f"{self.name}: -inf is not a quantile")
        return value  # +inf is legitimate: Q_(ell) with ell > n_j (paper 000 eq. 2)

    def information_bits(self, value) -> int:
        return 64  # one float64
