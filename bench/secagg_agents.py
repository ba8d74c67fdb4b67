"""SecAgg+ over site agents with sites killed mid-protocol (issue 21).

A secure sum of one vector per site (ddg_quantile's flat histogram: 1024 bins, ring Z_{2^32},
SecAgg+'s sparse graph) over CurveZMQ, sites in site hosts, default deadlines (30 s a phase).
10% of the sites (drawn with a fixed seed) crash in the mask phase: their connections close,
the coordinator's socket monitor makes them dropouts at once, and the sum is unmasked from the
survivors' shares. Reported: the secure session's time from events.jsonl (session_start to
session_end), with and without the crashes, the run's wall time and peak memory (bench/scale.py
watches them), and that the sum was released.

    python bench/secagg_agents.py [--sites 100 500 1000] [--method ddg_quantile|fedcp2_qq_secagg]
                                  [--killed 0 0.1] [--out bench/results/secagg_agents.json]

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


def method_entry(method: str, m: int, killed: float) -> dict:
    if method == "fedcp2_qq_secagg":
        # planned for no dropouts and released as a shortfall when sites are killed, so that the
        # sum is unmasked (on_shortfall: abort would stop before unmask)
        return {"name": "fedcp2_qq_secagg", "epsilon": 1.0, "on_shortfall": "report",
                "bins": {"count": 100, "lo": 0.0, "hi": 5.0}}
    return {"name": "ddg_quantile", "epsilon": 1.0, "modulus_bits": 32, "dropouts": int(round(killed * m)),
            "bins": {"count": BINS, "lo": 0.0, "hi": 4.0}}


def scenario(m: int, killed: float, method: str = "ddg_quantile") -> dict:
    faults = [{"action": "crash", "sites": {"fraction": killed, "seed": 1}, "phase": "mask",
               "method": method}] if killed else []
    return {
        "name": f"secagg-{m}-{int(killed * 100)}", "seed": 0, "trials": 1, "alpha": 0.1,
        # FedCP2-QQ needs the per-site data of shuffle-vs-local-m10000.yaml (301 calibration points)
        "data": {"source": "synthetic", "generator": "romano2019", "n": (430 if method == "fedcp2_qq_secagg" else 50) * m},
        "split": ({"train": 0.2, "calibration": 0.7, "test": 0.1} if method == "fedcp2_qq_secagg"
                  else {"train": 0.2, "calibration": 0.6, "test": 0.2}),
        # DDG's central claim over m sites, which each site books per release, is above the default limit of 10
        "sites": {"count": m, "sizes": "equal", "policy": {"max_epsilon": "unlimited"}},
        "model": {"kind": "ridge"},
        "methods": [method_entry(method, m, killed)],
        "runtime": {"deadlines": {"hello": 300, "join": 300, "respond": 120}},
        "faults": faults,
    }


def measure(m: int, killed: float, workdir: Path, method: str = "ddg_quantile") -> dict:
    result, out = run_watched(scenario(m, killed, method), workdir)
    result["killed_fraction"] = killed
    result["method"] = method
    if result["exit_code"] != 0:
        return result
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    start = next(e["ts"] for e in events if e["event"] == "session_start")
    end = next(e for e in events if e["event"] == "session_end")
    result["session_s"] = round(end["ts"] - start, 3)
    result["status"] = end["status"]
    result["dropouts"] = sorted({e["site"] for e in events if e["event"] == "dropout"})
    result["dropout_reasons"] = sorted({e["reason"].split(":")[0] for e in events if e["event"] == "dropout"})
    row = next(csv.DictReader(open(out / "results.csv")))
    result["answered"] = row["answered"]
    result["phase_s"] = {phase: round(seconds, 3) for (_, phase), seconds in phase_seconds(out).items()}
    result["dropouts"] = len(result["dropouts"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[100, 500, 1000])
    parser.add_argument("--method", choices=["ddg_quantile", "fedcp2_qq_secagg"], default="ddg_quantile")
    parser.add_argument("--killed", type=float, nargs="+", default=[0.0, 0.1])
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "secagg_agents.json"))
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="quorum-secagg-") as tmp:
        for m in args.sites:
            for killed in args.killed:
                result = measure(m, killed, Path(tmp), args.method)
                print(json.dumps(result), flush=True)
                runs.append(result)
    Path(args.out).write_text(json.dumps({"method": args.method, "runs": runs}, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
