"""What N authenticated ZeroMQ connections cost on this machine before any Quorum code runs: the
floor under a run's start-up and memory (issue 40, point 2).

One process binds a ROUTER (CurveZMQ server, or plain TCP with --plain); child processes of
`--per-process` DEALERs each (as site hosts hold their sites) make a key pair per DEALER, connect
and send one 100-byte hello. Reported: the wall time from the first child's start to the last
hello's arrival, the CPU (user and system) of all the processes, and their peak memory
(proportional set size, summed, sampled every 0.2 s). No ZAP handler runs, so the server checks
no client key: a lower bound on what Quorum's authenticated connections cost.

    python bench/connection_floor.py [--sites 2000 10000] [--per-process 2000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import threading
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from scale import pss  # noqa: E402  (the same memory measure as the scale benchmark)


def dealers(endpoint: str, server_public: bytes | None, count: int, done) -> None:
    """A child: `count` DEALERs, each with its own key pair, connected and saying hello; then
    wait until the parent has every hello (done is set) before closing."""
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, count + 16)
    sockets = []
    for _ in range(count):
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        if server_public is not None:
            public, secret = zmq.curve_keypair()
            socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = server_public, public, secret
        socket.connect(endpoint)
        socket.send(b"x" * 100)
        sockets.append(socket)
    done.wait()
    for socket in sockets:
        socket.close(0)
    context.term()


def cpu_seconds(pid: int) -> tuple[float, float]:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def measure(sites: int, per_process: int, curve: bool) -> dict:
    context = zmq.Context(io_threads=2)  # as the coordinator's channel
    context.set(zmq.MAX_SOCKETS, 64)
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.BACKLOG, 4096)
    server_public = None
    if curve:
        server_public, secret = zmq.curve_keypair()
        router.curve_server, router.curve_publickey, router.curve_secretkey = True, server_public, secret
    port = router.bind_to_random_port("tcp://127.0.0.1")
    spawn = multiprocessing.get_context("fork")
    done = spawn.Event()
    children = [spawn.Process(target=dealers, args=(f"tcp://127.0.0.1:{port}", server_public,
                                                     min(per_process, sites - start), done))
                for start in range(0, sites, per_process)]
    peak, watching = [0], [True]

    def sample() -> None:
        total = pss(os.getpid()) + sum(pss(child.pid) for child in children if child.pid)
        peak[0] = max(peak[0], total)

    def watch() -> None:
        while watching[0]:
            sample()
            time.sleep(0.2)

    began = time.monotonic()
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    for child in children:
        child.start()
    threading.Thread(target=watch, daemon=True).start()
    heard = 0
    while heard < sites:
        if router.poll(120_000):
            router.recv_multipart()
            heard += 1
        else:
            break
    seconds = time.monotonic() - began
    usage = resource.getrusage(resource.RUSAGE_SELF)
    user, system = usage.ru_utime - cpu_before.ru_utime, usage.ru_stime - cpu_before.ru_stime
    for child in children:
        child_user, child_system = cpu_seconds(child.pid)
        user, system = user + child_user, system + child_system
    watching[0] = False
    sample()  # every connection is up: a run shorter than the watcher's period is measured too
    done.set()
    for child in children:
        child.join(30)
    router.close(0)
    context.term()
    return {"sites": sites, "security": "curve" if curve else "plain", "processes": len(children) + 1,
            "heard": heard, "seconds_to_all_hellos": round(seconds, 2), "cpu_user_s": round(user, 2),
            "cpu_system_s": round(system, 2), "peak_memory_gib": round(peak[0] / 2**30, 3),
            "memory_per_connection_kb": round(peak[0] / sites / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--per-process", type=int, default=2000)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "connection_floor.json"))
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a descriptor per connection here, two per DEALER
    runs = []
    for sites in args.sites:
        for curve in (False, True):
            result = measure(sites, args.per_process, curve)
            print(json.dumps(result), flush=True)
            runs.append(result)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": runs}, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
