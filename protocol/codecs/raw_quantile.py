"""One raw score per site: a local order statistic, sent as a msgpack float64 (9 bytes)."""

from __future__ import annotations

import math

from protocol.codecs.base import Codec, PayloadError


class RawQuantile(Codec):
    name = "raw_quantile"

    def encode(self, value: float) -> float:
        return float(value)

    def decode(self, body) -> float:
        if isinstance(body, bool) or not isinstance(body, (int, float)):
            raise PayloadError(f"{self.name}: expected a number, got {type(body).__name__}")
        value = float(body)
        if math.isnan(value):
            raise PayloadError(f"{self.name}: NaN is not a quantile")
        if value == -math.inf:
            raise PayloadError(f"{self.name}: -inf is not a quantile")
        return value  # +inf is legitimate: Q_(ell) with ell > n_j (paper 000 eq. 2)

    def information_bits(self, value) -> int:
        return 64  # one float64
