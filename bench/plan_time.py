"""Benchmark: time to plan FedCP-QQ (eq. 6 over the exact M of eq. 5) against m and n.

Writes bench/results/plan_time.json: for each (m, n), the best of `repeats` wall times in
seconds, the chosen (ell, k) and its coverage. The published implementation needs 19 s for the
whole table at m=10, n=20 (paper 000, appendix A.2); the issue asks for m=n=1000 well under 1 s.

    python bench/plan_time.py [--repeats 3] [--out bench/results/plan_time.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.orderstats import qq_coverage_table  # noqa: E402
from protocol.planner import plan_quantile_of_quantiles  # noqa: E402

GRID = [(10, 20), (50, 20), (100, 10), (10, 100), (100, 100), (200, 500), (500, 500), (1000, 10),
        (10, 1000), (1000, 1000), (2000, 2000)]


def best_time(fn, repeats):
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - began)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "plan_time.json"))
    args = parser.parse_args()
    rows = []
    for m, n in GRID:
        seconds, plan = best_time(lambda: plan_quantile_of_quantiles(m, n, args.alpha), args.repeats)
        rows.append({"m": m, "n": n, "plan_seconds": seconds, "ell": plan.ell, "k": plan.k,
                     "coverage": plan.coverage})
        print(f"plan  m={m:>5} n={n:>5}: {seconds * 1000:8.2f} ms  ell*={plan.ell} k*={plan.k} "
              f"coverage={plan.coverage:.9f}")
    table_seconds, _ = best_time(lambda: qq_coverage_table(10, 20), args.repeats)
    print(f"full table M for m=10, n=20 (the published 19 s case): {table_seconds * 1000:.2f} ms")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"alpha": args.alpha, "machine": platform.platform(),
                               "python": platform.python_version(), "plans": rows,
                               "table_m10_n20_seconds": table_seconds}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
