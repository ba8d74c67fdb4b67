"""Paper 001 figure 2, all eight panels: worst quantile error over p = 0.1..0.9 against epsilon
for (epsilon, 1e-5)-DP, and what the paper's quoted points need.

Panels: n in {128, 512} clients (one scalar each: Unif[0, 10] or chi^2(4) clipped to [0, 10]) x
b in {32, 64} uniform bins; ring M = 2^18, sigma^2 = 2 (c derived from epsilon, and sigma^2 raised
where c rounds up); four estimators: flat histogram with estimated n (algorithm 1 option 1), with
exact n (option 2), hierarchical (algorithm 2, exact sensitivities) and hierarchical with
theorem 2 as printed (the paper's accounting). Each run draws fresh data (seeded by panel and
run, the same across epsilons and estimators) and fresh noise; the two flat estimators read the
same noisy sum (algorithm 1's options differ only in the coordinator's step 4).

Each run is the mechanism itself: every site's noisy histogram is made by the site code
(`protocol.methods.ddg_quantile.noisy_histogram`: c x + N_Z(0, sigma^2) per entry from the OS
CSPRNG, mod M), the ring sum is taken, and the coordinator's code (`DDGQuantile.finish`) decodes
it, with c and sigma^2 from the method's own planning (`session_parameters`). `--secagg` runs
each session instead through the real protocol in-process (X25519/AES-GCM/ChaCha20 masks,
`protocol.inprocess.run_session`), which releases the same sum (secure aggregation is exact):
about 60 times slower. `--over-agents` runs one panel over 512 site agents (below).

Per point: the mean and sd over runs of the worst error over p (the caption's metric), and, to
test readings of the paper's text, of the error averaged over p and at the median alone; per
panel the noiseless floor (the same metrics with no noise: quantization to b bins). Then the gap
analysis (`hypotheses`): the same mechanism with c / sigma^2 from other readings of the
accounting (`simple`: epsilon = rho + 2 sqrt(rho log(1/delta)); `zcdp`: the axis read as
theorem 1's epsilon, rho = epsilon^2 / 2) at epsilon 1, 5, 10, and (`noise_scale`) the flat and
printed-theorem-2 errors with the noise sd / c scaled by k (c -> 4c, sigma -> 4k sigma) on the panels the
paper's quoted points can belong to.

    python bench/paper001_fig2.py [--runs 100] [--quick] [--out runs/paper001-fig2]
        [--results bench/results/paper001_fig2.json]
writes fig2.json (every point) and fig2.png (the eight panels, the paper's quoted points marked)
under --out, and the JSON also to --results. `make paper001-fig2` runs the default (100 runs:
about 10 minutes on this 2-core machine); --quick (10 runs, no noise-scale sweep, --results not
written) about a minute.
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
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import brentq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data.synthetic import paper001_chi2, paper001_uniform  # noqa: E402
from protocol.inprocess import run_session  # noqa: E402
from protocol.methods import METHODS  # noqa: E402
from protocol.methods.ddg_quantile import noisy_histogram  # noqa: E402
from protocol.secagg.protocol import Aggregate, add_mod  # noqa: E402
from stats.ddg import (flat_histogram, histogram_concentrated_epsilon, histogram_epsilon,  # noqa: E402
                       quantile_error, ring_bits_required, zcdp_to_approx_dp)
from stats.dp import Bins  # noqa: E402

B, DELTA, SIGMA2, MODULUS_BITS = 10.0, 1e-5, 2.0, 18
#: label -> (histogram, count, accounting)
ESTIMATORS = {"flat, estimated n": ("flat", "estimated", "exact"), "flat, exact n": ("flat", "exact", "exact"),
              "hierarchical": ("hierarchical", "exact", "exact"),
              "hierarchical, theorem 2 as printed": ("hierarchical", "exact", "paper")}
DISTRIBUTIONS = {"uniform": paper001_uniform, "chi2": paper001_chi2}
LEVELS = [round(0.1 * i, 1) for i in range(1, 10)]
METRICS = ("worst", "mean_p", "median", "worst_of_means")
PAPER_RUNS = 10
EPSILONS = [1.0, 2.0, 5.0, 10.0, 20.0]
#: what paper 001 section 4 quotes of figure 2 (its only numbers); `panels` are those ours can be:
#: the left plot's "below 0.01 at epsilon 5" is under the noiseless floor of the worst error on
#: every panel but uniform, n = 512, b = 64; the right plot's errors are n = 128's (docs)
PAPER = [{"plot": plot_, "estimator": estimator, "epsilon": eps, "value": value, "text": text}
         for plot_, estimator, eps, value, text in [
             ("left", "flat, estimated n", 1.0, 0.03, "0.03 at epsilon = 1"),
             ("left", "flat, estimated n", 5.0, 0.01, "falls below 0.01 at epsilon = 5"),
             ("left", "hierarchical, theorem 2 as printed", 1.0, 0.09, "0.09 at epsilon = 1"),
             ("right", "flat, estimated n", 1.0, 0.10, "0.10 at epsilon = 1"),
             ("right", "hierarchical, theorem 2 as printed", 1.0, 0.26, "0.26 at epsilon = 1")]
]
PAPER_PANELS = {"left": [("uniform", 512, 64)],
                "right": [("uniform", 128, 64), ("uniform", 128, 32), ("chi2", 128, 64), ("chi2", 128, 32)]}
CONVERSIONS = ("tight", "simple", "zcdp")
NOISE_SCALES = [0.25, 0.5, 0.6, 0.7, 0.8, 1.0]


# -- the data, the accounting readings, one run ----------------------------------------------


def panel_values(dist: str, n: int, b: int, run: int) -> np.ndarray:
    """Run `run`'s n scalars of a panel (the same for every epsilon and estimator)."""
    return DISTRIBUTIONS[dist](n, np.random.default_rng([n, b, run, 1 if dist == "chi2" else 0]))[1]


def zcdp_target(epsilon: float, conversion: str, delta: float = DELTA) -> float:
    """Theorem 1's epsilon (the mechanism is (1/2) eps^2-zCDP) that a reading of the axis takes
    for (epsilon, delta)-DP: `tight` Quorum's (Canonne-Kamath-Steinke 2020 corollary 13),
    `simple` the bound epsilon = rho + 2 sqrt(rho log(1/delta)) (Bun-Steinke 2016), `zcdp` the
    axis read as theorem 1's epsilon itself."""
    if conversion == "zcdp":
        return epsilon
    if conversion == "simple":
        log = math.log(1.0 / delta)
        rho = ((math.sqrt(log + epsilon) - math.sqrt(log))) ** 2
    elif conversion == "tight":
        rho = brentq(lambda r: zcdp_to_approx_dp(r, delta) - epsilon, 1e-12, 1e4, xtol=1e-14)
    else:
        raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
    return math.sqrt(2.0 * rho)


def scaling_for_zcdp(eps_z: float, n: int, b: int, hierarchical: bool, accounting: str,
                     sigma2: float = SIGMA2) -> tuple[int, float]:
    """(c, sigma^2) giving theorem 1 / 2's epsilon = eps_z: as stats.ddg.scaling_for_epsilon
    (sigma^2 fixed, c rounded up to an integer, then sigma^2 raised back to eps_z)."""
    def eps_at(c, s2):
        return histogram_concentrated_epsilon(c, n, s2, b, hierarchical, accounting)

    hi = 1.0
    while eps_at(hi, sigma2) < eps_z:
        hi *= 2.0
    c = max(1, math.ceil(brentq(lambda c: eps_at(c, sigma2) - eps_z, 1e-9, hi, xtol=1e-10) - 1e-9))
    lo, hi = sigma2, sigma2
    while eps_at(c, hi) > eps_z:
        hi *= 2.0
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if eps_at(c, mid) <= eps_z else (mid, hi)
    return c, hi


def method_for(epsilon: float, b: int, estimator: str):
    histogram, count, accounting = ESTIMATORS[estimator]
    return METHODS["ddg_quantile"](0.1, epsilon=epsilon, delta=DELTA, sigma2=SIGMA2,
                                   bins={"lo": 0.0, "hi": B, "count": b}, histogram=histogram, count=count,
                                   accounting=accounting, modulus_bits=MODULUS_BITS)


def plan(epsilon: float, n: int, b: int, estimator: str, conversion: str = "tight", noise_scale: float = 1.0):
    """(method, sizes, params, public) of one point's sessions. `tight` keeps the method's own
    planning; the other readings (and a noise scale) replace c / sigma^2 in the public parameters
    the sites use (the central claim there is then not what they add: bench only)."""
    method = method_for(epsilon, b, estimator)
    sizes = {f"site-{i:04d}": 1 for i in range(n)}
    planned = method.session_parameters(sizes)
    if isinstance(planned, str):
        raise SystemExit(f"n={n} b={b} epsilon={epsilon} {estimator}: {planned}")
    params, public = planned
    histogram, _, accounting = ESTIMATORS[estimator]
    if conversion != "tight":
        c, sigma2 = scaling_for_zcdp(zcdp_target(epsilon, conversion), n, b, histogram == "hierarchical", accounting)
        public = {**public, "c": c, "sigma2": sigma2}
    if noise_scale != 1.0:  # c x 4 and sigma x 4k: the noise sd / c scaled by k, sigma kept >= 1/2
        public = {**public, "c": 4 * public["c"], "sigma2": public["sigma2"] * (4 * noise_scale) ** 2}
    if conversion != "tight" or noise_scale != 1.0:  # the coordinator would refuse a weaker sum than asked
        obtained = histogram_epsilon(public["c"], n, public["sigma2"], b, histogram == "hierarchical", DELTA,
                                     accounting)
        method = method_for(max(epsilon, obtained * (1 + 1e-6)), b, estimator)
    return method, sizes, params, public


def ring_bits(public: dict, n: int, b: int) -> int:
    """log2 M that theorem 1 / 2's no-wrap-around condition needs for these parameters (delta 1e-5)."""
    return ring_bits_required(public["c"], n, n, public["sigma2"], b, public["histogram"] == "hierarchical", DELTA)


def mechanism_sum(values: np.ndarray, sizes, params, public) -> Aggregate:
    """The ring sum of every site's noisy histogram (each made by the site code), as secure
    aggregation releases it."""
    total = np.zeros(params.length, dtype=np.uint64)
    for i in range(len(values)):
        total = add_mod(total, noisy_histogram(values[i:i + 1], public, params), params.modulus_bits)
    return Aggregate(total, sorted(sizes))


def level_errors(values: np.ndarray, indices: dict, b: int) -> np.ndarray:
    """Eq. (3) at each level p = 0.1..0.9: |F_j - p| for the index j chosen from the estimate,
    F the true CDF of the values at the bin edges."""
    cdf = np.cumsum(flat_histogram(values, Bins(0.0, B, b).edges)) / values.size
    return np.array([quantile_error(cdf, indices[str(p)], p) for p in LEVELS])


def noiseless_errors(values: np.ndarray, b: int) -> np.ndarray:
    """The floor: eq. (3) with the estimate equal to the truth (R*_p, quantization to b bins)."""
    cdf = np.cumsum(flat_histogram(values, Bins(0.0, B, b).edges)) / values.size
    return np.array([np.abs(cdf - p).min() for p in LEVELS])


def metrics(errors: np.ndarray) -> dict[str, np.ndarray]:
    """Per run (rows of `errors`, one column per level): the worst over p, the mean over p, p = 0.5."""
    return {"worst": errors.max(axis=1), "mean_p": errors.mean(axis=1), "median": errors[:, LEVELS.index(0.5)]}


def worst_of_means(errors: np.ndarray, group: int = PAPER_RUNS) -> dict:
    """The figure's points read the other way round: for each group of `group` runs (the paper's
    10), the mean over the runs of each level's error, then the worst level, max_p mean_runs
    Delta_p (never above mean_runs max_p Delta_p), with the sd over the runs at that level (an
    error bar as the caption's); averaged over the groups, with the sd of the point over groups."""
    groups = [errors[i:i + group] for i in range(0, max(len(errors) - group, 0) + 1, group)]
    points, bars = [], []
    for g in groups:
        means = g.mean(axis=0)
        worst = int(np.argmax(means))
        points.append(means[worst])
        bars.append(g[:, worst].std())
    return {"worst_of_means_mean": float(np.mean(points)), "worst_of_means_std": float(np.mean(bars)),
            "worst_of_means_spread": float(np.std(points)), "worst_of_means_groups": len(groups)}


def summary(errors: np.ndarray) -> dict:
    out = {}
    for name, values in metrics(errors).items():
        out[f"{name}_mean"], out[f"{name}_std"] = float(values.mean()), float(values.std())
    return {**out, **worst_of_means(errors)}


def run_point(dist: str, n: int, b: int, epsilon: float, estimators, runs: int, conversion: str = "tight",
              noise_scale: float = 1.0, secagg: bool = False) -> dict[str, dict]:
    """The errors of `estimators` (the two flat ones share one noisy sum per run) at one point."""
    sessions: dict[tuple, list[str]] = {}
    for label in estimators:
        histogram, _, accounting = ESTIMATORS[label]
        sessions.setdefault((histogram, accounting) if not secagg else (label,), []).append(label)
    errors = {label: [] for label in estimators}
    meta = {}
    began = time.perf_counter()
    for labels in sessions.values():
        planned = {label: plan(epsilon, n, b, label, conversion, noise_scale) for label in labels}
        first = planned[labels[0]]
        for label in labels:
            histogram, _, accounting = ESTIMATORS[label]
            meta[label] = {"c": first[3]["c"], "sigma2": first[3]["sigma2"],
                           "noise_sd": math.sqrt(n * first[3]["sigma2"]) / first[3]["c"],
                           "epsilon_accounted": histogram_epsilon(first[3]["c"], n, first[3]["sigma2"], b,
                                                                  histogram == "hierarchical", DELTA, accounting),
                           "ring_bits_needed": ring_bits(first[3], n, b)}
        for run in range(runs):
            values = panel_values(dist, n, b, run)
            if secagg:
                method = planned[labels[0]][0]
                outcomes = {labels[0]: run_session(method, {s: values[i:i + 1] for i, s in enumerate(first[1])},
                                                   lambda s, run=run: np.random.default_rng(run))}
            else:
                aggregate = mechanism_sum(values, *first[1:])
                outcomes = {label: planned[label][0].finish(aggregate, *planned[label][1:]) for label in labels}
            for label, outcome in outcomes.items():
                if outcome.status != "ok":
                    raise SystemExit(f"{dist} n={n} b={b} epsilon={epsilon} {label}: {outcome.reason}")
                errors[label].append(level_errors(values, outcome.details["quantile_indices"], b))
    seconds = (time.perf_counter() - began) / runs
    return {label: {**meta[label], **summary(np.array(errors[label])), "runs": runs,
                    "seconds_per_run": round(seconds, 4)} for label in estimators}


# -- the whole figure ------------------------------------------------------------------------


def panels(args):
    return [(d, n, b) for d in args.distributions for n in args.n for b in args.b]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--b", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--epsilons", type=float, nargs="+", default=EPSILONS)
    parser.add_argument("--distributions", nargs="+", default=list(DISTRIBUTIONS))
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--quick", action="store_true",
                        help="10 runs and no noise-scale sweep (about a minute); --results is then not written")
    parser.add_argument("--secagg", action="store_true", help="each session through the real protocol in-process")
    parser.add_argument("--no-analysis", action="store_true", help="the figure's points only")
    parser.add_argument("--out", default="runs/paper001-fig2")
    parser.add_argument("--results", default=None, help="also write the JSON here (bench/results/paper001_fig2.json)")
    parser.add_argument("--over-agents", action="store_true", help="the n = 512, b = 32 chi^2 panel over site agents")
    parser.add_argument("--docs", metavar="JSON", help="print the docs' markdown tables from a results JSON and stop")
    args = parser.parse_args()
    if args.docs:
        return print(docs_tables(json.loads(Path(args.docs).read_text())))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.over_agents:
        return over_agents(args.epsilons, args.runs if args.runs != 100 else 10, out)
    runs = 10 if args.quick else args.runs
    if args.quick and args.results:  # the committed results (and the docs' tables) stay the full run's
        print(f"--quick: not writing {args.results}", flush=True)
        args.results = None
    began = time.perf_counter()
    report = {"setting": {"B": B, "delta": DELTA, "sigma2": SIGMA2, "modulus_bits": MODULUS_BITS, "levels": LEVELS,
                          "runs": runs, "epsilons": args.epsilons, "estimators": list(ESTIMATORS),
                          "path": "secagg" if args.secagg else "mechanism"},
              "paper": PAPER, "paper_panels": {k: [list(p) for p in v] for k, v in PAPER_PANELS.items()},
              "floor": [], "points": [], "hypotheses": [], "noise_scale": []}

    def save():
        report["seconds"] = round(time.perf_counter() - began, 1)
        text = json.dumps(report, indent=1)
        (out / "fig2.json").write_text(text)
        if args.results:
            Path(args.results).write_text(text)

    for dist, n, b in panels(args):
        floor = np.array([noiseless_errors(panel_values(dist, n, b, run), b) for run in range(runs)])
        report["floor"].append({"distribution": dist, "n": n, "b": b, **summary(floor), "runs": runs})
        for eps in args.epsilons:
            for label, row in run_point(dist, n, b, eps, list(ESTIMATORS), runs, secagg=args.secagg).items():
                row = {"distribution": dist, "n": n, "b": b, "epsilon": eps, "estimator": label, **row}
                report["points"].append(row)
                print(json.dumps(row), flush=True)
            save()
    if not args.no_analysis:
        analysis(report, args, runs, save)
    save()
    plot(report, out / "fig2.png")
    print(f"{report['seconds']} s; {out / 'fig2.json'}, {out / 'fig2.png'}", flush=True)


def analysis(report, args, runs: int, save) -> None:
    """The gap analysis: other readings of the accounting at epsilon 1, 5, 10 on every panel,
    and the noise-scale sweep on the panels the paper's quoted points can belong to."""
    quoted = ["flat, estimated n", "hierarchical, theorem 2 as printed"]
    for dist, n, b in panels(args):
        for conversion in CONVERSIONS[1:]:
            for eps in (1.0, 5.0, 10.0):
                need = max(ring_bits(plan(eps, n, b, label, conversion)[3], n, b) for label in quoted)
                base = {"distribution": dist, "n": n, "b": b, "epsilon": eps, "conversion": conversion}
                if need > MODULUS_BITS:  # the paper's M = 2^18 would wrap around (theorem 1 / 2)
                    report["hypotheses"].append({**base, "estimator": None, "ring_bits_needed": need})
                    continue
                for label, row in run_point(dist, n, b, eps, quoted, runs, conversion).items():
                    report["hypotheses"].append({**base, "estimator": label, **row})
                    print(json.dumps(report["hypotheses"][-1]), flush=True)
        save()
    if args.quick:
        return
    for plot_ in ("left", "right"):
        for dist, n, b in PAPER_PANELS[plot_]:
            if (dist, n, b) not in panels(args):
                continue
            for k in NOISE_SCALES[:-1]:
                for eps in (1.0, 5.0) if plot_ == "left" else (1.0,):
                    for label, row in run_point(dist, n, b, eps, quoted, runs, noise_scale=k).items():
                        report["noise_scale"].append({"distribution": dist, "n": n, "b": b, "epsilon": eps,
                                                      "noise_scale": k, "estimator": label, **row})
                        print(json.dumps(report["noise_scale"][-1]), flush=True)
            save()


DIST_NAMES = {"uniform": "Unif", "chi2": "chi^2(4)"}
SHORT = {"flat, estimated n": "flat est.", "hierarchical, theorem 2 as printed": "thm 2"}


def paper_note(dist: str, n: int, b: int, eps: float) -> str:
    notes = []
    for plot_, keys in PAPER_PANELS.items():
        if (dist, n, b) in keys:
            quotes = [q for q in PAPER if q["plot"] == plot_ and q["epsilon"] == eps]
            if quotes:
                hedge = "" if len(keys) == 1 else "?"
                notes.append(f"{plot_}{hedge}: " + ", ".join(
                    f"{SHORT[q['estimator']]} {'< ' if 'below' in q['text'] else ''}{q['value']:.2f}" for q in quotes))
    return "; ".join(notes)


def cell(point: dict) -> str:
    """A docs cell: mean over runs of the worst error (sd) / worst level of the 10-run means."""
    return f"{point['worst_mean']:.3f} ({point['worst_std']:.3f}) / {point['worst_of_means_mean']:.3f}"


def docs_tables(report) -> str:
    """The markdown tables of docs/secure-aggregation.md's figure 2 part, from a results JSON."""
    points = {(r["distribution"], r["n"], r["b"], r["epsilon"], r["estimator"]): r for r in report["points"]}
    floors = {(r["distribution"], r["n"], r["b"]): r for r in report["floor"]}
    keys = sorted({k[:3] for k in points}, key=lambda k: (k[0] != "uniform", -k[1], -k[2]))
    lines = ["| values | n, b | epsilon | flat, estimated n | flat, exact n | hier. | thm 2 | floor | paper (text) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for dist, n, b in keys:
        for eps in sorted({k[3] for k in points if k[:3] == (dist, n, b)}):
            cells = [cell(points[(dist, n, b, eps, e)]) for e in ESTIMATORS]
            lines.append(f"| {DIST_NAMES[dist]} | {n}, {b} | {eps:g} | " + " | ".join(cells)
                         + f" | {floors[(dist, n, b)]['worst_mean']:.3f} / {floors[(dist, n, b)]['worst_of_means_mean']:.3f}"
                         f" | {paper_note(dist, n, b, eps)} |")
    lines += ["", "| plot | the paper's text | panel | ours: mean of worst (sd) | ours: worst of 10-run means (spread) |",
              "|---|---|---|---|---|"]
    for quote in report["paper"]:
        for dist, n, b in report["paper_panels"][quote["plot"]]:
            point = points.get((dist, n, b, quote["epsilon"], quote["estimator"]))
            if point:
                lines.append(f"| {quote['plot']} | {SHORT[quote['estimator']]}: {quote['text']} | {DIST_NAMES[dist]}, {n}, {b} | "
                             f"{point['worst_mean']:.3f} ({point['worst_std']:.3f}) | "
                             f"{point['worst_of_means_mean']:.3f} ({point['worst_of_means_spread']:.3f}) |")
    hyp = {(r["distribution"], r["n"], r["b"], r["epsilon"], r["conversion"], r["estimator"]): r
           for r in report["hypotheses"]}
    wraps = {(r["distribution"], r["n"], r["b"], r["epsilon"], r["conversion"]): r["ring_bits_needed"]
             for r in report["hypotheses"] if r["estimator"] is None}
    wanted = [(1.0, "flat, estimated n"), (5.0, "flat, estimated n"), (1.0, "hierarchical, theorem 2 as printed"),
              (10.0, "flat, estimated n"), (10.0, "hierarchical, theorem 2 as printed")]
    lines += ["", "| panel | conversion | metric | flat est. at 1 | flat est. at 5 | thm 2 at 1 | flat est. at 10 | thm 2 at 10 |",
              "|---|---|---|---|---|---|---|---|"]
    shown = [("uniform", 512, 64), ("chi2", 512, 64), *PAPER_PANELS["right"]]
    for dist, n, b in [k for k in shown if k in keys]:
        for conversion in CONVERSIONS:
            for metric, name in (("worst", "worst"), ("worst_of_means", "worst of 10-run means"),
                                 ("mean_p", "mean over p"), ("median", "median")):
                cells = []
                for eps, label in wanted:
                    row = points.get((dist, n, b, eps, label)) if conversion == "tight" else \
                        hyp.get((dist, n, b, eps, conversion, label))
                    cells.append(f"{row[metric + '_mean']:.3f}" if row else
                                 f"wraps (M = 2^{wraps.get((dist, n, b, eps, conversion), '?')} needed)")
                lines.append(f"| {DIST_NAMES[dist]}, {n}, {b} | {conversion} | {name} | " + " | ".join(cells) + " |")
    scaled = {(r["distribution"], r["n"], r["b"], r["epsilon"], r["noise_scale"], r["estimator"]): r
              for r in report["noise_scale"]}
    if scaled:
        ks = sorted({k[4] for k in scaled}) + [1.0]
        lines += ["", "| panel | noise sd x k | " + " | ".join(f"k = {k:g}" for k in ks) + " |",
                  "|---|---|" + "---|" * len(ks)]
        for dist, n, b in [k for k in shown if k in keys and k != ("chi2", 512, 64)]:
            for eps, label in wanted[:3]:
                if (dist, n, b, eps, ks[0], label) not in scaled:
                    continue
                cells = [f"{(scaled.get((dist, n, b, eps, k, label)) or points[(dist, n, b, eps, label)])['worst_mean']:.3f}"
                         for k in ks]
                lines.append(f"| {DIST_NAMES[dist]}, {n}, {b} | {SHORT[label]} at {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
        summary_ = run_study(validate_scenario(raw), out / f"eps-{eps:g}")
        seconds = time.perf_counter() - began
        results = list(csv.DictReader(open(out / f"eps-{eps:g}" / "results.csv")))
        for method, label in labels.items():
            errors = [float(r["quantile_error"]) for r in results if r["method"] == method and r["status"] == "ok"]
            if len(errors) != runs:
                raise SystemExit(f"epsilon={eps} {method}: {len(errors)} of {runs} runs ok (see {out / f'eps-{eps:g}'})")
            rows.append({"distribution": "chi2", "n": 512, "b": 32, "epsilon": eps, "estimator": label,
                         "worst_mean": float(np.mean(errors)), "worst_std": float(np.std(errors)), "runs": runs,
                         "whole_run_s": round(seconds, 1), "placement": summary_["placement"]})
            print(json.dumps(rows[-1]), flush=True)
        (out / "fig2.json").write_text(json.dumps({"points": rows, "paper": [], "floor": []}, indent=1))
    plot({"points": rows, "paper": [], "floor": []}, out / "fig2.png")


def plot(report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["points"]
    keys = sorted({(r["distribution"], r["n"], r["b"]) for r in rows}, key=lambda k: (k[0] != "uniform", -k[1], -k[2]))
    cols = min(4, len(keys))
    rows_ = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 3.5 * rows_), squeeze=False)
    colours = dict(zip(ESTIMATORS, ("C0", "C1", "C2", "C3")))
    for axis, (dist, n, b) in zip(axes.flat, keys):
        for label in ESTIMATORS:
            pts = [r for r in rows if (r["distribution"], r["n"], r["b"], r["estimator"]) == (dist, n, b, label)]
            if pts and "worst_of_means_mean" in pts[0]:  # the paper's reading, solid, with its error bars
                axis.errorbar([r["epsilon"] for r in pts], [r["worst_of_means_mean"] for r in pts],
                              yerr=[r["worst_of_means_std"] for r in pts], marker="o", ms=3, capsize=3, label=label,
                              color=colours[label])
            if pts:  # the mean over runs of each run's worst error, dashed
                axis.plot([r["epsilon"] for r in pts], [r["worst_mean"] for r in pts], ls="--", lw=1,
                          color=colours[label], label=None if "worst_of_means_mean" in pts[0] else label)
        floor = [f for f in report.get("floor", []) if (f["distribution"], f["n"], f["b"]) == (dist, n, b)]
        if floor:
            axis.axhline(floor[0]["worst_mean"], color="grey", ls=":", lw=1, label="noiseless floor (dashed reading)")
        marked = set()
        for quote in report.get("paper", []):
            if [dist, n, b] in report.get("paper_panels", {}).get(quote["plot"], []):
                axis.plot(quote["epsilon"], quote["value"], marker="v" if "below" in quote["text"] else "*", ms=11,
                          ls="none", color=colours[quote["estimator"]], markeredgecolor="k",
                          label=None if quote["plot"] in marked else f"paper, {quote['plot']} plot (text)")
                marked.add(quote["plot"])
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_title(f"{'Unif[0,10]' if dist == 'uniform' else 'chi^2(4)'}, n={n}, b={b}, bit width 18", fontsize=9)
        axis.set_xlabel("epsilon ((epsilon, 1e-5)-DP)")
        axis.set_ylabel("worst error over p = 0.1..0.9")
        axis.legend(fontsize=6)
    for axis in list(axes.flat)[len(keys):]:
        axis.set_visible(False)
    fig.suptitle("solid: worst level of the 10-run mean errors (error bars: sd over runs at that level); "
                 "dashed: mean over runs of each run's worst error; stars: the paper's text", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
