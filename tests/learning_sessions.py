"""Shared machinery for the learning tests (paper 002 and its baselines): small blob sites, a
learning method with test-sized settings, and an in-process session that can capture every
message as the bytes msgpack would put on the wire."""

import msgpack
import numpy as np

from protocol.codecs import CODECS
from protocol.inprocess import drive
from protocol.methods import METHODS

SMALL = ["trials=1", "sites.count=4", "data.n=1200", "methods.*.rounds=3", "methods.*.fraction=1.0"]
SCENARIO = "scenarios/fedtype-blobs.yaml"


def blob_sites(count=3, n=240, seed=5):
    from data.synthetic import classification_blobs

    rng = np.random.default_rng(seed)
    X, y = classification_blobs(count * n, rng, classes=4, features=6, clusters=1, separation=1.5)
    return {f"site-{j}": np.column_stack([X[j * n:(j + 1) * n], y[j * n:(j + 1) * n]]) for j in range(count)}


def learning_method(name, **params):
    base = {"classes": 4, "rounds": 4, "fraction": 1.0, "lr": 3e-3, "batch_size": 16, "local_epochs": 2, "passes": 1,
            "precision": "float16", "device": "cpu"}
    arch = {"private_models": [{"kind": "mlp", "hidden": [64, 64], "channels": [], "image": []},
                               {"kind": "mlp", "hidden": [96], "channels": [], "image": []}],
            "proxy": {"kind": "mlp", "hidden": [8], "channels": [], "image": []}}
    arch["meme"] = arch["proxy"]  # FML's meme: the proxy's size, as in the comparison
    cls = METHODS[name]
    defaults = {k: v["default"] for k, v in cls.PARAMS.items() if "default" in v}  # what validation fills in
    spec = {**defaults, **base, **{k: v for k, v in arch.items() if k in cls.PARAMS}, **params}
    return cls(0.1, **spec)


def run_learning(method, sites, capture=None, session=1):
    halves = {s: type(method).site(rows, np.random.default_rng([session, j]), s)
              for j, (s, rows) in enumerate(sites.items())}

    def ask(site, phase, body):
        encoder, request = CODECS[method.codec].for_site(body)
        answer = encoder.encode(halves[site].answer(phase, request))
        if capture is not None:
            capture.append(("down", msgpack.packb(body, use_bin_type=True)))
            capture.append(("up", msgpack.packb(answer, use_bin_type=True)))
        return answer

    outcome = drive(method, {s: len(r) for s, r in sites.items()}, ask, np.random.default_rng(9))
    return outcome, halves


def assert_no_private_weight_on_the_wire(halves, wire: bytes) -> None:
    """No 8-byte run of any site's private tensor, in float16 or float32 as it stands after
    training, occurs in `wire` (the sampled runs cover every tensor)."""
    from learning.nets import get_weights

    for half in halves.values():
        for precision in ("float16", "float32"):
            for tensor, array in get_weights(half.private, precision).items():
                raw = array.tobytes()
                for start in range(0, len(raw) - 8, max(8, len(raw) // 64)):
                    assert raw[start:start + 8] not in wire, f"private {tensor} ({precision}) found on the wire"
