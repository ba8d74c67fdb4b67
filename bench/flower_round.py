"""Side by side in one run: a round in which each of m clients returns one float, in Flower's
simulation runtime and in Quorum over site hosts, at m = 100, 1,000 and 10,000 (issue 21).

Flower (1.41, `flwr[simulation]`, bench/requirements-flower.txt) runs its simulation runtime:
a ServerApp with FedAvg for one round, m virtual ClientApps each returning a one-float array,
executed by Ray actors (one per core, Flower's default of one CPU per client). Its round is
timed inside the ServerApp, from the round's start to the end of aggregation, so Ray's
start-up is reported apart. Ray is told to use 127.0.0.1 as its node address.

Quorum runs the same m as `run.py run` of bench/scale.py's scenario with FedCP-QQ only, one
trial: each site answers the coordinator's question with one float (its local quantile), over
ZeroMQ with CurveZMQ, from site hosts placed automatically. Its round is the FedCP-QQ session
(events.jsonl); the trial's open (sites load the model and score their rows) and the start-up
(processes, keys, handshakes) are reported apart, and the whole run's wall time too.

Both are watched the same way (bench/scale.py's `watch`: PSS of the process and every
descendant every 0.2 s, killed if the machine runs low on memory). Run it with Quorum's
interpreter, naming Flower's:

    python -m venv /tmp/flwrenv && /tmp/flwrenv/bin/pip install -r bench/requirements-flower.txt
    python bench/flower_round.py --flower-python /tmp/flwrenv/bin/python \\
        [--sites 100 1000 10000] [--out bench/results/flower_round.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # bench/scale.py's run_one and watch (Quorum's interpreter only)


def flower_worker(m: int, out: Path) -> None:
    """Runs under Flower's interpreter: one FedAvg round over m simulated clients."""
    import numpy as np
    from flwr.client import ClientApp, NumPyClient
    from flwr.common import Context
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    logging.getLogger("flwr").setLevel(logging.WARNING)
    marks: dict[str, float] = {}

    class OneFloat(NumPyClient):
        def __init__(self, value: float) -> None:
            self.value = value

        def fit(self, parameters, config):
            return [np.array([self.value])], 1, {}

    def client_fn(context: Context):
        return OneFloat(float(int(context.node_id) % 1000) / 1000.0).to_client()

    class TimedFedAvg(FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            marks.setdefault("round_start", time.perf_counter())
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            aggregated = super().aggregate_fit(server_round, results, failures)
            marks["round_end"] = time.perf_counter()
            marks["results"], marks["failures"] = len(results), len(failures)
            return aggregated

    def server_fn(context: Context):
        strategy = TimedFedAvg(fraction_fit=1.0, min_fit_clients=m, min_available_clients=m,
                               fraction_evaluate=0.0, min_evaluate_clients=0,
                               initial_parameters=None)
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=1))

    began = time.perf_counter()
    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                   num_supernodes=m,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"_node_ip_address": "127.0.0.1", "include_dashboard": False}})
    import flwr

    out.write_text(json.dumps({
        "flwr": flwr.__version__, "clients": m,
        "round_s": round(marks["round_end"] - marks["round_start"], 3) if "round_end" in marks else None,
        "results": marks.get("results"), "failures": marks.get("failures"),
        "simulation_s": round(time.perf_counter() - began, 2)}))


def quorum_side(m: int, workdir: Path) -> dict:
    from scale import run_one

    run = run_one(m, 1, workdir, methods=("fedcp_qq",))
    if run["exit_code"] != 0:
        return {"error": run.get("stopped") or run.get("output_tail", "")[-500:], **run}
    trial = run["trials_timing"][0]
    return {"round_s": trial["sessions_s"], "trial_open_s": trial["open_s"],
            "start_to_first_trial_s": run["start_to_first_trial_s"], "whole_run_s": run["wall_s"],
            "peak_memory_gib": run["peak_memory_gib"], "placement": run["placement"],
            "answered": trial["joined"], "coverage": run["coverage"]["fedcp_qq"]}


def flower_side(m: int, flower_python: str, workdir: Path) -> dict:
    from scale import watch

    out = workdir / f"flower-{m}.json"
    watched = watch([flower_python, str(Path(__file__).resolve()), "--worker", str(m), "--worker-out", str(out)])
    if watched["exit_code"] != 0 or not out.exists():
        return {"error": watched["stopped"] or watched["output"][-800:], "wall_s": watched["wall_s"],
                "peak_memory_gib": watched["peak_memory_gib"]}
    result = json.loads(out.read_text())
    return {"round_s": result["round_s"], "simulation_s": result["simulation_s"], "whole_run_s": watched["wall_s"],
            "peak_memory_gib": watched["peak_memory_gib"], "answered": result["results"],
            "failures": result["failures"], "flwr": result["flwr"]}


def ratio(a, b):
    return round(a / b, 2) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--flower-python", help="an interpreter with bench/requirements-flower.txt installed")
    parser.add_argument("--out", default=str(HERE / "results" / "flower_round.json"))
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        flower_worker(args.worker, Path(args.worker_out))
        return
    if not args.flower_python:
        parser.error("--flower-python is required: Flower is not a Quorum dependency (see the docstring)")
    rows = []
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="quorum-vs-flower-") as tmp:
        for m in args.sites:
            row = {"clients": m, "flower": flower_side(m, args.flower_python, Path(tmp)),
                   "quorum": quorum_side(m, Path(tmp))}
            row["flower_over_quorum"] = {key: ratio(row["flower"].get(key), row["quorum"].get(key))
                                         for key in ("round_s", "whole_run_s", "peak_memory_gib")}
            print(json.dumps(row), flush=True)
            rows.append(row)
            out.write_text(json.dumps({"machine": {"cores": os.cpu_count(), "platform": platform.platform()},
                                       "rows": rows}, indent=2))  # written after each m: nothing lost
    print(f"written {out}")


if __name__ == "__main__":
    main()
