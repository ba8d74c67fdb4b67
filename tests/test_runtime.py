"""The multi-process system: real site processes over ZeroMQ, deadlines, bad messages."""

import os
import time
from pathlib import Path

import numpy as np
import zmq

from coordinator.driver import Coordinator, Deadlines
from coordinator.events import EventLog
from protocol.methods import METHODS
from sites.service import SiteService
from runner.processes import SiteHosts
from runner.study import run_study
from quorum import load_scenario
from stats.planner import plan_quantile_of_quantiles, replan_server_order
from transport.channel import RouterChannel

from tests.support import TINY, one_live_site, start_fakes, stop_fakes


def read_events(path):
    import json

    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def comparable(rows):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_processes_give_the_same_results_as_in_process(tmp_path):
    """With the policy's explicit seeded noise (a regression mode: its releases are not private),
    the DP draws too are the same in both backends."""
    scenario = load_scenario(TINY, ["sites.policy.noise=seeded"]).to_dict()
    run_study(scenario, tmp_path / "proc", backend="processes")
    run_study(scenario, tmp_path / "inproc", backend="inprocess")
    from runner.outputs import RunDirectory

    proc, inproc = RunDirectory(tmp_path / "proc").read_results(), RunDirectory(tmp_path / "inproc").read_results()
    assert len(proc) == 2 * 6
    assert comparable(proc) == comparable(inproc)  # DP draws included: the same seeds in both
    assert all(row["status"] in ("ok", "infinite") for row in proc)
    assert {row["privacy"] for row in proc} == {"none", "local", "central"}
    hellos = [e for e in read_events(tmp_path / "proc" / "events.jsonl") if e["event"] == "hello"]
    pids = {e["pid"] for e in hellos}
    assert len(hellos) == 4 and len(pids) == 4 and os.getpid() not in pids  # one OS process per site
    assert sorted(p.name for p in (tmp_path / "proc" / "logs").iterdir()) == [f"site-00{j}.log" for j in range(4)]


def test_site_processes_are_visible_by_name(tmp_path):
    channel = RouterChannel("tcp://127.0.0.1:*")
    procs = SiteHosts(["site-000", "site-001"], SiteService(channel.endpoint, str(tmp_path), policy={"non_private": "allow"}),
                      tmp_path)
    procs.start()
    try:
        coordinator = Coordinator(channel, EventLog(None), Deadlines(hello=30))
        assert coordinator.await_members(["site-000", "site-001"]) == ["site-000", "site-001"]
        for site, pid in procs.pids().items():
            assert coordinator.members[site] == pid
            assert Path(f"/proc/{pid}/cmdline").read_bytes().startswith(f"quorum-site {site}".encode())
        coordinator.shutdown()
        procs.stop()
        assert procs.exit_codes() == {"site-000": 0, "site-001": 0}
    finally:
        procs.stop(timeout=0.1)
        channel.close()


def test_deadline_turns_a_mute_site_into_a_dropout_and_k_is_replanned(tmp_path):
    channel = RouterChannel("tcp://127.0.0.1:*")
    events = EventLog(tmp_path / "events.jsonl")
    coordinator = Coordinator(channel, events, Deadlines(hello=10, join=10, respond=0.5))
    mute = {"site-003", "site-007"}
    fakes = start_fakes(channel.endpoint, 12, 20, mute=mute)
    try:
        members = coordinator.await_members([f.site_id for f in fakes])
        sizes, dropped = coordinator.open_trial(0, 0, members)
        assert len(sizes) == 12 and not dropped
        began = time.monotonic()
        outcome = coordinator.run_method(0, 0, METHODS["fedcp_qq"](0.1), sizes)
        assert time.monotonic() - began < 5  # the deadline, not a hang
        plan = plan_quantile_of_quantiles(12, 20, 0.1)
        assert outcome.details["answered"] == 10 and set(outcome.details["dropped"]) == mute
        assert outcome.details["k"] == replan_server_order(10, 20, plan.ell, 0.1).k
        answers = sorted(float(np.sort(f.scores)[plan.ell - 1]) for f in fakes if f.site_id not in mute)
        assert outcome.threshold == answers[outcome.details["k"] - 1]
        dropouts = [e for e in read_events(tmp_path / "events.jsonl") if e["event"] == "dropout"]
        assert {e["site"] for e in dropouts} == mute
        assert all("deadline" in e["reason"] for e in dropouts)
    finally:
        stop_fakes(fakes)
        channel.close()


def read_rejections(directory):
    return [e for e in read_events(directory / "events.jsonl") if e["event"] == "rejected"]


def test_coordinator_logs_and_survives_bad_messages(tmp_path):
    channel = RouterChannel("tcp://127.0.0.1:*")
    coordinator = Coordinator(channel, EventLog(tmp_path / "events.jsonl"), Deadlines(hello=10, join=10, respond=2))
    context = zmq.Context.instance()
    rogue = context.socket(zmq.DEALER)
    rogue.setsockopt(zmq.ROUTING_ID, b"site-009")
    rogue.connect(channel.endpoint)
    fakes = start_fakes(channel.endpoint, 3, 10)
    try:
        rogue.send(b"\x00not msgpack")
        from protocol.wire import Envelope, encode

        rogue.send(encode(Envelope("hello", 0, "site-001", 0, {"pid": 1})))  # speaking for another site
        rogue.send(encode(Envelope("response", 1, "site-009", 1, {"phase": "respond", "body": 1.0})))
        members = coordinator.await_members([f.site_id for f in fakes])
        sizes, _ = coordinator.open_trial(0, 0, members)
        outcome = coordinator.run_method(0, 0, METHODS["fedcp_qq"](0.1), sizes)
        assert outcome.status == "ok" and outcome.details["answered"] == 3
        # The rogue's sends are asynchronous: a message may land after the session above ended.
        # Between phases nothing reads the socket; the next phase reads and refuses it, so run
        # further sessions until all three have been refused (each takes milliseconds).
        deadline, index = time.monotonic() + 10, 1
        while len(read_rejections(tmp_path)) < 3 and time.monotonic() < deadline:
            assert coordinator.run_method(0, index, METHODS["fedcp_qq"](0.1), sizes).status == "ok"
            index += 1
        rejected = read_rejections(tmp_path)
        reasons = [e["reason"] for e in rejected]
        assert any("checksum mismatch" in r for r in reasons)
        assert any("came from 'site-009'" in r for r in reasons)
        # the stray response is refused whichever phase it lands in
        assert any(e.get("site") == "site-009" and e.get("type") == "response" for e in rejected)
        assert "site-009" not in coordinator.members
    finally:
        stop_fakes(fakes)
        rogue.close(linger=0)
        channel.close()


def test_live_site_process_survives_bad_messages(tmp_path):
    scenario, world, channel, procs = one_live_site(tmp_path)
    try:
        coordinator = Coordinator(channel, EventLog(tmp_path / "events.jsonl"), Deadlines(hello=30, join=30, respond=5))
        assert coordinator.await_members(["site-000"]) == ["site-000"]
        channel.socket.send_multipart([b"site-000", b"\xc1\xc1garbage"])
        channel.socket.send_multipart([b"site-000", b"x" * 100, b"two frames"])
        channel.send("site-000", "request", 0, {"method": "fedcp_qq", "phase": "respond", "body": {"ell": 1}})
        channel.send("site-000", "request", 999, {"method": "nonsense", "phase": "respond", "body": {}})
        time.sleep(0.5)
        sizes, _ = coordinator.open_trial(0, scenario["seed"], ["site-000"])
        assert sizes == {"site-000": len(world.shards["site-000"][1])}
        outcome = coordinator.run_method(0, 0, METHODS["centralized"](0.1), sizes)
        assert outcome.status in ("ok", "infinite") and outcome.details["pooled"] == sizes["site-000"]
        log = (tmp_path / "site-000.log").read_text()
        assert "rejected a message" in log and "checksum mismatch" in log and "expected one frame" in log
        assert procs.processes["site-000"].is_alive()
        coordinator.shutdown()
    finally:
        procs.stop()
        channel.close()


def test_result_cells_are_plain_numbers(tmp_path):
    from results.conformal import Threshold
    from runner.outputs import RunDirectory

    rundir = RunDirectory(tmp_path, families=[Threshold])
    rundir.append_session({"trial": np.int64(0), "method": "x", "guarantee": np.float64(0.25),
                           "coverage": float("nan"), "size": float("inf")}, {})
    row = rundir.read_results()[0]
    assert (row["trial"], row["guarantee"], row["coverage"], row["size"]) == ("0", "0.25", "nan", "inf")


def test_unequal_sizes_with_a_dropout_robust_plan_over_the_network(tmp_path):
    from stats.optimizer import plan_optimized
    from stats.planner import replan_after_dropouts

    sizes = [307, 250, 208, 172, 143, 118, 98, 81, 67, 56]
    channel = RouterChannel("tcp://127.0.0.1:*")
    coordinator = Coordinator(channel, EventLog(tmp_path / "events.jsonl"), Deadlines(hello=10, join=10, respond=0.5))
    mute = {"site-000", "site-004"}  # the largest site among them
    fakes = start_fakes(channel.endpoint, 10, sizes, mute=mute)
    try:
        joined, _ = coordinator.open_trial(0, 0, coordinator.await_members([f.site_id for f in fakes]))
        assert [joined[f.site_id] for f in fakes] == sizes
        outcome = coordinator.run_method(0, 0, METHODS["fedcp_qq"](0.1, planner="optimized", dropouts=3), joined)
        plan = plan_optimized(tuple(sizes), 0.1, 3)
        kept = [j for j, f in enumerate(fakes) if f.site_id not in mute]
        replanned = replan_after_dropouts([sizes[j] for j in kept], [plan.ells[j] for j in kept], 0.1)
        answers = sorted(float(np.sort(fakes[j].scores)[plan.ells[j] - 1]) for j in kept)
        assert outcome.status == "ok" and outcome.details["answered"] == 8
        assert outcome.details["k"] == replanned.k and outcome.details["guarantee"] >= 0.9
        assert outcome.threshold == answers[replanned.k - 1]
    finally:
        stop_fakes(fakes)
        channel.close()
