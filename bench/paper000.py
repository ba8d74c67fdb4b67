"""Paper 000 (Humbert et al. 2023, One-shot federated conformal prediction) side by side: every
figure that can be had offline, one command (`make paper000`, quick: `make paper000 ARGS=--quick`).

  theory   figures 1, 2, 6, 7 and proposition A.1 from stats.orderstats / stats.planner (exact);
           theorem C.3 (Ehm's bounds, stats.ehm) on heterogeneous sites
  fig3     the intervals of section 5.1 on Romano et al.'s synthetic data (m = 50, n = 20),
           drawn to runs/paper000/fig3.png (and bench/results/paper000_fig3.png)
  real     figures 8-17 (appendix B.1) for the paper's three models (ridge split CP, CQR with a
           quantile regression forest, CQR with a network), and figure 4 pooling them: each
           scenarios/paper000/fig*.yaml run by run.py in-process with the model overridden
  b2       appendix B.2, figure 18: FedCP2-QQ at epsilon 10, 5, 1 on bike and bio

Writes bench/results/paper000.json (bench/paper_pages.py renders it into docs/papers/000.md).

    .venv/bin/python bench/paper000.py                # the paper's sizes: 20 trials, 1,000 trees
    .venv/bin/python bench/paper000.py --quick        # forest and network 3 trials, 100 trees
    .venv/bin/python bench/paper000.py --budget-minutes 60   # part of the paper's sizes, resumable

Every run lands in runs/paper000/ and is reused by later calls (keeping its first time); a run
stopped part-way (a budget, a killed session) is continued with run.py's --resume, its finished
trials kept. --budget-minutes runs the unfinished paper-size runs cheapest first for that long;
every row of the results then comes from the largest finished run of its figure and model, and
says its size ("the paper's size" only for 20 trials, 1,000 trees, the network's 200 epochs).
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from stats import ehm  # noqa: E402
from stats.orderstats import max_per_site_coverage, qq_coverage, qq_coverage_table  # noqa: E402
from stats.planner import choose_gamma, plan_quantile_of_quantiles  # noqa: E402

OUT = ROOT / "bench" / "results" / "paper000.json"
RUNS = ROOT / "runs" / "paper000"
ALPHA = 0.1
SUMMARY = ["item", "the paper", "ours", "verdict", "why, or the stand-in", "command", "time here"]
CMD = "make paper000"
#: appendix B.1: figure, data set, m, n (the scenario files under scenarios/paper000/)
REAL = [("8", "bio", 100, 10), ("9", "bio", 10, 100), ("10", "bike", 100, 10), ("11", "bike", 10, 100),
        ("12", "community", 80, 10), ("13", "community", 10, 80), ("14", "star", 80, 10),
        ("15", "star", 10, 80), ("16", "concrete", 40, 10), ("17", "concrete", 10, 40)]
METHODS = ("fedcp_qq", "centralized", "fedcp_avg")
#: wall seconds of each run.py run (measured when it ran; reused runs keep their first time)
RUN_SECONDS: dict[str, float] = {}


def scenario_file(fig: str, data: str, m: int, n: int) -> Path:
    return ROOT / "scenarios" / "paper000" / f"fig{fig}-{data}-m{m}-n{n}.yaml"


def model_override(model: str, trees: int, epochs: int | None = None) -> str:
    """--set value for the model: the scenario's forest with `trees` trees and one job (the same
    trees as with more: each is seeded before any job runs), ridge, or the CQR network (its
    default 200 epochs with early stopping, or `epochs`)."""
    if model == "cqr_forest":
        return ("model={kind: cqr_forest, params: {n_estimators: %d, min_samples_leaf: 40, "
                "quantiles: [0.05, 0.95], n_jobs: 1}}" % trees)
    if model == "cqr_net" and epochs:
        return "model={kind: cqr_net, params: {epochs: %d}}" % epochs
    return "model={kind: %s}" % model


def row(item, paper, ours, ok: bool, why: str, command: str, seconds: float, verdict=None):
    verdict = verdict or ("reproduced" if ok else "differs")
    return [item, paper, ours, verdict, why, command, seconds if isinstance(seconds, str) else f"{seconds:.1f} s"]


# ---------------------------------------------------------------- theory (figures 1, 2, 6, 7)

def figure1():
    """Figure 1: M[ell*, k*] (exact coverage of FedCP-QQ) against the centralized upper bound
    1 - alpha + 1/(mn + 1) and the single-agent bound 1 - alpha + 1/(n + 1), m in {5, 20},
    n = 10..100 (theorem 2.1, section 3.3)."""
    rows = []
    for m in (5, 20):
        for n in range(10, 101, 10):
            plan = plan_quantile_of_quantiles(m, n, ALPHA)
            rows.append([m, n, plan.ells[0], plan.k, round(plan.coverage, 5),
                         round(1 - ALPHA + 1 / (m * n + 1), 5), round(1 - ALPHA + 1 / (n + 1), 5)])
    return rows


def figure2(ns=(20, 50, 100, 200, 500, 1000), epsilons=(1.0, 5.0, 10.0), alphas=(0.05, 0.1, 0.2),
            bins=100, grid=50):
    """Figure 2: M[ell_gamma + ell_cor, k_gamma] at the best gamma (section 4, 'Choosing gamma'),
    m = 10, B = 100 bins, the gamma grid of protocol.methods.fedcp2_qq (50)."""
    rows = []
    for alpha in alphas:
        for eps in epsilons:
            for n in ns:
                choice = choose_gamma((n,) * 10, alpha, eps, bins, grid, 0)
                rows.append([alpha, eps, n, "none feasible" if choice is None else round(choice[3], 5),
                             "" if choice is None else round(choice[0], 4),
                             "" if choice is None else choice[2]])
    return rows


def figures6_7():
    """Figures 6 and 7: the table M[ell, k] for (m, n) = (10, 20) and (5, 10); its optimum
    (eq. 6) and whether it is non-decreasing in ell and in k (appendix A.2)."""
    rows, tables = [], {}
    for m, n in ((10, 20), (5, 10)):
        table = qq_coverage_table(m, n)  # [ell - 1, k - 1]
        tables[(m, n)] = table
        plan = plan_quantile_of_quantiles(m, n, ALPHA)
        monotone = bool(np.all(np.diff(table, axis=0) >= -1e-12) and np.all(np.diff(table, axis=1) >= -1e-12))
        rows.append([m, n, plan.ells[0], plan.k, round(plan.coverage, 5), round(float(table[0, 0]), 6),
                     round(float(table[-1, -1]), 6), int(np.sum(table >= 1 - ALPHA)), monotone])
    return rows, tables


def proposition_a1():
    """Proposition A.1: M[n, k] in closed form against eq. (5) (largest difference over k)."""
    worst = 0.0
    for m, n in ((5, 10), (10, 20), (50, 3), (100, 10)):
        k = np.arange(1, m + 1)
        worst = max(worst, float(np.max(np.abs(max_per_site_coverage(m, n, k) - qq_coverage(m, n, n, k)))))
    return worst


def theorem_c3(seed=0, draws=2000):
    """Theorem C.3 over random heterogeneous sites: the exact distance, Ehm's upper bound, and the
    smallest distance / factor (the largest universal C the draws allow)."""
    rng = np.random.default_rng(seed)
    ratios, slack, constants = [], [], []
    for _ in range(draws):
        m = int(rng.integers(2, 101))
        p = rng.beta(*rng.uniform(0.2, 5, 2), size=m)
        d, upper = ehm.distance(p), ehm.upper_bound(p)
        if upper > 0:
            ratios.append(d / upper)
            constants.append(ehm.lower_constant(p))
    # a worked case: m = 10 sites whose ell*-th order statistic lies below the test score with
    # probabilities spread around 0.9 (proposition 3.4's p_j(S))
    example = np.linspace(0.8, 1.0, 10)
    return {"max_ratio": max(ratios), "min_constant": min(constants), "median_ratio": float(np.median(ratios)),
            "example": (ehm.distance(example), ehm.upper_bound(example), ehm.lower_bound_factor(example))}


def plot_theory(fig1, tables, fig2, out: Path):
    from results.plotting import pyplot, save

    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, m in zip(axes, (5, 20)):
        rows = [r for r in fig1 if r[0] == m]
        n = [r[1] for r in rows]
        ax.plot(n, [r[4] for r in rows], "o-", label="FedCP-QQ, M[l*, k*]")
        ax.plot(n, [r[5] for r in rows], "s--", label="centralized, 1 - a + 1/(mn+1)")
        ax.plot(n, [r[6] for r in rows], "^:", label="one agent, 1 - a + 1/(n+1)")
        ax.set_title(f"figure 1: m = {m}")
        ax.set_xlabel("n")
        ax.legend(fontsize=7)
    save(fig, out / "fig1.png")
    fig, ax = plt.subplots(figsize=(5, 4))
    image = ax.imshow(tables[(10, 20)], origin="lower", aspect="auto", extent=(0.5, 10.5, 0.5, 20.5))
    ax.set_xlabel("k")
    ax.set_ylabel("l")
    ax.set_title("figure 6: M[l, k], m = 10, n = 20")
    fig.colorbar(image)
    save(fig, out / "fig6.png")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key in zip(axes, ((5, 10), (10, 20))):
        table = tables[key]
        for k in range(table.shape[1]):
            ax.plot(np.arange(1, table.shape[0] + 1), table[:, k], label=f"k={k + 1}")
        ax.axhline(1 - ALPHA, color="k", ls="--", lw=0.8)
        ax.set_title(f"figure 7: (m, n) = {key}")
        ax.set_xlabel("l")
        ax.legend(fontsize=6, ncol=2)
    save(fig, out / "fig7.png")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
    for ax, alpha in zip(axes, sorted({r[0] for r in fig2})):
        for eps in sorted({r[1] for r in fig2}):
            pts = [(r[2], r[3]) for r in fig2 if r[0] == alpha and r[1] == eps and not isinstance(r[3], str)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=f"epsilon {eps:g}")
        ax.axhline(1 - alpha, color="k", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(f"figure 2: alpha = {alpha}, m = 10")
        ax.set_xlabel("n")
        ax.legend(fontsize=7)
    save(fig, out / "fig2.png")


# ---------------------------------------------------------------- figure 3

def figure3(trees: int, seed: int, out: Path):
    """Section 5.1 / figure 3: one draw of Romano et al.'s data (2,000 points, half training,
    half calibration over m = 50 sites of n = 20), 5,000 test points, CQR with the quantile
    forest; the three thresholds from the same stats functions the methods use."""
    from data.synthetic import romano2019
    from models.cqr_forest import CQRForest
    from models.scores import coverage_and_size, cqr_interval
    from results.plotting import pyplot, save
    from stats.conformal import (average_of_quantiles, order_statistic, quantile_of_quantiles,
                                 split_conformal_order, split_conformal_threshold)

    rng = np.random.default_rng(seed)
    X, y = romano2019(2000, rng)
    Xt, yt = romano2019(5000, rng)
    model = CQRForest(n_estimators=trees, min_samples_leaf=40, max_features=1.0, quantiles=[0.05, 0.95],
                      tune=True, tune_range=0.05, tune_steps=5, coverage_factor=0.85, n_jobs=1)
    model.fit(X[:1000], y[:1000], ALPHA, rng)
    m, n = 50, 20
    scores = model.scores(X[1000:], y[1000:]).reshape(m, n)
    plan = plan_quantile_of_quantiles(m, n, ALPHA)
    thresholds = {
        "FedCP-QQ": quantile_of_quantiles([order_statistic(s, plan.ells[0]) for s in scores], plan.k),
        "centralized": split_conformal_threshold(scores.ravel(), ALPHA),
        "FedCP-Avg": average_of_quantiles([order_statistic(s, split_conformal_order(n, ALPHA)) for s in scores]),
    }
    base = model.base_predictions(Xt)
    results = {}
    for name, q in thresholds.items():
        lower, upper = cqr_interval(base, q)
        results[name] = (q,) + tuple(coverage_and_size(yt, lower, upper))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    order = np.argsort(Xt[:, 0])
    ax.scatter(Xt[order, 0], yt[order], s=2, color="0.6", label="test points")
    for (name, q), color, style, width in zip(thresholds.items(), ("tab:blue", "tab:orange", "tab:green"),
                                              ("-", "--", "-"), (2.6, 1.2, 1.2)):
        lower, upper = cqr_interval(base[order], q)
        ax.plot(Xt[order, 0], lower, color=color, ls=style, lw=width, label=f"{name}: coverage {results[name][1]:.3f}, "
                                                                  f"length {results[name][2]:.2f}")
        ax.plot(Xt[order, 0], upper, color=color, ls=style, lw=width)
    ax.set_ylim(-4, 9)
    ax.set_xlabel("X")
    ax.set_ylabel("Y")
    ax.set_title(f"figure 3: m = {m}, n = {n}, alpha = {ALPHA}, forest of {trees} trees")
    ax.legend(fontsize=7, loc="upper left")
    save(fig, out / "fig3.png")
    return results, plan


# ---------------------------------------------------------------- figures 4, 8-17 and B.2

def run_scenario(path: Path, out: Path, trials: int, sets: list[str], budget: "Budget | None" = None) -> float | None:
    """One scenario through run.py in-process; returns its wall time, or None when `budget` ran out
    before it finished. A finished run (out/done) is reused and keeps its first time; an unfinished
    one (scenario.yaml but no done: stopped at a budget, or killed) is continued with --resume, its
    finished trials kept, and its time so far (out/partial) added to the time it is given."""
    done = out / "done"
    if (out / "results.csv").exists() and done.exists():
        return float(done.read_text())
    command = [sys.executable, str(ROOT / "run.py"), "run", str(path), "--backend", "inprocess",
               "--trials", str(trials), "--out", str(out)]
    for s in sets:
        command += ["--set", s]
    if (out / "scenario.yaml").exists():
        command.append("--resume")
    before = float((out / "partial").read_text()) if (out / "partial").exists() else 0.0
    limit = None if budget is None else budget.left()
    if limit is not None and limit <= 0:
        return None
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        code = process.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)  # our own run.py and only it (its own session)
        process.wait()
        code = None
    seconds = time.perf_counter() - start
    if budget is not None:
        budget.spend(seconds)
    if code is None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "partial").write_text(f"{before + seconds:.1f}")
        print(f"  budget spent: {shown(out)} stopped after {seconds:.0f} s, resumable", flush=True)
        return None
    if code != 0:
        raise subprocess.CalledProcessError(code, command)
    done.write_text(f"{before + seconds:.1f}")
    return before + seconds


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


class Budget:
    """Wall seconds a partial full run may spend on runs (--budget-minutes)."""

    def __init__(self, minutes: float) -> None:
        self.total, self.spent = 60.0 * minutes, 0.0

    def left(self) -> float:
        return self.total - self.spent

    def spend(self, seconds: float) -> None:
        self.spent += seconds


# ---------------------------------------------------------------- which run stands for each row

#: a run directory's name: model, trials, trees (forest), epochs (network, when not its own 200)
RUN_NAME = re.compile(r"^(?P<model>[a-z_]+)-t(?P<t>\d+)(?:-trees(?P<trees>\d+))?(?:-epochs(?P<epochs>\d+))?$")
B2_NAME = re.compile(r"^t(?P<t>\d+)-trees(?P<trees>\d+)$")
PAPER_TRIALS, PAPER_TREES = 20, 1000


@dataclass(frozen=True)
class Size:
    """The size one run ran at; `paper` when it is the paper's (20 trials, 1,000 trees, the
    network's own 200 epochs)."""
    model: str
    trials: int
    trees: int | None = None
    epochs: int | None = None

    @property
    def paper(self) -> bool:
        return (self.trials >= PAPER_TRIALS and self.epochs is None
                and (self.model != "cqr_forest" or (self.trees or 0) >= PAPER_TREES))

    def name(self) -> str:
        return (f"{self.model}-t{self.trials}" + (f"-trees{self.trees}" if self.trees else "")
                + (f"-epochs{self.epochs}" if self.epochs else ""))

    def plain(self) -> str:
        parts = [f"{self.trials} trials"]
        if self.trees:
            parts.append(f"{self.trees:,} trees")
        if self.model == "cqr_net":
            parts.append(f"{self.epochs or 200} epochs")
        return ", ".join(parts)

    def label(self) -> str:
        return self.plain() + (" (the paper's size)" if self.paper else " (quick size)")

    def short_of_paper(self) -> str:
        """Why a row at this size is not at the paper's (empty when it is)."""
        if self.paper:
            return ""
        paper = Size(self.model, PAPER_TRIALS, PAPER_TREES if self.model == "cqr_forest" else None).plain()
        return f"quick size ({self.plain()}), not the paper's {paper}: not run at full size yet (time)"

    def rank(self):
        return (self.paper, self.trees or 0, -(self.epochs or 10**6) if self.epochs else 0, self.trials)


def finished(out: Path) -> bool:
    return (out / "results.csv").exists() and (out / "done").exists()


def best_finished(folder: Path, model: str, wanted: Size) -> tuple[Path, Size] | None:
    """The run that stands for a row: the wanted size when it finished, else the largest finished
    run of the same model in `folder` (the paper's size first, then more trees, then more trials)."""
    if finished(folder / wanted.name()):
        return folder / wanted.name(), wanted
    found = []
    for run in folder.glob(f"{model}-t*") if folder.exists() else ():
        match = RUN_NAME.match(run.name)
        if match and match["model"] == model and finished(run):
            size = Size(model, int(match["t"]), int(match["trees"]) if match["trees"] else None,
                        int(match["epochs"]) if match["epochs"] else None)
            found.append((size.rank(), run.name, run, size))
    if not found:
        return None
    _, _, run, size = max(found)
    return run, size


def estimate(folder: Path, wanted: Size) -> float:
    """Seconds the wanted run should take, from the finished runs in `folder` (their time per
    trial, scaled by trees when those differ), for running the cheapest first; 1e9 when nothing
    ran there yet."""
    best = None
    for run in folder.glob("*") if folder.exists() else ():
        match = RUN_NAME.match(run.name) or B2_NAME.match(run.name)
        if not (match and finished(run)) or match.groupdict().get("model", wanted.model) != wanted.model:
            continue
        per = float((run / "done").read_text()) / int(match["t"])
        trees = int(match["trees"] or 0)
        if wanted.trees and trees and trees != wanted.trees:
            per *= wanted.trees / trees
        epochs = match.groupdict().get("epochs")
        close = (trees == (wanted.trees or 0), (int(epochs) if epochs else None) == wanted.epochs, int(match["t"]))
        if best is None or close > best[0]:
            best = (close, per)
    return 1e9 if best is None else best[1] * wanted.trials


def per_trial(out: Path) -> dict[str, list[tuple[float, float]]]:
    """{method: [(coverage, size) per ok trial]} from a run's results.csv."""
    found: dict[str, list] = {}
    with open(out / "results.csv") as f:
        for r in csv.DictReader(f):
            if r["status"] == "ok" and r["coverage"] not in ("", "nan"):
                found.setdefault(r["method"], []).append((float(r["coverage"]), float(r["size"])))
    return found


def judge(trials: dict) -> tuple[bool, str, dict]:
    """The paper's claim for a figure of appendix B.1: FedCP-QQ covers at least about 0.9, its
    coverage and length are close to centralized, FedCP-Avg covers and costs more."""
    mean = {k: np.mean(np.array(v), axis=0) for k, v in trials.items()}
    qq, ce, av = mean["fedcp_qq"], mean["centralized"], mean["fedcp_avg"]
    length_gap = qq[1] / ce[1] - 1
    failed = [what for what, holds in (
        (f"QQ covers {qq[0]:.3f} < 0.885", qq[0] >= 0.885),
        (f"QQ and central coverage {abs(qq[0] - ce[0]):.3f} apart (> 0.02)", abs(qq[0] - ce[0]) <= 0.02),
        (f"QQ length {100 * length_gap:+.1f}% of central (beyond 10%)", abs(length_gap) <= 0.10),
        (f"Avg covers {av[0]:.3f}, below QQ's {qq[0]:.3f} - 0.005", av[0] >= qq[0] - 0.005),
        (f"Avg length {av[1]:.3g} below QQ's {qq[1]:.3g}", av[1] >= qq[1] * 0.99)) if not holds]
    text = (f"QQ {qq[0]:.3f} / {qq[1]:.3g}, central {ce[0]:.3f} / {ce[1]:.3g} "
            f"(QQ length {100 * length_gap:+.1f}%), Avg {av[0]:.3f} / {av[1]:.3g}")
    return not failed, text + " || " + "; ".join(failed), mean


def real_sizes(models, trials: int, trees: int, net_trials: int, forest_trials: int, net_epochs: dict):
    """[(fig, data, m, n, Size)]: every figure of appendix B.1 and model at the sizes asked for."""
    out = []
    for fig, data, m, n in REAL:
        for model in models:
            t = {"ridge": trials, "cqr_forest": forest_trials, "cqr_net": net_trials}[model]
            out.append((fig, data, m, n, Size(model, t, trees if model == "cqr_forest" else None,
                                              net_epochs.get(data) if model == "cqr_net" else None)))
    return out


def b2_size(trials: int, trees: int) -> Size:
    return Size("cqr_forest", trials, trees)


def b2_folder(data: str) -> Path:
    return RUNS / f"b2-{data}"


def b2_name(size: Size) -> str:
    return f"t{size.trials}-trees{size.trees}"


def b2_best(data: str, wanted: Size) -> tuple[Path, Size] | None:
    """Figure 18's stand-in run: the wanted size when finished, else the largest finished one."""
    folder = b2_folder(data)
    found = []
    for run in folder.glob("t*") if folder.exists() else ():
        match = B2_NAME.match(run.name)
        if match and finished(run):
            size = b2_size(int(match["t"]), int(match["trees"]))
            found.append((run.name == b2_name(wanted), size.rank(), run.name, run, size))
    return None if not found else max(found)[3:]


def jobs(real, b2_wanted: Size | None) -> list[tuple[str, Path, Path, Size, list[str]]]:
    """Every run asked for: (what, scenario, run directory, size, --set values)."""
    out = []
    for fig, data, m, n, size in real:
        out.append((f"figure {fig} {data} {size.model}", scenario_file(fig, data, m, n),
                    RUNS / f"fig{fig}-{data}" / size.name(), size,
                    [model_override(size.model, size.trees or 0, size.epochs)]))
    if b2_wanted:
        for data in ("bike", "bio"):
            out.append((f"figure 18 {data}", ROOT / "scenarios" / "paper000" / f"b2-{data}.yaml",
                        b2_folder(data) / b2_name(b2_wanted), b2_wanted,
                        [f"model.params.n_estimators={b2_wanted.trees}", "model.params.n_jobs=1"]))
    return out


def run_jobs(todo, budget: Budget | None) -> None:
    """Run what is not finished yet: in order without a budget; with one, the forest's figures,
    then the network's, then figure 18, each the cheapest first (by the finished runs' per-trial
    times), those expected to outlast the whole budget last; the one running when the budget is
    spent is stopped and left resumable."""
    pending = [job for job in todo if not finished(job[2])]
    if budget is not None:
        # the forest's figures first (their quick runs had the fewest trees), then the network's, then
        # B.2; a run expected to outlast the whole budget after all of them (bio's forest here)
        rank = {"cqr_forest": 0, "cqr_net": 1}
        pending.sort(key=lambda job: (estimate(job[2].parent, job[3]) > budget.left(),
                                      2 if job[0].startswith("figure 18") else rank.get(job[3].model, 0),
                                      estimate(job[2].parent, job[3])))
    for what, scenario, out, size, sets in pending:
        if budget is not None and budget.left() <= 0:
            print(f"  not run (budget spent): {what} at {size.label()}", flush=True)
            continue
        print(f"  {time.strftime('%H:%M:%S')} running {what} at {size.label()} -> {shown(out)}"
              + ("" if budget is None else f" ({budget.left() / 60:.0f} min of budget left)"), flush=True)
        seconds = run_scenario(scenario, out, size.trials, sets, budget)
        if seconds is not None:
            print(f"    done in {seconds:.0f} s ({seconds / size.trials:.1f} s a trial)", flush=True)


def real_data(real):
    """Each figure's row from the run that stands for it (best_finished), labelled with its size."""
    detail, summary, pooled, runs = [], [], {}, []
    for fig, data, m, n, wanted in real:
        found = best_finished(RUNS / f"fig{fig}-{data}", wanted.model, wanted)
        if found is None:
            summary.append((fig, data, m, n, wanted, None, False, "not run yet", None))
            continue
        out, size = found
        seconds = float((out / "done").read_text())
        trials_of = per_trial(out)
        ok, text, mean = judge(trials_of)
        side = "m >> n" if m > n else "m << n"
        for method in METHODS:
            pooled.setdefault((size.model, side, method), []).extend(trials_of.get(method, []))
            detail.append([f"figure {fig}", data, m, n, size.model, size.label(), len(trials_of.get(method, [])),
                           method, round(float(mean[method][0]), 4), round(float(mean[method][1]), 4)])
        cov = np.array([c for c, _ in trials_of["fedcp_qq"]])
        if not ok and cov.mean() < 0.9:  # say by how much, against the noise of the trials
            se = cov.std(ddof=1) / np.sqrt(len(cov))
            text += (f"; QQ coverage {0.9 - cov.mean():.3f} below 0.9 = {(0.9 - cov.mean()) / se:.1f} standard "
                     f"errors of its {len(cov)}-trial mean")
        summary.append((fig, data, m, n, wanted, size, ok, text, seconds))
        RUN_SECONDS[str(out.relative_to(ROOT))] = seconds
        runs.append([f"figure {fig}", data, size.model, size.trials, size.trees or "", size.epochs or
                     (200 if size.model == "cqr_net" else ""), "yes" if size.paper else "no", round(seconds, 1),
                     round(seconds / size.trials, 1)])
    return detail, summary, pooled, runs


def b2(wanted: Size):
    rows, timing, sizes, runs = [], {}, {}, []
    for data in ("bike", "bio"):
        found = b2_best(data, wanted)
        if found is None:
            continue
        out, size = found
        seconds = float((out / "done").read_text())
        trials_of = per_trial(out)
        timing[data], sizes[data] = seconds, size
        RUN_SECONDS[str(out.relative_to(ROOT))] = seconds
        runs.append(["figure 18", data, "cqr_forest", size.trials, size.trees, "", "yes" if size.paper else "no",
                     round(seconds, 1), round(seconds / size.trials, 1)])
        for method, values in trials_of.items():
            v = np.array(values)
            rows.append([data, method, size.label(), len(values), round(float(v[:, 0].mean()), 4),
                         round(float(v[:, 0].min()), 4), round(float(v[:, 1].mean()), 4)])
    return rows, timing, sizes, runs


# ---------------------------------------------------------------- the results file

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the forest and the network 3 trials, forests of 100 trees (and 1,000 where cheap)")
    parser.add_argument("--trials", type=int, help="trials per figure (20, as the paper; ridge also when quick)")
    parser.add_argument("--forest-trials", type=int, help="trials of the forest, also figure 18 (as --trials; quick 3)")
    parser.add_argument("--net-trials", type=int, help="trials of the network (as --trials; quick 3)")
    parser.add_argument("--trees", type=int, help="trees of the forest (1000; quick 100)")
    parser.add_argument("--net-epochs", default=None,
                        help="DATA=EPOCHS,... epochs of the CQR network per data set (default: the model's 200)")
    parser.add_argument("--check-trees", type=int, default=None,
                        help="also run the forest at this many trees on --check-data (quick: 1000)")
    parser.add_argument("--check-data", default="bike,community,star,concrete")
    parser.add_argument("--fig3-trees", type=int, default=1000, help="trees of figure 3's forest (1000, as the paper)")
    parser.add_argument("--models", default="ridge,cqr_forest,cqr_net")
    parser.add_argument("--parts", default="theory,fig3,real,b2")
    parser.add_argument("--results", type=Path, default=OUT)
    parser.add_argument("--budget-minutes", type=float, default=None,
                        help="a partial run: spend at most this long on the runs of figures 8-18 that are not "
                             "finished, the cheapest first (the one running at the end is stopped and resumed by the "
                             "next call); rows without a finished run at the asked size use the largest cached one, "
                             "labelled with its size")
    args = parser.parse_args(argv)
    trials = args.trials or 20
    forest_trials = args.forest_trials or (3 if args.quick else trials)
    net_trials = args.net_trials or (3 if args.quick else trials)
    trees = args.trees or (100 if args.quick else 1000)
    parts = set(args.parts.split(","))
    if args.check_trees is None and args.quick:
        args.check_trees = 1000
    if args.check_trees == trees:
        args.check_trees = None
    spec = args.net_epochs or ""
    net_epochs = {k: int(v) for k, v in (item.split("=") for item in spec.split(",") if item)}
    models = args.models.split(",")
    RUNS.mkdir(parents=True, exist_ok=True)
    quick_note = "" if not args.quick else (f" (quick run: ridge {trials} trials, forest {forest_trials} trials of "
                                            f"{trees} trees, network {net_trials} trials)")
    tables, summary, all_runs, size_note = [], [], [], ""
    spent = {}
    real = real_sizes(models, trials, trees, net_trials, forest_trials, net_epochs)
    b2_wanted = b2_size(forest_trials, trees)
    budget = None if args.budget_minutes is None else Budget(args.budget_minutes)
    if parts & {"real", "b2"}:
        run_jobs(jobs(real if "real" in parts else [], b2_wanted if "b2" in parts else None), budget)

    if "theory" in parts:
        start = time.perf_counter()
        fig1 = figure1()
        fig2 = figure2()
        fig67, matrices = figures6_7()
        a1 = proposition_a1()
        c3 = theorem_c3()
        plot_theory(fig1, matrices, fig2, RUNS)
        seconds = time.perf_counter() - start
        spent["theory"] = seconds
        below_one = all(r[4] <= r[6] for r in fig1)
        excess = max((r[4] - (1 - ALPHA)) * (r[0] * r[1] + 1) for r in fig1)
        summary.append(row("figure 1 (coverage against the two upper bounds)",
                           "M[l*,k*] close to the centralized bound 1-a+1/(mn+1), far below one agent's 1-a+1/(n+1); "
                           "conjecture: 1-a+O(1/(mn+1))",
                           f"M[l*,k*] <= one agent's bound at all 20 (m, n): {below_one}; "
                           f"max (M*-(1-a))(mn+1) = {excess:.2f}",
                           below_one and excess < 5, "", f"{CMD} (theory part)", seconds))
        tables.append({"name": "figure1", "title": "Figure 1: exact coverage of FedCP-QQ and the two bounds",
                       "columns": ["m", "n", "l*", "k*", "M[l*,k*]", "1-a+1/(mn+1)", "1-a+1/(n+1)"], "rows": fig1})
        feas = [r for r in fig2 if not isinstance(r[3], str)]
        shrinks = all(
            all(a[3] >= b[3] - 1e-9 for a, b in zip(sub, sub[1:]))
            for sub in ([r for r in feas if r[0] == al and r[1] == e] for al in (0.05, 0.1, 0.2) for e in (1.0, 5.0, 10.0)))
        nearest = min(feas, key=lambda r: r[3] - (1 - r[0]))
        closest = nearest[3] - (1 - nearest[0])
        summary.append(row("figure 2 (private correction M[l_g+l_cor, k_g], m = 10)",
                           "tends to 1-a as n and epsilon grow (correction vanishes)",
                           f"non-increasing in n at every (alpha, epsilon): {shrinks}; smallest excess over 1-a "
                           f"{closest:.4f} (alpha {nearest[0]}, epsilon {nearest[1]:g}, n = {nearest[2]}); infeasible cells {len(fig2) - len(feas)} of {len(fig2)}",
                           shrinks, "", f"{CMD} (theory part)", seconds))
        tables.append({"name": "figure2", "title": "Figure 2: degree of compensation of FedCP2-QQ (m = 10, B = 100)",
                       "columns": ["alpha", "epsilon", "n", "M[l_g+l_cor,k_g]", "gamma", "l_cor"], "rows": fig2})
        monotone = all(r[-1] for r in fig67)
        summary.append(row("figures 6 and 7 (the table M[l, k])",
                           "M non-decreasing in l and k; only a few (l, k) need computing",
                           f"(10,20): (l*,k*) = ({fig67[0][2]},{fig67[0][3]}), M* = {fig67[0][4]}; "
                           f"(5,10): ({fig67[1][2]},{fig67[1][3]}), M* = {fig67[1][4]}; monotone: {monotone}",
                           monotone, "", f"{CMD} (theory part)", seconds))
        tables.append({"name": "figures6-7", "title": "Figures 6 and 7: the coverage table M[l, k]",
                       "columns": ["m", "n", "l*", "k*", "M[l*,k*]", "M[1,1]", "M[n,m]", "cells >= 1-a", "monotone"],
                       "rows": fig67})
        summary.append(row("proposition A.1 (every site sends its maximum)", "closed form of M[n,k]",
                           f"closed form = eq. (5) to {a1:.1e}", a1 < 1e-12, "", f"{CMD} (theory part)", seconds))
        summary.append(row("theorem C.3 (Ehm's bounds on d_TV(PoisBin, Bin))",
                           "C[..][..] <= d_TV <= m/(m+1)[1-p^(m+1)-(1-p)^(m+1)][1-sum p(1-p)/(m p(1-p))], C unstated",
                           f"exact d_TV <= upper bound on 2,000 random p (max ratio {c3['max_ratio']:.6f}, equal at m = 2); "
                           f"smallest d_TV/factor {c3['min_constant']:.3f} (so C = 0.24 holds on these draws)",
                           c3["max_ratio"] <= 1 + 1e-9, "", f"{CMD} (theory part)", seconds))
        ex = c3["example"]
        tables.append({"name": "theorem-c3", "title": "Theorem C.3: the exact distance against Ehm's bounds",
                       "columns": ["case", "d_TV exact", "upper bound", "lower factor (times C)"],
                       "rows": [["m = 10, p_j = 0.80, 0.82, ..., 1.00", round(ex[0], 6), round(ex[1], 6), round(ex[2], 6)],
                                ["2,000 random p (m 2-100): max d_TV / upper", round(c3["max_ratio"], 6), "", ""],
                                ["2,000 random p: median d_TV / upper", round(c3["median_ratio"], 4), "", ""],
                                ["2,000 random p: min d_TV / factor (largest C)", round(c3["min_constant"], 4), "", ""]]})

    if "fig3" in parts:
        start = time.perf_counter()
        results, plan = figure3(args.fig3_trees, 0, RUNS)
        seconds = time.perf_counter() - start
        spent["fig3"] = seconds
        qq, ce, av = results["FedCP-QQ"], results["centralized"], results["FedCP-Avg"]
        ok = abs(qq[2] / ce[2] - 1) < 0.1 and av[2] > qq[2] and qq[1] >= 0.88
        (ROOT / "bench" / "results").mkdir(exist_ok=True)
        (ROOT / "bench" / "results" / "paper000_fig3.png").write_bytes((RUNS / "fig3.png").read_bytes())
        summary.append(row("figure 3 (intervals on synthetic data, m = 50, n = 20)",
                           "FedCP-QQ almost identical to centralized; FedCP-Avg larger (outliers)",
                           f"length QQ {qq[2]:.3f}, central {ce[2]:.3f}, Avg {av[2]:.3f}; coverage "
                           f"{qq[1]:.3f} / {ce[1]:.3f} / {av[1]:.3f} (bench/results/paper000_fig3.png)",
                           ok, "" if ok else "see the figure3 table", f"{CMD} (fig3 part)", seconds))
        tables.append({"name": "figure3", "title": f"Figure 3: one draw, forest of {args.fig3_trees} trees, (l*, k*) = "
                                                   f"({plan.ells[0]}, {plan.k})",
                       "columns": ["method", "threshold", "test coverage", "mean length"],
                       "rows": [[k, round(v[0], 4), round(v[1], 4), round(v[2], 4)] for k, v in results.items()]})

    if "real" in parts:
        detail, figs, pooled, runs = real_data(real)
        for fig, data, m, n, wanted, size, ok, text, seconds in figs:
            if size is None:
                print(f"figure {fig} {data} {wanted.model}: no finished run, no row", flush=True)
                continue
            why = "" if ok else f"fails: {text.split(' || ')[1]}"
            text = text.split(" || ")[0]
            if not ok and size.trials < PAPER_TRIALS:
                why += f" (from {size.trials} trials only: theorem 3.2 holds on average over calibration draws)"
            if not size.paper:
                why = (why + "; " if why else "") + size.short_of_paper()
            summary.append(row(f"figure {fig} ({data}, m={m}, n={n}), {size.model}",
                               "QQ covers >= 0.9, coverage and length close to centralized; Avg higher on both",
                               text + f" [{size.label()}]", ok, why, f"{CMD} (real part)", seconds))
        mixed = {r[6] for r in runs}
        at_paper = sum(r[6] == "yes" for r in runs)
        size_note = quick_note or ("" if mixed == {"yes"} else
                                   f" (sizes per row: {at_paper} of {len(runs)} runs of figures 8-17 at the paper's size, the rest quick)")
        tables.append({"name": "figures8-17", "title": "Figures 8-17: mean coverage and length per data set, model and method"
                       + size_note, "columns": ["figure", "data", "m", "n", "model", "size", "trials", "method",
                                                "coverage", "length"], "rows": detail})
        fig4 = []
        for model in models:
            for side in ("m >> n", "m << n"):
                for method in METHODS:
                    v = np.array(pooled.get((model, side, method), []))
                    if len(v):
                        fig4.append([model, side, method, len(v), round(float(v[:, 0].mean()), 4),
                                     round(float(v[:, 0].std()), 4)])
        tables.append({"name": "figure4", "title": "Figure 4: coverage pooled over the five data sets"
                       + (size_note and " (each figure's run at its size in the figures8-17 table)"),
                       "columns": ["model", "regime", "method", "points", "mean coverage", "sd"], "rows": fig4})
        for model in models:
            mean = {(r[1], r[2]): r[4] for r in fig4 if r[0] == model}
            sd = {(r[1], r[2]): r[5] for r in fig4 if r[0] == model}
            model_runs = [r for r in runs if r[2] == model]
            full = sum(r[6] == "yes" for r in model_runs)
            ok = all(mean[(s, "fedcp_qq")] >= 0.895 and mean[(s, "fedcp_avg")] > mean[(s, "fedcp_qq")]
                     and abs(mean[(s, "fedcp_qq")] - mean[(s, "centralized")]) <= 0.01 for s in ("m >> n", "m << n"))
            why = "" if ok else "see the figure4 table"
            if full < len(model_runs):
                why = (why + "; " if why else "") + (f"pooled over {full} of {len(model_runs)} figures at the paper's "
                                                    "size, the rest at quick sizes (runs table)")
            summary.append(row(f"figure 4 ({model}), coverage pooled over data sets",
                               "QQ mean >= 0.90 and close to centralized (sd slightly larger), same for m>>n and m<<n; "
                               "Avg higher",
                               "; ".join(f"{s}: QQ {mean[(s, 'fedcp_qq')]:.3f} (sd {sd[(s, 'fedcp_qq')]:.3f}), central "
                                         f"{mean[(s, 'centralized')]:.3f} (sd {sd[(s, 'centralized')]:.3f}), Avg "
                                         f"{mean[(s, 'fedcp_avg')]:.3f}" for s in ("m >> n", "m << n"))
                               + f" [{full} of {len(model_runs)} figures at the paper's size]",
                               ok, why, f"{CMD} (real part)", "the runs of figures 8-17"))
        all_runs.extend(runs)

    if "real" in parts and args.check_trees and "cqr_forest" in models:
        # the forest at the paper's tree count on the data sets where it is affordable here
        check_data = args.check_data.split(",")
        rows, oks, total = [], [], 0.0
        for fig, data, m, n in REAL:
            if data not in check_data:
                continue
            out = RUNS / f"fig{fig}-{data}" / f"cqr_forest-t{forest_trials}-trees{args.check_trees}"
            seconds = run_scenario(scenario_file(fig, data, m, n), out, forest_trials,
                                   [model_override("cqr_forest", args.check_trees)])
            RUN_SECONDS[str(out.relative_to(ROOT))] = seconds
            total += seconds
            ok, text, mean = judge(per_trial(out))
            text = text.split(" || ")[0]
            oks.append(ok)
            rows.append([f"figure {fig}", data, m, n, args.check_trees, forest_trials, text, round(seconds, 1)])
        tables.append({"name": "forest-trees", "title": f"The forest at {args.check_trees} trees ({forest_trials} trials)",
                       "columns": ["figure", "data", "m", "n", "trees", "trials", "coverage / length", "seconds"],
                       "rows": rows})
        summary.append(row(f"figures {', '.join(r[0].split()[1] for r in rows)}, forest at the paper's {args.check_trees} trees",
                           "as figures 8-17", f"{sum(oks)} of {len(oks)} figures pass the same test as at {trees} trees "
                           "(forest-trees table)", all(oks), "" if all(oks) else "see the forest-trees table",
                           f"{CMD} (real part, --check-trees)", total))

    if "b2" in parts:
        rows, timing, sizes, runs = b2(b2_wanted)
        all_runs.extend(runs)
        tables.append({"name": "figure18", "title": "Figure 18 (appendix B.2): FedCP2-QQ, m = 5, n = 200, B = 100"
                       + quick_note, "columns": ["data", "method", "size", "trials", "mean coverage", "min coverage",
                                                 "length"], "rows": rows})
        for data in ("bike", "bio"):
            if data not in sizes:
                continue
            cov = {r[1]: r[4] for r in rows if r[0] == data}
            ladder = [cov.get(k) for k in ("fedcp_qq", "fedcp2_eps10", "fedcp2_eps5", "fedcp2_eps1")]
            ok = all(c is not None and c >= 0.89 for c in ladder) and ladder[3] >= ladder[0]
            why = "" if ok else "see the figure18 table"
            if not sizes[data].paper:
                why = (why + "; " if why else "") + sizes[data].short_of_paper()
            summary.append(row(f"figure 18 ({data}), FedCP2-QQ at epsilon 10, 5, 1",
                               "mean coverage >= 0.90 at every epsilon, more conservative as epsilon falls",
                               "mean coverage QQ / eps10 / eps5 / eps1: " + " / ".join(
                                   "-" if c is None else f"{c:.3f}" for c in ladder) + f" [{sizes[data].label()}]",
                               ok, why, f"{CMD} (b2 part)", timing[data]))

    if all_runs:
        tables.append({"name": "runs", "title": "The runs behind figures 8-18: size and measured time here "
                       "(one process, one thread; a reused run keeps its first time)",
                       "columns": ["figure", "data", "model", "trials", "trees", "epochs", "the paper's size",
                                   "seconds", "seconds a trial"], "rows": all_runs})

    summary.append(["figure 5 (unbalanced sites)", "coverage respected with unequal n_j (sizes not given)",
                    "scenarios/unbalanced-fig5.yaml (paper 004's ten sizes)", "impossible offline",
                    "the paper does not list its site sizes; stand-in: `python run.py run scenarios/unbalanced-fig5.yaml`",
                    "python run.py run scenarios/unbalanced-fig5.yaml --backend inprocess", "not run by this command"])
    results = {"paper": "000", "title": "One-shot federated conformal prediction (Humbert, Le Bars, Bellet, Arlot, ICML 2023)",
               "command": CMD, "quick": f"{CMD} ARGS=--quick",
               "settings": {"quick": args.quick, "budget_minutes": args.budget_minutes, "trials": trials, "forest_trials": forest_trials,
                            "net_trials": net_trials, "trees": trees, "net_epochs": net_epochs,
                            "fig3_trees": args.fig3_trees, "models": models, "parts": sorted(parts)},
               "seconds": {**{k: round(v, 1) for k, v in spent.items()}, "runs": RUN_SECONDS,
                           "total": round(sum(spent.values()) + sum(RUN_SECONDS.values()), 1)},
               "tables": [{"name": "summary", "title": "Summary: the paper's figures against ours"
                           + (quick_note or (size_note if "real" in parts else "")),
                           "columns": SUMMARY, "rows": summary}] + tables}
    from paper_pages import publish  # bench/ is on the path when this file runs

    publish("000", results, args.results)


if __name__ == "__main__":
    main()
