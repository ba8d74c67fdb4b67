"""Do idle connections to live peers survive TCP keepalive when thousands go idle together?

The finding behind transport.channel's keepalive policy (issue 21). A ROUTER, as the
coordinator's, accepts m DEALER connections from two client processes (one message each, then
silence while the clients stay alive) with the given keepalive settings, and counts for `hold`
seconds what its socket monitor reports as disconnected, with the kernel's counters around it:
TCPAbortOnTimeout (connections the kernel gave up on), TCPKeepAlive (probes sent),
the drops of the per-CPU input queue (/proc/net/softnet_stat, column 2: packets dropped because
more than net.core.netdev_max_backlog were waiting) and ListenOverflows.

Connections that went idle in the same second are probed in the same timer tick: on loopback
every probe and its answer pass through that input queue, so a burst of thousands overflows it
and some probes are lost. A connection is aborted when KEEPALIVE_PROBES probes in a row are lost.
Linux only (it reads /proc).

    python bench/keepalive_bursts.py [--sites 10000] [--hold 40] [--out bench/results/keepalive_bursts.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import resource
import time
from pathlib import Path

import zmq
from zmq.utils.monitor import recv_monitor_message

CLIENT_PROCESSES = 2
#: (label, keepalive idle s, interval s, probes); None: keepalive off. Short idle and interval so
#: that several rounds of probes fit in `hold` seconds; the loss per burst does not depend on them.
SETTINGS = [("off", None), ("3 probes", (5, 2, 3)), ("9 probes", (5, 2, 9))]


def kernel_counters() -> dict[str, int]:
    head, values = open("/proc/net/netstat").read().split("\n")[:2]
    tcp = dict(zip(head.split()[1:], map(int, values.split()[1:])))
    dropped = sum(int(line.split()[1], 16) for line in open("/proc/net/softnet_stat"))
    return {"aborted_on_timeout": tcp["TCPAbortOnTimeout"], "keepalive_probes": tcp["TCPKeepAlive"],
            "input_queue_drops": dropped, "listen_overflows": tcp["ListenOverflows"]}


def clients(endpoint: str, count: int, first: int, hold: float) -> None:
    """`count` live DEALERs, each sending one message, then idle for `hold` seconds."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, count + 16)
    sockets = []
    for i in range(count):
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.ROUTING_ID, str(first + i).encode())
        socket.connect(endpoint)
        socket.send(b"hello")
        sockets.append(socket)
    time.sleep(hold)
    for socket in sockets:
        socket.close()
    context.term()


def trial(sites: int, hold: float, keepalive: tuple[int, int, int] | None) -> dict:
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.BACKLOG, 4096)
    router.setsockopt(zmq.TCP_KEEPALIVE, 0 if keepalive is None else 1)
    if keepalive is not None:
        for option, value in zip((zmq.TCP_KEEPALIVE_IDLE, zmq.TCP_KEEPALIVE_INTVL, zmq.TCP_KEEPALIVE_CNT), keepalive):
            router.setsockopt(option, value)
    router.monitor("inproc://keepalive-bursts", zmq.EVENT_DISCONNECTED)
    monitor = context.socket(zmq.PAIR)
    monitor.connect("inproc://keepalive-bursts")
    router.bind("tcp://127.0.0.1:*")
    endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
    before, start = kernel_counters(), time.monotonic()
    share = sites // CLIENT_PROCESSES
    processes = [multiprocessing.Process(target=clients, args=(endpoint, share, k * share, hold + 5))
                 for k in range(CLIENT_PROCESSES)]
    for process in processes:
        process.start()
    received = disconnected = 0
    while time.monotonic() - start < hold:
        if router.poll(100):
            router.recv_multipart()
            received += 1
        while monitor.poll(0):
            recv_monitor_message(monitor)
            disconnected += 1
    after = kernel_counters()
    for process in processes:
        process.join()
    context.destroy(linger=0)
    return {"keepalive": None if keepalive is None else dict(zip(("idle_s", "interval_s", "probes"), keepalive)),
            "received": received, "reported_disconnected": disconnected,
            **{name: after[name] - before[name] for name in after}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=10_000)
    parser.add_argument("--hold", type=float, default=40.0, help="seconds the connections stay idle")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "keepalive_bursts.json")
    args = parser.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    rows = []
    for label, keepalive in SETTINGS:
        row = {"setting": label, **trial(args.sites, args.hold, keepalive)}
        print(json.dumps(row))
        rows.append(row)
    backlog = Path("/proc/sys/net/core/netdev_max_backlog").read_text().strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"sites": args.sites, "hold_s": args.hold, "netdev_max_backlog": int(backlog),
                                    "cpus": multiprocessing.cpu_count(), "kernel": platform.release(),
                                    "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
