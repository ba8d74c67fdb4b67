"""Benchmark: the emulation against real kernel links (issue 39, point 3), phase by phase.

The same scenario runs twice over real site processes, its links emulated at the coordinator's
socket (transport.emulation) and through Linux traffic control in a network namespace the run
makes (transport.kernel_links: htb per site, netem where the kernel has it). For each method
session's phases, the seconds from the first request handed to a link to the last answer's
arrival (the ledger's `sent` and `arrived`), averaged over trials, in both modes, and their
ratio, after a one-trial run that warms the machine up. Methods: FedCP-QQ, FedCP2-QQ's one-hot secure sum (SecAgg+), paper 001's DDG quantile
(SecAgg+) and a FedType round, at 100 sites by default.

Networks: `thin` (0.5 Mbit/s up, 2 down, no latency: rates alone, which htb sets on any Linux
that permits namespaces) everywhere; `broadband` and `mobile-4g` (the presets, with latency and
jitter) where the kernel has netem; where it has not, they are skipped and the JSON says why.

    python bench/kernel_links.py [--sites 100] [--trials 2] [--networks thin,broadband,mobile-4g]

Writes bench/results/kernel_links.json and prints a markdown table (docs/networks.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from networks import GROUPS, scenario  # noqa: E402 (bench/networks.py: the same scenarios)
from runner.study import run_study  # noqa: E402
from transport.kernel_links import kernel_problem, kernel_support  # noqa: E402
from transport.links import network_of  # noqa: E402

METHODS = {"conformal": ["fedcp_qq", "fedcp2_qq_secagg"], "ddg": ["ddg_quantile"], "learning": ["fedtype"]}
NETWORKS = {
    "thin": {"profiles": {"thin": {"up_mbps": 0.5, "down_mbps": 2}}, "default": "thin"},
    "broadband": {"default": "broadband"},
    "mobile-4g": {"default": "mobile-4g"},
}


def phase_seconds(run_dir: Path) -> dict[tuple[str, str], float]:
    """(method, phase) -> the mean over trials of the seconds from the phase's first request
    handed to a link to its last answer's arrival."""
    span = defaultdict(lambda: [float("inf"), 0.0])
    with open(run_dir / "ledger.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["method"] and row["phase"]:
                key = (row["method"], row["phase"], row["trial"])
                if row["direction"] == "down":
                    span[key][0] = min(span[key][0], float(row["sent"]))
                else:
                    span[key][1] = max(span[key][1], float(row["arrived"]))
    seconds = defaultdict(list)
    for (method, phase, _), (start, end) in span.items():
        if end > start:
            seconds[(method, phase)].append(end - start)
    return {key: sum(v) / len(v) for key, v in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=100)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--groups", default=",".join(METHODS))
    parser.add_argument("--networks", default=",".join(NETWORKS))
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "kernel_links.json"))
    args = parser.parse_args()
    support = kernel_support()
    if not support.namespaces:
        print(f"skipped: no kernel links on this machine ({support.why})")
        write(args.out, args, [], {"all": support.why})
        return
    rows, skipped = [], {}
    for name in args.networks.split(","):
        for group in args.groups.split(","):
            methods = [m for m in GROUPS[group] if m["name"] in METHODS[group]]
            specs = {mode: scenario(group, args.sites, args.trials, {**NETWORKS[name], "mode": mode})
                     for mode in ("emulated", "kernel")}
            for spec in specs.values():
                spec["methods"] = methods
            problem = kernel_problem(network_of(specs["kernel"]["network"], [f"site-{j:03d}" for j in range(args.sites)]))
            if problem:
                skipped[name] = problem
                print(f"{name}: skipped ({problem})", flush=True)
                break
            with tempfile.TemporaryDirectory() as tmp:
                # a one-trial run first warms the machine up (fork server, page cache, torch), so
                # that neither mode pays for cold caches (as bench/networks.py does)
                run_study({**specs["emulated"], "trials": 1}, Path(tmp) / "warm-up")
                measured = {}
                for mode, spec in specs.items():
                    began = time.perf_counter()
                    run_study(spec, Path(tmp) / mode)
                    print(f"{group} {name} {mode}: {time.perf_counter() - began:.1f} s", flush=True)
                    measured[mode] = phase_seconds(Path(tmp) / mode)
            for key, emulated in measured["emulated"].items():
                kernel = measured["kernel"].get(key)
                rows.append({"network": name, "group": group, "method": key[0], "phase": key[1],
                             "emulated_seconds": emulated, "kernel_seconds": kernel,
                             "kernel_over_emulated": kernel / emulated if kernel and emulated else None})
            write(args.out, args, rows, skipped)  # after every pair of runs: nothing measured is lost
    print("| network | method | phase | emulated s | kernel s | kernel / emulated |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        ratio = "-" if r["kernel_over_emulated"] is None else f"{r['kernel_over_emulated']:.2f}"
        kernel = "-" if r["kernel_seconds"] is None else f"{r['kernel_seconds']:.3f}"
        print(f"| {r['network']} | {r['method']} | {r['phase']} | {r['emulated_seconds']:.3f} | {kernel} | {ratio} |")
    for name, why in skipped.items():
        print(f"{name}: skipped: {why}")


def write(path: str, args, rows: list[dict], skipped: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({
        "benchmark": "kernel_links", "sites": args.sites, "trials": args.trials, "machine": platform.node(),
        "python": platform.python_version(), "networks": {n: NETWORKS[n] for n in args.networks.split(",")},
        "skipped": skipped, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
