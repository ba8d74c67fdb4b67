"""Flower's SecAgg+ at the settings of bench/secagg_sum.py, for a speed comparison (issue 5).

Flower is the most used federated learning framework; its secure aggregation is the SecAgg+
workflow (`flwr.server.workflow.SecAggPlusWorkflow` with the client mod `secaggplus_mod`). This
script runs it in Flower's own simulation runtime (Ray) on m virtual clients that each return one
float vector of length 1024, and times the workflow's four stages (setup, share keys, collect
masked vectors, unmask) from the server side, so that Ray's start-up is not counted.

Flower is not a Quorum dependency: run this with an interpreter that has it, e.g.

    python -m venv /tmp/flwrenv && /tmp/flwrenv/bin/pip install -r bench/requirements-flower.txt
    /tmp/flwrenv/bin/python bench/flower_secagg.py [--sites 10 50 100 200] [--dropped 0 0.1]
                                                   [--out bench/results/flower_secagg.json]

Settings matched to bench/secagg_sum.py: vector length 1024, masks on Z_{2^32} (Flower's
`modulus_range`, its maximum), each client's key shared with its neighbours in a sparse graph
(Flower's `num_shares` = 2 ceil(log2 m) + 1 as in our default degree + the client itself,
`reconstruction_threshold` a strict majority of them). Flower quantizes floats to 2^22 levels
before masking; we sum integers already on the ring, so both mask and sum 1024 entries of Z_M.

--dropped f: a fraction f of the clients (partition ids drawn with a fixed seed) fail in the
masking stage, after they shared their keys: their fit raises, Flower's simulation answers the
server with an error message, and the workflow counts them dead and rebuilds their pairwise masks
from their neighbours' shares of their key (the same point as bench/secagg_agents.py's crashes in
the mask phase). Each row says how many were dropped, and checks the released vector against the
mean of the survivors' vectors (`max_abs_error`, Flower's quantization error: its inputs are
floats). Bytes per client up and down are each SecAgg+ stage's messages as Flower serializes them
(`message_to_proto`, what its gRPC transport would carry, without gRPC's framing); the simulation
itself passes objects in memory.
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
METER: dict = {"on": False, "down": {}, "up": {}, "result": None}


def client_vector(partition: int, length: int) -> np.ndarray:
    return np.random.default_rng(partition).uniform(-1, 1, length).astype(np.float32)


def lost_partitions(m: int, dropped: float) -> set[int]:
    return {int(p) for p in np.random.default_rng(1).choice(m, int(round(dropped * m)), replace=False)} if dropped else set()


def build_apps(m: int, length: int, dropped: float = 0.0):
    from flwr.client import ClientApp, NumPyClient
    from flwr.client.mod import secaggplus_mod
    from flwr.common import Context
    from flwr.server import LegacyContext, ServerApp, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
    from flwr.common.serde import message_to_proto

    lost = lost_partitions(m, dropped)

    class VectorClient(NumPyClient):
        def __init__(self, partition: int) -> None:
            self.partition = partition
            self.vector = client_vector(partition, length)

        def fit(self, parameters, config):
            if self.partition in lost:  # fit runs in the masking stage (secaggplus_mod): a dropout there
                raise RuntimeError(f"client {self.partition} dropped while masking (benchmark)")
            return [self.vector], 1, {}

    def client_fn(context: Context):
        return VectorClient(int(context.node_config["partition-id"])).to_client()

    def size(message) -> int:
        return message_to_proto(message).ByteSize()

    class MeteredGrid:
        """The server's grid, counting the serialized bytes of each message sent to and
        received from every node while a SecAgg+ stage runs."""

        def __init__(self, grid) -> None:
            self._grid = grid

        def __getattr__(self, name):
            return getattr(self._grid, name)

        def send_and_receive(self, messages, *args, **kwargs):
            messages = list(messages)
            if METER["on"]:
                for message in messages:
                    node = message.metadata.dst_node_id
                    METER["down"][node] = METER["down"].get(node, 0) + size(message)
            replies = self._grid.send_and_receive(messages, *args, **kwargs)
            if METER["on"]:
                replies = list(replies)
                for reply in replies:
                    node = reply.metadata.src_node_id
                    METER["up"][node] = METER["up"].get(node, 0) + size(reply)
            return replies

    class TimedSecAggPlus(SecAggPlusWorkflow):
        """The workflow as shipped, with each stage's wall time recorded."""

        def __getattribute__(self, name):
            attr = super().__getattribute__(name)
            if name.endswith("_stage") and callable(attr):
                def timed(*args, **kwargs):
                    began = time.perf_counter()
                    METER["on"] = True
                    try:
                        done = attr(*args, **kwargs)
                    finally:
                        TIMINGS[name] = time.perf_counter() - began
                        METER["on"] = False
                    if name == "unmask_stage" and done:
                        import flwr.compat.common.recorddict_compat as compat
                        from flwr.common import parameters_to_ndarrays
                        record = args[1].state.array_records["parameters"]
                        METER["result"] = parameters_to_ndarrays(compat.arrayrecord_to_parameters(record, True))[0]
                    return done
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
        workflow(MeteredGrid(grid), legacy)
        TIMINGS["round_total"] = time.perf_counter() - began

    client_app = ClientApp(client_fn=client_fn, mods=[secaggplus_mod])
    return server_app, client_app, shares, threshold


def run(m: int, length: int, dropped: float = 0.0) -> dict:
    from flwr.simulation import run_simulation

    TIMINGS.clear()
    METER.update(on=False, down={}, up={}, result=None)
    server_app, client_app, shares, threshold = build_apps(m, length, dropped)
    began = time.perf_counter()
    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=m,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    total = time.perf_counter() - began
    stages = {k: round(v, 4) for k, v in TIMINGS.items() if k.endswith("_stage")}
    lost = lost_partitions(m, dropped)
    expected = np.mean([client_vector(p, length) for p in range(m) if p not in lost], axis=0)
    result = METER["result"]
    nodes = set(METER["down"]) | set(METER["up"])
    return {"sites": m, "length": length, "num_shares": shares, "threshold": threshold,
            "dropped_fraction": dropped, "dropped": len(lost), "released": result is not None,
            "max_abs_error": None if result is None else float(np.max(np.abs(result - expected))),
            "secure_sum_s": round(sum(stages.values()), 4), "stages_s": stages,
            "bytes_up_per_site": float(np.mean([METER["up"].get(n, 0) for n in nodes])) if nodes else None,
            "bytes_down_per_site": float(np.mean([METER["down"].get(n, 0) for n in nodes])) if nodes else None,
            "round_with_fedavg_s": round(TIMINGS.get("round_total", math.nan), 4),
            "simulation_wall_s": round(total, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sites", type=int, nargs="+", default=[10, 50, 100, 200])
    parser.add_argument("--length", type=int, default=LENGTH)
    parser.add_argument("--dropped", type=float, nargs="+", default=[0.0],
                        help="fractions of the clients that fail while masking")
    parser.add_argument("--out", default="bench/results/flower_secagg.json")
    args = parser.parse_args()
    import flwr

    logging.getLogger("flwr").setLevel(logging.WARNING)
    rows = []
    for m in args.sites:
        for dropped in args.dropped:
            row = run(m, args.length, dropped)
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"flwr": flwr.__version__, "python": platform.python_version(),
                               "machine": platform.machine(), "rows": rows}, indent=2))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
