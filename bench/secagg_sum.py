"""Secure sum: wall time and bytes per site against m (issue 5, item 7), in both modes (issue 48).

m in {10, 50, 100, 200} sites, vector length 1024 on Z_M with M = 2^32, 0% and 10% of the sites
dropping before they mask (so the coordinator must rebuild their pairwise masks), sparse
(SecAgg+) and full graphs, and the protocol's two modes: `active` (signed keys checked against a
registry, the graph every site recomputes, the consistency round) and `semi-honest`. The phases
run in-process through the codec's encode/decode, with the real crypto; bytes are the msgpack
bodies each site sends and receives (the transport envelope adds about 40 bytes a message, see
the ledger of a process run). One process does all the sites' work, so the time is the sum of
the sites' and the coordinator's CPU time (the coordinator's unmasking puts every other job on
the second core from 2,000 jobs on). A site's refusal counts it dropped, as the runtime does,
and a session that then ends without a sum is reported `status: aborted` with the reason (the
active mode's threshold, more than two thirds of a neighbourhood, is not met where a
neighbourhood lost more than a third of its sites: 10% random dropouts do that to some
neighbourhood in about 45% of the draws at 1,000 sites); an ok sum is checked exact. `peak_rss_gib` is this process's peak resident memory so
far (getrusage), so it is one run's own only for the first run of a process: bench/secagg_modes.py
runs each size in a process of its own and measures the peak from outside.

    python bench/secagg_sum.py [--sites 10 50 100 200] [--modes active semi-honest] [--graphs sparse full]
                               [--dropouts 0 0.1] [--seed 0] [--out bench/results/secagg_sum.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from protocol.codecs.secagg_ddg import SecAggDDG  # noqa: E402
from protocol.methods.base import RequestError, Send  # noqa: E402
from protocol.methods.secure_sum import SecureSumCoordinator, SecureSumSite  # noqa: E402
from protocol.secagg.graph import default_degree, default_threshold  # noqa: E402
from protocol.secagg.identity import identities_in_memory  # noqa: E402
from protocol.secagg.protocol import MODES, SecAggParams, add_mod  # noqa: E402

BITS, LENGTH = 32, 1024


def one_run(m: int, dropout: float, graph: str, seed: int = 0, mode: str = "active") -> dict:
    rng = np.random.default_rng(seed)
    sites = [f"site-{i:04d}" for i in range(m)]
    inputs = {s: rng.integers(0, 1 << BITS, LENGTH, dtype=np.uint64) for s in sites}
    lost = set(rng.choice(sites, int(round(dropout * m)), replace=False)) if dropout else set()
    k = m - 1 if graph == "full" else default_degree(m)
    params = SecAggParams(BITS, LENGTH, k, default_threshold(k, mode), m, mode)
    codec = SecAggDDG(LENGTH)
    up = dict.fromkeys(sites, 0)
    down = dict.fromkeys(sites, 0)
    # each site's signing key and the registry of all of them (made by the launcher, outside the
    # timed protocol, as a real run's keys are made before its sessions); in the semi-honest mode
    # every site's policy takes part
    identities = identities_in_memory(sites, semi_honest=mode == "semi-honest")
    phase_s: dict[str, float] = {}
    began = time.perf_counter()
    coordinator = SecureSumCoordinator(params, sites, np.random.default_rng(seed), {}, lambda a: a)
    halves = {s: SecureSumSite(s, lambda public, p, s=s: inputs[s], identity=identities[s]) for s in sites}
    step = coordinator.start()
    lost_now: set[str] = set()
    while isinstance(step, Send):
        phase_began = time.perf_counter()
        answers, dropped = {}, {}
        for site, body in step.requests.items():
            down[site] += len(msgpack.packb(body, use_bin_type=True))
            if site in lost and step.phase == "mask":
                dropped[site] = "dropped"
                continue
            try:
                wire = codec.encode(halves[site].answer(step.phase, body))
            except RequestError as exc:  # a refusal: the runtime counts the site dropped, with why
                dropped[site] = f"refused: {exc}"
                continue
            up[site] += len(msgpack.packb(wire, use_bin_type=True))
            answers[site] = codec.decode(wire)
        if step.phase == "mask":
            lost_now = set(dropped)
        phase = step.phase
        step = coordinator.advance(step.phase, answers, dropped)
        phase_s[phase] = round(time.perf_counter() - phase_began, 4)  # the sites' answers and the server's step
    seconds = time.perf_counter() - began
    if step.ok:
        expected = np.zeros(LENGTH, dtype=np.uint64)
        for s in sorted(set(sites) - lost_now):
            expected = add_mod(expected, inputs[s], BITS)
        assert np.array_equal(step.total, expected), "the sum is not the survivors' sum"
    return {"m": m, "mode": mode, "seed": seed, "status": "ok" if step.ok else "aborted",
            **({} if step.ok else {"reason": step.reason[:500]}),
            "dropout": dropout, "dropped": len(lost_now), "graph": graph, "degree": k,
            "threshold": params.threshold, "seconds": round(seconds, 4), "phase_s": phase_s,
            "bytes_up_per_site": float(np.mean(list(up.values()))),
            "bytes_down_per_site": float(np.mean(list(down.values()))),
            "payload_bytes_per_site": LENGTH * BITS // 8,
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sites", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--graphs", nargs="+", choices=["sparse", "full"], default=["sparse", "full"])
    parser.add_argument("--dropouts", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--seed", type=int, default=0, help="draws the inputs and which sites drop")
    parser.add_argument("--out", default="bench/results/secagg_sum.json")
    args = parser.parse_args()
    rows = []
    for graph in args.graphs:
        for m in args.sites:
            for dropout in args.dropouts:
                for mode in args.modes:
                    row = one_run(m, dropout, graph, args.seed, mode)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
