"""One authenticated hostile peer against a live coordinator: memory and the honest sessions' time.

Issue 36, point 3. A CURVE coordinator (this process's main thread) runs `sessions` FedCP-QQ
sessions over `sites` honest sites (each a thread with its own authenticated DEALER) twice, each
run in a fresh process: once alone, once while one more peer, holding a valid key of its own
(`site-hostile`), floods it from another process with valid-looking envelopes carrying map bombs
(4 MiB of nested empty maps: about 4 million containers each), oversized control messages and
garbage, as fast as its socket lets it. Reported per run: the coordinator process's peak RSS
(ru_maxrss), each session's wall time, what was rejected; and the ratios hostile / alone.

    python bench/hostile_peer.py [--sites 8] [--sessions 20] [--out bench/results/hostile_peer.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import msgpack
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from coordinator.driver import Coordinator, Deadlines  # noqa: E402
from coordinator.events import EventLog  # noqa: E402
from protocol.methods import METHODS  # noqa: E402
from transport.channel import RouterChannel, DealerChannel  # noqa: E402
from transport.security import generate_keys, load_client_keys, load_server_keys  # noqa: E402

HOSTILE = "site-hostile"


def honest_site(endpoint: str, site_id: str, keys, stop: threading.Event) -> None:
    import zmq

    scores = np.random.default_rng(int(site_id[-3:])).standard_normal(40)
    channel = DealerChannel(endpoint, site_id, keys=keys, context=zmq.Context.instance())
    channel.send("hello", 0, {"pid": 1})
    while not stop.is_set():
        incoming = channel.receive(0.05)
        if incoming is None or incoming.envelope is None:
            continue
        env = incoming.envelope
        if env.type == "open":
            channel.send("join", env.session, {"n": len(scores), "device": "cpu"})
        elif env.type == "request":
            ell = env.payload["body"]["ell"]
            channel.send("response", env.session, {"phase": env.payload["phase"], "body": float(np.sort(scores)[ell - 1])})
        elif env.type == "shutdown":
            break
    channel.close()


def bomb(session: int, seq: int) -> bytes:
    """A CRC-valid `response` whose body is 64 lists of 65,536 empty maps (4 MiB)."""
    body = [[{}] * 65536 for _ in range(64)]
    packed = msgpack.packb({"v": 1, "t": "response", "s": session, "f": HOSTILE, "n": seq,
                            "p": {"phase": "respond", "body": body}}, use_bin_type=True)
    return packed + zlib.crc32(packed).to_bytes(4, "little")


def big_join(seq: int) -> bytes:
    packed = msgpack.packb({"v": 1, "t": "join", "s": 0, "f": HOSTILE, "n": seq,
                            "p": {"n": 10, "device": "x" * 500_000}}, use_bin_type=True)
    return packed + zlib.crc32(packed).to_bytes(4, "little")


HOSTILE_CODE = """
import sys, time, zmq
sys.path.insert(0, {root!r})
sys.path.insert(0, {bench!r})
from hostile_peer import HOSTILE, bomb, big_join
from transport.security import load_client_keys, secure_client
keys = load_client_keys({keys!r}, HOSTILE)
socket = zmq.Context.instance().socket(zmq.DEALER)
socket.setsockopt(zmq.LINGER, 0)
socket.setsockopt(zmq.SNDHWM, 4)
secure_client(socket, keys)
socket.connect({endpoint!r})
messages = [bomb(1, 1), big_join(2), b"\\x00" * 1000]
sent, end = 0, time.monotonic() + {seconds}
while time.monotonic() < end:
    try:
        socket.send(messages[sent % 3], flags=zmq.NOBLOCK)
        sent += 1
    except zmq.Again:
        time.sleep(0.001)
print(sent)
"""


def one_run(hostile: bool, sites: int, sessions: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="hostile-"))
    ids = [f"site-{j:03d}" for j in range(sites)]
    keys = generate_keys(work / "keys", [*ids, HOSTILE])
    channel = RouterChannel("tcp://127.0.0.1:*", keys=load_server_keys(keys, [*ids, HOSTILE]))
    events = EventLog(work / "events.jsonl")
    coordinator = Coordinator(channel, events, Deadlines(hello=30, join=30, respond=30))
    stop = threading.Event()
    threads = [threading.Thread(target=honest_site, args=(channel.endpoint, s, load_client_keys(keys, s), stop),
                                daemon=True) for s in ids]
    for thread in threads:
        thread.start()
    flood = None
    if hostile:
        code = HOSTILE_CODE.format(root=str(ROOT), bench=str(ROOT / "bench"), keys=str(keys),
                                   endpoint=channel.endpoint, seconds=sessions * 2 + 30)
        flood = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        members = coordinator.await_members(ids)
        sizes, _ = coordinator.open_trial(0, 0, members)
        times, statuses = [], []
        for index in range(sessions):
            began = time.perf_counter()
            outcome = coordinator.run_method(0, index, METHODS["fedcp_qq"](0.1), sizes)
            times.append(time.perf_counter() - began)
            statuses.append(outcome.status)
    finally:
        stop.set()
        if flood is not None:
            flood.kill()
        channel.close()
    rejected = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()
                if '"rejected"' in line]
    return {"hostile": hostile, "sites": sites, "sessions": sessions,
            "session_seconds_median": float(np.median(times)), "session_seconds_max": float(np.max(times)),
            "statuses": sorted(set(statuses)), "answered_all": statuses.count("ok") + statuses.count("infinite") == sessions,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "rejected": len(rejected),
            "rejected_reasons": sorted({r.get("reason", "")[:80] for r in rejected})[:5]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "hostile_peer.json"))
    parser.add_argument("--one", choices=["alone", "hostile"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.one == "hostile", args.sites, args.sessions)))
        return
    runs = {}
    for mode in ("alone", "hostile"):  # each in a fresh process, so that peak RSS is its own
        done = subprocess.run([sys.executable, __file__, "--one", mode, "--sites", str(args.sites),
                               "--sessions", str(args.sessions)], capture_output=True, text=True, check=True)
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(mode, runs[mode])
    result = {"machine": platform.platform(), "cpus": multiprocessing.cpu_count(), **runs,
              "ratio_session_median": runs["hostile"]["session_seconds_median"] / runs["alone"]["session_seconds_median"],
              "extra_rss_mib": runs["hostile"]["peak_rss_mib"] - runs["alone"]["peak_rss_mib"]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"session median x{result['ratio_session_median']:.2f} under the flood; coordinator peak RSS "
          f"+{result['extra_rss_mib']:.0f} MiB; {runs['hostile']['rejected']} messages rejected -> {out}")


if __name__ == "__main__":
    main()
