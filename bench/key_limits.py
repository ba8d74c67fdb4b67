"""Limits per key (issue 48, point 5): what one key can cost a CURVE RouterChannel, however many
connections it opens.

Three measurements over 127.0.0.1, each against a fresh RouterChannel in this process (its ZAP
handler, one allow-listed flooding key `site-x` and one honest key `site-h`), the flooder a child
process:

- queue: the flooder opens C connections with site-x and sends max-size messages (8 MiB) as fast
  as they go for 4 s while the channel reads nothing; reported, the growth of this process's RSS
  against `queue_bound` (RECEIVE_QUEUE messages of at most MAXMSGSIZE);
- descriptors: the flooder opens N connections with site-x and sends 1 MiB messages for 4 s while
  the channel reads; reported, the server side's ESTABLISHED connections (most and median over
  2 s), how many handshakes waited or were refused, and how long after an honest site (site-h)
  dialled the channel read its hello;
- restart: a site dials, says hello and closes, and the next dials at once, six times; reported,
  the milliseconds from each dial to its hello being read.

    python bench/key_limits.py [--connections 1 4 50] [--flood 400] [--out bench/results/key_limits.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zmq  # noqa: E402

from transport.channel import DealerChannel, RouterChannel, queue_bound  # noqa: E402
from transport.security import ClientKeys, ServerKeys, new_key_pair  # noqa: E402

FLOODER = textwrap.dedent("""
    import sys, time, zmq
    endpoint, server, public, secret, connections, size, seconds = sys.argv[1:8]
    context = zmq.Context()
    sockets = []
    for _ in range(int(connections)):
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SNDHWM, 2)
        socket.curve_serverkey, socket.curve_publickey, socket.curve_secretkey = \\
            server.encode(), public.encode(), secret.encode()
        socket.connect(endpoint)
        sockets.append(socket)
    message, sent, end = b"\\0" * int(size), 0, time.time() + float(seconds)
    while time.time() < end:
        progressed = False
        for socket in sockets:
            try:
                socket.send(message, zmq.NOBLOCK)
                sent, progressed = sent + 1, True
            except zmq.Again:
                pass
        if not progressed:
            time.sleep(0.01)
    print(sent, flush=True)
""")


def rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    return 0.0


def established(port: int) -> int:
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                count += 1
    return count


def setup():
    server_public, server_secret = new_key_pair()
    flood, honest = new_key_pair(), new_key_pair()
    channel = RouterChannel("tcp://127.0.0.1:*", keys=ServerKeys(server_public, server_secret,
                                                                 {flood[0]: "site-x", honest[0]: "site-h"}))
    return channel, server_public, flood, honest


def flooder(channel, server_public, flood, connections: int, size: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", FLOODER, channel.endpoint, server_public.decode(),
                             flood[0].decode(), flood[1].decode(), str(connections), str(size), str(seconds)],
                            stdout=subprocess.PIPE, text=True)


def queue(connections: int) -> dict:
    channel, server_public, flood, _ = setup()
    try:
        time.sleep(0.2)
        base = rss_mib()
        process = flooder(channel, server_public, flood, connections, 8 << 20, 4.0)
        peak = 0.0
        while process.poll() is None:
            time.sleep(0.1)
            peak = max(peak, rss_mib() - base)
        sent = int(process.stdout.read())
        return {"connections": connections, "rss_growth_mib": round(peak, 1),
                "queue_bound_mib": round(queue_bound() / 2**20, 2), "messages_sent": sent,
                "waited": sum(channel.connections.waited.values()),
                "refused": sum(channel.connections.refused.values())}
    finally:
        channel.close()


def descriptors(connections: int) -> dict:
    channel, server_public, flood, honest = setup()
    port = int(channel.endpoint.rsplit(":", 1)[1])
    process = flooder(channel, server_public, flood, connections, 1 << 20, 4.0)
    try:
        samples, until = [], time.monotonic() + 2.0
        while time.monotonic() < until:
            channel.receive(0.05)
            samples.append(established(port))
        context = zmq.Context.instance()
        site = DealerChannel(channel.endpoint, "site-h", keys=ClientKeys(server_public, *honest), context=context)
        began = time.monotonic()
        site.send("hello", 0, {"pid": 1})
        heard = None
        while heard is None and time.monotonic() - began < 10:
            incoming = channel.receive(0.5)
            if incoming is not None and incoming.peer == "site-h":
                heard = time.monotonic() - began
        site.close()
        return {"connections": connections, "established_most": max(samples),
                "established_median": sorted(samples)[len(samples) // 2],
                "waited": sum(channel.connections.waited.values()),
                "refused": sum(channel.connections.refused.values()),
                "honest_hello_read_after_ms": None if heard is None else round(heard * 1000, 1)}
    finally:
        process.kill()
        process.wait()
        channel.close()


def restart(lives: int = 6) -> dict:
    channel, server_public, _, honest = setup()
    context = zmq.Context()
    times = []
    try:
        for life in range(lives):
            began = time.monotonic()
            site = DealerChannel(channel.endpoint, "site-h", keys=ClientKeys(server_public, *honest), context=context)
            site.send("hello", 0, {"pid": life})
            while time.monotonic() - began < 10:
                incoming = channel.receive(0.5)
                if incoming is not None and incoming.envelope is not None and incoming.envelope.payload["pid"] == life:
                    break
            times.append(round((time.monotonic() - began) * 1000, 1))
            site.close()
        return {"lives": lives, "dial_to_hello_read_ms": times, "waited": sum(channel.connections.waited.values())}
    finally:
        channel.close()
        context.term()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 4, 50])
    parser.add_argument("--flood", type=int, default=400)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "key_limits.json"))
    args = parser.parse_args()
    result = {"machine": f"{platform.machine()}, {platform.node()}", "zmq": zmq.zmq_version(),
              "queue": [queue(c) for c in args.connections], "descriptors": descriptors(args.flood),
              "restart": restart()}
    print(json.dumps(result, indent=2))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
