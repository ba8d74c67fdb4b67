"""Paper 001 figure 3 (section 5, appendix B.3): FedAvg, Δ-FL, DP-FedAvg and DP-Δ-FL (flat and
hierarchical loss histograms) on the label-shift task, the per-client test error's mean and 90th
percentile against epsilon for (epsilon, 1/n)-DP, n = 2,500 training clients.

The fast in-process path. The world is scenarios/paper001/fig3.yaml's (world.trial.build_trial:
the same sites, rows and held-out clients as a live run of that scenario); it is built once per
trial and every client's rows are stacked, so that a round computes all the sampled clients at
once through the very functions the live halves call: protocol.methods.tail_rounds.site_step (the
clients' loss or loss bin and their local update, clipped under privacy) on the stacked sampled
clients, then protocol.methods.tail_rounds.server_step (the coordinator's tail selection and noisy
aggregation), with the mechanism from the method object's own `.mechanism(population)`
(sigma_for_epsilon). The coordinator's Generator is the live one, coordinator_rng(site_rng(seed,
trial, session, COORDINATOR_ID), seeded=True), session = method_session(trial, the method's index
in the scenario), and it is drawn in TailCoordinator's order: each round rng.choice(training
sites, m, replace=False), sorted, then server_step's histogram noise, then its update noise. So
a run here equals the live runtime's (`run.py run scenarios/paper001/fig3.yaml` with
`sites.policy.noise: seeded`) to the last bits of the float arithmetic: tests/test_paper001_fig3.py
checks it on the small scenario, and --live checks one full-scale configuration.

Seeded noise is not private (protocol.noise): here it only makes a simulation replayable; the
mechanism's noise scales are the private run's.

Tuning (appendix B.3): the hyperparameters of each private method at each epsilon minimise the
90th percentile error of the 500 validation clients over the paper's grids (DP-Δ-FL: quantile
ratio r x loss bound B x bins b x clip C = 240 configurations per histogram; DP-FedAvg: C), one run
(trial 0) per configuration at --tune-rounds rounds (1,000 by default: the paper's). Then --runs
runs (trials 0 ..) of each tuned configuration and of FedAvg and Δ-FL at the full --rounds, their
test clients' errors reported (mean and sd over runs).

    python bench/paper001_fig3.py [--quick] [--jobs 2] [--runs 5] [--epsilons 3 5 10 15 20]
        [--tune-rounds 1000] [--grid descent|paper|coarse] [--results bench/results/paper001_fig3.json]
        [--figure bench/results/paper001_fig3.png]
    python bench/paper001_fig3.py --live [--live-epsilon 5] [--backend inprocess|processes]
        runs the tuned DP-Δ-FL (flat) at one epsilon through the live runtime (run_study over
        fig3.yaml, noise seeded) and compares its errors with the fast path's
        (bench/results/paper001_fig3_live.json).

`make paper001-fig3` runs the default; --quick a few-minute version (coarse grid, 200 tuning
rounds, 2 runs, epsilons 5 and 20).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's notes on orders it drops
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from learning.tail_fl import error_summary, initial_weights, misclassification, with_intercept  # noqa: E402
from protocol.methods import METHODS  # noqa: E402
from protocol.methods.tail_rounds import sample_round, server_step, site_step  # noqa: E402
from protocol.rounds_privacy import combined_epsilon, site_account_epsilon  # noqa: E402,F401
from protocol.noise import coordinator_rng  # noqa: E402
from protocol.sessions import method_session  # noqa: E402
import stats.ddg  # noqa: E402,F401  (imported by learning.tail_fl inside its functions: loaded before a run)
from scenarios.scenario import method_params, validate_scenario  # noqa: E402
from specs.schema import read_yaml  # noqa: E402
from stats.randomness import site_rng  # noqa: E402
from transport.channel import COORDINATOR_ID  # noqa: E402
from world.trial import WorldSpec, build_trial  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios/paper001/fig3.yaml"
RESULTS = ROOT / "bench/results/paper001_fig3.json"
FIGURE = ROOT / "bench/results/paper001_fig3.png"
EPSILONS = (3.0, 5.0, 10.0, 15.0, 20.0)
#: the paper's grids (appendix B.3)
GRIDS = {
    "paper": {"quantile_ratio": (0.1, 0.25, 0.5, 0.75), "loss_bound": (0.7, 0.9, 1.1, 1.3, 1.5),
              "bins": (16, 32, 64), "clip": (0.9, 1.1, 1.3, 1.5)},
    "coarse": {"quantile_ratio": (0.1, 0.5), "loss_bound": (0.9, 1.3), "bins": (16, 64), "clip": (0.9, 1.3)},
}
#: the methods of figure 3 by their label in fig3.yaml
LABELS = ("fedavg", "delta_fl", "dp_fedavg", "dp_delta_fl_flat", "dp_delta_fl_hier")
PRIVATE = ("dp_fedavg", "dp_delta_fl_flat", "dp_delta_fl_hier")
#: what section 5's text says of figure 3 (percentage points)
PAPER = {
    "p90_gap_dp_fedavg_minus_dp_delta_fl_at_5": 4.3,
    "dp_delta_fl_p90_within_of_delta_fl_at_5": 1.0,
    "dp_delta_fl_p90_below_fedavg": True,
    "mean_gap_dp_delta_fl_vs_dp_fedavg": (0.2, 0.4),
    "mean_gap_nonprivate": 0.24,
}


# -- the world -------------------------------------------------------------------------------

def load_scenario(path: Path | str = SCENARIO, overrides: dict | None = None) -> dict:
    """The scenario's raw mapping (methods unvalidated), with dotted overrides applied."""
    raw = read_yaml(path)
    for key, value in (overrides or {}).items():
        node = raw
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return raw


def world_spec(raw: dict) -> tuple[WorldSpec, dict]:
    """The world of a scenario and its validated mapping without its methods (the world does not
    depend on them; validating a private method needs its accounting, which the fast path calls
    itself through the method objects)."""
    plain = copy.deepcopy(raw)
    plain["methods"] = [m for m in raw["methods"] if m["name"] == "delta_fl"][:1] or [
        {"name": "delta_fl", "classes": 2}]
    scenario = validate_scenario(plain)
    return WorldSpec.of(scenario), scenario


def methods_of(raw: dict, alpha: float) -> dict[str, tuple[int, object]]:
    """label -> (index in the scenario, the method object) for the scenario's methods."""
    out = {}
    for index, entry in enumerate(raw["methods"]):
        label = entry.get("label", entry["name"])
        out[label] = (index, METHODS[entry["name"]](alpha, **method_params(entry)))
    return out


@dataclass
class FastWorld:
    """One trial's world as stacked arrays, sites in site order (the coordinator's sorted order)."""

    seed: int
    trial: int
    sites: list[str]
    X1: np.ndarray  # (sites, n, d + 1) features with the intercept column
    y: np.ndarray  # (sites, n) integer labels

    @classmethod
    def build(cls, spec: WorldSpec, trial: int) -> "FastWorld":
        world = build_trial(spec, trial)
        sites = sorted(world.shards)
        rows = world.site_scores  # the rows each site serves (models.examples: features then label)
        sizes = {len(rows[s]) for s in sites}
        if len(sizes) != 1:
            raise ValueError(f"the fast path stacks sites of one size; this world has sizes {sorted(sizes)[:5]}")
        stacked = np.stack([np.asarray(rows[s], dtype=float) for s in sites])
        labels = stacked[:, :, -1]
        return cls(spec.seed, trial, sites, with_intercept(stacked[:, :, :-1]), labels.astype(np.int64))

    def roles(self, held_out: int, validation: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(training, validation, test) site indices as TailCoordinator splits them: the last
        `held_out` sites are held out, the first `validation` of them validation clients."""
        count = len(self.sites)
        training = np.arange(count - held_out)
        held = np.arange(count - held_out, count)
        return training, held[:validation], held[validation:]


# -- one run ---------------------------------------------------------------------------------

def run_fast(world: FastWorld, method, index: int, rounds: int | None = None, seeded: bool = True) -> dict:
    """One session of `method` (scenario index `index`) on `world`, as the live runtime runs it
    (TailCoordinator's draws: sample_round, then site_step and server_step), every sampled client
    at once. rounds: fewer than the method's (tuning), or None. Returns the test and validation
    clients' error summaries and, for a private method, its mechanism and privacy figures (as
    TailCoordinator._privacy_report computes them, no site lost)."""
    start = time.perf_counter()
    p = method.params
    rounds = p["rounds"] if rounds is None else rounds
    session = method_session(world.trial, index)
    rng = coordinator_rng(site_rng(world.seed, world.trial, session, COORDINATOR_ID), seeded)
    training, validation, test = world.roles(p["held_out"], p["validation"])
    n = len(training)
    features = world.X1.shape[-1] - 1
    W = initial_weights(features, p["classes"])
    mechanism = method.mechanism(n, features) if method.private else method.mechanism(n)
    if mechanism is not None and "sigma_update" not in mechanism:
        raise ValueError(f"{method.name}: the fast path runs the trusted curator's central noise (noise: central), "
                         f"not noise: {method.params.get('noise')}")
    m = min(p["clients_per_round"], n)
    ids = [world.sites[i] for i in training]
    place = {site: i for i, site in enumerate(ids)}
    participation = np.zeros(n, dtype=np.int64)
    tails, sampled = [], []
    for _ in range(rounds):
        chosen = np.array([place[site] for site in sample_round(ids, m, p.get("sampling", "without_replacement"), rng)],
                          dtype=np.int64)
        participation[chosen] += 1
        sampled.append(len(chosen))
        if not len(chosen):
            continue
        sites = training[chosen]
        numbers, updates = site_step(W, world.X1[sites], world.y[sites], p["lr"], p["local_steps"],
                                     p["weight_decay"], mechanism)
        step, info = server_step(mechanism, method.tail, numbers, updates, rng)
        W = W + step
        tails.append(info["tail"])
    out = {"trial": world.trial, "rounds": rounds, "sampling": p.get("sampling", "without_replacement"),
           "test": error_summary(misclassification(W, world.X1[test], world.y[test])),
           "validation": (error_summary(misclassification(W, world.X1[validation], world.y[validation]))
                          if len(validation) else None),
           "tail_mean": float(np.mean(tails)), "sampled_mean": float(np.mean(sampled)),
           "weights_norm": float(np.linalg.norm(W))}
    if mechanism is not None:
        delta = method.target_delta(mechanism["population"])
        rho = method.round_cost(mechanism)
        most = int(participation.max())
        out.update({"mechanism": mechanism, "delta": delta, "rho_round": rho,
                    "epsilon_central": combined_epsilon(0.0, [(rho, rounds, mechanism["sampling"], m, n)], delta),
                    "epsilon_site_max": site_account_epsilon(rho, most, delta) if most else 0.0,
                    "participations_max": most})
    out["seconds"] = time.perf_counter() - start
    return out


# -- the study -------------------------------------------------------------------------------

_WORLDS: dict[int, FastWorld] = {}
_CONTEXT: dict = {}


def _task(task: tuple) -> tuple:
    """One run in a worker: (key, trial, label, params, rounds) -> (key, result)."""
    key, trial, label, params, rounds = task
    index, base = _CONTEXT["methods"][label]
    extra = {"sampling": "poisson"} if _CONTEXT["accounting"] == "poisson" and base.private else {}
    method = METHODS[base.name](_CONTEXT["alpha"], **{**base.params, **params, **extra})
    return key, run_fast(_WORLDS[trial], method, index, rounds)


def run_tasks(tasks: list[tuple], jobs: int, progress: str = "") -> dict:
    """Run tasks over `jobs` forked workers (the worlds are inherited); key -> result."""
    results, started = {}, time.perf_counter()
    if jobs <= 1:
        iterator = map(_task, tasks)
        pool = None
    else:
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(jobs)
        iterator = pool.imap_unordered(_task, tasks, chunksize=1)
    try:
        for done, (key, result) in enumerate(iterator, 1):
            results[key] = result
            if progress and (done % max(1, len(tasks) // 20) == 0 or done == len(tasks)):
                print(f"  {progress}: {done}/{len(tasks)} runs, {time.perf_counter() - started:.0f} s", flush=True)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return results


def grid_configs(label: str, grid: dict) -> list[dict]:
    if label == "dp_fedavg":
        return [{"clip": c} for c in grid["clip"]]
    names = ("quantile_ratio", "loss_bound", "bins", "clip")
    return [dict(zip(names, values)) for values in itertools.product(*(grid[k] for k in names))]


CENTRE = {"quantile_ratio": 0.25, "loss_bound": 1.1, "bins": 32, "clip": 1.1}
#: the coordinates of the descent, in order
COORDINATES = ("clip", "loss_bound", "quantile_ratio", "bins")


def _score(result: dict) -> tuple[float, float]:
    """What tuning minimises: the validation clients' 90th percentile error (appendix B.3), ties
    (the per-client errors move in steps of 1/100) broken by their mean error."""
    return result["validation"]["p90_error"], result["validation"]["mean_error"]


def tune(args) -> tuple[dict, dict, int]:
    """The tuned hyperparameters of each private method at each epsilon, on trial 0's validation
    clients, one run per configuration at --tune-rounds rounds.

    --grid paper / coarse: every configuration of the grid. --grid descent (the default: the
    paper's 240 configurations per histogram and epsilon take 9 s each here, 5 hours on two
    cores): the paper's grid one coordinate at a time from the centre (C, then B, then r, then
    b), each time every value of that coordinate with the others at their best so far, so every
    value of the paper's grid is tried but not every combination (13 runs per DP-Δ-FL chain, 4
    for DP-FedAvg). Returns ({label@eps: every configuration tried with its scores}, {label@eps:
    the chosen configuration}, how many runs)."""
    grid = GRIDS["paper" if args.grid == "descent" else args.grid]
    chains = [(label, eps) for label in PRIVATE for eps in args.epsilons]
    tried: dict[tuple, dict[tuple, dict]] = {chain: {} for chain in chains}

    def key_of(config: dict) -> tuple:
        return tuple(sorted(config.items()))

    def evaluate(wanted: dict[tuple, list[dict]], stage: str) -> None:
        tasks = []
        for chain, configs in wanted.items():
            for config in configs:
                if key_of(config) not in tried[chain]:
                    tasks.append(((chain, key_of(config)), 0, chain[0], {**config, "epsilon": chain[1]},
                                  args.tune_rounds))
        for (chain, key), result in run_tasks(tasks, args.jobs, f"tuning {stage}").items():
            tried[chain][key] = result
        return len(tasks)

    count = 0
    if args.grid != "descent":
        count += evaluate({chain: grid_configs(chain[0], grid) for chain in chains}, "grid")
        best = {chain: dict(min(tried[chain], key=lambda k: _score(tried[chain][k]))) for chain in chains}
    else:
        best = {chain: ({"clip": CENTRE["clip"]} if chain[0] == "dp_fedavg" else dict(CENTRE)) for chain in chains}
        for coordinate in COORDINATES:
            wanted = {chain: [{**best[chain], coordinate: value} for value in grid[coordinate]]
                      for chain in chains if coordinate in best[chain]}
            count += evaluate(wanted, coordinate)
            for chain, configs in wanted.items():
                best[chain] = min(configs, key=lambda c: _score(tried[chain][key_of(c)]))
    tuning = {f"{label}@{eps:g}": [{**dict(key), "validation_p90": r["validation"]["p90_error"],
                                    "validation_mean": r["validation"]["mean_error"], "seconds": r["seconds"]}
                                   for key, r in tried[(label, eps)].items()]
              for label, eps in chains}
    return tuning, {f"{label}@{eps:g}": best[(label, eps)] for label, eps in chains}, count


def retune(args, chosen: dict) -> tuple[dict, int]:
    """--retune COORDINATE=v1,v2,...: one more descent stage from the chosen configurations (of
    --tuned-from or of tune), over values outside the paper's grid; `chosen` is updated in place.
    Returns (every configuration tried with its scores, how many runs)."""
    coordinate, values = args.retune.split("=")
    values = [type(CENTRE[coordinate])(float(v)) for v in values.split(",")]
    tasks, configs = [], {}
    for key, config in chosen.items():
        if coordinate not in config:
            continue
        label, eps = key.split("@")
        configs[key] = [{**config, coordinate: v} for v in dict.fromkeys([config[coordinate], *values])]
        for c, candidate in enumerate(configs[key]):
            tasks.append(((key, c), 0, label, {**candidate, "epsilon": float(eps)}, args.tune_rounds))
    results = run_tasks(tasks, args.jobs, f"retuning {coordinate}")
    tried = {}
    for key, candidates in configs.items():
        scored = [(_score(results[(key, c)]), c) for c in range(len(candidates))]
        chosen[key] = candidates[min(scored)[1]]
        tried[key] = [{**candidates[c], "validation_p90": sc[0], "validation_mean": sc[1]} for sc, c in scored]
    return tried, len(tasks)


def summarise(runs: list[dict]) -> dict:
    p90 = np.array([r["test"]["p90_error"] for r in runs]) * 100
    mean = np.array([r["test"]["mean_error"] for r in runs]) * 100
    sd = (lambda a: float(a.std(ddof=1)) if len(a) > 1 else 0.0)
    return {"p90_pct": float(p90.mean()), "p90_sd": sd(p90), "mean_pct": float(mean.mean()), "mean_sd": sd(mean),
            "runs": len(runs)}


def study(args) -> dict:
    raw = load_scenario(args.scenario)
    spec, scenario = world_spec(raw)
    methods = methods_of(raw, scenario["alpha"])
    missing = [label for label in LABELS if label not in methods]
    if missing:
        raise SystemExit(f"{args.scenario} lacks the methods {missing}")
    _CONTEXT.update({"methods": methods, "alpha": scenario["alpha"], "accounting": args.accounting})
    timings = {}
    started = time.perf_counter()
    for trial in range(args.runs):
        _WORLDS[trial] = FastWorld.build(spec, trial)
    timings["build_worlds_s"] = time.perf_counter() - started
    print(f"{args.runs} worlds ({len(_WORLDS[0].sites)} sites) in {timings['build_worlds_s']:.1f} s", flush=True)
    started = time.perf_counter()
    if args.tuned_from:
        previous = json.loads(Path(args.tuned_from).read_text())["summary"]
        tuning, count = {"tuned_from": args.tuned_from}, 0
        chosen = {f"{label}@{eps:g}": previous[f"{label}@{eps:g}"]["tuned"] for label in PRIVATE
                  for eps in args.epsilons}
    else:
        tuning, chosen, count = tune(args)
    if args.retune:
        extra, more = retune(args, chosen)
        tuning = {"before": tuning, "retune": extra}
        count += more
    timings["tuning_s"] = time.perf_counter() - started
    timings["tuning_runs"] = count
    tasks = []
    for trial in range(args.runs):
        for label in ("fedavg", "delta_fl"):
            tasks.append(((label, None, trial), trial, label, {}, args.rounds))
        for label in PRIVATE:
            for eps in args.epsilons:
                tasks.append(((label, eps, trial), trial, label, {**chosen[f"{label}@{eps:g}"], "epsilon": eps},
                              args.rounds))
    started = time.perf_counter()
    final = run_tasks(tasks, args.jobs, "final runs")
    timings["final_s"] = time.perf_counter() - started
    timings["final_runs"] = len(tasks)
    seconds = [r["seconds"] for r in final.values() if r["rounds"] == 1000]
    if seconds:
        timings["seconds_per_1000_round_run"] = float(np.median(seconds))
    runs, summary = {}, {}
    for (label, eps, trial), result in sorted(final.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])):
        key = label if eps is None else f"{label}@{eps:g}"
        runs.setdefault(key, []).append(result)
    for key, results in runs.items():
        summary[key] = summarise(results)
        private = [r for r in results if "mechanism" in r]
        if private:
            r0 = private[0]
            summary[key].update({"sigma_update": r0["mechanism"]["sigma_update"],
                                 "sigma_histogram": r0["mechanism"]["sigma_histogram"],
                                 "rho_round": r0["rho_round"], "epsilon_central": r0["epsilon_central"],
                                 "epsilon_site_max": max(r["epsilon_site_max"] for r in private),
                                 "delta": r0["delta"], "tuned": chosen[key]})
            summary[key]["sampling"] = r0["mechanism"]["sampling"]
    return {"setting": {"scenario": str(Path(args.scenario).resolve().relative_to(ROOT)),
                        "sites": len(_WORLDS[0].sites), "training": int(len(_WORLDS[0].roles(
                            methods["fedavg"][1].params["held_out"], methods["fedavg"][1].params["validation"])[0])),
                        "rounds": args.rounds, "tune_rounds": args.tune_rounds, "runs": args.runs,
                        "tune_runs": 1, "grid": args.grid,
                        "grid_values": GRIDS["paper" if args.grid == "descent" else args.grid], "epsilons": list(args.epsilons),
                        "tail": methods["delta_fl"][1].tail, "noise": "seeded (replayable simulation)",
                        "quick": bool(args.quick), "accounting": args.accounting,
                        "tuned_from": args.tuned_from, "retune": args.retune},
            "timings": timings, "summary": summary, "tuning": tuning, "runs": runs,
            "claims": claims(summary, args.epsilons), "paper": PAPER}


def claims(summary: dict, epsilons) -> dict:
    """Section 5's statements, checked on our numbers (percentage points)."""
    out = {}
    fedavg, delta = summary["fedavg"], summary["delta_fl"]
    out["mean_gap_nonprivate"] = delta["mean_pct"] - fedavg["mean_pct"]
    out["p90_gap_nonprivate"] = fedavg["p90_pct"] - delta["p90_pct"]
    for eps in epsilons:
        dpf = summary[f"dp_fedavg@{eps:g}"]
        for hist in ("flat", "hier"):
            dpd = summary[f"dp_delta_fl_{hist}@{eps:g}"]
            out[f"{hist}@{eps:g}"] = {
                "p90_gap_dp_fedavg_minus_dp_delta_fl": dpf["p90_pct"] - dpd["p90_pct"],
                "dp_delta_fl_p90_minus_delta_fl": dpd["p90_pct"] - delta["p90_pct"],
                "dp_delta_fl_p90_below_fedavg": dpd["p90_pct"] < fedavg["p90_pct"],
                "mean_gap_dp_delta_fl_minus_dp_fedavg": dpd["mean_pct"] - dpf["mean_pct"]}
        flat, hier = summary[f"dp_delta_fl_flat@{eps:g}"], summary[f"dp_delta_fl_hier@{eps:g}"]
        out[f"flat_vs_hier@{eps:g}"] = {"p90_diff": flat["p90_pct"] - hier["p90_pct"],
                                         "within_one_sd": abs(flat["p90_pct"] - hier["p90_pct"])
                                         <= max(flat["p90_sd"], hier["p90_sd"])}
    return out


def docs_table(result: dict) -> str:
    """docs/private-training.md's tables of figure 3 (tests/test_paper001_fig3.py keeps the docs
    equal to the committed JSON): per epsilon and method the test clients' 90th percentile and
    mean error (mean ± sd over runs, percent), the tuned hyperparameters and the mechanism; then
    section 5's claims beside ours."""
    summary, setting = result["summary"], result["setting"]
    variant = ""
    if setting.get("accounting") == "poisson":
        variant += "; the private methods with sampling: poisson (the counterfactual)"
    if setting.get("retune"):
        variant += f"; {setting['retune'].split('=')[0]} retuned over {setting['retune'].split('=')[1]} too"
    lines = [f"Test clients' errors in percent, mean ± sd over {setting['runs']} runs "
             f"({setting['sites']} sites, {setting['training']} training, {setting['rounds']} rounds{variant}):", "",
             "| epsilon | method | p90 error | mean error | C | B | b | r | sigma (sum) | sigma_q | rho / round "
             "| epsilon central | epsilon site max |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    names = {"fedavg": "FedAvg", "delta_fl": "Δ-FL", "dp_fedavg": "DP-FedAvg", "dp_delta_fl_flat": "DP-Δ-FL flat",
             "dp_delta_fl_hier": "DP-Δ-FL hierarchical"}

    def cell(s, metric):
        return f"{s[metric + '_pct']:.2f} ± {s[metric + '_sd']:.2f}"

    for label in ("fedavg", "delta_fl"):
        s = summary[label]
        lines.append(f"| none | {names[label]} | {cell(s, 'p90')} | {cell(s, 'mean')} | | | | | | | | | |")
    for eps in setting["epsilons"]:
        for label in PRIVATE:
            s = summary[f"{label}@{eps:g}"]
            t = s["tuned"]
            quantile = label != "dp_fedavg"
            lines.append(
                f"| {eps:g} | {names[label]} | {cell(s, 'p90')} | {cell(s, 'mean')} | {t['clip']:g} | "
                + (f"{t['loss_bound']:g} | {t['bins']} | {t['quantile_ratio']:g} | " if quantile else "| | | ")
                + f"{s['sigma_update']:.3f} | " + (f"{s['sigma_histogram']:.3f}" if quantile else "")
                + f" | {s['rho_round']:.5f} | {s['epsilon_central']:.3f} | {s['epsilon_site_max']:.2f} |")
    claims_ = result["claims"]
    lines += ["", "Section 5's statements (percentage points) against ours (flat / hierarchical histogram):", "",
              "| epsilon | p90: DP-FedAvg minus DP-Δ-FL | p90: DP-Δ-FL minus Δ-FL | p90: DP-Δ-FL below FedAvg "
              "| mean: DP-Δ-FL minus DP-FedAvg | p90: flat minus hierarchical |",
              "|---|---|---|---|---|---|"]
    for eps in setting["epsilons"]:
        f, h = claims_[f"flat@{eps:g}"], claims_[f"hier@{eps:g}"]
        yes = {True: "yes", False: "no"}
        lines.append(
            f"| {eps:g} | {f['p90_gap_dp_fedavg_minus_dp_delta_fl']:+.2f} / {h['p90_gap_dp_fedavg_minus_dp_delta_fl']:+.2f} "
            f"| {f['dp_delta_fl_p90_minus_delta_fl']:+.2f} / {h['dp_delta_fl_p90_minus_delta_fl']:+.2f} "
            f"| {yes[f['dp_delta_fl_p90_below_fedavg']]} / {yes[h['dp_delta_fl_p90_below_fedavg']]} "
            f"| {f['mean_gap_dp_delta_fl_minus_dp_fedavg']:+.2f} / {h['mean_gap_dp_delta_fl_minus_dp_fedavg']:+.2f} "
            f"| {claims_[f'flat_vs_hier@{eps:g}']['p90_diff']:+.2f} |")
    lines += ["", f"Without privacy: Δ-FL's mean error minus FedAvg's {claims_['mean_gap_nonprivate']:+.2f} "
              f"(paper: 0.24), FedAvg's p90 error minus Δ-FL's {claims_['p90_gap_nonprivate']:+.2f}.",
              "Paper, at epsilon 5: DP-FedAvg minus DP-Δ-FL 4.3 (p90); DP-Δ-FL within 1 of Δ-FL (p90); DP-Δ-FL "
              "below FedAvg (p90); DP-Δ-FL within 0.2-0.4 of DP-FedAvg (mean, every epsilon)."]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, epsilons = result["summary"], result["setting"]["epsilons"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    styles = {"dp_fedavg": ("DP-FedAvg", "C0", "o"), "dp_delta_fl_flat": ("DP-Δ-FL (flat)", "C3", "s"),
              "dp_delta_fl_hier": ("DP-Δ-FL (hierarchical)", "C2", "^")}
    for ax, (metric, title) in zip(axes, (("p90", "90th percentile test error (%)"), ("mean", "mean test error (%)"))):
        for label, (name, color, marker) in styles.items():
            ys = [summary[f"{label}@{e:g}"][f"{metric}_pct"] for e in epsilons]
            es = [summary[f"{label}@{e:g}"][f"{metric}_sd"] for e in epsilons]
            ax.errorbar(epsilons, ys, yerr=es, label=name, color=color, marker=marker, capsize=3)
        for label, name, color in (("fedavg", "FedAvg (no DP)", "C0"), ("delta_fl", "Δ-FL (no DP)", "C3")):
            ax.axhline(summary[label][f"{metric}_pct"], color=color, linestyle="--", label=name)
        ax.set_xlabel("epsilon (delta = 1/n)")
        ax.set_ylabel(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    s = result["setting"]
    fig.suptitle(f"paper 001 figure 3: n = {s['training']} clients, p = {s['tail']}, {s['rounds']} rounds, "
                 f"{s['runs']} runs (sd bars)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def live(args) -> dict:
    """One configuration through the live runtime at full scale (runner.study.run_study over
    fig3.yaml, trial 0, seeded noise), timed, and the fast path's run of the same session."""
    from runner.outputs import RunDirectory
    from runner.study import run_study

    label, eps = args.live_method, args.live_epsilon
    raw = load_scenario(args.scenario, {"sites.policy.noise": "seeded", "trials": 1})
    entry = dict(next(m for m in raw["methods"] if m.get("label", m["name"]) == label))
    tuned_from = None
    if RESULTS.exists() and label in PRIVATE:
        summary = json.loads(RESULTS.read_text())["summary"].get(f"{label}@{eps:g}")
        if summary:
            entry.update(summary["tuned"])
            tuned_from = str(RESULTS.relative_to(ROOT))
    if label in PRIVATE:
        entry["epsilon"] = eps
    if args.live_rounds:
        entry["rounds"] = args.live_rounds
    raw["methods"] = [entry]
    if args.backend == "processes" and args.sites_per_process:
        raw.setdefault("runtime", {}).setdefault("placement", {})["sites_per_process"] = args.sites_per_process
    out = Path(args.live_out)
    started = time.perf_counter()
    run_study(copy.deepcopy(raw), out, backend=args.backend)
    live_s = time.perf_counter() - started
    row = RunDirectory(out).read_results()[0]
    details = row["details"] if isinstance(row["details"], dict) else json.loads(row["details"])
    spec, validated = world_spec(raw)
    started = time.perf_counter()
    world = FastWorld.build(spec, 0)
    build_s = time.perf_counter() - started
    index, method = methods_of(raw, validated["alpha"])[label]
    fast = run_fast(world, method, index)
    keys = ("mean_error", "p90_error")
    compared = {"live": {k: details[k] for k in keys}, "fast": fast["test"],
                "live_validation": {k: details.get(f"validation_{k}") for k in keys},
                "fast_validation": fast["validation"],
                "equal": all(abs(details[k] - fast["test"][k]) <= 1e-9 for k in keys)
                and all(abs(details[f"validation_{k}"] - fast["validation"][k]) <= 1e-9 for k in keys)}
    for k in ("epsilon_central", "epsilon_site_max", "rho_round", "sigma_update", "sigma_histogram"):
        if k in details:
            compared.setdefault("privacy_live", {})[k] = details[k]
            compared.setdefault("privacy_fast", {})[k] = fast.get(k, fast.get("mechanism", {}).get(k))
    return {"method": entry, "tuned_from": tuned_from, "backend": args.backend, "sites": len(world.sites),
            "rounds": method.params["rounds"], "trial": 0, "noise": "seeded",
            "live_run_s": live_s, "fast_world_s": build_s, "fast_run_s": fast["seconds"],
            "live_status": row["status"], **compared}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", default=str(SCENARIO))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--tune-rounds", type=int, default=1000)
    parser.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    parser.add_argument("--grid", choices=sorted(GRIDS) + ["descent"], default="descent")
    parser.add_argument("--results", default=None)
    parser.add_argument("--figure", default=None)
    parser.add_argument("--accounting", choices=["method", "poisson"], default="method",
                        help="poisson: the private methods with sampling: poisson (each client with "
                             "probability m / n, one added or removed: the setting of the paper's bound [27])")
    parser.add_argument("--tuned-from", default=None, help="take the tuned hyperparameters from this results JSON")
    parser.add_argument("--retune", default=None, metavar="COORDINATE=v1,v2",
                        help="one more tuning stage over these values (e.g. loss_bound=2,2.5,3), then the runs")
    parser.add_argument("--table", action="store_true", help="print the docs' tables from --results and stop")
    parser.add_argument("--live", action="store_true", help="one configuration through the live runtime")
    parser.add_argument("--live-method", default="dp_delta_fl_flat", choices=LABELS)
    parser.add_argument("--live-epsilon", type=float, default=5.0)
    parser.add_argument("--live-rounds", type=int, default=0, help="0: the scenario's")
    parser.add_argument("--backend", choices=["inprocess", "processes"], default="inprocess")
    parser.add_argument("--sites-per-process", type=int, default=0)
    parser.add_argument("--live-out", default="runs/paper001-fig3-live")
    args = parser.parse_args(argv)
    if args.table:
        print(docs_table(json.loads(Path(args.results or RESULTS).read_text())))
        return 0
    if args.live:
        result = live(args)
        name = f"paper001_fig3_live_{args.backend}.json"
        path = Path(args.results) if args.results else RESULTS.with_name(name)
        previous = json.loads(path.read_text()) if path.exists() else []
        previous = previous if isinstance(previous, list) else [previous]
        path.write_text(json.dumps(previous + [result], indent=1, default=float) + "\n")
        print(json.dumps(result, indent=1, default=float))
        return 0 if result["equal"] else 1
    if args.quick:
        args.grid, args.tune_rounds, args.runs, args.epsilons = "coarse", 200, 2, [5.0, 20.0]
    suffix = (("_quick" if args.quick else "") + ("_poisson" if args.accounting == "poisson" else "")
              + (f"_{args.retune.split('=')[0]}" if args.retune else ""))
    results = Path(args.results) if args.results else RESULTS.with_name(f"paper001_fig3{suffix}.json")
    figure = Path(args.figure) if args.figure else results.with_suffix(".png")
    started = time.perf_counter()
    result = study(args)
    result["timings"]["total_s"] = time.perf_counter() - started
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(result, indent=1, default=float) + "\n")
    plot(result, figure)
    print(f"wrote {results} and {figure} in {result['timings']['total_s']:.0f} s")
    for key, s in result["summary"].items():
        print(f"  {key:24s} p90 {s['p90_pct']:6.2f} ± {s['p90_sd']:.2f}   mean {s['mean_pct']:6.2f} ± {s['mean_sd']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
