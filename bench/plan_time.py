"""Benchmark: planning time for FedCP-QQ, equal and unequal site sizes.

Writes bench/results/plan_time.json with, for each case, the best of `repeats` wall times (s),
the plan and its exact coverage:
  - equal sizes, eq. (6) over the exact M of eq. (5), against m and n. The published
    implementation needs 19 s for the m=10, n=20 table (paper 000, appendix A.2); the issue
    asks for m = n = 1000 well under a second;
  - unequal sizes drawn uniformly in [5, 500] (seeded): the paper's rule and the optimized
    per-site plan, with and without dropouts (d = m / 10), for m in 10..200 (the issue asks for
    m = 200 in a few seconds at most), and the ten-centre sizes of paper 004's table 1;
  - at the bound (issue 48, point 4): sessions whose sites announce the largest n_j a join admits
    (protocol.engine.MAX_PLANNED_N), timed through each FedCP-QQ-family method's coordinator half
    (fedcp_qq, fedcp2_qq, fedcp2_qq_shuffle, fedcp2_qq_secagg) with peak memory: what one peer's
    announced size can cost everyone's session.

    python bench/plan_time.py [--repeats 3] [--out bench/results/plan_time.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.engine import MAX_PLANNED_N  # noqa: E402
from protocol.methods import METHODS  # noqa: E402
from stats import optimizer, planner  # noqa: E402
from stats.orderstats import qq_coverage_table  # noqa: E402

EQUAL = [(10, 20), (50, 20), (100, 10), (10, 100), (100, 100), (200, 500), (500, 500), (1000, 10),
         (10, 1000), (1000, 1000), (2000, 2000)]
UNEQUAL_M = [10, 50, 100, 200, 1000, 10000]
#: Cases this large are timed once (each takes seconds).
ONCE_FROM_M = 1000
PAPER004_TEN = (307, 250, 208, 172, 143, 118, 98, 81, 67, 56)


def best_time(fn, repeats):
    times, result = [], None
    for _ in range(repeats):
        for cached in (planner.plan_quantile_of_quantiles, planner.plan_paper_rule, optimizer.plan_optimized):
            cached.cache_clear()  # time the computation, not the cache
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
    alpha = args.alpha
    equal = []
    for m, n in EQUAL:
        seconds, plan = best_time(lambda: planner.plan_quantile_of_quantiles(m, n, alpha), args.repeats)
        equal.append({"m": m, "n": n, "seconds": seconds, "ell": plan.ell, "k": plan.k, "coverage": plan.coverage})
        print(f"eq.6       m={m:>5} n={n:>5}: {seconds * 1000:8.1f} ms  ell*={plan.ell} k*={plan.k} "
              f"coverage={plan.coverage:.9f}")
    table_seconds, _ = best_time(lambda: qq_coverage_table(10, 20), args.repeats)
    print(f"full table M for m=10, n=20 (the published 19 s case): {table_seconds * 1000:.2f} ms")

    cases = [("paper004-ten", PAPER004_TEN)]
    rng = np.random.default_rng(0)
    cases += [(f"uniform5-500-m{m}", tuple(int(v) for v in rng.integers(5, 501, size=m))) for m in UNEQUAL_M]
    unequal = []
    for name, sizes in cases:
        m = len(sizes)
        for label, fn in [("paper_rule", lambda: planner.plan_paper_rule(sizes, alpha)),
                          ("optimized", lambda: optimizer.plan_optimized(sizes, alpha)),
                          ("optimized_d", lambda: optimizer.plan_optimized(sizes, alpha, max(1, m // 10)))]:
            seconds, plan = best_time(fn, 1 if m >= ONCE_FROM_M else args.repeats)
            unequal.append({"case": name, "m": m, "planner": label, "dropouts": plan.dropouts,
                            "seconds": seconds, "k": plan.k, "coverage": plan.coverage,
                            "excess": plan.coverage - (1 - alpha)})
            print(f"{label:<11} {name:<18} m={m:>3} d={plan.dropouts:>2}: {seconds:7.3f} s  k={plan.k} "
                  f"coverage={plan.coverage:.9f}")
    bound = at_the_bound(alpha)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"alpha": alpha, "machine": platform.platform(), "python": platform.python_version(),
                               "equal": equal, "table_m10_n20_seconds": table_seconds, "unequal": unequal,
                               "at_the_bound": bound},
                              indent=2))
    print(f"wrote {out}")


#: (label, sizes): one huge site among small ones, two equal huge sites, many huge unequal sites
BOUND_CASES = [("one site at the bound, nine of 20", {**{f"s{i}": 20 for i in range(9)}, "big": MAX_PLANNED_N}),
               ("two sites at the bound", {"a": MAX_PLANNED_N, "b": MAX_PLANNED_N}),
               ("100 sites in [10, bound]", None)]
BOUND_METHODS = {"fedcp_qq": {}, "fedcp2_qq": {"epsilon": 1.0, "bins": {"count": 50, "lo": 0.0, "hi": 5.0}},
                 "fedcp2_qq_shuffle": {"epsilon": 1.0, "bins": {"count": 50, "lo": 0.0, "hi": 5.0}},
                 "fedcp2_qq_secagg": {"epsilon": 1.0, "bins": {"count": 50, "lo": 0.0, "hi": 5.0}}}


def at_the_bound(alpha: float) -> list[dict]:
    """Each method's planning (its coordinator half's first step) for sessions at the join bound,
    each in a fresh process so that its peak memory is its own."""
    import multiprocessing

    rng = np.random.default_rng(0)
    rows = []
    for label, sizes in BOUND_CASES:
        if sizes is None:
            sizes = {f"s{i}": int(v) for i, v in enumerate(rng.integers(10, MAX_PLANNED_N + 1, size=100))}
        for name, params in BOUND_METHODS.items():
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                seconds, step, peak = pool.apply(_plan_once, (name, params, alpha, sizes))
            rows.append({"case": label, "method": name, "seconds": seconds, "first_step": step, "peak_mib": peak})
            print(f"at the bound  {label:<34} {name:<18} {seconds:7.2f} s  {peak:6.0f} MiB  -> {step}")
    return rows


def _plan_once(name, params, alpha, sizes):
    import resource

    began = time.perf_counter()
    try:
        step = type(METHODS[name](alpha, **params).coordinator(sizes, np.random.default_rng(0)).start()).__name__
    except Exception as exc:  # reported, not raised: the bench says what the bound costs
        step = f"{type(exc).__name__}: {exc}"
    return time.perf_counter() - began, step, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    main()
