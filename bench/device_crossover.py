"""Benchmark: the model size at which CUDA overtakes the CPU, for scoring and for training.

A site does two things with a network (issue 51, point 3): it scores its calibration rows with the
trial's model (models.torch_nets: forward passes in batches of INFERENCE_BATCH, then a softmax),
and, in a learning method (FedType, FML, FedProto, FedAvg), it trains its networks (Adam on
mini-batches of the method's `batch_size`, 16 by default, one local epoch over its rows). Both are
timed here on the networks the learning methods build (learning.nets.build_net): MLPs of a sweep
of widths (two hidden layers) and, in the full sweep, the CNN on 8x8 images (digits) with a sweep
of channels, on the CPU with the threads of one site process (1: sites/local.py, models.torch_nets;
--threads to change) and on CUDA when torch sees a GPU. Each time is the best of --repeats after
one warm-up call (CUDA start-up is not counted; torch.cuda.synchronize before each clock read).

The crossover of a sweep is the smallest size (parameter count) from which CUDA is faster at every
larger size in it; null when CUDA is never faster, and "unmeasured" when there is no CUDA here.
Writes bench/results/device_crossover.json (device_crossover-quick.json with --quick).

    python bench/device_crossover.py [--quick] [--threads 1] [--repeats 3]
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

from learning.nets import build_net, parameter_count  # noqa: E402
from models.torch_nets import INFERENCE_BATCH  # noqa: E402

FEATURES, CLASSES = 64, 10  # digits: 8x8 pixels, 10 classes
#: (family, sizes): MLP widths with two hidden layers; CNN first-layer channels (two conv layers, c and 2c)
SWEEPS = {"quick": {"mlp": [16, 64, 256, 1024], "cnn": []},
          "full": {"mlp": [16, 32, 64, 128, 256, 512, 1024, 2048], "cnn": [4, 8, 16, 32, 64]}}
#: scoring: rows a site scores at once (a digits site holds ~180, a large one 50,000);
#: training: the mini-batch of a learning method (16: LEARNING_PARAMS' default) and a large one
SCORING_POINTS = {"quick": [1000, 50_000], "full": [200, 5000, 50_000]}
TRAINING_BATCHES = {"quick": [16, 256], "full": [16, 64, 256]}
TRAINING_ROWS = 1000  # one local epoch over a site's training rows


def architecture(family: str, size: int) -> dict:
    if family == "mlp":
        return {"kind": "mlp", "hidden": [size, size], "channels": [], "image": []}
    return {"kind": "cnn", "hidden": [], "channels": [size, 2 * size], "image": [8, 8]}


def _clock(device: str, work, repeats: int) -> float:
    """Best seconds of `work()` over `repeats` calls, after one warm-up call."""
    import torch

    work()
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        work()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
    return best


def time_scoring(family: str, size: int, points: int, device: str, repeats: int) -> float:
    """Seconds to score `points` rows as a site does: forward in INFERENCE_BATCH batches, softmax, to numpy."""
    import torch

    net = build_net(architecture(family, size), FEATURES, CLASSES, seed=0).to(device).eval()
    X = np.random.default_rng(0).standard_normal((points, FEATURES)).astype(np.float32)

    def work():
        with torch.no_grad():
            out = [torch.softmax(net(torch.as_tensor(X[i:i + INFERENCE_BATCH], device=device)), dim=1).cpu().numpy()
                   for i in range(0, points, INFERENCE_BATCH)]
        return np.concatenate(out)

    return _clock(device, work, repeats)


def time_training(family: str, size: int, batch: int, device: str, repeats: int) -> float:
    """Seconds of one local epoch over TRAINING_ROWS rows (Adam, cross-entropy, mini-batches of `batch`),
    the rows already on the device as a learning site holds them (learning.train.SiteData)."""
    import torch

    net = build_net(architecture(family, size), FEATURES, CLASSES, seed=0).to(device).train()
    rng = np.random.default_rng(0)
    X = torch.as_tensor(rng.standard_normal((TRAINING_ROWS, FEATURES)).astype(np.float32), device=device)
    y = torch.as_tensor(rng.integers(0, CLASSES, TRAINING_ROWS), device=device)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)

    def work():
        order = torch.as_tensor(rng.permutation(TRAINING_ROWS), device=device)
        for i in range(0, TRAINING_ROWS, batch):
            index = order[i:i + batch]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(X[index]), y[index]).backward()
            optimizer.step()

    return _clock(device, work, repeats)


def crossover(rows: list[dict]) -> dict | None:
    """The smallest row (by parameters) of one sweep from which CUDA is faster at every larger size
    (rows: {"parameters", "cpu_s", "cuda_s"}); None when CUDA is not faster at the largest."""
    ordered = sorted(rows, key=lambda r: r["parameters"])
    found = None
    for row in reversed(ordered):
        if row["cuda_s"] is None or row["cuda_s"] >= row["cpu_s"]:
            break
        found = row
    return found


def sweep(task: str, family: str, sizes: list[int], loads: list[int], devices: list[str], repeats: int) -> list[dict]:
    rows = []
    for load in loads:
        for size in sizes:
            net = build_net(architecture(family, size), FEATURES, CLASSES, seed=0)
            row = {"task": task, "family": family, "size": size, "parameters": parameter_count(net),
                   ("points" if task == "scoring" else "batch"): load}
            for device in ("cpu", "cuda"):
                if device not in devices:
                    row[f"{device}_s"] = None
                    continue
                timer = time_scoring if task == "scoring" else time_training
                row[f"{device}_s"] = round(timer(family, size, load, device, repeats), 6)
            row["cuda_speedup"] = round(row["cpu_s"] / row["cuda_s"], 3) if row["cuda_s"] else None
            rows.append(row)
            shown = f"{row['cuda_s']:.4f} s cuda (x{row['cuda_speedup']})" if row["cuda_s"] else "no cuda"
            print(f"{task:8s} {family} {size:5d} ({row['parameters']:>9,d} params) "
                  f"{'points' if task == 'scoring' else 'batch'} {load:6d}: {row['cpu_s']:.4f} s cpu, {shown}")
    return rows


def crossovers(rows: list[dict], cuda: bool) -> list[dict]:
    """Per task, family and load: where CUDA overtakes the CPU (or why not known)."""
    out = []
    keys = sorted({(r["task"], r["family"], r.get("points", r.get("batch"))) for r in rows})
    for task, family, load in keys:
        part = [r for r in rows if (r["task"], r["family"], r.get("points", r.get("batch"))) == (task, family, load)]
        entry = {"task": task, "family": family, ("points" if task == "scoring" else "batch"): load}
        if not cuda:
            entry.update(size=None, parameters=None, verdict="unmeasured: no CUDA on this machine")
        else:
            found = crossover(part)
            entry.update(size=found and found["size"], parameters=found and found["parameters"],
                         verdict=(f"CUDA faster from size {found['size']} ({found['parameters']:,d} parameters)"
                                  if found else "CUDA never faster in this sweep"))
        out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller sweep (MLPs only), in about a minute")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (1: as one site process)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None, help="default bench/results/device_crossover.json "
                        "(device_crossover-quick.json with --quick: a quick sweep never replaces the full one)")
    args = parser.parse_args()
    args.out = args.out or str(Path(__file__).resolve().parent / "results" /
                               ("device_crossover-quick.json" if args.quick else "device_crossover.json"))
    import torch

    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    devices = ["cpu"] + (["cuda"] if cuda else [])
    mode = "quick" if args.quick else "full"
    began, rows = time.perf_counter(), []
    for family, sizes in SWEEPS[mode].items():
        if sizes:
            rows += sweep("scoring", family, sizes, SCORING_POINTS[mode], devices, args.repeats)
            rows += sweep("training", family, sizes, TRAINING_BATCHES[mode], devices, args.repeats)
    result = {"benchmark": "device_crossover", "mode": mode, "host": platform.node(), "cpus": os.cpu_count(),
              "cpu_threads": args.threads, "torch": torch.__version__, "cuda": cuda,
              "gpu": torch.cuda.get_device_name(0) if cuda else None,
              "note": None if cuda else ("no CUDA here (torch sees no GPU): CPU times only, the crossover is "
                                         "unmeasured; run `make bench-device-crossover` on a GPU machine"),
              "features": FEATURES, "classes": CLASSES, "training_rows": TRAINING_ROWS,
              "inference_batch": INFERENCE_BATCH, "repeats": args.repeats,
              "seconds": round(time.perf_counter() - began, 1),
              "crossovers": crossovers(rows, cuda), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    for entry in result["crossovers"]:
        load = f"points {entry['points']}" if "points" in entry else f"batch {entry['batch']}"
        print(f"crossover {entry['task']} {entry['family']} {load}: {entry['verdict']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
