"""Paper 002's comparison, measured (issues 10 and 25): FedType's private models against local-only
training, FedAvg on the proxy architecture, and the paper's own baselines FML and FedProto, plus
FedType-P (ours) and its ablations, on non-IID (Dirichlet) splits, trial by trial.

Each regime is a scenario file plus overrides, run in one process (`--backend inprocess`: the same
sessions as over site processes, without sockets) for `--trials` seeded trials. Per method it
reports the final accuracy (mean over sites, then over trials, with the standard error over
trials); per method the paired difference to local-only, FedAvg, FML and FedProto (same trial, so
the same data split and sites) with a 95% t interval; mean accuracy at a quarter, half and all of
the rounds; and the weight (or prototype) bytes sent against what sending the private models would
have cost. (In-process there is no wire: `run.py run` over site processes puts the ledger's bytes
per round in rounds.csv.)

    python bench/fedtype_baselines.py [--regime digits-a1.0-12 ...] [--trials 5] [--set KEY=VALUE]
                                      [--methods local_only,fedtype_personal] [--jobs 2]
                                      [--out bench/results/fedtype_baselines.json]

Regimes already in the output file are kept (run two invocations on different regimes one after
the other, or pass --out per invocation).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
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
from quorum import load_scenario  # noqa: E402

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
BASELINES = ("local_only", "fedavg", "fml", "fedproto")


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
                 "weight_bytes": sent[method][0], "private_model_bytes": sent[method][1],
                 "rounds": last}
        for baseline in BASELINES:
            if baseline != method and baseline in accuracy:
                common = sorted(set(per_trial) & set(accuracy[baseline]))
                entry[f"minus_{baseline}"] = paired([per_trial[t] - accuracy[baseline][t] for t in common])
        methods[method] = entry
    return methods


def run_regime(name: str, trials: int, seed: int | None, extra: list[str], methods: list[str] | None = None) -> dict:
    path, overrides = REGIMES[name]
    overrides = [*overrides, *extra, f"trials={trials}"] + ([f"seed={seed}"] if seed is not None else [])
    scenario = load_scenario(ROOT / path, overrides).to_dict()
    if methods:  # the scenario's entries with these labels only (e.g. a variant against local_only)
        labels = [m.get("label") or m["name"] for m in scenario["methods"]]
        unknown = sorted(set(methods) - set(labels))
        if unknown:
            raise SystemExit(f"{path}: no method labelled {unknown}; it has {labels}")
        scenario["methods"] = [m for m, label in zip(scenario["methods"], labels) if label in methods]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        run_study(scenario, out, backend="inprocess")
        rundir = RunDirectory(out)
        methods = summarize(rundir.read_results(), rundir.read_rounds())
    return {"scenario": path, "overrides": overrides, "sites": scenario["sites"]["count"],
            "concentration": scenario["sites"]["heterogeneity"].get("concentration"),
            "seconds": round(time.perf_counter() - started, 1), "methods": methods}


#: the table's columns: (method label, heading); the paired intervals are against local-only
COLUMNS = (("local_only", "local-only"), ("fedavg", "FedAvg"), ("fml", "FML"), ("fedproto", "FedProto"),
           ("fedtype", "FedType eq3"), ("fedtype_set_mass", "FedType set_mass"), ("fedtype_personal", "FedType-P"))
ABLATIONS = (("fedtype_personal", "FedType-P (equal head)"), ("fedtype_personal_fitted", "fitted head"),
             ("fedtype_personal_nohead", "no head"), ("fedtype_personal_unshared", "control: proxy not shared"),
             ("fedtype_personal_shift", "label shift + global head"))


def interval(entry: dict | None) -> str:
    if not entry or not entry.get("ci95"):
        return ""
    low, high = entry["ci95"]
    mark = " **>0**" if low > 0 else " **<0**" if high < 0 else ""
    return f"{entry['mean']:+.3f} [{low:+.3f}, {high:+.3f}]{mark}"


def per_round(entry: dict) -> str:
    rounds = entry.get("rounds") or max(int(k.split("_")[1]) for k in entry["curve"])
    scale = 1e3 * rounds * len(entry["per_trial"])
    return f"{entry['weight_bytes'] / scale:.1f} ({entry['private_model_bytes'] / scale:.0f})"


def markdown_tables(report: dict) -> str:
    """The comparison as markdown: accuracy (+- se over trials) per method and regime; the paired
    difference of each federated method to local-only; to FML and FedProto; the ablations of
    FedType-P; and the bytes on the wire per round."""
    lines = ["| regime | " + " | ".join(h for _, h in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for name, result in report.items():
        methods = result["methods"]
        cells = [f"{methods[m]['accuracy']:.3f} +- {methods[m]['accuracy_se'] or 0:.3f}" if m in methods else ""
                 for m, _ in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for baseline in ("local_only", "fml", "fedproto"):
        against = [(m, h) for m, h in COLUMNS if m != baseline and m != "fedavg" and (baseline == "local_only" or m.startswith("fedtype"))]
        lines += ["", f"Paired difference to {dict(COLUMNS)[baseline]} (mean [95% t interval], per trial):", "",
                  "| regime | " + " | ".join(h for _, h in against) + " |", "|---" * (len(against) + 1) + "|"]
        for name, result in report.items():
            methods = result["methods"]
            lines.append(f"| {name} | " + " | ".join(interval(methods.get(m, {}).get(f"minus_{baseline}"))
                                                     for m, _ in against) + " |")
    lines += ["", "FedType-P's ablations, paired difference to local-only:", "",
              "| regime | " + " | ".join(h for _, h in ABLATIONS) + " |", "|---" * (len(ABLATIONS) + 1) + "|"]
    for name, result in report.items():
        methods = result["methods"]
        lines.append(f"| {name} | " + " | ".join(interval(methods.get(m, {}).get("minus_local_only"))
                                                 for m, _ in ABLATIONS) + " |")
    shown = [(m, h) for m, h in COLUMNS if m != "local_only"]
    lines += ["", "What a round sends (weights or prototypes, all sampled sites, down + up), kB; in brackets what"
              " the private models would have cost:", "",
              "| regime | " + " | ".join(h for _, h in shown) + " |", "|---" * (len(shown) + 1) + "|"]
    for name, result in report.items():
        methods = result["methods"]
        lines.append(f"| {name} | " + " | ".join(per_round(methods[m]) if m in methods else "" for m, _ in shown) + " |")
    return "\n".join(lines)


def run_named(job: tuple) -> tuple[str, dict]:
    """One regime in a pool worker, on one torch thread (two workers with a thread per core each
    oversubscribe a 2-core machine: measured 7x slower)."""
    import torch

    torch.set_num_threads(1)
    return job[0], run_regime(*job)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--regime", action="append", choices=sorted(REGIMES),
                        help="repeatable; default: every regime")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seed", type=int, help="override the scenario's seed")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra scenario override for every regime (repeatable)")
    parser.add_argument("--methods", help="comma-separated method labels to run (default: every one of the scenario)")
    parser.add_argument("--jobs", type=int, default=1, help="regimes run in this many processes at once")
    parser.add_argument("--out", default="bench/results/fedtype_baselines.json")
    parser.add_argument("--table", action="store_true", help="only print the tables of the output file, run nothing")
    args = parser.parse_args()
    out = Path(args.out)
    report = json.loads(out.read_text()) if out.exists() else {}
    if args.table:
        print(markdown_tables(report))
        return
    names = args.regime or list(REGIMES)
    methods = args.methods.split(",") if args.methods else None
    jobs = [(name, args.trials, args.seed, args.overrides, methods) for name in names]
    with multiprocessing.get_context("spawn").Pool(max(1, min(args.jobs, len(jobs)))) as pool:
        finished = pool.imap_unordered(run_named, jobs) if args.jobs > 1 else ((job[0], run_regime(*job)) for job in jobs)
        for name, result in finished:
            report[name] = result
            line = {m: round(v["accuracy"], 4) for m, v in result["methods"].items()}
            print(json.dumps({"regime": name, "seconds": result["seconds"], "accuracy": line}), flush=True)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report, indent=1))  # after each regime: finished work stays on disk
    print(markdown_tables(report))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
