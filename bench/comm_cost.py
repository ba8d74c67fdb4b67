"""Benchmark: bytes per site and coordinator time per trial against the number of sites m,
for each codec, over real site processes (the ledger counts ZMTP bytes at the coordinator).

Each site holds n calibration points (default 100; synthetic data, ridge regression); methods:
fedcp_qq (raw_quantile), fedcp2_qq (exp_mech_bins, B = 100), private_cp_local (exp_mech_bins,
per-site bins) and centralized (raw_scores). Writes bench/results/comm_cost.json.

    python bench/comm_cost.py [--sites 10,50,100,200] [--n 100] [--trials 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runner.outputs import RunDirectory  # noqa: E402
from runner.study import run_study  # noqa: E402
from scenarios.scenario import validate_scenario  # noqa: E402

METHODS = [
    {"name": "fedcp_qq"},
    {"name": "fedcp2_qq", "epsilon": 5.0, "bins": {"count": 100, "lo": -3.0, "hi": 3.0}},
    {"name": "private_cp_local", "epsilon": 5.0, "bins": {"count": 0, "lo": -3.0, "hi": 3.0}},
    {"name": "centralized"},
]


def scenario(m: int, n: int, trials: int) -> dict:
    return validate_scenario({
        "name": f"comm-cost-m{m}", "seed": 0, "trials": trials, "alpha": 0.1,
        "data": {"source": "synthetic", "generator": "romano2019", "n": 3 * n * m},
        "split": {"train": 0.4, "calibration": 0.4, "test": 0.2},
        "sites": {"count": m, "sizes": [n] * m, "policy": {"non_private": "allow"}}, "model": {"kind": "ridge"}, "methods": METHODS,
        "runtime": {"deadlines": {"hello": 120, "join": 120, "respond": 60}},
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", default="10,50,100,200")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "comm_cost.json"))
    args = parser.parse_args()
    results = []
    for m in [int(v) for v in args.sites.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            began = time.perf_counter()
            summary = run_study(scenario(m, args.n, args.trials), Path(tmp) / "run")
            wall = time.perf_counter() - began
            rows = RunDirectory(Path(tmp) / "run").read_results()
        for method, cost in summary["communication"].items():
            if method in ("connection", "trial setup"):
                continue
            seconds = [float(r["seconds"]) for r in rows if r["method"] == method]
            entry = {"m": m, "method": method, "codec": summary["methods"][method]["codec"],
                     "bytes_up_per_site": cost["bytes_up_per_site_mean"],
                     "bytes_down_per_site": cost["bytes_down_per_site_mean"],
                     "bytes_per_trial": cost["bytes_per_trial"], "info_bits_per_trial": cost["info_bits_per_trial"],
                     "overhead_up": cost["overhead_up"],
                     "coordinator_seconds_per_trial": sum(seconds) / len(seconds), "run_wall_seconds": wall}
            results.append(entry)
            print(f"m={m:>4} {method:<17} {entry['codec']:<14} up {entry['bytes_up_per_site']:7.1f} B/site  "
                  f"down {entry['bytes_down_per_site']:6.1f} B/site  session {entry['coordinator_seconds_per_trial'] * 1000:7.1f} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "n": args.n,
                               "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
