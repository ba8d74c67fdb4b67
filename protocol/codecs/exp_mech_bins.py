"""One exponential-mechanism bin index per site (paper 000 algorithm 2): a msgpack integer,
1 to 5 bytes, carrying log2(B) bits. The coordinator's codec knows B and refuses anything else."""

from __future__ import annotations

import math

from protocol.codecs.base import Codec, PayloadError


class ExpMechBins(Codec):
    name = "exp_mech_bins"

    def __init__(self, count: int | None = None) -> None:
        self.count = count  # B; needed to decode, not to encode

    def encode(self, value: int) -> int:
        return int(value)

    def decode(self, body) -> int:
        if isinstance(body, bool) or not isinstance(body, int):
            raise PayloadError(f"{self.name}: expected a bin index, got {type(body).__name__}")
        if self.count is None:
            raise PayloadError(f"{self.name}: the number of bins is not known to this decoder")
        if not 0 <= body < self.count:
            raise PayloadError(f"{self.name}: bin index {body} outside [0, {self.count})")
        return body

    def information_bits(self, value) -> int:
        return math.ceil(math.log2(self.count)) if self.count and self.count > 1 else 0
