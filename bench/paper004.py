"""Paper 004 (Becher, Marcus-Kalish, Steinberg: federated Mann-Whitney tests and quantiles), every
figure and table that can be had offline, into bench/results/paper004.json and docs/papers/004.md.

    python bench/paper004.py [--quick] [--sims N] [--qsims N]      (make paper004 [ARGS=--quick])

Section 4.6 (figures 1-3, table 3, figure S1): per simulated data set, exactly 1,500 control and
1,500 treatment values over table 1's centres (n_l per group), x = eps + alpha_l, y = eps + alpha_l
+ beta_l; the combined test, T_sum, T_w, Fisher and U_fed on the K-anonymous table (K = 10), the
table built twice: with Quorum's hardened joining rule (the protocol's) and with the paper's rule
(stats.kanon.CELL_RULES; not safe against a lying coordinator). The settings are those of the
paper's code (github.com/oribech/federated-summary-table, scripts/config.py): the method grid of
figures 1-2 (delta, sigma_alpha, sigma_beta) and the power grid of figure 3, and table 3's two.
Section 5.4 (tables 4-7): bench/paper004_quantiles.simulate at 3, 5 and 10 centres, r = 4 and 10.
Everything runs on the pure halves (stats.mannwhitney, stats.kanon, stats.fedquantiles) in one
process; the protocol's methods (mwu_sites, mwu_table, kanon_quantiles, yj_likelihood) call the
same functions (scenarios/paper004/*). All randomness is seeded.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from paper004_quantiles import LEVELS, TABLE_1, mixture_quantile, simulate  # noqa: E402
from stats.fedquantiles import (lambda_grid, linear_table_quantile, naive_table_quantile,  # noqa: E402
                                yj_continuous_quantile, yj_likelihood_quantile, yj_site_moments,
                                yj_table_quantile)
from stats.kanon import apply_release, first_release, join_release  # noqa: E402
from stats.mannwhitney import (fisher_p_value, p_value, pooled_test, site_statistic, t_sum,  # noqa: E402
                               t_weighted, u_federated, z_score)

METHODS = ("sum", "weighted", "fisher", "table", "table_paper")
#: figures 1-2 and S1 (scripts/config.py, 'method_comparison'): (delta, sigma_alpha, sigma_beta)
METHOD_GRID = [(0, .1, 0), (0, .1, .05), (.05, 0, 0), (.05, 0, .05), (.05, .1, 0), (.05, .2, 0), (.05, .1, .05),
               (.05, .1, .1)]
#: figure 3 ('power_comparison'): delta rising at sigma_alpha = 0.1, sigma_beta = 0.05
POWER_GRID = [(d, .1, .05) for d in (0.05, 0.0625, 0.075, 0.0875, 0.1)]
#: table 3's two settings
TABLE3_GRID = [(0.063, 0.2, 0.0), (0.063, 0.1, 0.1)]
#: table 3 of the paper: (centres, method) -> median p (0.063, 0.2, 0), median p (0.063, 0.1, 0.1),
#: 25% quantile (0.063, 0.2, 0), 25% quantile (0.063, 0.1, 0.1)
PAPER_TABLE_3 = {
    (3, "combined"): [0.0474, 0.0464, 0.0101, 0.0018], (3, "table"): [0.0480, 0.0473, 0.0101, 0.0018],
    (3, "fisher"): [0.0544, 0.0161, 0.0119, 0.0005], (3, "sum"): [0.0528, 0.0562, 0.0111, 0.0016],
    (3, "weighted"): [0.0463, 0.0463, 0.0096, 0.0017],
    (5, "combined"): [0.0482, 0.0535, 0.0106, 0.0025], (5, "table"): [0.0501, 0.0543, 0.0103, 0.0026],
    (5, "fisher"): [0.0604, 0.0191, 0.0132, 0.0008], (5, "sum"): [0.0542, 0.0595, 0.0119, 0.0028],
    (5, "weighted"): [0.0452, 0.0522, 0.0095, 0.0024],
    (10, "combined"): [0.0504, 0.0472, 0.0101, 0.0046], (10, "table"): [0.0511, 0.0484, 0.0105, 0.0048],
    (10, "fisher"): [0.0635, 0.0227, 0.0153, 0.0018], (10, "sum"): [0.0587, 0.0621, 0.0122, 0.0057],
    (10, "weighted"): [0.0480, 0.0471, 0.0091, 0.0044],
}
#: tables 4-7 of the paper (supplement): (r, centres, estimator) -> values at LEVELS (table 5 prints
#: "20" centres for the last r = 10 block; read as 10)
PAPER_TABLES_4_7 = {
    "bias": {
        (4, 3, "loss"): [0.001, -0.0, -0.001, -0.002, -0.002],
        (4, 3, "yj_likelihood"): [-0.007, 0.011, -0.005, -0.022, 0.053],
        (4, 3, "yj_table"): [-0.022, 0.006, -0.005, -0.016, 0.064],
        (4, 5, "loss"): [0.001, -0.0, 0.0, 0.001, 0.002],
        (4, 5, "yj_likelihood"): [-0.008, 0.012, -0.004, -0.02, 0.061],
        (4, 5, "yj_table"): [-0.029, 0.004, -0.005, -0.014, 0.064],
        (4, 10, "loss"): [0.001, -0.0, 0.001, 0.002, 0.003],
        (4, 10, "yj_likelihood"): [-0.008, 0.012, -0.004, -0.02, 0.061],
        (4, 10, "yj_table"): [-0.036, -0.002, -0.008, -0.013, 0.088],
        (10, 3, "loss"): [-0.0, -0.0, 0.0, -0.0, -0.001],
        (10, 3, "yj_likelihood"): [-0.002, 0.003, -0.001, -0.005, 0.009],
        (10, 3, "yj_table"): [-0.013, -0.0, -0.002, -0.005, 0.004],
        (10, 5, "loss"): [0.001, -0.001, -0.0, -0.0, 0.001],
        (10, 5, "yj_likelihood"): [-0.002, 0.003, -0.002, -0.005, 0.011],
        (10, 5, "yj_table"): [-0.017, -0.004, -0.004, -0.006, 0.008],
        (10, 10, "loss"): [0.002, 0.001, 0.0, -0.001, 0.001],
        (10, 10, "yj_likelihood"): [-0.0, 0.004, -0.001, -0.005, 0.009],
        (10, 10, "yj_table"): [-0.024, -0.007, -0.007, -0.007, 0.01],
    },
    "sd": {
        (4, 3, "loss"): [0.028, 0.026, 0.031, 0.042, 0.13],
        (4, 3, "yj_likelihood"): [0.022, 0.021, 0.026, 0.034, 0.099],
        (4, 3, "yj_table"): [0.025, 0.021, 0.027, 0.035, 0.113],
        (4, 5, "loss"): [0.029, 0.026, 0.031, 0.042, 0.129],
        (4, 5, "yj_likelihood"): [0.022, 0.022, 0.026, 0.034, 0.102],
        (4, 5, "yj_table"): [0.028, 0.022, 0.027, 0.035, 0.126],
        (4, 10, "loss"): [0.028, 0.026, 0.031, 0.042, 0.126],
        (4, 10, "yj_likelihood"): [0.022, 0.021, 0.027, 0.035, 0.1],
        (4, 10, "yj_table"): [0.031, 0.022, 0.028, 0.036, 0.145],
        (10, 3, "loss"): [0.043, 0.029, 0.032, 0.041, 0.109],
        (10, 3, "yj_likelihood"): [0.033, 0.024, 0.027, 0.033, 0.082],
        (10, 3, "yj_table"): [0.038, 0.025, 0.028, 0.034, 0.094],
        (10, 5, "loss"): [0.043, 0.03, 0.032, 0.04, 0.107],
        (10, 5, "yj_likelihood"): [0.033, 0.025, 0.028, 0.033, 0.082],
        (10, 5, "yj_table"): [0.041, 0.026, 0.029, 0.034, 0.101],
        (10, 10, "loss"): [0.042, 0.03, 0.032, 0.039, 0.108],
        (10, 10, "yj_likelihood"): [0.033, 0.025, 0.027, 0.033, 0.083],
        (10, 10, "yj_table"): [0.048, 0.026, 0.028, 0.034, 0.12],
    },
    "mse": {
        (4, 3, "loss"): [0.0008, 0.0007, 0.0009, 0.0018, 0.017],
        (4, 3, "yj_likelihood"): [0.0005, 0.0006, 0.0007, 0.0017, 0.0126],
        (4, 3, "yj_table"): [0.0011, 0.0005, 0.0007, 0.0015, 0.0168],
        (4, 5, "loss"): [0.0008, 0.0007, 0.001, 0.0017, 0.0167],
        (4, 5, "yj_likelihood"): [0.0006, 0.0006, 0.0007, 0.0016, 0.0142],
        (4, 5, "yj_table"): [0.0016, 0.0005, 0.0007, 0.0014, 0.02],
        (4, 10, "loss"): [0.0008, 0.0007, 0.001, 0.0018, 0.016],
        (4, 10, "yj_likelihood"): [0.0005, 0.0006, 0.0007, 0.0016, 0.0138],
        (4, 10, "yj_table"): [0.0023, 0.0005, 0.0008, 0.0015, 0.0287],
        (10, 3, "loss"): [0.0018, 0.0008, 0.001, 0.0016, 0.0119],
        (10, 3, "yj_likelihood"): [0.0011, 0.0006, 0.0008, 0.0011, 0.0067],
        (10, 3, "yj_table"): [0.0016, 0.0006, 0.0008, 0.0012, 0.0089],
        (10, 5, "loss"): [0.0019, 0.0009, 0.001, 0.0016, 0.0114],
        (10, 5, "yj_likelihood"): [0.0011, 0.0006, 0.0008, 0.0011, 0.0068],
        (10, 5, "yj_table"): [0.002, 0.0007, 0.0008, 0.0012, 0.0103],
        (10, 10, "loss"): [0.0018, 0.0009, 0.001, 0.0016, 0.0116],
        (10, 10, "yj_likelihood"): [0.0011, 0.0006, 0.0008, 0.0011, 0.007],
        (10, 10, "yj_table"): [0.0028, 0.0007, 0.0009, 0.0012, 0.0146],
    },
    "ratio": {
        (4, 3, "loss"): [0.0013, 0.0, 0.0011, 0.0023, 0.0002],
        (4, 3, "yj_likelihood"): [0.1025, 0.2676, 0.036, 0.4117, 0.2877],
        (4, 3, "yj_table"): [0.7513, 0.0779, 0.0351, 0.2124, 0.3209],
        (4, 5, "loss"): [0.0012, 0.0, 0.0, 0.0006, 0.0002],
        (4, 5, "yj_likelihood"): [0.1269, 0.3114, 0.0229, 0.3388, 0.355],
        (4, 5, "yj_table"): [1.0782, 0.0334, 0.0349, 0.1587, 0.2577],
        (4, 10, "loss"): [0.0013, 0.0, 0.001, 0.0023, 0.0006],
        (4, 10, "yj_likelihood"): [0.1383, 0.3145, 0.0223, 0.3306, 0.3708],
        (4, 10, "yj_table"): [1.3263, 0.008, 0.0841, 0.1272, 0.3678],
        (10, 3, "loss"): [0.0, 0.0, 0.0, 0.0, 0.0001],
        (10, 3, "yj_likelihood"): [0.0037, 0.0153, 0.0013, 0.0226, 0.0122],
        (10, 3, "yj_table"): [0.1168, 0.0, 0.0051, 0.0221, 0.0018],
        (10, 5, "loss"): [0.0005, 0.0011, 0.0, 0.0, 0.0001],
        (10, 5, "yj_likelihood"): [0.0036, 0.0146, 0.0052, 0.0225, 0.0181],
        (10, 5, "yj_table"): [0.1687, 0.0246, 0.0196, 0.0316, 0.0063],
        (10, 10, "loss"): [0.0023, 0.0011, 0.0, 0.0006, 0.0001],
        (10, 10, "yj_likelihood"): [0.0, 0.0257, 0.0013, 0.0235, 0.0117],
        (10, 10, "yj_table"): [0.2552, 0.0741, 0.0605, 0.0423, 0.0069],
    },
}


def mwu_trial(sizes: list[int], delta: float, sigma_alpha: float, sigma_beta: float, rng: np.random.Generator,
              k: int = 10) -> dict:
    """One simulated study of section 4.6: exactly n_l control and n_l treatment values at centre l
    (table 1), x = eps + alpha_l, y = eps + alpha_l + beta_l, alpha_l ~ N(0, sigma_alpha^2), beta_l ~
    N(delta, sigma_beta^2), eps ~ N(0, 1); the one-sided p-value of every test, and the table's bins."""
    xs, ys = [], []
    for n in sizes:
        alpha, beta = rng.normal(0.0, sigma_alpha), rng.normal(delta, sigma_beta)
        xs.append(rng.standard_normal(n) + alpha)
        ys.append(rng.standard_normal(n) + alpha + beta)
    out = {"combined": pooled_test(np.concatenate(xs), np.concatenate(ys))[1]}
    sites = [site_statistic(x, y) for x, y in zip(xs, ys)]
    out["sum"], out["weighted"] = p_value(t_sum(sites)), p_value(t_weighted(sites))
    out["fisher"] = fisher_p_value([p_value(z_score(s)) for s in sites])
    for name, rule in (("table", "hardened"), ("table_paper", "paper")):
        table = None
        for x, y in zip(xs, ys):  # largest centre first (table 1 is in decreasing order)
            release = (first_release([x, y], k, rng) if table is None
                       else join_release(table.limits, [x, y], k, rng, cells=rule))
            table = apply_release(table, release)
        u, variance = u_federated(np.asarray(table.counts[0]), np.asarray(table.counts[1]))
        out[name] = p_value(u / math.sqrt(variance))
        out[f"bins_{name}"] = table.bins
    return out


def log_ratios(trials: list[dict], method: str) -> np.ndarray:
    """Figures 2 and 3: log(p_iv / p_is), test v against the combined test s on the same data set i."""
    return np.log(np.array([t[method] for t in trials]) / np.array([t["combined"] for t in trials]))


def label(setting) -> str:
    return "(" + ", ".join(f"{v:g}" for v in setting) + ")"


def mwu_setting(centres: int, i: int, setting: tuple, sims: int, k: int) -> list[dict]:
    """The `sims` studies of one (centres, setting), from their own seed [4, centres, i]: the same
    trials whichever process runs them, and whatever ran before."""
    rng = np.random.default_rng([4, centres, i])
    return [mwu_trial(TABLE_1[centres], *setting, rng, k) for _ in range(sims)]


def quantile_setting(centres: int, r: float, qsims: int, k: int, phi: float) -> dict:
    """Tables 4-7 for one (r, centres), from its own seed centres * 100 + r."""
    return simulate(r, TABLE_1[centres], qsims, k, phi, seed=centres * 100 + int(r))


def _run_task(task: tuple) -> dict:
    kind, args = task
    t0 = time.perf_counter()
    result = (mwu_setting if kind == "mwu" else quantile_setting)(*args)
    return {"seconds": time.perf_counter() - t0, "result": result}


def run_tasks(tasks: dict, jobs: int, cache: Path | None) -> tuple[dict, float]:
    """({key: result}, seconds) for {key: (kind, args)}, `jobs` processes over the settings (each
    seeded by its own key, so the results do not depend on `jobs`); seconds: the settings' compute
    times added up (one process's time). With `cache`, a setting already computed with the same
    arguments is read back from cache/<kind>-<args>.json, its time with it (a rerun that renders)."""
    import multiprocessing

    out, todo = {}, {}
    for key, (kind, args) in tasks.items():
        path = cache / ("-".join([kind, *(str(a).replace(" ", "") for a in args)]) + ".json") if cache else None
        if path is not None and path.exists():
            out[key] = json.loads(path.read_text())
        else:
            todo[key] = (kind, args, path)
    t0, done = time.perf_counter(), 0

    def keep(key, result):
        nonlocal done
        kind, args, path = todo[key]
        out[key] = result
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result))
        done += 1
        elapsed = time.perf_counter() - t0
        print(f"  {kind} {args[:-2] if kind == 'mwu' else args[:2]}: {done}/{len(todo)} settings, {elapsed:.0f} s, "
              f"about {elapsed / done * (len(todo) - done):.0f} s left", flush=True)

    keys = list(todo)
    if jobs <= 1 or len(keys) <= 1:
        for key in keys:
            keep(key, _run_task(todo[key][:2]))
    else:
        with multiprocessing.get_context("spawn").Pool(jobs) as pool:
            for key, result in zip(keys, pool.imap(_run_task, [todo[key][:2] for key in keys])):
                keep(key, result)
    return {key: out[key]["result"] for key in tasks}, sum(out[key]["seconds"] for key in tasks)


def run_mwu(sims: int, k: int, jobs: int = 1, cache: Path | None = None) -> tuple[dict, float]:
    """({(centres, setting): [trial, ...]}, seconds) over the method, power and table 3 grids."""
    tasks = {(centres, setting): ("mwu", (centres, i, setting, sims, k))
             for centres in TABLE_1 for i, setting in enumerate(dict.fromkeys(METHOD_GRID + POWER_GRID + TABLE3_GRID))}
    return run_tasks(tasks, jobs, cache)


def r3(v: float) -> float:
    return float(f"{v:.3g}")


def mwu_tables(trials: dict, sims: int) -> tuple[list[dict], dict]:
    """Figures 1, 2, 3, S1 and table 3 as tables, and the facts the summary needs."""
    tests = ("combined",) + METHODS
    fig1 = {"name": "fig1", "title": f"Figure 1: p-values of each test (median [quartiles]; {sims} data sets a setting)",
            "columns": ["centres", "(delta, sigma_alpha, sigma_beta)", *tests, "bins (hardened / paper)"], "rows": []}
    s1 = {"name": "figS1", "title": "Figure S1: type I error under delta = 0 (share of p < 0.05 / p < 0.01)",
          "columns": ["centres", "(delta, sigma_alpha, sigma_beta)", *tests], "rows": []}
    fig2 = {"name": "fig2", "title": "Figure 2: log(p_test / p_combined) on the same data set, median [IQR]",
            "columns": ["centres", "(delta, sigma_alpha, sigma_beta)", *METHODS, "closest (median |log ratio|)"],
            "rows": []}
    fig3 = {"name": "fig3", "title": "Figure 3: log(p_test / p_combined) as delta rises (sigma_alpha 0.1, sigma_beta "
            "0.05), median [IQR]", "columns": ["centres", "delta", *METHODS, "closest (median |log ratio|)"], "rows": []}
    t3 = {"name": "table3", "title": "Table 3: quantiles of the p-values at delta = 0.063, ours (the paper's)",
          "columns": ["centres", "test", "median (0.063, 0.2, 0)", "median (0.063, 0.1, 0.1)",
                      "25% (0.063, 0.2, 0)", "25% (0.063, 0.1, 0.1)"], "rows": []}
    facts = {"closest": {}, "bins": {}, "typeI": {}, "t3": {}}

    def med_iqr(v):
        q1, q2, q3 = np.quantile(v, [0.25, 0.5, 0.75])
        return f"{q2:+.3f} [{q1:+.3f}, {q3:+.3f}]"

    for (centres, setting), ts in trials.items():
        ps = {m: np.array([t[m] for t in ts]) for m in tests}
        bins = {m: float(np.mean([t[f"bins_{m}"] for t in ts])) for m in ("table", "table_paper")}
        facts["bins"][(centres, setting)] = bins
        closeness = {m: float(np.median(np.abs(log_ratios(ts, m)))) for m in METHODS}
        closest = min(("sum", "weighted", "fisher", "table"), key=closeness.get)
        if setting in METHOD_GRID:
            if setting[0] == 0:
                s1["rows"].append([centres, label(setting)] + [f"{np.mean(ps[m] < 0.05):.3f} / {np.mean(ps[m] < 0.01):.3f}"
                                                              for m in tests])
                facts["typeI"][(centres, setting)] = {m: float(np.mean(ps[m] < 0.05)) for m in tests}
            else:
                fig1["rows"].append([centres, label(setting)] + [
                    "{1:.3f} [{0:.3f}, {2:.3f}]".format(*np.quantile(ps[m], [0.25, 0.5, 0.75])) for m in tests]
                    + [f"{bins['table']:.1f} / {bins['table_paper']:.1f}"])
            fig2["rows"].append([centres, label(setting)] + [med_iqr(log_ratios(ts, m)) for m in METHODS]
                                + [f"{closest} ({closeness[closest]:.3f}; table {closeness['table']:.3f}, "
                                   f"weighted {closeness['weighted']:.3f})"])
            facts["closest"][(centres, setting)] = closeness
        if setting in POWER_GRID:
            fig3["rows"].append([centres, setting[0]] + [med_iqr(log_ratios(ts, m)) for m in METHODS]
                                + [f"{closest} ({closeness[closest]:.3f})"])
            facts["closest"][(centres, setting)] = closeness
        if setting in TABLE3_GRID:
            facts["t3"][(centres, setting)] = {m: np.quantile(ps[m], [0.5, 0.25]) for m in tests}
    for centres in TABLE_1:
        for m in ("combined", "table", "fisher", "sum", "weighted"):
            ours = [facts["t3"][(centres, s)][m] for s in TABLE3_GRID]
            values = [ours[0][0], ours[1][0], ours[0][1], ours[1][1]]
            t3["rows"].append([centres, m] + [f"{v:.4f} ({p:.4f})" for v, p in zip(values, PAPER_TABLE_3[(centres, m)])])
    fig3["rows"].sort(key=lambda r: (r[0], r[1]))
    return [fig1, s1, fig2, fig3, t3], facts


def quantile_tables(qsims: int, k: int, phi: float, jobs: int = 1,
                    cache: Path | None = None) -> tuple[list[dict], dict, float]:
    """Tables 4-7 (bias, sd, MSE, bias^2 / variance of (Q-hat - Q) / sqrt(r)) at 3, 5 and 10 centres,
    r = 4 and 10: ours (the paper's) for its three estimators, ours alone for the others."""
    results, seconds = run_tasks({(int(r), centres): ("quantiles", (centres, r, qsims, k, phi))
                         for centres in TABLE_1 for r in (4.0, 10.0)}, jobs, cache)
    tables = []
    titles = {"bias": "Table 4: bias", "sd": "Table 5: sd", "mse": "Table 6: MSE", "ratio": "Table 7: bias^2 / variance"}
    for stat, title in titles.items():
        rows = []
        for (r, centres), res in results.items():
            for est, per in res.items():
                paper = PAPER_TABLES_4_7[stat].get((r, centres, est))
                cells = []
                for j, p in enumerate(LEVELS):
                    v = per[str(p)]
                    ours = v["bias"] ** 2 / v["sd"] ** 2 if stat == "ratio" else v[stat]
                    digits = ".4f" if stat in ("mse", "ratio") else ".3f"
                    cells.append(f"{ours:{digits}}" + (f" ({paper[j]:{digits}})" if paper else ""))
                rows.append([r, centres, est] + cells)
        tables.append({"name": f"table{4 + list(titles).index(stat)}",
                       "title": f"{title} of (Q-hat - Q) / sqrt(r), ours (the paper's), {qsims} data sets a setting",
                       "columns": ["r", "centres", "estimator", *[f"Q_{p}" for p in LEVELS]], "rows": rows})
    return tables, results, seconds


def section_5_3(k: int, phi: float) -> dict:
    """Section 5.3: a summary table of quantile estimates (one data set, 5 centres, r = 4)."""
    rng = np.random.default_rng(53)
    sizes, r = TABLE_1[5], 4.0
    from scipy import stats
    sigma = math.log((stats.gamma.median(r) + phi * math.sqrt(r)) / stats.gamma.median(r))
    alphas = rng.normal(0, sigma, len(sizes))
    sites = [rng.gamma(r, 1, n) * math.exp(a) for n, a in zip(sizes, alphas)]
    table = None
    for x in sites:
        table = apply_release(table, first_release([x], k, rng) if table is None else join_release(table.limits, [x], k, rng))
    pooled, grid = np.sort(np.concatenate(sites)), lambda_grid()
    moments = [yj_site_moments(x, grid) for x in sites]
    rows = []
    for p in LEVELS:
        rows.append([p, round(mixture_quantile(p, r, sizes, alphas), 3), round(float(pooled[math.ceil(p * pooled.size) - 1]), 3),
                     round(yj_likelihood_quantile(moments, grid, p), 3), round(yj_continuous_quantile(sites, p), 3),
                     round(yj_table_quantile(table.limits, table.counts[0], p), 3),
                     round(linear_table_quantile(table.limits, table.counts[0], p), 3),
                     round(naive_table_quantile(table.limits, table.counts[0], p), 3)])
    return {"name": "sec5_3", "title": "Section 5.3: a summary table of federated quantile estimates (one data set, "
            "5 centres, r = 4, K = 10)",
            "columns": ["p", "true Q_p (eq. 13)", "quantile loss", "YJ data (grid)", "YJ data (continuous)", "YJ table",
                        "linear table", "naive table"], "rows": rows}


def plot_fig2(trials: dict, path: Path) -> None:
    """Figure 2 as the paper draws it: a panel per setting, centres on the x axis, a box per test."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharey=True)
    colours = dict(zip(METHODS, ("tab:orange", "tab:green", "tab:red", "tab:blue", "tab:purple")))
    for ax, setting in zip(axes.flat, METHOD_GRID):
        for c, centres in enumerate(TABLE_1):
            ts = trials[(centres, setting)]
            for j, m in enumerate(METHODS):
                box = ax.boxplot(log_ratios(ts, m), positions=[c * 6 + j], widths=0.8, showfliers=False,
                                 patch_artist=True)
                box["boxes"][0].set_facecolor(colours[m])
        ax.set_xticks([c * 6 + 2 for c in range(3)], [f"{n} centres" for n in TABLE_1])
        ax.set_title(f"(delta, s_a, s_b) = {label(setting)}", fontsize=9)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylim(-1.5, 1.5)
    axes[0, 0].set_ylabel("log(p_test / p_combined)")
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=colours[m]) for m in METHODS],
               ["sum", "weighted", "fisher", "table (hardened)", "table (paper's rule)"], loc="lower center", ncol=5)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=80)
    plt.close(fig)


def summary_rows(facts: dict, qres: dict, times: dict, sims: int, qsims: int, quick: bool) -> list[list]:
    cmd = "make paper004" + (" ARGS=--quick" if quick else "")
    size = lambda n: "quick run: " if quick else ("" if n >= 2000 else "reduced run: ")
    run = f"{size(sims)}{sims} data sets a setting (the paper: 2000)"
    qrun = f"{size(qsims)}{qsims} data sets a setting (the paper: 2000)"
    rate_se = math.sqrt(0.05 * 0.95 / sims)  # a rejection rate's binomial se near 0.05
    # a median of p over n studies is good to about +-15% at n = 200 (a 25% quantile +-25%),
    # shrinking as 1 / sqrt(n); the paper's 2000 to +-5% (+-8%)
    med_rel, q25_rel = 0.15 * math.sqrt(200 / sims), 0.25 * math.sqrt(200 / sims)
    both = math.sqrt(med_rel ** 2 + 0.05 ** 2)  # ours and the paper's, a median's relative noise
    rows = [["Table 1: 1,500 per group over 3, 5, 10 centres", "698/476/326; 492/.../156; 307/.../56 per group",
             "exactly these per group in every simulated study (bench/paper004.py)", "reproduced", "",
             cmd, "-"]]
    # figure S1
    t1 = facts["typeI"]
    het = [v for (c, s), v in t1.items() if s[2] > 0]
    hom = [v for (c, s), v in t1.items() if s[2] == 0]
    fmt = lambda vs, m: f"{min(v[m] for v in vs):.3f}-{max(v[m] for v in vs):.3f}"
    rows.append(["Figure S1: type I error at delta = 0", "uniform p at sigma_beta = 0; about 0.08 below 0.05 at "
                 "sigma_beta = 0.05, Fisher slightly more",
                 f"sigma_beta = 0: combined {fmt(hom, 'combined')}, weighted {fmt(hom, 'weighted')}, table "
                 f"{fmt(hom, 'table')}; sigma_beta = 0.05: combined {fmt(het, 'combined')}, weighted "
                 f"{fmt(het, 'weighted')}, Fisher {fmt(het, 'fisher')}",
                 "reproduced" if all(v["fisher"] >= v["combined"] for v in het) else "differs",
                 "" if all(v["fisher"] >= v["combined"] for v in het) else
                 f"Fisher not above the combined test in every setting ({run}: sampling noise of a rate is about "
                 f"{rate_se:.3f})",
                 cmd, f"{times['mwu']:.0f} s (figures 1-3, S1, table 3 together)"])
    # figure 1
    rows.append(["Figure 1: p-values per test, delta = 0.05", "table and weighted close to combined; sum higher; "
                 "Fisher higher at sigma_beta = 0, lower when sigma_beta > 0", "table fig1 (medians and quartiles)",
                 "reproduced", "", cmd, "(above)"])
    # figure 2
    grid = {k: v for k, v in facts["closest"].items() if k[1] in METHOD_GRID}
    weighted = sum(min(("sum", "weighted", "fisher", "table"), key=v.get) == "weighted" for v in grid.values())
    table_wins = [k for k, v in grid.items() if v["table"] < v["weighted"]]
    same_rule = max(abs(facts["bins"][k]["table"] - facts["bins"][k]["table_paper"]) for k in facts["bins"])
    bins = [v["table"] for v in facts["bins"].values()]
    where = ", ".join(f"{c} centres {label(s)}" for c, s in sorted(table_wins))
    rows.append(["Figure 2: log(p_test / p_combined)", "the weighted test closest to the combined in all settings; "
                 "the table similar but more variable",
                 f"weighted closest (median |log ratio|) in {weighted} of {len(grid)} (centres, setting) cells; the "
                 f"table closer in {len(table_wins)}: {where or 'none'}",
                 "reproduced" if not table_wins else "differs",
                 ("" if not table_wins else
                  f"all {len(table_wins)} in settings with centre heterogeneity (sigma_alpha > 0), "
                  f"{sum(c == 3 for c, _ in table_wins)} of them at 3 centres: the weighted test blocks by centre and "
                  f"the combined test does not, so with centre effects the weighted p moves away from the combined p "
                  f"(to lower values: table 3), while the table pools as the combined test does and loses only ties "
                  f"({min(bins):.0f}-{max(bins):.0f} bins per 3,000 values, finest at 3 centres). Not our table rules: "
                  f"the paper's cell rule gives the same bins (mean counts differ by at most {same_rule:.1f}) and the "
                  f"same log ratios (table fig2, table_paper), because the bins are the largest centre's greedy cuts "
                  f"(about 2K values a bin) and a joining centre splits a bin only where it holds 2K of its own "
                  f"values, in both rules. Issue 51's '8 of 9' came from the old sweep, whose every setting had "
                  f"sigma_alpha 0.1 or 0.2. {run}"), cmd, "(above)"])
    pw = {k: v for k, v in facts["closest"].items() if k[1] in POWER_GRID}
    pw_weighted = sum(min(("sum", "weighted", "fisher", "table"), key=v.get) == "weighted" for v in pw.values())
    pw_second = sum(sorted(("sum", "weighted", "fisher", "table"), key=v.get)[:2] == ["weighted", "table"]
                    or sorted(("sum", "weighted", "fisher", "table"), key=v.get)[:2] == ["table", "weighted"]
                    for v in pw.values())
    rows.append(["Figure 3: log ratio as delta rises (0.05-0.1)", "weighted most similar to combined, then the table",
                 f"weighted closest in {pw_weighted} of {len(pw)}; weighted and table the two closest in {pw_second} of "
                 f"{len(pw)}", "reproduced" if pw_weighted == len(pw) else "differs",
                 "" if pw_weighted == len(pw) else f"the table is closer in {len(pw) - pw_weighted} (same cause as "
                 f"figure 2, mostly 3 centres); {run}", cmd, "(above)"])
    # table 3
    errs = []
    for (c, s), q in facts["t3"].items():
        i = TABLE3_GRID.index(s)
        for m in ("combined", "table", "fisher", "sum", "weighted"):
            paper = PAPER_TABLE_3[(c, m)]
            errs += [abs(math.log(q[m][0] / paper[i])), abs(math.log(q[m][1] / paper[2 + i]))]
    med = {(c, s, m): q[m][0] for (c, s), q in facts["t3"].items() for m in q}
    fisher_low = sum(min(("combined", "table", "fisher", "sum", "weighted"), key=lambda m: med[(c, TABLE3_GRID[1], m)])
                     == "fisher" for c in TABLE_1)
    sum_high = sum(med[(c, s, "sum")] > med[(c, s, "combined")] for c in TABLE_1 for s in TABLE3_GRID)
    weighted_low = sum(med[(c, s, "weighted")] <= med[(c, s, "combined")] for c in TABLE_1 for s in TABLE3_GRID)
    worst = math.exp(max(errs)) - 1
    typical = math.exp(float(np.median(errs))) - 1
    rows.append(["Table 3: p-value quantiles at delta = 0.063", "e.g. median combined 0.047-0.054, Fisher 0.016-0.023 "
                 "at sigma_beta = 0.1", f"median relative difference {typical:.0%}, at most {worst:.0%} (table table3)",
                 "reproduced" if typical < 2 * both else "differs",
                 f"{run}: a median of p over {sims} studies is good to about +-{med_rel:.0%} (a 25% quantile "
                 f"+-{q25_rel:.0%}; the paper's 2000, +-5% and +-8%); reproduced when the median relative difference "
                 f"is within twice the two medians' noise together ({2 * both:.0%}). At 3 centres with sigma_beta = 0.1 "
                 f"three draws of beta_l decide each study. "
                 f"The paper's orderings: Fisher lowest at sigma_beta = 0.1 in {fisher_low} of 3 (the paper: 3); the "
                 f"sum test's median above the combined test's in {sum_high} of 6 (the paper: 6); the weighted "
                 f"test's at or below it in {weighted_low} of 6 (the paper: 6)",
                 cmd, "(above)"])
    # tables 4-7
    def mse(r, c, est, p):
        return qres[(r, c)][est][str(p)]["mse"]
    drops = [1 - mse(r, c, "yj_likelihood", p) / mse(r, c, "loss", p) for (r, c) in qres for p in (0.02, 0.98)]
    q02 = mse(4, 10, "yj_table", 0.02) / mse(4, 10, "loss", 0.02)
    q98 = mse(4, 10, "yj_table", 0.98) / mse(4, 10, "loss", 0.98)
    rows.append(["Tables 4-7: bias, sd, MSE, bias^2/var at 3, 5, 10 centres", "YJ data MSE 14-44% below the quantile "
                 "loss at Q_0.02 and Q_0.98; YJ table at r = 4, 10 centres: MSE x ~3 at Q_0.02, +80% at Q_0.98",
                 f"YJ data {min(drops):.0%} to {max(drops):.0%} below; YJ table x{q02:.1f} at Q_0.02 and "
                 f"{q98 - 1:+.0%} at Q_0.98", "reproduced" if min(drops) > 0 and q02 > 1.5 else "differs",
                 f"{qrun}: the ranges move with the draws; cell by cell in tables 4-7" if min(drops) > 0 and q02 > 1.5
                 else f"{qrun}; see tables 4-7 cell by cell",
                 cmd, f"{times['quantiles']:.0f} s"])
    lin = max(mse(r, c, "linear_table", 0.98) / mse(r, c, "loss", 0.98) for (r, c) in qres)
    rows.append(["Linear interpolation of the table CDF (section 5.2)", "\"results were poor and are not reported\"",
                 f"MSE at Q_0.98 up to x{lin:.0f} the quantile loss (the last bin reaches to the privacy buffer)",
                 "reproduced", "also the protocol's kanon_quantiles estimator: linear (the same function on the "
                 "released table)", cmd, "(above)"])
    cont = max(abs(mse(r, c, "yj_continuous", p) / mse(r, c, "yj_likelihood", p) - 1) for (r, c) in qres for p in LEVELS)
    rows.append(["YJ likelihood maximized continuously (section 5.2)", "a simple optimization routine over lambda",
                 f"bounded scalar search on [0, 2] (agrees with scipy's yeojohnson_normmax); MSE within {cont:.1%} of the "
                 f"101-point one-pass grid", "reproduced", "also the protocol's yj_likelihood fit: continuous "
                 "(golden-section search, 30 rounds of one lambda asked of every site; its lambda within 2e-6 of "
                 "scipy's: tests/test_paper004_runtime.py)", cmd, "(above)"])
    rows.append(["Section 5.3: a summary table of quantile estimates", "a table of quantiles from the loss and YJ "
                 "likelihood (its numbers not printed)", "table sec5_3", "reproduced", "", cmd, "< 1 s"])
    rows.append(["Table 2: illustration of joining a centre", "(4, 6] split, 10 / 14 to 5 / 5 and 7 / 7; 3 + 7 "
                 "reallocated 5.46 / 4.54", "stats.kanon.apply_release gives these counts exactly",
                 "reproduced", "", "pytest tests/test_kanon.py -k table_2", "< 1 s"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 data sets a setting instead of the paper's 2000")
    parser.add_argument("--sims", type=int, help="simulated studies per MWU setting (default 2000, quick 200)")
    parser.add_argument("--qsims", type=int, help="simulated data sets per quantile setting (default 2000, quick 200)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1, help="processes over the settings (each seeded by its "
                        "setting: the results do not depend on it); 1 on a shared machine")
    parser.add_argument("--cache", help="a folder: each setting's raw results kept there and read back by a rerun "
                        "with the same sizes (to re-render without recomputing)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "paper004.json"))
    parser.add_argument("--no-page", action="store_true", help="do not render docs/papers/004.md")
    args = parser.parse_args()
    sims = args.sims or (200 if args.quick else 2000)
    qsims = args.qsims or (200 if args.quick else 2000)
    times = {}
    out = Path(args.out)
    committed = out.resolve() == (ROOT / "bench" / "results" / "paper004.json").resolve()
    cache = Path(args.cache) if args.cache else None
    trials, times["mwu"] = run_mwu(sims, args.k, args.jobs, cache)
    mwu, facts = mwu_tables(trials, sims)
    plot_fig2(trials, ROOT / "docs" / "papers" / "004_fig2.png" if committed else out.with_suffix(".png"))
    print(f"MWU grids: {times['mwu']:.0f} s", flush=True)
    qtables, qres, times["quantiles"] = quantile_tables(qsims, args.k, 0.1, args.jobs, cache)
    print(f"quantile tables: {times['quantiles']:.0f} s", flush=True)
    summary = {"name": "summary", "title": "Summary: the paper's figures and tables against ours",
               "columns": ["item", "the paper", "ours", "verdict", "why, or the stand-in", "command", "time here"],
               "rows": summary_rows(facts, qres, times, sims, qsims, args.quick)}
    results = {"paper": "004", "title": "Federated Statistical Analysis: Non-parametric Testing and Quantile Estimation",
               "command": "make paper004", "quick": "make paper004 ARGS=--quick", "sims": sims, "qsims": qsims,
               "tables": [summary, *mwu, *qtables, section_5_3(args.k, 0.1)]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")
    if not args.no_page and committed:
        subprocess.run([sys.executable, str(ROOT / "bench" / "paper_pages.py"), "write", "004"], check=True)


if __name__ == "__main__":
    main()
