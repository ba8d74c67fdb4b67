"""Issue 10's judged comparison, measured: FedType's private models against local-only training
and against FedAvg on the proxy architecture, on non-IID (Dirichlet) splits, trial by trial.

Each regime is a scenario file plus overrides, run in one process (`--backend inprocess`: the same
sessions as over site processes, without sockets) for `--trials` seeded trials. Per method it
reports the final accuracy (mean over sites, then over trials, with the standard error over
trials); per FedType variant the paired difference to local-only and to FedAvg (same trial, so
the same data split and sites) with a 95% t interval; mean accuracy at a quarter, half and all of
the rounds; and the weight bytes sent against what sending the private models would have cost.

    python bench/fedtype_baselines.py [--regime digits-a1.0-12 ...] [--trials 5] [--set KEY=VALUE]
                                      [--out bench/results/fedtype_baselines.json]

Regimes already in the output file are kept (run two invocations on different regimes one after
the other, or pass --out per invocation).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.outputs import RunDirectory  # noqa: E402
from runner.study import run_study  # noqa: E402
from scenarios.scenario import load_scenario  # noqa: E402

DIGITS, BLOBS = "scenarios/fedtype-digits.yaml", "scenarios/fedtype-blobs.yaml"
REGIMES = {
    "digits-a0.5-8": (DIGITS, []),
    # 12 sites: 142 rows each, 14 conformal points (20 sites would leave 8, fewer than the 9 that
    # theta = 0.1 needs; FedType refuses such sites: stats.conformal.smallest_calibration)
    "digits-a1.0-12": (DIGITS, ["sites.count=12", "sites.heterogeneity.concentration=1.0"]),
    "digits-a0.1-12": (DIGITS, ["sites.count=12", "sites.heterogeneity.concentration=0.1"]),
    "blobs-a0.3-10": (BLOBS, []),
    "blobs-1cluster-a0.5-20": (BLOBS, ["data.n=2000", "sites.count=20", "sites.heterogeneity.concentration=0.5",
                                       "data.options.clusters=1", "data.options.separation=0.5"]),
}
BASELINES = ("local_only", "fedavg")


def paired(differences: list[float]) -> dict:
    """Mean of per-trial differences, its standard error and a 95% t interval (n - 1 df)."""
    d = np.asarray(differences, dtype=float)
    if d.size < 2:
        return {"mean": float(d.mean()) if d.size else None, "se": None, "ci95": None, "trials": int(d.size)}
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    half = float(stats.t.ppf(0.975, d.size - 1) * se)
    return {"mean": float(d.mean()), "se": se, "ci95": [float(d.mean() - half), float(d.mean() + half)],
            "trials": int(d.size)}


def summarize(results: list[dict], rounds: list[dict]) -> dict:
    accuracy = defaultdict(dict)  # method -> trial -> final accuracy (mean over sites)
    for row in results:
        if row["status"] == "ok":
            accuracy[row["method"]][row["trial"]] = float(row["accuracy"])
    curves = defaultdict(lambda: defaultdict(list))  # method -> round -> accuracies over trials
    sent = defaultdict(lambda: [0, 0])  # method -> [weight bytes down + up, private-model counterfactual]
    for row in rounds:
        curves[row["method"]][int(row["round"])].append(float(row["accuracy_mean"]))
        sent[row["method"]][0] += int(row["weights_bytes_down"]) + int(row["weights_bytes_up"])
        sent[row["method"]][1] += int(row["private_weights_bytes"])
    methods = {}
    for method, per_trial in accuracy.items():
        values = np.array(list(per_trial.values()))
        curve = curves[method]
        last = max(curve) if curve else 0
        at = {f"round_{r}": float(np.mean(curve[r])) for r in sorted({max(1, last // 4), max(1, last // 2), last})
              if r in curve}
        entry = {"accuracy": float(values.mean()),
                 "accuracy_se": float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else None,
                 "per_trial": {t: round(v, 4) for t, v in sorted(per_trial.items())}, "curve": at,
                 "weight_bytes": sent[method][0], "private_model_bytes": sent[method][1]}
        for baseline in BASELINES:
            if baseline != method and baseline in accuracy:
                common = sorted(set(per_trial) & set(accuracy[baseline]))
                entry[f"minus_{baseline}"] = paired([per_trial[t] - accuracy[baseline][t] for t in common])
        methods[method] = entry
    return methods


def run_regime(name: str, trials: int, seed: int | None, extra: list[str]) -> dict:
    path, overrides = REGIMES[name]
    overrides = [*overrides, *extra, f"trials={trials}"] + ([f"seed={seed}"] if seed is not None else [])
    scenario = load_scenario(ROOT / path, overrides)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        run_study(scenario, out, backend="inprocess")
        rundir = RunDirectory(out)
        methods = summarize(rundir.read_results(), rundir.read_rounds())
    return {"scenario": path, "overrides": overrides, "sites": scenario["sites"]["count"],
            "concentration": scenario["sites"]["heterogeneity"].get("concentration"),
            "seconds": round(time.perf_counter() - started, 1), "methods": methods}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", action="append", choices=sorted(REGIMES),
                        help="repeatable; default: every regime")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seed", type=int, help="override the scenario's seed")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra scenario override for every regime (repeatable)")
    parser.add_argument("--out", default="bench/results/fedtype_baselines.json")
    args = parser.parse_args()
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}
    for name in args.regime or list(REGIMES):
        result = run_regime(name, args.trials, args.seed, args.overrides)
        report[name] = result
        line = {m: round(v["accuracy"], 4) for m, v in result["methods"].items()}
        print(json.dumps({"regime": name, "seconds": result["seconds"], "accuracy": line}), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))  # after each regime: finished work stays on disk
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
