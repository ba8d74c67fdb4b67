"""Issue 50: one pump over a transport and a clock, so both backends write the same events.

The same scenario, with faults and attacks, run over site processes (ZeroMQ, real time) and in
process (the in-memory transport, a virtual clock) writes the same events.jsonl: the same joins,
dropouts with their reasons, rejected messages, attacks, session outcomes, in the same order, and
the same ledger (every message, its type and its size on the wire).
What may differ is only what a process has and memory has not (pids, placement, keys, endpoints,
timestamps and durations) and the order in which site processes happened to say hello.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

import quorum
from runner.study import run_study

ROOT = Path(__file__).resolve().parents[1]
#: events only a run of processes has (where they ran, their keys), and fields that are times or pids
PROCESS_ONLY = {"coordinator_start", "placement", "keys", "registry", "shuffler_start", "sites_stopped",
                "shuffler_stopped", "run_start", "run_end"}
UNTIMED = ("ts", "seconds", "pid")


def comparable_events(path: Path) -> list[dict]:
    """events.jsonl without times, pids and process-only events; hellos in site order (sites
    come up in any order), everything else in the order it was written."""
    events = [json.loads(line) for line in path.read_text().splitlines()]
    events = [{k: v for k, v in e.items() if k not in UNTIMED} for e in events if e["event"] not in PROCESS_ONLY]
    hellos = iter(sorted((e for e in events if e["event"] == "hello"), key=lambda e: e["site"]))
    return [next(hellos) if e["event"] == "hello" else e for e in events]


CASES = [  # (scenario, overrides): a crash (and, slow, stragglers); every attack on private bins; a lying secure sum
    # deadlines far above what a loaded machine needs: over processes a late answer is a real dropout
    pytest.param("scenarios/faults-site-crash.yaml", ["trials=3", "sites.policy.noise=seeded",
                                                      "runtime.deadlines.respond=20"], id="faults-site-crash"),
    pytest.param("scenarios/faults-site-crash.yaml", ["trials=4", "sites.policy.noise=seeded", "runtime.deadlines.respond=8"],
                 marks=pytest.mark.slow, id="faults-site-crash-stragglers"),
    pytest.param("scenarios/attacks/private-bins.yaml", ["trials=1", "sites.policy.noise=seeded"], id="private-bins"),
    pytest.param("scenarios/attacks/secure-sum.yaml", ["sites.policy.noise=seeded"], id="secure-sum"),
]


@pytest.mark.parametrize("path, overrides", CASES)
def test_both_backends_write_the_same_events(path, overrides, tmp_path):
    scenario = quorum.load_scenario(ROOT / path, overrides).to_dict()
    written = {}
    for backend in ("inprocess", "processes"):
        run_study(scenario, tmp_path / backend, backend=backend)
        written[backend] = comparable_events(tmp_path / backend / "events.jsonl")
    inproc, procs = written["inprocess"], written["processes"]
    assert any(e["event"] in ("dropout", "attack", "rejected") for e in procs), "nothing happened to compare"
    for i, (a, b) in enumerate(zip(inproc, procs)):
        assert a == b, f"event {i} differs:\n in-process {a}\n processes  {b}"
    assert len(inproc) == len(procs)
    # and the same messages on the wire, byte for byte as framed (CurveZMQ's sizes in memory too)
    ledgers = {backend: comparable_ledger(tmp_path / backend / "ledger.csv") for backend in written}
    assert ledgers["inprocess"] == ledgers["processes"], (ledgers["inprocess"] - ledgers["processes"],
                                                          ledgers["processes"] - ledgers["inprocess"])


def comparable_ledger(path: Path) -> Counter:
    """ledger.csv's rows without times and links, as a multiset (messages arrive in any order)."""
    with open(path) as handle:
        return Counter((r["trial"], r["session"], r["phase"], r["site"], r["direction"], r["type"], r["bytes"],
                        r["accepted"], r["info_bits"]) for r in csv.DictReader(handle))


def test_the_in_process_backend_waits_out_deadlines_in_network_time_without_sleeping(tmp_path, monkeypatch):
    """Stragglers' 3 s deadline passes on the virtual clock: the log's times (network time) say
    the phase lasted its deadline, and nothing in the run slept (time.sleep refuses here)."""
    import time

    def no_sleep(seconds):
        raise AssertionError(f"slept {seconds} s on a virtual clock")

    scenario = quorum.load_scenario(ROOT / "scenarios/faults-site-crash.yaml", ["trials=4"]).to_dict()
    monkeypatch.setattr(time, "sleep", no_sleep)
    run_study(scenario, tmp_path, backend="inprocess")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    late = [e for e in events if e["event"] == "dropout" and "no answer within the respond deadline (3 s)" in e["reason"]]
    assert len(late) == 4 * 4  # the 20% of 20 sites that straggle in trial 3, in each of its 4 sessions
    opened = next(e for e in events if e["event"] == "session_start" and e["session"] == late[0]["session"])
    assert late[0]["ts"] - opened["ts"] == pytest.approx(3.0, abs=0.01)
    rows = (tmp_path / "ledger.csv").read_text().splitlines()
    assert len(rows) > 100  # the in-memory transport meters every message, as the sockets do


def test_a_peer_flooding_refused_messages_fills_the_log_only_to_a_bound(tmp_path):
    """Issue 50's red team: every refused message was a `rejected` line, so one peer could grow
    events.jsonl without bound. Now the first MAX_REJECTED_LOGGED per peer are logged, one event
    says the rest are counted, and the run's end gives the count; the ledger still meters all."""
    from coordinator.driver import MAX_REJECTED_LOGGED, Coordinator, Deadlines
    from coordinator.events import EventLog
    from transport.clock import VirtualClock
    from transport.ledger import Ledger
    from transport.memory import COORDINATOR_ID, MemoryPeer, MemoryTransport, Outbound, Packer

    class Flood(MemoryPeer):
        name = "site-000"

        def deliver(self, sender, data, nbytes, now):
            return []

    clock, packer, sent = VirtualClock(), Packer("site-000"), MAX_REJECTED_LOGGED + 500
    transport = MemoryTransport(clock)
    junk = [Outbound(0.0, COORDINATOR_ID, packer.pack("error", 5, {"phase": "respond", "reason": "x"}) if i % 2
                     else b"\x00not msgpack") for i in range(sent)]  # refused envelopes, and bytes that are none
    transport.attach(Flood(), junk + [Outbound(0.0, COORDINATOR_ID, packer.pack("hello", 0, {"pid": 1}))])
    ledger = Ledger()
    coordinator = Coordinator(transport, EventLog(tmp_path / "events.jsonl"), Deadlines(hello=5), ledger, clock=clock)
    assert coordinator.await_members(["site-000"]) == ["site-000"]
    coordinator.shutdown()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    names = [e["event"] for e in events]
    assert names.count("rejected") == MAX_REJECTED_LOGGED and names.count("rejected_suppressed") == 1
    assert next(e for e in events if e["event"] == "rejected_total")["peers"] == {"site-000": sent}
    assert sum(1 for row in ledger.rows if row["direction"] == "up" and not row["accepted"]) == sent
