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
    (fedcp_qq, fedcp2_qq, fedcp2_qq_shuffle, fedcp2_qq_secagg) with peak memory and the plan made:
    2 to 10,000 sites all at the bound, one at the bound among small sites, half and half, sizes
    drawn up to it (BOUND_CASES); each case in its own process, stopped after --timeout seconds
    (recorded as not finished): what one peer's announced size can cost everyone's session.

    python bench/plan_time.py [--repeats 3] [--timeout 600] [--out bench/results/plan_time.json]
    python bench/plan_time.py --only-bound [--cases uniform:10000 ...] [--methods fedcp_qq ...] --out-bound F
    python bench/plan_time.py --before F ... --before-label COMMIT   # keeps F's rows (older planners) beside

With --before, the rows of --out-bound files made by this script against older planners (a
checkout of COMMIT) are kept under at_the_bound.before, so that the JSON holds both.
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
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds each at-the-bound case may run before it is stopped (recorded as not finished)")
    parser.add_argument("--only-bound", action="store_true",
                        help="run only the at-the-bound cases and print them (writes nothing unless --out-bound)")
    parser.add_argument("--out-bound", default=None, help="with --only-bound: write the at-the-bound rows here")
    parser.add_argument("--methods", nargs="*", default=None, help="at-the-bound methods to run (default: all)")
    parser.add_argument("--cases", nargs="*", default=None, help="at-the-bound cases, by label or kind:m (default: all)")
    parser.add_argument("--before", nargs="*", default=None,
                        help="--out-bound files of the same cases run with earlier planners, kept beside the new rows")
    parser.add_argument("--before-label", default="", help="which planners --before measured (a commit)")
    args = parser.parse_args()
    alpha = args.alpha
    if args.only_bound:
        bound = at_the_bound(alpha, args.timeout, args.methods, args.cases)
        if args.out_bound:
            Path(args.out_bound).write_text(json.dumps({"alpha": alpha, "machine": platform.platform(),
                                                        "at_the_bound": bound}, indent=2))
        return
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
    bound = at_the_bound(alpha, args.timeout, args.methods, args.cases)
    if args.before:
        rows = [row for path in args.before for row in json.loads(Path(path).read_text())["at_the_bound"]["cases"]]
        bound["before"] = {"planners": args.before_label, "cases": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"alpha": alpha, "machine": platform.platform(), "python": platform.python_version(),
                               "equal": equal, "table_m10_n20_seconds": table_seconds, "unequal": unequal,
                               "at_the_bound": bound},
                              indent=2))
    print(f"wrote {out}")


#: Sessions at the join bound (each site's n_j at most MAX_PLANNED_N): (label, how the sizes are
#: made), m up to the 10,000 sites Quorum runs. `("equal", m)`: m sites at the bound; `("one", m)`:
#: one at the bound among m - 1 of 20; `("half", m)`: every other site at the bound, the rest 20
#: (`"half1000"`: the rest 1,000); `("uniform", m)`: m sizes drawn uniformly in [10, bound] (seeded;
#: `"uniform1000"`: in [1,000, bound], sizes every FedCP²-QQ variant can serve).
BOUND_CASES = [("one site at the bound, nine of 20", ("one", 10)),
               ("two sites at the bound", ("equal", 2)),
               ("100 sites in [10, bound]", ("uniform", 100)),
               ("1,000 sites at the bound", ("equal", 1000)),
               ("10,000 sites at the bound", ("equal", 10000)),
               ("one at the bound among 999 of 20", ("one", 1000)),
               ("one at the bound among 9,999 of 20", ("one", 10000)),
               ("half of 1,000 at the bound, half 20", ("half", 1000)),
               ("half of 10,000 at the bound, half 20", ("half", 10000)),
               ("half of 1,000 at the bound, half 1,000", ("half1000", 1000)),
               ("half of 10,000 at the bound, half 1,000", ("half1000", 10000)),
               ("1,000 sites in [10, bound]", ("uniform", 1000)),
               ("10,000 sites in [10, bound]", ("uniform", 10000)),
               ("10,000 sites in [1,000, bound]", ("uniform1000", 10000))]
_BINS = {"epsilon": 1.0, "bins": {"count": 50, "lo": 0.0, "hi": 5.0}}
#: Every method whose coordinator plans from the announced n_j (stats.planner, stats.optimizer):
#: FedCP-QQ (eq. 6 for equal sizes, the optimized per-site planner otherwise) and FedCP²-QQ's
#: three transports (the gamma grid of paper 000 section 4, each gamma an eq. (6) or paper-rule plan).
BOUND_METHODS = {"fedcp_qq": {}, "fedcp2_qq": _BINS, "fedcp2_qq_shuffle": _BINS,
                 "fedcp2_qq_secagg": {**_BINS, "secagg": {"mode": "active"}}}


def bound_sizes(kind: str, m: int) -> dict[str, int]:
    if kind == "equal":
        return {f"s{i}": MAX_PLANNED_N for i in range(m)}
    if kind == "one":
        return {**{f"s{i}": 20 for i in range(m - 1)}, "big": MAX_PLANNED_N}
    if kind == "half":
        return {f"s{i}": MAX_PLANNED_N if i % 2 else 20 for i in range(m)}
    if kind == "half1000":  # sizes FedCP²-QQ can serve (20 scores cannot hold ell_gamma + ell_cor)
        return {f"s{i}": MAX_PLANNED_N if i % 2 else 1000 for i in range(m)}
    if kind in ("uniform", "uniform1000"):
        rng = np.random.default_rng(0)  # the 100-site case is the one timed before 1,000 and 10,000
        low = 10 if kind == "uniform" else 1000
        return {f"s{i}": int(v) for i, v in enumerate(rng.integers(low, MAX_PLANNED_N + 1, size=m))}
    raise ValueError(kind)


def at_the_bound(alpha: float, timeout: float, methods=None, cases=None) -> dict:
    """Each method's planning (its coordinator half's first step) for sessions at the join bound,
    each case in a fresh process (its peak resident memory is its own; `before_mib` is the process
    with the method imported, before planning) stopped after `timeout` seconds (recorded as not
    finished, with its peak so far): what one peer's announced size can cost everyone."""
    rows = []
    for label, (kind, m) in BOUND_CASES:
        if cases and label not in cases and f"{kind}:{m}" not in cases:
            continue
        for name, params in BOUND_METHODS.items():
            if methods and name not in methods:
                continue
            row = {"case": label, "sizes": f"{kind}:{m}", "m": m, "method": name,
                   **_run_child({"method": name, "params": params, "alpha": alpha, "kind": kind, "m": m}, timeout)}
            rows.append(row)
            seconds = f"{row['seconds']:7.2f} s" if row["finished"] else f"> {timeout:g} s (did not finish)"
            print(f"at the bound  {label:<38} {name:<18} {seconds}  {row['peak_mib']:6.0f} MiB  -> {row['first_step']}",
                  flush=True)
    return {"timeout_s": timeout, "cases": rows}


def _run_child(job: dict, timeout: float) -> dict:
    """One case in a fresh interpreter; on timeout it is killed and its peak memory so far kept."""
    import subprocess

    child = subprocess.Popen([sys.executable, __file__, "--child"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        out, _ = child.communicate(json.dumps(job), timeout=timeout)
        return json.loads(out.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        peak = _peak_mib(child.pid)
        child.kill()
        child.communicate()
        return {"finished": False, "seconds": None, "first_step": f"did not finish in {timeout:g} s",
                "peak_mib": peak}


def _peak_mib(pid="self") -> float:
    """A process's peak resident memory (VmHWM: its own since exec; getrusage's ru_maxrss would
    also count the parent's at the fork)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        return next(int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith("VmHWM"))
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 if pid == "self" else 0.0


def _child() -> None:
    job = json.loads(sys.stdin.read())
    sizes = bound_sizes(job["kind"], job["m"])
    method = METHODS[job["method"]](job["alpha"], **job["params"])  # imported before the clock starts
    before = _peak_mib()
    began = time.perf_counter()
    try:
        first = method.coordinator(sizes, np.random.default_rng(0)).start()
        step = type(first).__name__
        status = getattr(getattr(first, "outcome", first), "status", None)
        if status:
            step += f" ({status})"
    except Exception as exc:  # reported, not raised: the bench says what the bound costs
        step = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - began
    peak = _peak_mib()
    print(json.dumps({"finished": True, "seconds": seconds, "first_step": step, "before_mib": before,
                      "peak_mib": peak, "plan": _plan_digest(method, sizes)}))


def _plan_digest(method, sizes) -> dict | None:
    """The plan the session made (the planners' caches make this a second look, not a second plan):
    server order, exact coverage, the range of site orders, and FedCP²-QQ's gamma, ell_cor, proxy."""
    try:
        planned = method.plan(sizes)
    except Exception:
        return None
    state = getattr(planned, "state", None)
    gamma = None
    if isinstance(state, tuple):
        gamma, state, correction, proxy = state
    if state is None or getattr(state, "ells", None) is None:
        return None
    digest = {"k": state.k, "coverage": state.coverage, "ell": [min(state.ells), max(state.ells)]}
    if gamma is not None:
        digest.update(gamma=gamma, ell_cor=correction, proxy=proxy)
    return digest


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        _child()
    else:
        main()
