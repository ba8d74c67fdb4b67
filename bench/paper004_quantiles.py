"""Paper 004 section 5.4: federated quantile estimates of Gamma(r) data spread over table 1's
centres with scale heterogeneity, MSE of the normalized error (Q-hat - Q) / sqrt(r).

The estimators use the pure halves (stats.kanon, stats.fedquantiles) in one process: the
K-anonymous table built centre by centre (largest first) for the naive and YJ table estimates,
per-centre moments on a lambda grid for the one-pass YJ likelihood, and the pooled sample
quantile that the iterative quantile loss (eq. 4) converges to.

    python bench/paper004_quantiles.py [--centres 5] [--sims 200] [--out bench/results/paper004_quantiles.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import optimize, special, stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from stats.fedquantiles import (lambda_grid, linear_table_quantile, naive_table_quantile,  # noqa: E402
                                yeo_johnson_inverse, yj_likelihood_continuous, yj_likelihood_quantile,
                                yj_site_moments, yj_table_quantile)
from stats.kanon import apply_release, first_release, join_release  # noqa: E402

TABLE_1 = {3: [698, 476, 326], 5: [492, 368, 276, 208, 156], 10: [307, 250, 208, 172, 143, 118, 98, 81, 67, 56]}
LEVELS = (0.02, 0.25, 0.5, 0.75, 0.98)
#: the paper's quantile loss, YJ data (one-pass grid and continuous fit) and YJ table, and the
#: naive and linear-interpolation table estimates it describes but does not tabulate
ESTIMATORS = ("loss", "yj_likelihood", "yj_continuous", "yj_table", "naive_table", "linear_table")


def mixture_quantile(p: float, r: float, sizes, alphas) -> float:
    """Eq. (13): the p-quantile of the centres' mixture of scaled Gamma(r) distributions."""
    total = sum(sizes)
    # the centres at once: scipy.special.gammainc is what stats.gamma.cdf evaluates, without its
    # per-call argument checks (most of the old run time); weights and scales computed as before and
    # summed in the same order, so that the root is bit for bit the old one
    weights = np.array([n / total for n in sizes])
    scales = np.array([math.exp(a) for a in alphas])
    return optimize.brentq(lambda q: sum((weights * special.gammainc(r, q / scales)).tolist()) - p, 1e-9, 1e3)


def simulate(r: float, sizes: list[int], sims: int, k: int, phi: float, seed: int) -> dict:
    """Tables 4-7 of paper 004 for one (r, centres) setting: per estimator and level, the bias, sd
    and MSE of the normalized error (Q-hat - Q) / sqrt(r) over `sims` data sets (the paper: 2000)."""
    rng = np.random.default_rng(seed)
    sigma_alpha = math.log((stats.gamma.median(r) + phi * math.sqrt(r)) / stats.gamma.median(r))
    grid = lambda_grid()
    errors = {name: {p: [] for p in LEVELS} for name in ESTIMATORS}
    for _ in range(sims):
        alphas = rng.normal(0, sigma_alpha, len(sizes))
        sites = [rng.gamma(r, 1, n) * math.exp(a) for n, a in zip(sizes, alphas)]
        table = None
        for x in sites:
            release = first_release([x], k, rng) if table is None else join_release(table.limits, [x], k, rng)
            table = apply_release(table, release)
        moments = [yj_site_moments(x, grid) for x in sites]
        lam, mu, sd = yj_likelihood_continuous(lambda v: [yj_site_moments(x, [v]) for x in sites])
        pooled = np.sort(np.concatenate(sites))
        for p in LEVELS:
            truth = mixture_quantile(p, r, sizes, alphas)
            estimates = {"loss": pooled[math.ceil(p * pooled.size) - 1],
                         "yj_likelihood": yj_likelihood_quantile(moments, grid, p),
                         "yj_continuous": float(yeo_johnson_inverse(np.array([mu + sd * stats.norm.ppf(p)]), lam)[0]),
                         "linear_table": linear_table_quantile(table.limits, table.counts[0], p),
                         "yj_table": yj_table_quantile(table.limits, table.counts[0], p),
                         "naive_table": naive_table_quantile(table.limits, table.counts[0], p)}
            for name, value in estimates.items():
                errors[name][p].append((value - truth) / math.sqrt(r))
    return {name: {str(p): {"bias": float(np.mean(e)), "sd": float(np.std(e, ddof=1)),
                            "mse": float(np.mean(np.square(e)))} for p, e in per.items()}
            for name, per in errors.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--centres", type=int, nargs="+", default=[5], choices=sorted(TABLE_1))
    parser.add_argument("--shapes", type=float, nargs="+", default=[4.0, 10.0])
    parser.add_argument("--sims", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--phi", type=float, default=0.1)
    parser.add_argument("--out", default="bench/results/paper004_quantiles.json")
    args = parser.parse_args()
    rows = []
    for centres in args.centres:
        for r in args.shapes:
            result = simulate(r, TABLE_1[centres], args.sims, args.k, args.phi, seed=centres * 100 + int(r))
            rows.append({"centres": centres, "r": r, "sims": args.sims, "k": args.k, "estimators": result})
            mse = {name: " / ".join(f"{v['mse'] * 1e3:.2f}" for v in per.values()) for name, per in result.items()}
            print(json.dumps({"centres": centres, "r": r, "mse_x1000": mse}), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
