"""Many sites on one machine: a whole run at m = 1,000 and 10,000 sites over site hosts (issue 21).

The scenario (ridge on romano2019 data, 20 calibration points per site, FedCP-QQ and
centralized, 5 trials, CurveZMQ on, automatic placement) runs as a user would run it:
`run.py run` in its own process. This script samples the memory of that process and all its
children every 0.2 s (proportional set size, so pages shared after the fork are counted once)
and kills the run if the machine's available memory falls below a floor, so a benchmark can
never take the machine down. It reports the whole run's wall time, each trial's open (the
join phase) and session times from events.jsonl, the peak memory, the placement chosen and
the coverage.

    python bench/scale.py [--sites 1000 10000] [--trials 5] [--out bench/results/scale.json]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MEMORY_FLOOR = 2 * 2**30  # stop the run when the machine has less than this available


#: --network mixed: every site on a link drawn from these (issue 39: links emulated at scale)
MIXED = {"default": "broadband", "links": [{"sites": "all", "mix": {"broadband": 2, "mobile-4g": 2, "mobile-3g": 1},
                                            "seed": 1}]}


def scenario(m: int, trials: int, methods: tuple[str, ...] = ("fedcp_qq", "centralized"),
             network: str | None = None) -> dict:
    per_site, calibration = 20, 0.8
    return {
        **({"network": MIXED if network == "mixed" else {"default": network}} if network else {}),
        "name": f"scale-{m}", "seed": 0, "trials": trials, "alpha": 0.1,
        "data": {"source": "synthetic", "generator": "romano2019", "n": int(per_site * m / calibration) + 10},
        "split": {"train": 0.1, "calibration": calibration, "test": 0.1},
        "sites": {"count": m, "sizes": "equal", "policy": {"non_private": "allow"}},  # raw baselines
        "model": {"kind": "ridge"},
        "methods": [{"name": name} for name in methods],
        "runtime": {"deadlines": {"hello": 300, "join": 300, "respond": 120}},
    }


def tree(pid: int) -> list[int]:
    """pid and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def available() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def watch(command: list[str], cwd: Path = ROOT) -> dict:
    """Run `command` in its own session, sampling the PSS of it and all its descendants every
    0.2 s and killing the whole group if the machine's available memory falls below the floor.
    Returns wall_s, peak_memory_gib, exit_code, stopped (why it was killed, or None), output."""
    began = time.monotonic()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()  # a chatty child must never block on a full pipe
    peak, stopped = 0, None
    while process.poll() is None:
        peak = max(peak, sum(pss(p) for p in tree(process.pid)))
        if available() < MEMORY_FLOOR:
            stopped = f"stopped: less than {MEMORY_FLOOR / 2**30:.0f} GiB of memory left"
            os.killpg(process.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    process.wait()
    reader.join(timeout=5)
    try:
        os.killpg(process.pid, signal.SIGKILL)  # anything it left behind (Ray's workers, say)
    except ProcessLookupError:
        pass
    return {"wall_s": round(time.monotonic() - began, 2), "peak_memory_gib": round(peak / 2**30, 3),
            "exit_code": process.returncode, "stopped": stopped, "output": "".join(output)}


def run_watched(spec: dict, workdir: Path) -> tuple[dict, Path]:
    """Run `spec` with `run.py run`, watching memory; (measures, run directory)."""
    path = workdir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = workdir / f"run-{spec['name']}"
    watched = watch([sys.executable, str(ROOT / "run.py"), "run", str(path), "--out", str(out)])
    output = watched.pop("output")
    result = {"sites": spec["sites"]["count"], "trials": spec["trials"], **watched}
    if watched["exit_code"] != 0:
        result["output_tail"] = output[-2000:]
    return result, out


def run_one(m: int, trials: int, workdir: Path, methods: tuple[str, ...] = ("fedcp_qq", "centralized"),
            network: str | None = None) -> dict:
    result, out = run_watched(scenario(m, trials, methods, network), workdir)
    if result["exit_code"] != 0:
        return result
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    placed = next(e for e in events if e["event"] == "placement")
    result["placement"] = {k: placed[k] for k in ("processes", "sites_per_process", "why")}
    start = next(e for e in events if e["event"] == "coordinator_start")["ts"]
    first_open = min(e["ts"] - e["seconds"] for e in events if e["event"] == "trial_open")
    result["start_to_first_trial_s"] = round(first_open - start, 2)  # hosts, keys, CURVE handshakes, hellos
    per_trial = []
    for trial in range(trials):
        opened = next(e for e in events if e["event"] == "trial_open" and e["trial"] == trial)
        sessions = [e for e in events if e["event"] in ("session_start", "session_end") and e["trial"] == trial]
        starts = [e["ts"] for e in sessions if e["event"] == "session_start"]
        ends = [e["ts"] for e in sessions if e["event"] == "session_end"]
        per_trial.append({"trial": trial, "open_s": round(opened["seconds"], 3),
                          "sessions_s": round(sum(b - a for a, b in zip(starts, ends)), 3),
                          "open_plus_sessions_s": round(opened["seconds"] + sum(b - a for a, b in zip(starts, ends)), 3),
                          "joined": len(opened["sizes"])})
    result["trials_timing"] = per_trial
    result["worst_open_plus_sessions_s"] = max(t["open_plus_sessions_s"] for t in per_trial)
    rows = list(csv.DictReader(open(out / "results.csv")))
    result["coverage"] = {label: round(sum(float(r["coverage"]) for r in rows if r["method"] == label) / trials, 4)
                          for label in methods}
    summary = json.loads((out / "summary.json").read_text())
    result["communication"] = {k: v for k, v in summary["communication"].items() if k in methods}
    result["dropouts"] = sum(1 for e in events if e["event"] == "dropout")
    if network:
        result["network"] = {"name": network, **summary["network"]}
        result["seconds_per_trial"] = {k: round(v["seconds_per_trial"], 3) for k, v in result["communication"].items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--network", default=None,
                        help="every site on this link profile, or 'mixed' (broadband, 4G and 3G): links at scale")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    args.out = args.out or str(ROOT / "bench" / "results" / (f"scale-{args.network}.json" if args.network
                                                             else "scale.json"))
    results = []
    with tempfile.TemporaryDirectory(prefix="quorum-scale-") as tmp:
        for m in args.sites:
            result = run_one(m, args.trials, Path(tmp), network=args.network)
            print(json.dumps({k: v for k, v in result.items() if k != "trials_timing"}), flush=True)
            results.append(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": {"cores": os.cpu_count()}, "runs": results}, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
