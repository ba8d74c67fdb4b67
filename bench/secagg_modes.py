"""SecAgg+'s active mode against its semi-honest mode and against Flower's SecAgg+, in one run
(issue 48 point 6, "Measured").

Every measurement is a process of its own, watched from outside (bench/scale.py: the peak is
the proportional set size of the process and all its children, sampled every 0.2 s; the run is
killed if the machine's available memory falls below 2 GiB) and stopped at a time limit, so a
size that does not fit is recorded with the reason instead of taking the machine down:

- `processes`: Quorum over real site processes (bench/secagg_agents.py): ddg_quantile's flat
  histogram, 1,024 bins on Z_{2^32}, SecAgg+'s sparse graph, CurveZMQ, sites in site hosts,
  10% of the sites crash in the mask phase; one run per mode, the method's `secagg: {mode}` and,
  for the semi-honest mode, every site's policy `secagg: semi-honest`. Time: the secure session
  (session_start to session_end in events.jsonl); bytes: the session's messages per site, up and
  down (the run's ledger); memory: the whole run's peak. Each site draws its 1,024 exact discrete
  Gaussian noise values in the mask phase (protocol.noise; the same in both modes, and about
  0.2 ms a site since issue 49's sampler, 30-300 ms with OpenDP's before); `protocol_s` is the
  session without the mask phase.
- `in-process`: the protocol alone, every site's and the coordinator's work in one process,
  no sockets, no noise (bench/secagg_sum.py): vector length 1,024 on Z_{2^32}, the sparse graph,
  10% of the sites dropping before they mask; bytes are the msgpack bodies; memory the larger of
  the sampled peak and the process's own peak resident set (a one-second run can end between
  two samples).
- `flower`: Flower's SecAgg+ workflow (bench/flower_secagg.py) in its simulation runtime (Ray,
  two workers), in its own interpreter (`--flower-python`, with bench/requirements-flower.txt):
  the same vector length and ring, num_shares = our degree + 1, a strict-majority threshold, 10%
  of the clients failing in its masking stage. Time: its four stages on the server; bytes: its
  messages as Flower serializes them.

Each mode runs until `--repeats` sessions gave a sum (sizes above 1,000: one), at most
`--repeats` + 2 attempts; attempt a uses seed a, which draws the session nonce (so the graph)
and the sites that drop, the same draws in both modes. A session can end without a sum: in the
active mode the threshold is more than two thirds of each neighbourhood, and a draw where some
survivor's neighbourhood lost more than a third of its sites cannot be unmasked (the JSON's
`abort_probability` estimates how often, with the protocol's own graph, and each row counts its
sums and aborts). Ratios are of the medians of the sessions that gave a sum: active/semi-honest
for each setting, and active/Flower and semi-honest/Flower at the sizes Flower ran. Writes
bench/results/secagg_modes.json with every run, the medians, the ratios, what did not fit and
why, and the machine (cores, memory, load); prints the table.

    python bench/secagg_modes.py [--quick] [--sites 100 1000 10000] [--repeats 3]
                                 [--flower-python /tmp/flwrenv/bin/python] [--flower-sites 100 1000]
                                 [--parts processes in-process flower] [--out bench/results/secagg_modes.json]

--quick: 100 sites only, one run each (a few minutes).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import ROOT, available, watch  # noqa: E402
from secagg_agents import read_run, scenario  # noqa: E402

MODES = ("active", "semi-honest")
KILLED = 0.1
LENGTH, BITS = 1024, 32
DEFAULT_FLOWER = "/tmp/flwrenv/bin/python"
#: sites per site host over real processes: auto (bench/scale.py's placement) up to 1,000; at
#: 10,000, 4 hosts of 2,500 (two per core)
LARGE_HOSTS = 2500


def limit_for(part: str, m: int) -> int:
    """Seconds a measurement may take before it is stopped and recorded as not fitting."""
    if part == "flower":
        return 900 if m <= 1000 else 1800
    return 600 if m <= 1000 else 2400


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict:
    with open("/proc/meminfo") as handle:
        total = next(int(line.split()[1]) * 1024 for line in handle if line.startswith("MemTotal:"))
    model = ""
    try:
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cores": os.cpu_count(), "memory_gib": round(total / 2**30, 1), "cpu": model,
            "python": platform.python_version(), "platform": platform.platform()}


def code() -> dict:
    """The commit measured, and whether the protocol's files differed from it."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    snapshot = ROOT / "SNAPSHOT"  # a tree exported from a commit (git archive) names it here
    if snapshot.exists() and not (ROOT / ".git").exists():
        return {"commit": snapshot.read_text().strip(), "tree": "exported from that commit (git archive), "
                "with this benchmark's files", "uncommitted_changes": []}
    changed = git("status", "--porcelain", "--", "protocol", "runner", "sites", "transport", "coordinator")
    return {"commit": git("rev-parse", "HEAD"), "uncommitted_changes": changed.splitlines()}


def timed_out(watched: dict, limit: int) -> str | None:
    """Why a watched command did not finish: the memory floor, or the time limit (timeout's 124
    or 137)."""
    if watched["stopped"]:
        return watched["stopped"]
    if watched["exit_code"] in (124, 137, -9):
        return f"stopped: ran past the limit of {limit} s"
    return None


def limited(limit: int, command: list[str]) -> list[str]:
    return ["timeout", "-k", "30", str(limit), *command]


def run_processes(m: int, mode: str, workdir: Path, seed: int = 0) -> dict:
    """Quorum over site processes: one `run.py run` of bench/secagg_agents.py's scenario (its
    seed draws the session nonce, so the graph, and which sites crash)."""
    limit = limit_for("processes", m)
    per_process = "auto" if m <= 1000 else LARGE_HOSTS
    # a 10,000-site phase of key agreements and signature checks takes minutes on two cores
    respond = max(120.0, 0.09 * m)
    spec = scenario(m, KILLED, "ddg_quantile", mode, per_process, respond, seed)
    path = workdir / f"{spec['name']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = workdir / f"run-{spec['name']}-{time.monotonic_ns()}"
    load = loadavg()
    watched = watch(limited(limit, [sys.executable, str(ROOT / "run.py"), "run", str(path), "--out", str(out)]))
    output = watched.pop("output")
    result = {"sites": m, "trials": 1, **watched, "loadavg_before": load, "loadavg_after": loadavg(),
              "limit_s": limit, "respond_s": respond, "seed": seed}
    why = timed_out(watched, limit)
    if why:
        result["stopped"] = why
    if watched["exit_code"] != 0:
        result["output_tail"] = output[-2000:]
    result = read_run(result, out, KILLED, "ddg_quantile", mode)
    if "session_s" in result:
        result["time_s"] = result["session_s"]
        result["protocol_s"] = round(sum(s for p, s in result["phase_s"].items() if p != "mask"), 3)
    result["peak_gib"] = result["peak_memory_gib"]
    return result


def run_in_process(m: int, mode: str, workdir: Path, seed: int = 0) -> dict:
    """The protocol alone, in one process of its own (bench/secagg_sum.py)."""
    limit = limit_for("in-process", m)
    out = workdir / f"sum-{mode}-{m}-{time.monotonic_ns()}.json"
    load = loadavg()
    watched = watch(limited(limit, [sys.executable, str(ROOT / "bench" / "secagg_sum.py"), "--sites", str(m),
                                    "--modes", mode, "--graphs", "sparse", "--dropouts", str(KILLED),
                                    "--seed", str(seed), "--out", str(out)]))
    output = watched.pop("output")
    result = {"sites": m, "mode": mode, "wall_s": watched["wall_s"], "exit_code": watched["exit_code"],
              "stopped": timed_out(watched, limit), "limit_s": limit, "loadavg_before": load,
              "loadavg_after": loadavg(), "peak_gib": watched["peak_memory_gib"]}
    if watched["exit_code"] != 0 or not out.exists():
        result["output_tail"] = output[-2000:]
        return result
    row = json.loads(out.read_text())[0]
    result.update({k: v for k, v in row.items() if k != "m"})
    result["time_s"] = row["seconds"]
    # a run of a second can end between two samples: its own peak resident set bounds it too
    result["peak_pss_sampled_gib"] = watched["peak_memory_gib"]
    result["peak_gib"] = max(watched["peak_memory_gib"], row["peak_rss_gib"])
    return result


def run_flower(m: int, python: str, workdir: Path) -> dict:
    """Flower's SecAgg+ in its simulation runtime, in its own interpreter (bench/flower_secagg.py)."""
    limit = limit_for("flower", m)
    out = workdir / f"flower-{m}-{time.monotonic_ns()}.json"
    load = loadavg()
    watched = watch(limited(limit, [python, str(ROOT / "bench" / "flower_secagg.py"), "--sites", str(m),
                                    "--dropped", str(KILLED), "--out", str(out)]))
    output = watched.pop("output")
    result = {"sites": m, "wall_s": watched["wall_s"], "exit_code": watched["exit_code"],
              "stopped": timed_out(watched, limit), "limit_s": limit, "loadavg_before": load,
              "loadavg_after": loadavg(), "peak_gib": watched["peak_memory_gib"]}
    if watched["exit_code"] != 0 or not out.exists():
        result["output_tail"] = output[-2000:]
        return result
    data = json.loads(out.read_text())
    row = data["rows"][0]
    result.update({k: v for k, v in row.items() if k != "sites"}, flwr=data["flwr"])
    result["time_s"] = row["secure_sum_s"]
    return result


def completed(run: dict) -> bool:
    return run.get("time_s") is not None and run.get("status", "ok") == "ok"


def fits(run: dict) -> bool:
    """Whether a run ran to its end (a sum, or a session that ended with its reason)."""
    return run.get("time_s") is not None or run.get("status") not in (None, "ok")


def outcomes(runs: list[dict]) -> dict:
    aborted = [r for r in runs if r.get("status") not in (None, "ok")]
    return {"runs": len(runs), "completed": sum(1 for r in runs if completed(r)), "aborted": len(aborted),
            **({"abort_reason": aborted[0].get("reason", "")[:300]} if aborted else {})}


def abort_probability(m: int, trials: int | None = None) -> dict:
    """Per mode, the share of random draws (a graph from a fresh seed, 10% of the sites dropped)
    in which some surviving site keeps fewer than t survivors in its neighbourhood (itself
    included): it cannot sign or unmask, and the session ends without a sum. The protocol's own
    graph (protocol.secagg.graph) and default thresholds."""
    sys.path.insert(0, str(ROOT))
    import numpy as np

    from protocol.secagg.graph import default_degree, default_threshold, harary_by_index

    trials = trials or 400
    rng = np.random.default_rng(0)
    k = default_degree(m)
    out = {}
    draws = []
    for _ in range(trials):
        graph = harary_by_index(m, k, rng.bytes(32))
        lost = set((rng.choice(m, int(round(KILLED * m)), replace=False) + 1).tolist())
        draws.append(sorted(len((graph.neighbours(i) | {i}) - lost) for i in range(1, m + 1) if i not in lost)[0])
    for mode in MODES:
        t = default_threshold(k, mode)
        out[mode] = {"degree": k, "threshold": t, "trials": trials,
                     "probability": round(sum(1 for fewest in draws if fewest < t) / trials, 3)}
    return out


METRICS = ("time_s", "protocol_s", "bytes_up_per_site", "bytes_down_per_site", "peak_gib")


def median_of(runs: list[dict]) -> dict | None:
    """Each metric's median over the runs that completed (None if none did)."""
    done = [r for r in runs if r.get("time_s") is not None and r.get("status", "ok") == "ok"]
    if not done:
        return None
    out = {"runs": len(done)}
    for metric in METRICS:
        values = [r[metric] for r in done if r.get(metric) is not None]
        if values:
            out[metric] = round(statistics.median(values), 4)
            if len(values) > 1:
                out[metric + "_range"] = [min(values), max(values)]
    return out


def ratio(a: dict | None, b: dict | None) -> dict | None:
    if not a or not b:
        return None
    return {metric: round(a[metric] / b[metric], 3) for metric in METRICS
            if a.get(metric) and b.get(metric)}


def why_not(runs: list[dict]) -> str | None:
    """Why none of these runs gave a measurement."""
    for r in runs:
        if r.get("stopped"):
            return r["stopped"]
        if r.get("exit_code"):
            return f"exit code {r['exit_code']}: {(r.get('output_tail') or '')[-300:]}"
        if r.get("status") not in (None, "ok"):
            return f"session {r['status']}: {r.get('reason', '')[:300]}"
    return None


def fmt(value, metric: str) -> str:
    if value is None:
        return "-"
    if metric.startswith("bytes"):
        return f"{value / 1000:.1f} kB"
    if metric == "peak_gib":
        return f"{value:.2f} GiB"
    return f"{value:.2f} s"


def table(summary: list[dict]) -> str:
    head = ("setting", "metric", "Quorum active", "Quorum semi-honest", "Flower SecAgg+", "active/semi",
            "active/Flower", "semi/Flower")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for row in summary:
        for metric in METRICS:
            cells = [row.get("active") and row["active"].get(metric), row.get("semi-honest") and
                     row["semi-honest"].get(metric), row.get("flower") and row["flower"].get(metric)]
            if all(c is None for c in cells):
                continue
            ratios = [(row.get(k) or {}).get(metric) for k in ("active/semi-honest", "active/flower",
                                                               "semi-honest/flower")]
            lines.append(" | ".join([row["setting"], metric, *(fmt(c, metric) for c in cells),
                                     *("-" if r is None else f"{r:.2f}" for r in ratios)]))
        sessions = [row.get(f"{mode}_sessions") for mode in MODES]
        if any(sessions):
            lines.append(" | ".join([row["setting"], "sums (of sessions)", *(
                f"{x['completed']} of {x['runs']}" if x else "-" for x in sessions), "-", "-", "-", "-"]))
        for what in ("active", "semi-honest", "flower"):
            if row.get(f"{what}_not_run"):
                lines.append(f"{row['setting']} | {what}: not measured | {row[f'{what}_not_run']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 sites only, one run each")
    parser.add_argument("--sites", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--repeats", type=int, default=3, help="sums per mode and setting up to 1,000 sites")
    parser.add_argument("--parts", nargs="+", choices=["processes", "in-process", "flower"],
                        default=["processes", "in-process", "flower"])
    parser.add_argument("--flower-python", default=DEFAULT_FLOWER)
    parser.add_argument("--flower-sites", type=int, nargs="+", default=[100, 1000],
                        help="Flower's sizes (its share-keys stage grew 30x from 100 to 1,000 clients here)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "secagg_modes.json"))
    args = parser.parse_args()
    if args.quick:
        args.sites, args.repeats, args.flower_sites = [100], 1, [100]
    flower_ok = "flower" in args.parts and Path(args.flower_python).exists()
    began, load, measured = time.time(), loadavg(), code()
    runs: list[dict] = []
    summary: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="quorum-secagg-modes-") as tmp:
        work = Path(tmp)
        for m in args.sites:
            repeats = args.repeats if m <= 1000 else 1
            for part in ("processes", "in-process"):
                if part not in args.parts:
                    continue
                setting = (f"m = {m:,}, 10% dropped, site processes" if part == "processes"
                           else f"m = {m:,}, 10% dropped, in-process protocol")
                by_mode: dict[str, list[dict]] = {mode: [] for mode in MODES}
                # `repeats` completed runs per mode; a session that aborts (the active mode's
                # threshold not met after the dropouts) is recorded and another drawn, up to
                # `repeats` + 2 attempts; attempt a runs with seed a, which draws the session nonce
                # (so the graph) and the sites that drop, the same draw in both modes
                for attempt in range(repeats + 2):
                    for mode in MODES:  # interleaved, so that the machine's drift falls on both
                        done = by_mode[mode]
                        if sum(1 for r in done if completed(r)) >= repeats:
                            continue
                        if done and not fits(done[-1]):
                            continue  # it did not fit once (time, memory, an error): it will not now
                        if part == "processes":
                            run = run_processes(m, mode, work, seed=attempt)
                        else:
                            run = run_in_process(m, mode, work, seed=attempt)
                        run.update(part=part, system=f"quorum {mode}", attempt=attempt)
                        runs.append(run)
                        done.append(run)
                        print(json.dumps({k: v for k, v in run.items() if k not in ("output_tail",)}), flush=True)
                row = {"setting": setting, "part": part, "sites": m, "killed": KILLED,
                       **{mode: median_of(by_mode[mode]) for mode in MODES}}
                for mode in MODES:
                    row[f"{mode}_sessions"] = outcomes(by_mode[mode])
                    if row[mode] is None:
                        row[f"{mode}_not_run"] = why_not(by_mode[mode]) or "no run completed"
                if flower_ok and m in args.flower_sites and part == "processes":
                    fl = []
                    for attempt in range(repeats if m <= 100 else 1):
                        run = run_flower(m, args.flower_python, work)
                        run.update(part="flower", system="flower secagg+", attempt=attempt)
                        runs.append(run)
                        fl.append(run)
                        print(json.dumps({k: v for k, v in run.items() if k != "output_tail"}), flush=True)
                        if not run.get("time_s"):
                            break
                    row["flower"] = median_of(fl)
                    if row["flower"] is None:
                        row["flower_not_run"] = why_not(fl) or "no run completed"
                elif part == "processes" and "flower" in args.parts:
                    row["flower_not_run"] = (
                        f"not run: Flower's interpreter {args.flower_python} is missing (see bench/flower_secagg.py)"
                        if not flower_ok else not_run_flower(m, summary))
                if part == "in-process":  # Flower's figures stand beside both of ours: the same runs
                    beside = next((r for r in summary if r["sites"] == m and r["part"] == "processes"), {})
                    if beside.get("flower"):
                        row["flower"], row["flower_runs"] = beside["flower"], "those of the site-processes row"
                row["active/semi-honest"] = ratio(row["active"], row["semi-honest"])
                row["active/flower"] = ratio(row["active"], row.get("flower"))
                row["semi-honest/flower"] = ratio(row["semi-honest"], row.get("flower"))
                summary.append(row)
    aborts = {f"{m}": abort_probability(m) for m in args.sites} if not args.quick else {}
    result = {
        "issue": "48 point 6",
        "command": " ".join(["python", "bench/secagg_modes.py", *map(shlex.quote, sys.argv[1:])]),
        "machine": {**machine(), "loadavg_at_start": load, "loadavg_at_end": loadavg(),
                    "available_gib_at_end": round(available() / 2**30, 1)},
        "settings": {"length": LENGTH, "modulus_bits": BITS, "graph": "sparse (SecAgg+, degree 2 ceil(log2 m))",
                     "killed_in_mask": KILLED, "method_over_processes": "ddg_quantile, 1,024 bins, epsilon 1",
                     "repeats": args.repeats, "sizes": args.sites, "flower_sizes": args.flower_sites},
        "code": measured,
        # how often 10% of the sites dropped at random leaves some survivor's neighbourhood with
        # fewer than t survivors (the session then ends without a sum), with the protocol's own
        # graph and thresholds
        "abort_probability": aborts,
        "seconds": round(time.time() - began, 1),
        "summary": summary,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(table(summary))
    print(f"written {args.out}")


def not_run_flower(m: int, summary: list[dict]) -> str:
    """Why Flower was not run at m: extrapolated from the largest size it ran."""
    ran = [row for row in summary if row.get("flower")]
    if not ran:
        return f"not run at {m:,} clients (--flower-sites)"
    last = max(ran, key=lambda row: row["sites"])
    smaller = [row for row in ran if row["sites"] < last["sites"]]
    growth = ""
    if smaller:
        first = min(smaller, key=lambda row: row["sites"])
        exponent = (math.log(last["flower"]["time_s"] / first["flower"]["time_s"])
                    / math.log(last["sites"] / first["sites"]))
        growth = (f"; its time grew as m^{exponent:.1f} from {first['sites']:,}, which puts {m:,} near "
                  f"{last['flower']['time_s'] * (m / last['sites']) ** exponent / 3600:.0f} h")
    return (f"not run at {m:,} clients (--flower-sites): {last['flower']['time_s']:.0f} s at "
            f"{last['sites']:,} clients{growth}, past any limit of this benchmark")


if __name__ == "__main__":
    main()
