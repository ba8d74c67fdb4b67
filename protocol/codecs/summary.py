"""Named summary statistics: a map of numbers and numeric vectors, checked against the fields a
method expects (paper 004's per-site summaries: U_l and V_l, a K-anonymous table release, moments
on a lambda grid, quantile-loss slopes).

Scalars travel as msgpack numbers, vectors as packed little-endian float64 / int64 bytes, so the
ledger's wire bytes are the summary's own size plus a few bytes of names. The decoder refuses a
body with missing, extra or mistyped fields, NaN anywhere, or a vector whose length the method
fixes and the body does not have.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from protocol.codecs.base import Codec, PayloadError

#: field kinds: a Python int, a finite-or-infinite float, a float64 vector, an int64 vector
KINDS = ("int", "float", "floats", "ints")
_DTYPES = {"floats": "<f8", "ints": "<i8"}


class Summary(Codec):
    name = "summary"

    def __init__(self, fields: Mapping[str, str] | None = None, lengths: Mapping[str, int] | None = None) -> None:
        """fields: name -> kind (the decoder's schema; the site's encoder needs none);
        lengths: name -> the exact length of a vector field, where the method fixes it."""
        unknown = {k for k in (fields or {}).values() if k not in KINDS}
        if unknown:
            raise ValueError(f"summary field kinds must be among {KINDS}, got {sorted(unknown)}")
        self.fields, self.lengths = dict(fields or {}), dict(lengths or {})

    def encode(self, value: Mapping[str, Any]) -> dict:
        out = {}
        for key, item in value.items():
            if isinstance(item, np.ndarray):
                kind = "ints" if np.issubdtype(item.dtype, np.integer) else "floats"
                out[key] = np.ascontiguousarray(item, dtype=_DTYPES[kind]).tobytes()
            elif isinstance(item, (bool, np.bool_)):
                out[key] = int(item)
            elif isinstance(item, (int, np.integer)):
                out[key] = int(item)
            else:
                out[key] = float(item)
        return out

    def decode(self, body) -> dict:
        if not isinstance(body, dict):
            raise PayloadError(f"{self.name}: expected a map of named statistics, got {type(body).__name__}")
        if set(body) != set(self.fields):
            raise PayloadError(f"{self.name}: expected fields {sorted(self.fields)}, got {sorted(map(str, body))}")
        return {key: self._field(key, kind, body[key]) for key, kind in self.fields.items()}

    def _field(self, key: str, kind: str, raw):
        where = f"{self.name} field {key!r}"
        if kind == "int":
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise PayloadError(f"{where}: expected an integer, got {type(raw).__name__}")
            return raw
        if kind == "float":
            if isinstance(raw, bool) or not isinstance(raw, (int, float)) or math.isnan(raw):
                raise PayloadError(f"{where}: expected a number, got {raw!r}")
            return float(raw)
        if not isinstance(raw, bytes) or len(raw) % 8:
            raise PayloadError(f"{where}: expected packed 8-byte values, got "
                               f"{len(raw) if isinstance(raw, bytes) else type(raw).__name__} bytes")
        array = np.frombuffer(raw, dtype=_DTYPES[kind])
        if kind == "floats" and np.isnan(array).any():
            raise PayloadError(f"{where}: NaN in the vector")
        expected = self.lengths.get(key)
        if expected is not None and array.size != expected:
            raise PayloadError(f"{where}: expected {expected} values, got {array.size}")
        return array.astype(float if kind == "floats" else np.int64)

    def information_bits(self, value) -> int:
        return 64 * sum(np.size(item) for item in value.values())
