"""Flower's SecAgg+ at the settings of bench/secagg_sum.py, for a speed comparison (issue 5).

Flower is the most used federated learning framework; its secure aggregation is the SecAgg+
workflow (`flwr.server.workflow.SecAggPlusWorkflow` with the client mod `secaggplus_mod`). This
script runs it in Flower's own simulation runtime (Ray) on m virtual clients that each return one
float vector of length 1024, and times the workflow's four stages (setup, share keys, collect
masked vectors, unmask) from the server side, so that Ray's start-up is not counted.

Flower is not a Quorum dependency: run this with an interpreter that has it, e.g.

    python -m venv /tmp/flwrenv && /tmp/flwrenv/bin/pip install -r bench/requirements-flower.txt
    /tmp/flwrenv/bin/python bench/flower_secagg.py [--sites 10 50 100 200] [--out bench/results/flower_secagg.json]

Settings matched to bench/secagg_sum.py: vector length 1024, masks on Z_{2^32} (Flower's
`modulus_range`, its maximum), each client's key shared with its neighbours in a sparse graph
(Flower's `num_shares` = 2 ceil(log2 m) + 1 as in our default degree + the client itself,
`reconstruction_threshold` a strict majority of them). Flower quantizes floats to 2^22 levels
before masking; we sum integers already on the ring, so both mask and sum 1024 entries of Z_M.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

LENGTH = 1024
TIMINGS: dict[str, float] = {}


def build_apps(m: int, length: int):
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import Context
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    class VectorClient(NumPyClient):
        def __init__(self, seed: int) -> None:
            self.vector = np.random.default_rng(seed).uniform(-1, 1, length).astype(np.float32)

        def fit(self, parameters, config):
            return [self.vector], 1, {}

    def client_fn(context: Context):
        return VectorClient(int(context.node_id) % (2 ** 31)).to_client()

    class TimedSecAggPlus(SecAggPlusWorkflow):
        """The workflow as shipped, with each stage's wall time recorded."""

        def __getattribute__(self, name):
            attr = super().__getattribute__(name)
            if name.endswith("_stage") and callable(attr):
                def timed(*args, **kwargs):
                    began = time.perf_counter()
                    try:
                        return attr(*args, **kwargs)
                    finally:
                        TIMINGS[name] = time.perf_counter() - began
                return timed
            return attr

    degree = 2 * math.ceil(math.log2(m))
    shares = min(m, degree + 1)
    threshold = shares // 2 + 1
    server_app = ServerApp()

    @server_app.main()
    def main(grid, context: Context) -> None:
        strategy = FedAvg(fraction_fit=1.0, min_fit_clients=m, min_available_clients=m, fraction_evaluate=0.0,
                          initial_parameters=None)
        legacy = LegacyContext(context=context, config=ServerConfig(num_rounds=1), strategy=strategy)
        workflow = DefaultWorkflow(fit_workflow=TimedSecAggPlus(
            num_shares=shares, reconstruction_threshold=threshold, clipping_range=1.0,
            modulus_range=2 ** 32, max_weight=1.0))
        began = time.perf_counter()
        workflow(grid, legacy)
        TIMINGS["round_total"] = time.perf_counter() - began

    client_app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
    return server_app, client_app, shares, threshold


def run(m: int, length: int) -> dict:
    from flwr.simulation import run_simulation

    TIMINGS.clear()
    server_app, client_app, shares, threshold = build_apps(m, length)
    began = time.perf_counter()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=m,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    total = time.perf_counter() - began
    stages = {k: round(v, 4) for k, v in TIMINGS.items() if k.endswith("_stage")}
    return {"sites": m, "length": length, "num_shares": shares, "threshold": threshold,
            "secure_sum_s": round(sum(stages.values()), 4), "stages_s": stages,
            "round_with_fedavg_s": round(TIMINGS.get("round_total", math.nan), 4),
            "simulation_wall_s": round(total, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sites", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--length", type=int, default=LENGTH)
    parser.add_argument("--out", default="bench/results/flower_secagg.json")
    args = parser.parse_args()
    import flwr

    logging.getLogger("flwr").setLevel(logging.WARNING)
    rows = []
    for m in args.sites:
        row = run(m, args.length)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"flwr": flwr.__version__, "python": platform.python_version(),
                               "machine": platform.machine(), "rows": rows}, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
