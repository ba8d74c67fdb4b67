"""Benchmark: how fast a site scores its calibration data, per model kind and device.

For each model kind (ridge, cqr_forest, cqr_net, classifier) and each device this machine has
(the CPU, and CUDA when torch sees a GPU), fit the model once on a synthetic training set, then
time `model.scores(X, y)` on batches of calibration points exactly as a site calls it (the
torch models in batches of models.torch_nets.INFERENCE_BATCH on the device). Reports scores per
second (best of --repeats) and the time of a first, cold call (CUDA start-up included).
scikit-learn models always run on the CPU. Writes bench/results/scoring_throughput.json.

    python bench/scoring_throughput.py [--points 100000] [--features 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from models import MODELS  # noqa: E402
from specs.schema import validate  # noqa: E402

PARAMS = {"ridge": {}, "cqr_forest": {"n_estimators": 100, "min_samples_leaf": 5, "tune": False},
          "cqr_net": {"epochs": 3}, "classifier": {"epochs": 3, "score": "raps"}}


def data(kind: str, points: int, features: int, rng: np.random.Generator):
    X = rng.standard_normal((points, features))
    if kind == "classifier":
        return X, (X[:, 0] > 0).astype(float) + (X[:, 1] > 0)
    return X, X @ rng.standard_normal(features) + rng.standard_normal(points)


def measure(kind: str, device: str, points: int, features: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    X_train, y_train = data(kind, 5000, features, rng)
    params = validate({"type": "map", "fields": MODELS[kind].PARAMS}, PARAMS[kind], "params")
    model = MODELS[kind](device=device, **params).fit(X_train, y_train, 0.1, rng)
    X, y = data(kind, points, features, rng)
    began = time.perf_counter()
    model.scores(X[:1000], y[:1000])
    cold = time.perf_counter() - began
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        model.scores(X, y)
        if device == "cuda":
            import torch

            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
    return {"model": kind, "device": model.device, "points": points, "features": features,
            "seconds": round(best, 5), "scores_per_second": round(points / best), "cold_first_call_s": round(cold, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "scoring_throughput.json"))
    args = parser.parse_args()
    import torch

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for kind in PARAMS:
        for device in devices:
            if device == "cuda" and kind in ("ridge", "cqr_forest"):
                continue  # scikit-learn: CPU only
            row = measure(kind, device, args.points, args.features, args.repeats)
            rows.append(row)
            print(f"{kind:11s} {row['device']:5s} {row['scores_per_second']:>12,d} scores/s "
                  f"({row['seconds']:.3f} s for {args.points:,d}; first call {row['cold_first_call_s']:.3f} s)")
    result = {"benchmark": "scoring_throughput", "host": platform.node(), "cpus": os.cpu_count(),
              "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
              "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
