"""The `count` codec: what a site may send is one non-negative integer, a count of its scores."""

from __future__ import annotations

from quorum.plugin import Codec, PayloadError


class Count(Codec):
    name = "count"

    def encode(self, value: int) -> int:
        return int(value)

    def decode(self, body) -> int:
        # msgpack gives back an int for what encode sent; a bool, float or negative is damage
        if isinstance(body, bool) or not isinstance(body, int) or body < 0:
            raise PayloadError(f"{self.name}: expected a non-negative integer, got {body!r}")
        return body

    def information_bits(self, value: int) -> int:
        return max(1, int(value).bit_length())
