"""Discrete Gaussian sampling speed (issue 49, point 4): draws a second of N_Z(0, sigma^2) vectors
from the OS CSPRNG, the exact vectorised sampler protocol.noise_fast (what protocol.noise's
discrete_gaussian uses) against the exact reference, OpenDP's sampler
(protocol.noise.discrete_gaussian_reference), for vector sizes 1e3 to 1e6 and sigma in
{1, 10, 1e3, 1e6}, in this process (numpy single-threaded), on this machine.

Each cell is the median rate over repeats (the new sampler: repeated until 1 s or 3 runs, at
least; the reference: 3 runs below 1e5 draws, 1 run from 1e5). The reference's rate does not
depend on the size (it draws one value at a time), so --reference-max (default 1e6) can cap the
sizes it is run at (1e6 draws take it about 2.5 minutes per sigma). The load average at the start
and end is recorded: other processes sharing the cores slow both samplers.

    python bench/discrete_gaussian.py [--sizes 1000 10000 100000 1000000] [--sigmas 1 10 1000 1000000]
                                      [--reference-max 1000000] [--out bench/results/discrete_gaussian.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from protocol.noise import discrete_gaussian, discrete_gaussian_reference  # noqa: E402
from protocol.noise_fast import _params  # noqa: E402


def rate(sample, sigma2: float, size: int, min_seconds: float, min_runs: int) -> float:
    rates, spent = [], 0.0
    while len(rates) < min_runs or spent < min_seconds:
        start = time.perf_counter()
        sample(sigma2, size)
        elapsed = time.perf_counter() - start
        rates.append(size / elapsed)
        spent += elapsed
    return statistics.median(rates)


def urandom_rate() -> float:
    start = time.perf_counter()
    os.urandom(64 << 20)
    return (64 << 20) / (time.perf_counter() - start) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000, 1_000_000])
    parser.add_argument("--sigmas", type=float, nargs="+", default=[1.0, 10.0, 1e3, 1e6])
    parser.add_argument("--reference-max", type=int, default=1_000_000)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "discrete_gaussian.json"))
    args = parser.parse_args()

    discrete_gaussian(1.0, 10), discrete_gaussian_reference(1.0, 10)  # imports, caches
    result = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}",
              "numpy": np.__version__, "opendp": version("opendp"),
              "load_average_start": os.getloadavg()[0], "urandom_mb_per_s": round(urandom_rate(), 1),
              "new": "protocol.noise.discrete_gaussian (protocol.noise_fast, exact, os.urandom)",
              "reference": "protocol.noise.discrete_gaussian_reference (OpenDP make_gaussian, exact)",
              "cells": []}
    for sigma in args.sigmas:
        sigma2 = sigma * sigma
        p = _params(sigma2)
        for size in args.sizes:
            cell = {"sigma": sigma, "size": size, "step_t": p.t, "acceptance": round(p.acceptance, 4),
                    "new_draws_per_s": round(rate(discrete_gaussian, sigma2, size, 1.0, 3))}
            if size <= args.reference_max:
                runs = 3 if size < 100_000 else 1
                reference = rate(discrete_gaussian_reference, sigma2, size, 0.0, runs)
                cell["reference_draws_per_s"] = round(reference)
                cell["speedup"] = round(cell["new_draws_per_s"] / cell["reference_draws_per_s"], 1)
            print(json.dumps(cell), flush=True)
            result["cells"].append(cell)
    result["load_average_end"] = os.getloadavg()[0]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
