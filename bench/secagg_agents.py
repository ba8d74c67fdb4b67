"""SecAgg+ over site agents with sites killed mid-protocol (issue 21).

A secure sum of one vector per site (ddg_quantile's flat histogram: 1024 bins, ring Z_{2^32},
SecAgg+'s sparse graph) over CurveZMQ, sites in site hosts, default deadlines (30 s a phase).
10% of the sites (drawn with a fixed seed) crash in the mask phase: their connections close,
the coordinator's socket monitor makes them dropouts at once, and the sum is unmasked from the
survivors' shares. Reported: the secure session's time from events.jsonl (session_start to
session_end), with and without the crashes, each phase's time, the bytes each site sent and
received in the session (mean over sites, from the run's ledger: summary.json `communication`),
the run's wall time and peak memory (bench/scale.py watches them), and that the sum was released.

--mode runs the protocol in each of SecAgg+'s modes (issue 48; the method's `secagg: {mode}`):
`active` (the default: signed keys, the graph every site recomputes, the consistency round) and
`semi-honest`, for which every site's policy says `secagg: semi-honest` (a site's default
policy refuses it). --sites-per-process sets runtime.placement.sites_per_process (default auto:
bench/scale.py's placement); --respond the deadline of a phase (a 10,000-site phase runs 10,000
sites' key agreements and signature checks on two cores: a minute or more). --seed is the
scenario's seed: it draws the session nonce (so the graph) and, with seed + 1, which sites crash.

    python bench/secagg_agents.py [--sites 100 500 1000] [--method ddg_quantile|fedcp2_qq_secagg]
                                  [--killed 0 0.1] [--mode active semi-honest]
                                  [--sites-per-process auto|N] [--respond 120] [--seed 0]
                                  [--out bench/results/secagg_agents.json]

--method fedcp2_qq_secagg sums FedCP2-QQ's one-hot bins instead (100 bins at epsilon 1, the
secure sum of scenarios/scale/shuffle-vs-local-m10000.yaml).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_links import phase_seconds  # noqa: E402
from scale import ROOT, run_watched  # noqa: E402

BINS = 1024


def method_entry(method: str, m: int, killed: float, mode: str = "active") -> dict:
    if method == "fedcp2_qq_secagg":
        # planned for no dropouts and released as a shortfall when sites are killed, so that the
        # sum is unmasked (on_shortfall: abort would stop before unmask)
        return {"name": "fedcp2_qq_secagg", "epsilon": 1.0, "on_shortfall": "report",
                "bins": {"count": 100, "lo": 0.0, "hi": 5.0}, "secagg": {"mode": mode}}
    return {"name": "ddg_quantile", "epsilon": 1.0, "modulus_bits": 32, "dropouts": int(round(killed * m)),
            "bins": {"count": BINS, "lo": 0.0, "hi": 4.0}, "secagg": {"mode": mode}}


def scenario(m: int, killed: float, method: str = "ddg_quantile", mode: str = "active",
             sites_per_process="auto", respond: float = 120.0, seed: int = 0) -> dict:
    """seed: the scenario's seed, which draws the data, the session nonce (so the graph) and,
    with seed + 1, the sites that crash: one seed, one draw of who drops where in the graph."""
    faults = [{"action": "crash", "sites": {"fraction": killed, "seed": seed + 1}, "phase": "mask",
               "method": method}] if killed else []
    return {
        "name": f"secagg-{mode}-{m}-{int(killed * 100)}", "seed": seed, "trials": 1, "alpha": 0.1,
        # FedCP2-QQ needs the per-site data of shuffle-vs-local-m10000.yaml (301 calibration points)
        "data": {"source": "synthetic", "generator": "romano2019", "n": (430 if method == "fedcp2_qq_secagg" else 50) * m},
        "split": ({"train": 0.2, "calibration": 0.7, "test": 0.1} if method == "fedcp2_qq_secagg"
                  else {"train": 0.2, "calibration": 0.6, "test": 0.2}),
        # DDG's central claim over m sites, which each site books per release, is above the default limit of 10
        # (and a site takes part in the semi-honest protocol only where its policy says so)
        # and the sites' own budget must cover one release at DDG's delta of 1e-5 (the default's
        # delta is 1e-6), as in scenarios/secagg-speed.yaml
        "sites": {"count": m, "sizes": "equal",
                  **({} if method == "fedcp2_qq_secagg" else {"budget": {"epsilon": 3, "delta": 1e-4}}),
                  "policy": {"max_epsilon": "unlimited", **({"secagg": "semi-honest"} if mode == "semi-honest" else {})}},
        "model": {"kind": "ridge"},
        "methods": [method_entry(method, m, killed, mode)],
        "runtime": {"deadlines": {"hello": 300, "join": 300, "respond": respond},
                    "placement": {"sites_per_process": sites_per_process}},
        "faults": faults,
    }


def measure(m: int, killed: float, workdir: Path, method: str = "ddg_quantile", mode: str = "active",
            sites_per_process="auto", respond: float = 120.0, seed: int = 0) -> dict:
    result, out = run_watched(scenario(m, killed, method, mode, sites_per_process, respond, seed), workdir)
    return read_run(result, out, killed, method, mode)


def read_run(result: dict, out: Path, killed: float, method: str, mode: str) -> dict:
    """The measures of a finished run (`result`: bench/scale.py's watch of it) from its run
    directory `out`."""
    result["killed_fraction"] = killed
    result["method"] = method
    result["mode"] = mode
    if result["exit_code"] != 0:
        return result
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    start = next(e["ts"] for e in events if e["event"] == "session_start")
    end = next(e for e in events if e["event"] == "session_end")
    result["session_s"] = round(end["ts"] - start, 3)
    result["status"] = end["status"]
    if end.get("reason"):
        result["reason"] = end["reason"][:500]
    result["dropouts"] = sorted({e["site"] for e in events if e["event"] == "dropout"})
    result["dropout_reasons"] = sorted({e["reason"].split(":")[0] for e in events if e["event"] == "dropout"})
    row = next(csv.DictReader(open(out / "results.csv")))
    result["answered"] = row["answered"]
    result["phase_s"] = {phase: round(seconds, 3) for (_, phase), seconds in phase_seconds(out).items()}
    result["dropouts"] = len(result["dropouts"])
    placed = next((e for e in events if e["event"] == "placement"), None)
    if placed:
        result["placement"] = {k: placed.get(k) for k in ("processes", "sites_per_process", "why")}
    cost = json.loads((out / "summary.json").read_text())["communication"].get(method)
    if cost:  # the session's own messages (trial setup and connections are reported apart)
        result["bytes_up_per_site"] = round(cost["bytes_up_per_site_mean"], 1)
        result["bytes_down_per_site"] = round(cost["bytes_down_per_site_mean"], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--method", choices=["ddg_quantile", "fedcp2_qq_secagg"], default="ddg_quantile")
    parser.add_argument("--killed", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--mode", nargs="+", choices=["active", "semi-honest"], default=["active"])
    parser.add_argument("--sites-per-process", default="auto", type=lambda v: v if v == "auto" else int(v))
    parser.add_argument("--respond", type=float, default=120.0, help="seconds a phase may take")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "secagg_agents.json"))
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="quorum-secagg-") as tmp:
        for m in args.sites:
            for killed in args.killed:
                for mode in args.mode:
                    result = measure(m, killed, Path(tmp), args.method, mode, args.sites_per_process, args.respond,
                                     args.seed)
                    print(json.dumps(result), flush=True)
                    runs.append(result)
    Path(args.out).write_text(json.dumps({"method": args.method, "runs": runs}, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
