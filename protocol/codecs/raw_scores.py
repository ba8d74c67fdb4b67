"""All of a site's scores, as packed little-endian float64 (8 bytes a score plus a short header).

This is what centralized calibration costs on the wire: the pooled baseline of paper 000.
"""

from __future__ import annotations

import numpy as np

from protocol.codecs.base import Codec, PayloadError


class RawScores(Codec):
    name = "raw_scores"

    def encode(self, value) -> bytes:
        return np.ascontiguousarray(value, dtype="<f8").tobytes()

    def decode(self, body) -> np.ndarray:
        if not isinstance(body, bytes):
            raise PayloadError(f"{self.name}: expected binary float64 data, got {type(body).__name__}")
        if len(body) % 8:
            raise PayloadError(f"{self.name}: {len(body)} bytes is not a whole number of float64 values")
        scores = np.frombuffer(body, dtype="<f8").astype(float)
        if np.isnan(scores).any():
            raise PayloadError(f"{self.name}: NaN among the scores")
        return scores

    def information_bits(self, value) -> int:
        return 64 * len(value)  # one float64 per score
