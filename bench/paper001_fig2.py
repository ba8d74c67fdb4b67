"""Paper 001 figure 2: worst quantile error over p = 0.1..0.9 against epsilon for (epsilon, 1e-5)-DP.

n clients (one scalar each: Unif[0, 10] or chi^2(4) clipped to [0, 10]), b uniform bins, ring
M = 2^18, sigma^2 = 2 (c derived from epsilon), flat histogram with estimated / exact count and
hierarchical histogram (exact sensitivities, and theorem 2 as printed), each run through the real protocol in-process (secure aggregation with
X25519/AES-GCM/ChaCha20 masks, the exact discrete Gaussian of protocol.noise). Writes JSON and a plot.

    python bench/paper001_fig2.py [--n 128 512] [--b 32 64] [--runs 10] [--out runs/paper001-fig2]
The same setting as scenarios: scenarios/paper001/*.yaml (with `run.py sweep`).

    python bench/paper001_fig2.py --over-agents [--epsilons 1 2 5 10 20] [--out runs/paper001-fig2-agents]
runs one panel (chi^2(4), n = 512, b = 32: scenarios/paper001/fig2-chi2-n512-b32.yaml) as a
user would, over 512 site agents in site hosts, ZeroMQ and CurveZMQ, one run per epsilon
(`runner.study.run_study`), and plots it the same way (fig2.png, fig2.json), with the whole
run's wall time per epsilon.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.synthetic import paper001_chi2, paper001_uniform  # noqa: E402
from stats.ddg import flat_histogram, quantile_error  # noqa: E402
from stats.dp import Bins  # noqa: E402
from protocol.inprocess import run_session  # noqa: E402
from protocol.methods import METHODS  # noqa: E402

ESTIMATORS = {"flat, estimated n": ("flat", "estimated", "exact"), "flat, exact n": ("flat", "exact", "exact"),
              "hierarchical": ("hierarchical", "exact", "exact"),
              "hierarchical, theorem 2 as printed": ("hierarchical", "exact", "paper")}
DISTRIBUTIONS = {"uniform": paper001_uniform, "chi2": paper001_chi2}
LEVELS = [round(0.1 * i, 1) for i in range(1, 10)]


def worst_error(values: np.ndarray, outcome, b: int) -> float:
    cdf = np.cumsum(flat_histogram(values, Bins(0.0, 10.0, b).edges)) / values.size
    return max(quantile_error(cdf, j, float(p)) for p, j in outcome.details["quantile_indices"].items())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--b", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 5.0, 10.0, 20.0])
    parser.add_argument("--distributions", nargs="+", default=list(DISTRIBUTIONS))
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default="runs/paper001-fig2")
    parser.add_argument("--over-agents", action="store_true", help="the n = 512, b = 32 chi^2 panel over site agents")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.over_agents:
        return over_agents(args.epsilons, args.runs, out)
    rows = []
    for dist in args.distributions:
        for n in args.n:
            for b in args.b:
                for eps in args.epsilons:
                    for label, (histogram, count, accounting) in ESTIMATORS.items():
                        errors, began = [], time.perf_counter()
                        for run in range(args.runs):
                            rng = np.random.default_rng([n, b, run, 1 if dist == "chi2" else 0])
                            _, values = DISTRIBUTIONS[dist](n, rng)
                            sites = {f"site-{i:04d}": values[i:i + 1] for i in range(n)}
                            method = METHODS["ddg_quantile"](0.1, epsilon=eps, delta=1e-5, sigma2=2.0,
                                                             bins={"lo": 0.0, "hi": 10.0, "count": b},
                                                             histogram=histogram, count=count, accounting=accounting,
                                                             modulus_bits=18)
                            outcome = run_session(method, sites, lambda s, run=run: np.random.default_rng(run))
                            if outcome.status != "ok":
                                raise SystemExit(f"{dist} n={n} b={b} eps={eps} {label}: {outcome.reason}")
                            errors.append(worst_error(values, outcome, b))
                        row = {"distribution": dist, "n": n, "b": b, "epsilon": eps, "estimator": label,
                               "error_mean": float(np.mean(errors)), "error_std": float(np.std(errors)),
                               "runs": args.runs, "seconds_per_run": (time.perf_counter() - began) / args.runs}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        (out / "fig2.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "fig2.png")


def over_agents(epsilons, runs: int, out: Path) -> None:
    import csv

    import yaml

    from runner.study import run_study
    from scenarios.scenario import validate_scenario

    path = Path(__file__).resolve().parents[1] / "scenarios" / "paper001" / "fig2-chi2-n512-b32.yaml"
    base = yaml.safe_load(path.read_text())
    labels = {"flat_estimated": "flat, estimated n", "flat_exact": "flat, exact n", "hierarchical": "hierarchical"}
    rows = []
    for eps in epsilons:
        raw = {**base, "trials": runs, "methods": [{**m, "epsilon": eps} for m in base["methods"]]}
        raw["runtime"] = {**raw.get("runtime", {}), "placement": {"sites_per_process": "auto"}}
        began = time.perf_counter()
        summary = run_study(validate_scenario(raw), out / f"eps-{eps:g}")
        seconds = time.perf_counter() - began
        results = list(csv.DictReader(open(out / f"eps-{eps:g}" / "results.csv")))
        for method, label in labels.items():
            errors = [float(r["quantile_error"]) for r in results if r["method"] == method and r["status"] == "ok"]
            if len(errors) != runs:
                raise SystemExit(f"epsilon={eps} {method}: {len(errors)} of {runs} runs ok (see {out / f'eps-{eps:g}'})")
            row = {"distribution": "chi2", "n": 512, "b": 32, "epsilon": eps, "estimator": label,
                   "error_mean": float(np.mean(errors)), "error_std": float(np.std(errors)), "runs": runs,
                   "whole_run_s": round(seconds, 1), "placement": summary["placement"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
        (out / "fig2.json").write_text(json.dumps(rows, indent=1))
    plot(rows, out / "fig2.png")


def plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["distribution"], r["n"], r["b"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for axis, (dist, n, b) in zip(axes[0], panels):
        for label in ESTIMATORS:
            pts = [r for r in rows if (r["distribution"], r["n"], r["b"], r["estimator"]) == (dist, n, b, label)]
            axis.errorbar([r["epsilon"] for r in pts], [r["error_mean"] for r in pts],
                          yerr=[r["error_std"] for r in pts], marker="o", capsize=3, label=label)
        axis.set_xscale("log")
        axis.set_title(f"{dist}, n={n}, b={b}, M=2^18", fontsize=9)
        axis.set_xlabel("epsilon ((epsilon, 1e-5)-DP)")
        axis.set_ylabel("worst quantile error")
        axis.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
