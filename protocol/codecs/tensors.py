"""Named tensors plus named scalar metrics: model weights as msgpack binary (paper 002, FedType's
proxy models; FedAvg's models).

A tensor travels as [name, dtype, shape, raw little-endian bytes] with dtype "f2" (half
precision) or "f4" (single); the sender picks the precision, the decoder keeps it, so that the
coordinator can count what each weight cost on the wire. Metrics are msgpack numbers. The same
packing serves the coordinator's downlink (`pack_tensors` / `unpack_tensors`), which is a request
body, not a codec-encoded answer.

The decoder refuses a body that is not {"tensors": [...], "metrics": {...}}, an unknown dtype, a
shape whose size does not match the bytes, a repeated name, NaN or infinite weights, or a
non-numeric metric. Whether the tensors are the ones the method expects (names and shapes of
the proxy architecture) is the method's check, since only it knows the architecture.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from protocol.codecs.base import Codec, PayloadError

#: wire dtype tag -> numpy dtype
DTYPES = {"f2": np.dtype("<f2"), "f4": np.dtype("<f4"), "f8": np.dtype("<f8")}
PRECISIONS = {"float16": "f2", "float32": "f4", "float64": "f8"}
MAX_TENSORS = 4096


def pack_tensors(tensors: Mapping[str, np.ndarray]) -> list:
    """{name: float16 / float32 / float64 array} -> a msgpack-able list of [name, dtype, shape, bytes]."""
    packed = []
    for name, array in tensors.items():
        array = np.asarray(array)
        tag = next((t for t, d in DTYPES.items() if array.dtype == d or array.dtype == d.newbyteorder("=")), None)
        if tag is None:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} is not float16, float32 or float64")
        packed.append([str(name), tag, [int(s) for s in array.shape],
                       np.ascontiguousarray(array, dtype=DTYPES[tag]).tobytes()])
    return packed


def unpack_tensors(packed: Any, where: str = "tensors") -> dict[str, np.ndarray]:
    """The inverse of pack_tensors, checked; PayloadError names what is wrong."""
    if not isinstance(packed, list) or len(packed) > MAX_TENSORS:
        raise PayloadError(f"{where}: expected a list of at most {MAX_TENSORS} tensors, got {type(packed).__name__}")
    out: dict[str, np.ndarray] = {}
    for index, item in enumerate(packed):
        if (not isinstance(item, list) or len(item) != 4 or not isinstance(item[0], str)
                or not isinstance(item[2], list) or not isinstance(item[3], bytes)):
            raise PayloadError(f"{where}[{index}]: expected [name, dtype, shape, bytes]")
        name, tag, shape, raw = item
        if name in out:
            raise PayloadError(f"{where}: tensor {name!r} twice")
        if tag not in DTYPES:
            raise PayloadError(f"{where} {name!r}: dtype {tag!r} is not one of {sorted(DTYPES)}")
        if not all(isinstance(s, int) and not isinstance(s, bool) and 0 <= s for s in shape):
            raise PayloadError(f"{where} {name!r}: shape {shape!r} is not a list of sizes")
        count = math.prod(shape)
        if count * DTYPES[tag].itemsize != len(raw):
            raise PayloadError(f"{where} {name!r}: shape {shape} needs {count * DTYPES[tag].itemsize} bytes, "
                               f"got {len(raw)}")
        array = np.frombuffer(raw, dtype=DTYPES[tag]).reshape(shape)
        if not np.isfinite(array).all():
            raise PayloadError(f"{where} {name!r}: NaN or infinite weights")
        out[name] = array
    return out


class Tensors(Codec):
    name = "tensors"

    def encode(self, value: Mapping[str, Any]) -> dict:
        metrics = {str(k): (int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else float(v))
                   for k, v in value.get("metrics", {}).items()}
        return {"tensors": pack_tensors(value.get("tensors", {})), "metrics": metrics}

    def decode(self, body) -> dict:
        if not isinstance(body, dict) or set(body) != {"tensors", "metrics"}:
            raise PayloadError(f"{self.name}: expected a map with 'tensors' and 'metrics', got "
                               f"{sorted(map(str, body)) if isinstance(body, dict) else type(body).__name__}")
        metrics = body["metrics"]
        if not isinstance(metrics, dict):
            raise PayloadError(f"{self.name}: metrics must be a map, got {type(metrics).__name__}")
        for key, item in metrics.items():
            if (not isinstance(key, str) or isinstance(item, bool) or not isinstance(item, (int, float))
                    or (isinstance(item, float) and math.isnan(item))):
                raise PayloadError(f"{self.name}: metric {key!r} must be a number, got {item!r}")
        return {"tensors": unpack_tensors(body["tensors"], f"{self.name} tensors"), "metrics": dict(metrics)}

    def information_bits(self, value) -> int:
        """The weights at the precision they were sent in, and 64 bits per metric."""
        return (sum(8 * a.nbytes for a in value["tensors"].values()) + 64 * len(value["metrics"]))
