"""Secure sum: wall time and bytes per site against m (issue 5, item 7).

m in {10, 50, 100, 200} sites, vector length 1024 on Z_M with M = 2^32, 0% and 10% of the sites
dropping before they mask (so the coordinator must rebuild their pairwise masks), sparse
(SecAgg+) and full graphs. The four phases run in-process through the codec's encode/decode,
with the real crypto; bytes are the msgpack bodies each site sends and receives (the transport
envelope adds about 40 bytes a message, see the ledger of a process run). One process does all
the sites' work, so the time is the sum of the sites' and the coordinator's CPU time.

    python bench/secagg_sum.py [--out bench/results/secagg_sum.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.codecs.secagg_ddg import SecAggDDG  # noqa: E402
from protocol.methods.base import Send  # noqa: E402
from protocol.methods.secure_sum import SecureSumCoordinator, SecureSumSite  # noqa: E402
from protocol.secagg.graph import default_degree, default_threshold  # noqa: E402
from protocol.secagg.protocol import SecAggParams, add_mod  # noqa: E402

BITS, LENGTH = 32, 1024


def one_run(m: int, dropout: float, graph: str, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    sites = [f"site-{i:04d}" for i in range(m)]
    inputs = {s: rng.integers(0, 1 << BITS, LENGTH, dtype=np.uint64) for s in sites}
    lost = set(rng.choice(sites, int(round(dropout * m)), replace=False)) if dropout else set()
    k = m - 1 if graph == "full" else default_degree(m)
    params = SecAggParams(BITS, LENGTH, k, default_threshold(k))
    codec = SecAggDDG(LENGTH)
    up = dict.fromkeys(sites, 0)
    down = dict.fromkeys(sites, 0)
    began = time.perf_counter()
    coordinator = SecureSumCoordinator(params, sites, np.random.default_rng(seed), {}, lambda a: a)
    halves = {s: SecureSumSite(s, lambda public, p, s=s: inputs[s]) for s in sites}
    step = coordinator.start()
    while isinstance(step, Send):
        answers, dropped = {}, {}
        for site, body in step.requests.items():
            down[site] += len(msgpack.packb(body, use_bin_type=True))
            if site in lost and step.phase == "mask":
                dropped[site] = "dropped"
                continue
            wire = codec.encode(halves[site].answer(step.phase, body))
            up[site] += len(msgpack.packb(wire, use_bin_type=True))
            answers[site] = codec.decode(wire)
        if step.phase == "mask":
            lost_now = set(dropped)
        step = coordinator.advance(step.phase, answers, dropped)
    seconds = time.perf_counter() - began
    expected = np.zeros(LENGTH, dtype=np.uint64)
    for s in sorted(set(sites) - lost_now):
        expected = add_mod(expected, inputs[s], BITS)
    assert step.ok and np.array_equal(step.total, expected), step.reason
    return {"m": m, "dropout": dropout, "graph": graph, "degree": k, "threshold": params.threshold,
            "seconds": round(seconds, 4), "bytes_up_per_site": float(np.mean(list(up.values()))),
            "bytes_down_per_site": float(np.mean(list(down.values()))),
            "payload_bytes_per_site": LENGTH * BITS // 8}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sites", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--out", default="bench/results/secagg_sum.json")
    args = parser.parse_args()
    rows = []
    for graph in ("sparse", "full"):
        for m in args.sites:
            for dropout in (0.0, 0.1):
                row = one_run(m, dropout, graph)
                rows.append(row)
                print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
