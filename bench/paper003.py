"""Paper 003 side by side (issue 51): `make paper003` runs every figure and claim of "Private
prediction sets" (Angelopoulos, Bates, Zrnic, Jordan) that can be had offline and writes
bench/results/paper003.json, which bench/paper_pages.py renders into docs/papers/003.md.

  figure 2 (theory)    q-tilde of eq. (3) with m* and gamma* of appendix C over n and epsilon,
                       beside the coverage of algorithm 3 on uniform scores (Monte Carlo over data
                       sets, the mechanism's expectation exact), theorem 3's upper bound
                       (stats/private_coverage.py, p_max = 1/m*) and corollary 1's (m = n epsilon,
                       gamma = 1/m)
  figure 3 (4.1)       bench/paper003_fig3.py (make paper003-fig3): private / non-private CNN x
                       private / non-private calibration on scikit-learn's digits (CIFAR-10 is not
                       here)
  figures 4, 5 (4.2-3) ImageNet and a pretrained ResNet-152 are not here: the stand-in is digits with
                       a logistic regression, private_cp over bin counts and epsilons
  figures 1, 6 (4.4)   CoronaHack X-rays are not here: named impossible, no stand-in beyond digits

    .venv/bin/python bench/paper003.py            # make paper003 (about 6.5 min here, 5 of them figure 3)
    .venv/bin/python bench/paper003.py --quick    # make paper003 ARGS=--quick (about 1.2 min)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol.methods import METHODS  # noqa: E402
from protocol.methods.base import Planned  # noqa: E402
from stats.dp import (Bins, exponential_mechanism_log_probabilities, optimal_bins_and_gamma,  # noqa: E402
                      private_level)
from stats.private_coverage import (corollary1_parameters, corollary1_rate, coverage_upper_bound,  # noqa: E402
                                    heaviest_bin_share)

RESULTS = ROOT / "bench" / "results" / "paper003.json"
ALPHA = 0.1
FIG2_N = (100, 300, 1_000, 3_000, 10_000, 30_000, 100_000)
FIG2_EPS = (0.5, 1.0, 2.0, 5.0, 10.0)
FIG4_BINS = (10, 100, 1_000, 10_000, 100_000)  # and m*
FIG5_EPS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
#: the paper's sizes (section 4): figure 3's calibration points and CIFAR-10 training images,
#: figures 4-5's ImageNet calibration points
PAPER_FIG3_N, PAPER_TRAIN, PAPER_IMAGENET_N = 5000, 50_000, 30_000
#: the rules that turn words into verdicts: private calibration's set-size cost counts as the
#: paper's "minuscule" below MINUSCULE (5%); private training "causes a larger set size" when the
#: mean set grows by more than ENLARGES (10%)
MINUSCULE, ENLARGES = 0.05, 0.10
#: simulated calibration sets for the reference coverage of algorithm 3 on uniform scores at
#: figure 3's n and epsilon (what "just above 0.9" means there: uniform_coverage)
REFERENCE_DATASETS = 200


def uniform_coverage(n: int, eps: float, datasets: int, rng: np.random.Generator) -> list[float]:
    """Algorithm 3's coverage on n uniform scores (paper 003, theorem 2 and figure 2's setting),
    at m* and gamma* of appendix C: for each of `datasets` simulated calibration sets, E[s-hat]
    exactly (the exponential mechanism's probabilities times the bins' upper edges), which is the
    coverage of s-hat for a uniform test score."""
    m, gamma = optimal_bins_and_gamma(n, ALPHA, eps)
    q, bins = private_level(n, ALPHA, eps, m, gamma), Bins(0.0, 1.0, m)
    return [float(np.exp(exponential_mechanism_log_probabilities(
        np.bincount(bins.index_of(rng.uniform(size=n)), minlength=m), min(q, 1.0), eps)) @ bins.edges[1:])
        for _ in range(datasets)]


def figure2(datasets: int) -> dict:
    """q-tilde (eq. 3) at (m*, gamma*) over n and epsilon, and on uniform scores (p_max = 1/m) the
    coverage of algorithm 3 (E[s-hat]: the mechanism's exact expectation, averaged over `datasets`
    simulated calibration sets) between theorem 2's 1 - alpha and theorem 3's bound."""
    rows = []
    for eps in FIG2_EPS:
        for n in FIG2_N:
            m, gamma = optimal_bins_and_gamma(n, ALPHA, eps)
            q = private_level(n, ALPHA, eps, m, gamma)
            cover = uniform_coverage(n, eps, datasets, np.random.default_rng([3, n, int(eps * 10)]))
            mc, mc_se = float(np.mean(cover)), float(np.std(cover, ddof=1) / np.sqrt(datasets))
            cm, cg = corollary1_parameters(n, eps)
            rows.append({"n": n, "epsilon": eps, "m*": m, "gamma*": gamma, "q_tilde": q,
                         "coverage": mc, "coverage_se": mc_se,
                         "theorem3": coverage_upper_bound(n, ALPHA, eps, m, gamma, 1.0 / m),
                         "corollary1": coverage_upper_bound(n, ALPHA, eps, cm, cg, 1.0 / cm),
                         "rate": corollary1_rate(n, ALPHA, eps)})
    return {"rows": rows}


def _digits_scores(seed: int = 0):
    """The stand-in for a non-private pretrained model: a logistic regression trained on 597 of
    scikit-learn's digits; the other 1,200 images' class probabilities and labels."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    digits = load_digits()
    X, y = digits.data / 16.0, digits.target
    order = np.random.default_rng([seed, 3, 4]).permutation(len(y))
    train, held = order[:597], order[597:]
    model = LogisticRegression(max_iter=2000, C=1.0).fit(X[train], y[train])
    probabilities = model.predict_proba(X[held])
    return probabilities, y[held], float(np.mean(probabilities.argmax(axis=1) == y[held]))


def _calibrate(method, scores):
    planned = Planned({"pool": {}})
    return method.combine({"pool": len(scores)}, planned, {"pool": scores}, set(), np.random.default_rng())


def bins_and_epsilon(splits: int) -> dict:
    """Figures 4 and 5's stand-in: private_cp on the digits model's LAC scores (1 - p_y), n = 600
    calibration and 600 test points over `splits` random splits, at epsilon 5 over bin counts
    (figure 4) and at m* over epsilons (figure 5), with split conformal beside them."""
    probabilities, labels, accuracy = _digits_scores()
    scores = 1.0 - probabilities[np.arange(len(labels)), labels]
    configs = [("split conformal", None, METHODS["centralized"](ALPHA))]
    configs += [("bins", (m, 5.0), METHODS["private_cp"](ALPHA, epsilon=5.0, bins={"count": m, "lo": 0.0, "hi": 1.0}))
                for m in (*FIG4_BINS, 0)]
    configs += [("epsilon", (0, eps), METHODS["private_cp"](ALPHA, epsilon=eps, bins={"count": 0, "lo": 0.0, "hi": 1.0}))
                for eps in FIG5_EPS]
    cells = {i: {"coverage": [], "size": [], "upper": [], "p_max": [], "bins": None} for i in range(len(configs))}
    rng = np.random.default_rng([3, 4, 2])
    half = len(labels) // 2
    for _ in range(splits):
        perm = rng.permutation(len(labels))
        cal, test = perm[:half], perm[half:]
        for i, (_, _, method) in enumerate(configs):
            outcome = _calibrate(method, scores[cal])
            t = outcome.threshold
            cells[i]["coverage"].append(float(np.mean(scores[test] <= t)))
            cells[i]["size"].append(float(np.mean(np.sum(1.0 - probabilities[test] <= t, axis=1))))
            grid = (outcome.details.get("theorem3") or [None])[0]
            if grid:
                b = Bins(**grid["bins"])
                share = heaviest_bin_share(np.bincount(b.index_of(scores[cal]), minlength=b.count))
                cells[i]["p_max"].append(share)
                cells[i]["upper"].append(coverage_upper_bound(grid["n"], ALPHA, grid["epsilon"], b.count,
                                                              grid["gamma"], share))
                cells[i]["bins"] = b.count
    rows = []
    for i, (kind, setting, _) in enumerate(configs):
        c = cells[i]
        cov, size = np.array(c["coverage"]), np.array(c["size"])
        rows.append({"kind": kind, "m": (setting[0] or "m*") if setting else "-", "bins": c["bins"],
                     "epsilon": setting[1] if setting else None,
                     "coverage_mean": float(cov.mean()), "coverage_sd": float(cov.std(ddof=1)),
                     "coverage_median": float(np.median(cov)), "size_mean": float(size.mean()),
                     "size_median": float(np.median(size)),
                     "upper_bound_mean": float(np.mean(c["upper"])) if c["upper"] else None,
                     "p_max_mean": float(np.mean(c["p_max"])) if c["p_max"] else None})
    return {"accuracy": accuracy, "n": half, "test": len(labels) - half, "splits": splits, "rows": rows}


def figure3(quick: bool) -> tuple[dict, float]:
    """bench/paper003_fig3.py (make paper003-fig3): the full run (5 model seeds x 200 splits) or a
    quick one (1 seed x 20 splits, 5 DP-SGD epochs) into its own file."""
    out = ROOT / "bench" / "results" / ("paper003_fig3_quick.json" if quick else "paper003_fig3.json")
    extra = ["--models", "1", "--trials", "20", "--epochs", "15", "--plain-epochs", "40"] if quick else []
    began = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "bench" / "paper003_fig3.py"), *extra, "--out", str(out)], check=True,
                   env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.read_text()), time.perf_counter() - began


def r(x, digits=4):
    """A table cell: the number rounded, "-" for none."""
    return "-" if x is None else round(float(x), digits)


def secs(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def build(quick: bool, fig2: dict, t2: float, stand: dict, t45: float, fig3: dict, t3: float) -> dict:
    mode = "quick: " if quick else ""
    rows2 = fig2["rows"]
    grid = {(row["epsilon"], row["n"]): row for row in rows2}
    falls_n = all(grid[(e, b)]["q_tilde"] <= grid[(e, a)]["q_tilde"] + 1e-3
                  for e in FIG2_EPS for a, b in zip(FIG2_N, FIG2_N[1:]))
    falls_eps = all(grid[(b, n)]["q_tilde"] <= grid[(a, n)]["q_tilde"] + 1e-3
                    for n in FIG2_N for a, b in zip(FIG2_EPS, FIG2_EPS[1:]))
    last = grid[(FIG2_EPS[-1], FIG2_N[-1])]
    first = grid[(FIG2_EPS[0], FIG2_N[0])]
    valid = [row for row in rows2 if row["q_tilde"] < 1]
    above = all(row["coverage"] >= 1 - ALPHA - 3 * row["coverage_se"] for row in rows2)
    below = all(row["coverage"] <= row["theorem3"] + 3 * row["coverage_se"] for row in rows2)
    informative = [row for row in rows2 if row["theorem3"] < 1]
    big = [grid[(e, n)] for e in (1.0, 10.0) for n in (10_000, 100_000)]
    ratios = [(row["corollary1"] - (1 - ALPHA)) / row["rate"] for row in big]
    fig2_cmd = "make paper003 (bench/paper003.py figure2)"
    d = f"{len(FIG2_N) * len(FIG2_EPS)} (n, epsilon) cells"

    cells = {(c["model"], c["calibration"]): c for c in fig3["cells"]}
    acc = fig3["accuracy"]
    n3, eps3, seeds = fig3["setup"]["calibration_n"], fig3["calibration_epsilon"][0], fig3["setup"]["model_seeds"]
    # what each cell's coverage should be on well-spread scores: split conformal's
    # ceil((n+1)(1-alpha))/(n+1), algorithm 3's mean on uniform scores at (n, epsilon) (theorem 2's setting)
    reference = {"non-private": math.ceil((n3 + 1) * (1 - ALPHA)) / (n3 + 1),
                 "private": float(np.mean(uniform_coverage(n3, eps3, REFERENCE_DATASETS,
                                                           np.random.default_rng([3, n3, int(eps3 * 10)]))))}
    npnp, nppr = cells[("non-private", "non-private")], cells[("non-private", "private")]
    dpnp, dppr = cells[("DP-SGD", "non-private")], cells[("DP-SGD", "private")]
    setup = fig3["setup"]
    f3size = (f"{setup['model_seeds']} model seeds x {setup['splits_per_model']} splits, n = {setup['calibration_n']}"
              + (f", DP-SGD {setup['dp_sgd']['epochs']} epochs" if quick else ""))
    f3cmd = "make paper003-fig3" + (" (quick: --models 1 --trials 20 --epochs 15)" if quick else "")
    covs = [c["coverage_mean"] for c in (npnp, nppr, dpnp, dppr)]
    # a cell's tolerance: the sd of its coverage over splits over the root of the model seeds
    within = [(1 - ALPHA) - c["coverage_sd"] / math.sqrt(seeds) <= c["coverage_mean"]
              <= reference[c["calibration"]] + c["coverage_sd"] / math.sqrt(seeds) for c in (npnp, nppr, dpnp, dppr)]
    off = [name for name, ok in zip(("non-private model / non-private calibration",
                                     "non-private model / private calibration", "DP-SGD model / non-private calibration",
                                     "DP-SGD model / private calibration"), within) if not ok]
    temperature = fig3.get("temperature")
    tnote = (f"the scores are temperature-scaled as the paper's code does (T {temperature['non-private']:.2f} "
             f"non-private, {temperature['DP-SGD']:.2f} DP-SGD, mean over seeds, fitted on "
             f"{setup.get('temperature_rows')} rows that are neither training nor calibration rows)"
             if temperature and setup.get("temperature_rows") else
             "the paper's code temperature-scales the scores first, this run does not")
    accs = {name: [m["accuracy"] for m in fig3["models"] if m["model"] == name] for name in ("non-private", "DP-SGD")}
    drops = [a - b for a, b in zip(accs["non-private"], accs["DP-SGD"])]
    drop, paper_drop = acc["non-private"] - acc["DP-SGD"], (fig3["paper"]["accuracy"]["non-private model"]
                                                           - fig3["paper"]["accuracy"]["private model"])
    drop_sd = float(np.std(drops, ddof=1)) if len(drops) > 1 else float("nan")
    size_se = lambda c: c["size_sd"] / math.sqrt(seeds)  # noqa: E731
    private_cost_np = nppr["size_mean"] / npnp["size_mean"] - 1
    private_cost_dp = dppr["size_mean"] / dpnp["size_mean"] - 1
    model_cost = dpnp["size_mean"] / npnp["size_mean"] - 1
    crowd = (f"the DP-SGD model's scores crowd near 1 (split conformal's threshold median {dpnp['threshold_median']:.3f}), "
             f"so one of m*'s uniform bins on [0, 1] is a large step in set size: {100 * dppr['share_size_over_5']:.0f}% of "
             f"the splits' private sets hold more than five of the ten labels (median size {dppr['size_median']:.2f} "
             f"against {dpnp['size_median']:.2f}); {tnote}; DP-SGD's noise comes from the OS, so each rerun's models "
             "differ; ")
    dp_off = "DP-SGD model / private calibration" in off
    paper_reference = float(np.mean(uniform_coverage(PAPER_FIG3_N, eps3, REFERENCE_DATASETS,
                                                     np.random.default_rng([3, PAPER_FIG3_N, int(eps3 * 10)]))))
    slope = (f"the DP-SGD model's sets grow faster with coverage: private calibration's "
             f"{dppr['coverage_mean'] - dpnp['coverage_mean']:+.3f} of coverage costs it "
             f"{dppr['size_mean'] - dpnp['size_mean']:+.3f} labels a set, the non-private model "
             f"{nppr['size_mean'] - npnp['size_mean']:+.3f} for {nppr['coverage_mean'] - npnp['coverage_mean']:+.3f}; ")

    srows = stand["rows"]
    by_m = [row for row in srows if row["kind"] == "bins"]
    by_e = [row for row in srows if row["kind"] == "epsilon"]
    flat_m = [row for row in by_m if row["m"] in (100, 1_000, 10_000)]
    mstar = next(row for row in by_m if row["m"] == "m*")
    e10 = next(row for row in by_e if row["epsilon"] == 10.0)
    paper_ne = PAPER_IMAGENET_N / stand["n"]
    stand_note = (f"digits, logistic regression (accuracy {stand['accuracy']:.3f}), n = {stand['n']} calibration / "
                  f"{stand['test']} test points, {stand['splits']} splits")

    summary = [
        ["Figure 2: q-tilde (eq. 3, m* and gamma* of appendix C) as n and epsilon grow",
         "falls toward 1 - alpha = 0.9 as n and epsilon grow, with mild fluctuations from m* and gamma*",
         f"{mode}q-tilde {first['q_tilde']:.3f} at n = {FIG2_N[0]}, epsilon = {FIG2_EPS[0]:g} (above 1: level 1) down to "
         f"{last['q_tilde']:.4f} at n = {FIG2_N[-1]:,}, epsilon = {FIG2_EPS[-1]:g}; non-increasing in n at every epsilon: "
         f"{'yes' if falls_n else 'no'}, in epsilon at every n: {'yes' if falls_eps else 'no'}",
         "reproduced" if falls_n and falls_eps and last["q_tilde"] - (1 - ALPHA) < 0.01 else "differs",
         "" if falls_n and falls_eps else "q-tilde rises somewhere (see the figure2 table)", fig2_cmd, secs(t2)],
        ["Theorem 2: coverage >= 1 - alpha",
         "P(Y in C(X)) >= 0.9 for any score distribution",
         f"{mode}algorithm 3 on uniform scores, {d}: coverage >= 0.9 in all (within 3 standard errors): "
         f"{'yes' if above else 'no'}; figure 3's four digits cells {min(covs):.3f}-{max(covs):.3f}",
         "reproduced" if above and min(covs) >= 1 - ALPHA - 0.01 else "differs",
         "" if above and min(covs) >= 1 - ALPHA - 0.01 else "coverage below 0.9 (by more than 0.01 on digits)",
         fig2_cmd, secs(t2)],
        ["Theorem 3: coverage upper bound (new: stats/private_coverage.py, results.csv coverage_upper_bound)",
         "P(Y in C(X)) <= 1 - (1-gamma) alpha + (1 - gamma alpha)(2 p_max + 2(1 + max{q/(1-q), 1}) log(m/(gamma alpha)) / ((n+1) epsilon))",
         f"{mode}coverage under the bound in all {d}: {'yes' if below else 'no'}; the bound is below 1 in "
         f"{len(informative)} of them (e.g. {grid[(5.0, 100_000)]['coverage']:.4f} under {grid[(5.0, 100_000)]['theorem3']:.4f} "
         f"at n = 100,000, epsilon = 5); on digits' LAC scores it is {mstar['upper_bound_mean']:.3f} on average "
         f"(p_max {mstar['p_max_mean']:.2f}: the scores pile up in the lowest bin)", "reproduced" if below else "differs",
         "" if below else "coverage above the bound", fig2_cmd + "; tests/test_paper003_bound.py", secs(t2)],
        ["Corollary 1: m ~ n epsilon, gamma = 1/m give 1 - alpha + O(log(n epsilon / alpha) / (n epsilon))",
         "excess coverage of order log(n epsilon / alpha) / (n epsilon)",
         f"{mode}theorem 3 at m = n epsilon, gamma = 1/m, p_max = 1/m: excess / rate = "
         + ", ".join(f"{x:.1f}" for x in ratios) + " at (epsilon, n) = (1, 1e4), (1, 1e5), (10, 1e4), (10, 1e5)",
         "reproduced" if max(ratios) / min(ratios) < 1.5 else "differs",
         "" if max(ratios) / min(ratios) < 1.5 else "the ratio is not settling", fig2_cmd, secs(t2)],
        ["Section 4.1: model accuracy, non-private vs DP-SGD (8, 1e-5)", "73% vs 67% (CIFAR-10, Opacus CNN)",
         f"{mode}{acc['non-private']:.3f} vs {acc['DP-SGD']:.3f} ({f3size})",
         "reproduced" if abs(drop - paper_drop) <= drop_sd else "differs",
         f"CIFAR-10 is not offline: stand-in digits ({setup['train_rows']:,} training images, not {PAPER_TRAIN:,}); "
         f"DP-SGD loses {100 * drop:.0f} points ("
         + (f"sd {100 * drop_sd:.0f} over model seeds" if len(drops) > 1 else "one model seed: no sd")
         + f") where the paper lost {100 * paper_drop:.0f}", f3cmd, secs(t3)],
        ["Figure 3: coverage in the four cells", "concentrates just above 0.9 in every cell",
         f"{mode}non-private/private model x non-private/private calibration: " + ", ".join(f"{c:.3f}" for c in covs),
         "reproduced" if not off else "differs",
         (f"every cell between 0.9 and what its calibration gives on well-spread scores ({reference['non-private']:.3f} "
          f"split conformal, {reference['private']:.3f} algorithm 3 on uniform scores at n = {n3}, epsilon {eps3:g}), "
          "within one sd over model seeds; " if not off else
          "; ".join(f"{name} at {c['coverage_mean']:.3f}, {c['coverage_mean'] - reference[c['calibration']]:+.3f} from "
                    f"the {reference[c['calibration']]:.3f} its calibration gives on well-spread scores"
                    for name, c in zip(("non-private model / non-private calibration",
                                        "non-private model / private calibration",
                                        "DP-SGD model / non-private calibration", "DP-SGD model / private calibration"),
                                       (npnp, nppr, dpnp, dppr)) if name in off) + ": "
          + (crowd if dp_off else ""))
         + ("" if dp_off else tnote + "; ")
         + f"stand-in digits (CIFAR-10 not offline); private calibration adds {covs[1] - covs[0]:.3f} (non-private "
         f"model) and {covs[3] - covs[2]:.3f} (DP-SGD model) of coverage at n = {n3}", f3cmd, secs(t3)],
        ["Figure 3: private model training enlarges the sets", "larger sets from the private model's poorer accuracy",
         f"{mode}mean set {npnp['size_mean']:.3f} -> {dpnp['size_mean']:.3f} (+{100 * model_cost:.0f}%) under split conformal",
         "reproduced" if model_cost > ENLARGES else "differs",
         f"{'more' if model_cost > ENLARGES else 'not more'} than {100 * ENLARGES:.0f}% larger (set-size sd over splits "
         f"/ root of the seeds: {size_se(npnp):.3f}, {size_se(dpnp):.3f}); stand-in digits (CIFAR-10 not offline)",
         f3cmd, secs(t3)],
        ["Figure 3: private calibration costs little in set size", "\"minuscule increase in set size\" (n = 5000)",
         f"{mode}+{100 * private_cost_np:.0f}% (non-private model), +{100 * private_cost_dp:.0f}% (DP-SGD model) mean set "
         f"size at calibration epsilon 8",
         "reproduced" if max(private_cost_np, private_cost_dp) < MINUSCULE else "differs",
         (f"both under {100 * MINUSCULE:.0f}%; " if max(private_cost_np, private_cost_dp) < MINUSCULE else
          f"n = {n3}, not {PAPER_FIG3_N}: the excess coverage shrinks as 1/(n epsilon) (corollary 1), so at "
          f"{PAPER_FIG3_N / n3:.0f}x fewer points private calibration costs more (algorithm 3 on uniform scores covers "
          f"{reference['private']:.3f} at n = {n3}, {paper_reference:.3f} at n = {PAPER_FIG3_N}, epsilon {eps3:g}); "
          + (crowd if dp_off else slope))
         + "stand-in digits (CIFAR-10 not offline)", f3cmd, secs(t3)],
        ["Figure 4 (section 4.2): coverage and size over the number of bins m",
         "ImageNet, ResNet-152, n = 30000, epsilon 5: coverage nearly constant over three orders of magnitude of m; "
         "m* works comparatively well",
         f"{mode}stand-in: coverage {min(r_['coverage_mean'] for r_ in flat_m):.3f}-"
         f"{max(r_['coverage_mean'] for r_ in flat_m):.3f} for m = 100..10,000, "
         f"{next(r_ for r_ in by_m if r_['m'] == 10)['coverage_mean']:.3f} at m = 10, "
         f"{next(r_ for r_ in by_m if r_['m'] == 100_000)['coverage_mean']:.3f} at m = 100,000, "
         f"{mstar['coverage_mean']:.3f} at m* = {mstar['bins']}",
         "impossible offline",
         f"ImageNet and a pretrained ResNet-152 are not on this machine; stand-in {stand_note}",
         "make paper003 (bench/paper003.py bins_and_epsilon)", secs(t45)],
        ["Figure 5 (section 4.3): coverage and size over epsilon",
         "ImageNet, n = 30000: less conservative as epsilon grows, little sensitivity to epsilon",
         f"{mode}stand-in: coverage " + ", ".join(f"{r_['coverage_mean']:.3f}" for r_ in by_e)
         + " at epsilon " + ", ".join(f"{r_['epsilon']:g}" for r_ in by_e),
         "impossible offline",
         f"ImageNet is not on this machine; stand-in {stand_note} (n epsilon is {paper_ne:.0f} times smaller than the "
         "paper's, so the sensitivity to epsilon is larger)", "make paper003 (bench/paper003.py bins_and_epsilon)",
         secs(t45)],
        ["Figure 6 (section 4.4): CoronaHack, ResNet-18, n = 1000, epsilon 10", "median coverage 90.4%",
         f"{mode}stand-in digits at epsilon 10, m*: median coverage {e10['coverage_median']:.3f}",
         "impossible offline", "the CoronaHack X-rays and a pretrained ResNet-18 are not on this machine; stand-in "
         f"{stand_note}", "make paper003 (bench/paper003.py bins_and_epsilon)", secs(t45)],
        ["Figure 1: example X-rays with their private sets", "three CoronaHack images and their sets",
         "-", "impossible offline", "images of the CoronaHack data set, not on this machine; no stand-in", "-", "-"],
    ]
    fig2_table = {"name": "figure2", "title": "Figure 2 and theorems 2-3, corollary 1: theory (alpha = 0.1, uniform scores)",
                  "columns": ["epsilon", "n", "m*", "gamma*", "q-tilde (eq. 3)", "coverage (Monte Carlo)",
                              "theorem 3 bound (p_max = 1/m*)", "corollary 1 bound (m = n eps, gamma = 1/m)"],
                  "rows": [[row["epsilon"], row["n"], row["m*"], r(row["gamma*"], 5), r(row["q_tilde"]),
                            r(row["coverage"]), r(row["theorem3"]), r(row["corollary1"])] for row in rows2]}
    names = {"non-private": "non-private", "DP-SGD": "DP-SGD (8, 1e-5)"}
    fig3_table = {"name": "figure3", "title": "Figure 3 (section 4.1) on digits, " + (
                      f"softmax temperature-scaled (T fitted per model on {setup['temperature_rows']} rows held out of "
                      "training)" if setup.get("temperature_rows") else "no temperature scaling"),
                  "columns": ["model (accuracy)", "calibration", "coverage mean (sd)", "set size mean (sd)",
                              "size median", "theorem 3 bound (mean)"],
                  "rows": [[f"{names[c['model']]} ({acc[c['model']]:.3f})", c["calibration"],
                            f"{c['coverage_mean']:.4f} ({c['coverage_sd']:.4f})", f"{c['size_mean']:.3f} ({c['size_sd']:.3f})",
                            r(c["size_median"], 3), r(c.get("coverage_upper_bound_mean"))] for c in fig3["cells"]]}
    stand_table = {"name": "figures4-5", "title": f"Figures 4 and 5 stand-in ({stand_note})",
                   "columns": ["calibration", "m", "epsilon", "coverage mean (sd)", "coverage median", "set size mean",
                               "theorem 3 bound (mean)", "p_max (mean)"],
                   "rows": [[row["kind"] if row["kind"] == "split conformal" else "private_cp",
                             row["m"] if row["m"] != "m*" else f"m* = {row['bins']}", row["epsilon"] or "-",
                             f"{row['coverage_mean']:.4f} ({row['coverage_sd']:.4f})", r(row["coverage_median"]),
                             r(row["size_mean"], 3), r(row["upper_bound_mean"]), r(row["p_max_mean"], 3)]
                            for row in srows]}
    return {"paper": "003", "title": "Private prediction sets (Angelopoulos, Bates, Zrnic, Jordan)",
            "command": "make paper003", "quick": "make paper003 ARGS=--quick", "quick_run": quick,
            "seconds": {"figure2": round(t2, 1), "figures4-5": round(t45, 1), "figure3": round(t3, 1)},
            "tables": [{"name": "summary", "title": "Summary", "columns": ["item", "the paper", "ours", "verdict",
                                                                           "why, or the stand-in", "command", "time here"],
                        "rows": summary}, fig2_table, fig3_table, stand_table],
            "raw": {"figure2": fig2, "figures4-5": stand}}


def rebuild(previous: dict) -> dict:
    """The results file from a previous one's stored runs (raw) and figure 3's results file."""
    quick, t = previous["quick_run"], previous["seconds"]
    fig3 = json.loads((ROOT / "bench" / "results" / ("paper003_fig3_quick.json" if quick else "paper003_fig3.json"))
                      .read_text())
    return build(quick, previous["raw"]["figure2"], t["figure2"], previous["raw"]["figures4-5"], t["figures4-5"],
                 fig3, t["figure3"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer simulated data sets and splits, figure 3 quick")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--rebuild", action="store_true",
                        help="rebuild the results file from its stored runs and figure 3's file, running nothing")
    args = parser.parse_args(argv)
    if args.rebuild:
        args.out.write_text(json.dumps(rebuild(json.loads(args.out.read_text())), indent=1) + "\n")
        sys.path.insert(0, str(ROOT / "bench"))
        from paper_pages import write

        print(write("003"))
        return 0
    began = time.perf_counter()
    fig2 = figure2(20 if args.quick else 100)
    t2 = time.perf_counter() - began
    print(f"figure 2: {t2:.0f} s", flush=True)
    began = time.perf_counter()
    stand = bins_and_epsilon(20 if args.quick else 100)
    t45 = time.perf_counter() - began
    print(f"figures 4-5 stand-in: {t45:.0f} s", flush=True)
    fig3, t3 = figure3(args.quick)
    sys.path.insert(0, str(ROOT / "bench"))
    from paper_pages import publish

    publish("003", build(args.quick, fig2, t2, stand, t45, fig3, t3), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
