"""Benchmark: network time against wall time (issue 50 point 4).

The in-process backend runs a study's sites over their emulated links on a virtual clock
(transport.clock): every message's arrival is its link's (latency, jitter, serialization at the
link's rate) plus the sender's measured service time, delivered in that order without anyone
waiting. This script measures what that buys: each case's network time (the span of its
events.jsonl, whose times are network time on the virtual clock) against its wall time (the
whole process, Python's start-up and data included, and run_study alone), with the peak memory
of the process (proportional set size, sampled every 0.2 s as bench/scale.py does, the run
stopped if the machine runs short).

  fedtype-1000   1,000 sites on a seeded mix of 4G and 3G (3 to 1), 30 FedType rounds
                 (paper 002): classification_blobs (4 classes, 8 features, 150 rows a site), a
                 private MLP of 16 units and a proxy MLP of 8 on every site, a tenth of the sites
                 sampled a round (cross-device), one local epoch
  mixed-10000    10,000 sites on broadband, 4G and 3G (2:2:1), FedCP-QQ (raw quantiles) and
                 local-DP FedCP2-QQ (epsilon 5), ridge on romano2019, 100 calibration points a
                 site (bench/scale.py's scenario, larger shards), one trial
  real-time      the mixed scenario at 100 sites, 2 trials: in-process on the virtual clock
                 and over site processes in real time (ZeroMQ, the links emulated at the
                 coordinator's socket), each session's time on the links (summary.json) side by side

    python bench/network_time.py [--quick] [--cases fedtype-1000,mixed-10000,real-time]

--quick: 100 sites for 5 rounds, 1,000 mixed sites, 20 sites in real time (a minute or two).
Writes bench/results/network_time.json (bench/results/network_time-quick.json with --quick) and
prints a markdown table (docs/networks.md, "Network time").
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from scale import watch  # noqa: E402  (bench/scale.py: PSS of the process tree, a memory floor)

MOBILE = {"default": "mobile-4g", "links": [{"sites": "all", "mix": {"mobile-4g": 3, "mobile-3g": 1}, "seed": 2}]}
MIXED = {"default": "broadband",
         "links": [{"sites": "all", "mix": {"broadband": 2, "mobile-4g": 2, "mobile-3g": 1}, "seed": 1}]}
DEADLINES = {"hello": 300, "join": 300, "respond": 120}


def fedtype(m: int, rounds: int) -> dict:
    """FedType over phones: the smallest faithful model and data (see the module's docstring)."""
    return {
        "name": f"network-time-fedtype-{m}", "seed": 0, "trials": 1, "alpha": 0.1,
        "data": {"source": "synthetic", "generator": "classification_blobs", "n": 150 * m,
                 "options": {"classes": 4, "features": 8, "clusters": 2, "separation": 1.0}},
        "split": {"train": 0.05, "calibration": 0.95, "test": 0.0},
        "sites": {"count": m, "sizes": "equal", "policy": {"non_private": "allow"}},
        "model": {"kind": "examples"},
        "methods": [{"name": "fedtype", "classes": 4, "rounds": rounds, "fraction": 0.1, "local_epochs": 1,
                     "private_models": [{"kind": "mlp", "hidden": [16]}], "proxy": {"kind": "mlp", "hidden": [8]}}],
        "network": MOBILE,
        "runtime": {"deadlines": DEADLINES},
    }


def mixed(m: int, trials: int = 1) -> dict:
    """FedCP-QQ and local-DP FedCP2-QQ over broadband, 4G and 3G (bench/scale.py's data, with
    100 calibration points a site: at 20, FedCP2-QQ's private quantile is infinite without asking)."""
    per_site, calibration = 100, 0.8
    return {
        "name": f"network-time-mixed-{m}", "seed": 0, "trials": trials, "alpha": 0.1,
        "data": {"source": "synthetic", "generator": "romano2019", "n": int(per_site * m / calibration) + 10},
        "split": {"train": 0.1, "calibration": calibration, "test": 0.1},
        # the sites consent to the raw quantiles, and take two releases of epsilon 5 a trial
        "sites": {"count": m, "sizes": "equal", "policy": {"non_private": "allow", "max_epsilon": 6},
                  "budget": {"epsilon": 11, "delta": 1.0e-5}},
        "model": {"kind": "ridge"},
        "methods": [{"name": "fedcp_qq"},
                    {"name": "fedcp2_qq", "epsilon": 5.0, "bins": {"count": 50, "lo": "training", "hi": "training"}}],
        "network": MIXED,
        "runtime": {"deadlines": DEADLINES},
    }


def one(spec_path: str, out: str, backend: str) -> None:
    """The child: run one study (run_study, as bench/networks.py does) and say how long it took."""
    from runner.study import run_study
    from scenarios.scenario import validate_scenario

    spec = validate_scenario(yaml.safe_load(Path(spec_path).read_text()))
    began = time.perf_counter()
    run_study(spec, out, backend=backend)
    print(json.dumps({"run_wall_s": round(time.perf_counter() - began, 3)}), flush=True)


def measure(spec: dict, workdir: Path, backend: str = "inprocess") -> dict:
    """Run `spec` in a watched child process; network time, wall time, memory, sessions."""
    path = workdir / f"{spec['name']}-{backend}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = workdir / f"run-{spec['name']}-{backend}"
    env_note = "OMP_NUM_THREADS=1"  # one thread a process: torch and BLAS on 2 shared cores
    watched = watch(["env", env_note, sys.executable, __file__, "--one", str(path), str(out), backend])
    output = watched.pop("output")
    result = {"case": spec["name"], "backend": backend, "sites": spec["sites"]["count"], "trials": spec["trials"],
              "methods": [m.get("label", m["name"]) for m in spec["methods"]], **watched}
    if watched["exit_code"] != 0:
        result["output_tail"] = output[-3000:]
        return result
    result["run_wall_s"] = next(json.loads(line)["run_wall_s"] for line in output.splitlines()
                                if line.startswith('{"run_wall_s"'))
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    start = next(e["ts"] for e in events if e["event"] == "run_start")
    result["span_s"] = round(events[-1]["ts"] - events[0]["ts"], 3)  # network time on the virtual clock
    result["run_span_s"] = round(events[-1]["ts"] - start, 3)  # from run_start: without the sites' start-up
    summary = json.loads((out / "summary.json").read_text())
    result["link_seconds_per_trial"] = {k: round(v["seconds_per_trial"], 3) for k, v in summary["communication"].items()}
    result["network"] = summary["network"]["profiles"]
    spans: dict = {}  # each session on the links: its first message handed over to its last arrival
    with open(out / "ledger.csv") as handle:
        for row in csv.DictReader(handle):
            if row["method"] and row["sent"]:
                first, last = spans.get((row["trial"], row["method"]), (float("inf"), 0.0))
                spans[(row["trial"], row["method"])] = (min(first, float(row["sent"])), max(last, float(row["arrived"])))
    result["session_link_seconds"] = {f"trial {t} {m}": round(b - a, 3) for (t, m), (a, b) in sorted(spans.items())}
    result["dropouts"] = sum(1 for e in events if e["event"] == "dropout")
    result["statuses"] = [e["status"] for e in events if e["event"] == "session_end"]
    sessions = {e["session"]: e for e in events if e["event"] == "session_end"}
    result["rounds"] = {e["label"]: e.get("rounds") for e in sessions.values()}
    result["speedup"] = round(result["span_s"] / result["run_wall_s"], 2) if backend == "inprocess" else None
    return result


def table(results: list[dict]) -> str:
    lines = ["| case | sites | backend | network time s | wall s (run) | wall s (process) | network / wall | peak GiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r["exit_code"] != 0:
            lines.append(f"| {r['case']} | {r['sites']} | {r['backend']} | failed: {r.get('stopped') or r['exit_code']} |"
                         " | | | |")
            continue
        ratio = f"{r['span_s'] / r['run_wall_s']:.2f}" if r["backend"] == "inprocess" else "(real time)"
        lines.append(f"| {r['case']} | {r['sites']:,} | {r['backend']} | {r['span_s']:.1f} | {r['run_wall_s']:.1f} | "
                     f"{r['wall_s']:.1f} | {ratio} | {r['peak_memory_gib']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        one(*sys.argv[2:5])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a minute or two")
    parser.add_argument("--cases", default="fedtype-1000,mixed-10000,real-time")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    quick = args.quick
    out = Path(args.out or ROOT / "bench" / "results" / ("network_time-quick.json" if quick else "network_time.json"))
    cases = args.cases.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="quorum-network-time-") as tmp:
        for case in cases:
            if case == "fedtype-1000":
                specs = [(fedtype(100, 5) if quick else fedtype(1000, 30), "inprocess")]
            elif case == "mixed-10000":
                specs = [(mixed(1000) if quick else mixed(10000), "inprocess")]
            elif case == "real-time":
                m = 20 if quick else 100
                specs = [(mixed(m, 2), "inprocess"), (mixed(m, 2), "processes")]
            else:
                raise SystemExit(f"unknown case {case!r} (fedtype-1000, mixed-10000, real-time)")
            for spec, backend in specs:
                result = measure(spec, Path(tmp), backend)
                result["group"] = case
                print(json.dumps({k: v for k, v in result.items() if k not in ("network", "output_tail")}), flush=True)
                if result["exit_code"] != 0:
                    print(result.get("output_tail", ""), flush=True)
                results.append(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cores": os.cpu_count(), "python": platform.python_version(),
                                           "load_at_end": os.getloadavg()},
                               "quick": quick, "runs": results}, indent=2))
    print(table(results))
    print(f"written {out}")


if __name__ == "__main__":
    main()
