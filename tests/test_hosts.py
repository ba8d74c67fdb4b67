"""Site hosts: many sites per OS process, each still a site in every way the protocol sees.

Results do not depend on placement; a crashed agent ends alone; a killed host (scripted, or
SIGKILL from outside) makes its sites dropouts at once, from the coordinator's socket monitor,
not at a deadline; a launcher that cannot hold the connections says what to change."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from runner.outputs import RunDirectory
from sites.service import SiteService
from runner.processes import placement
from runner.study import run_study
from scenarios.scenario import validate_scenario
from sites import host as host_module
from sites.trials import TrialCache
from tests.support import TINY, trial_zero
from tests.test_cli import ROOT

METHODS = [{"name": "fedcp_qq"}, {"name": "centralized"},
           {"name": "fedcp2_qq", "epsilon": 5.0, "bins": {"count": 50, "lo": -3.0, "hi": 3.0}}]
SLOW_DEADLINE = 120.0  # a dropout that waited for it would make these runs take minutes


def scenario(per_process, faults=(), trials=2, count=8, **runtime) -> dict:
    raw = yaml.safe_load(TINY.read_text())
    raw.update(trials=trials, methods=METHODS, faults=list(faults))
    raw["sites"]["count"] = count
    raw["runtime"] = {"deadlines": {"hello": 30, "join": SLOW_DEADLINE, "respond": SLOW_DEADLINE},
                      "placement": {"sites_per_process": per_process}, **runtime}
    return validate_scenario(raw)


def events_of(out):
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def comparable(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def test_results_do_not_depend_on_placement(tmp_path):
    runs = {}
    for per_process in (1, 3, 8):
        out = tmp_path / f"p{per_process}"
        summary = run_study(scenario(per_process), out)
        assert summary["placement"]["sites_per_process"] == per_process
        runs[per_process] = comparable(RunDirectory(out).read_results())
        placed = next(e for e in events_of(out) if e["event"] == "placement")
        assert placed["processes"] == -(-8 // per_process) and placed["sites_per_process"] == per_process
        hellos = [e for e in events_of(out) if e["event"] == "hello"]
        assert len(hellos) == 8 and len({e["pid"] for e in hellos}) == placed["processes"]
    run_study(scenario(1), tmp_path / "inproc", backend="inprocess")
    assert runs[1] == runs[3] == runs[8] == comparable(RunDirectory(tmp_path / "inproc").read_results())
    log = (tmp_path / "p3" / "logs" / "host-001.log").read_text()  # sites 3, 4, 5: each line tagged
    assert all(f"quorum.site.site-00{j}" in log for j in (3, 4, 5)) and "site-006" not in log


def test_a_crashed_agent_ends_alone_and_is_dropped_at_once(tmp_path):
    crash = {"action": "crash", "sites": "site-001", "phase": "respond", "trials": 0, "method": "centralized"}
    out = tmp_path / "run"
    began = time.monotonic()
    summary = run_study(scenario(4, [crash]), out)
    assert time.monotonic() - began < SLOW_DEADLINE / 2
    rows = RunDirectory(out).read_results()
    assert summary["trials"] == 2 and len(rows) == 6
    events = events_of(out)
    lost = [e for e in events if e["event"] == "dropout" and e["site"] == "site-001"]
    assert lost[0]["reason"].startswith("connection lost") and lost[0]["phase"] == "respond"
    # never answers again (trial 1: not connected), its host-mates answer everything
    assert any(e["phase"] == "join" and "not connected" in e["reason"] for e in lost[1:])
    assert {e["site"] for e in events if e["event"] == "dropout"} == {"site-001"}
    codes = next(e for e in events if e["event"] == "sites_stopped")["exit_codes"]
    assert codes == {"host-000": 0, "host-001": 0}


def test_a_scripted_host_kill_drops_all_its_sites_at_once(tmp_path):
    kill = {"action": "kill_host", "sites": "site-005", "phase": "respond", "trials": 0, "method": "fedcp_qq"}
    out = tmp_path / "run"
    began = time.monotonic()
    run_study(scenario(4, [kill]), out)
    assert time.monotonic() - began < SLOW_DEADLINE / 2
    events = events_of(out)
    first = [e for e in events if e["event"] == "dropout" and e.get("session") == 1]
    # host-001 answers its sites' requests in the order its loop finds them ready (under load not
    # always 004 to 007); those handled before site-005's may have left
    assert {"site-005"} <= {e["site"] for e in first} <= {f"site-00{j}" for j in range(4, 8)}
    assert all(e["reason"].startswith("connection lost") for e in first)
    rows = RunDirectory(out).read_results()
    assert len(rows) == 6 and all(r["status"] in ("ok", "infinite") for r in rows)
    assert {r["sites"] for r in rows if r["trial"] == "1"} == {"4"}  # the survivors carry trial 1
    codes = next(e for e in events if e["event"] == "sites_stopped")["exit_codes"]
    assert codes == {"host-000": 0, "host-001": -signal.SIGKILL}


def test_an_external_sigkill_of_a_host_mid_session_makes_its_sites_dropouts(tmp_path):
    """The run is a separate process; a host is killed from outside while every site's answer
    is held back three seconds, i.e. mid-session."""
    slow = {"action": "delay", "seconds": 3.0, "phase": "respond", "trials": 0, "method": "fedcp_qq"}
    path = tmp_path / "s.yaml"
    raw = yaml.safe_load(TINY.read_text())
    raw.update(trials=2, methods=METHODS, faults=[slow])
    raw["sites"]["count"] = 8
    raw["runtime"] = {"deadlines": {"hello": 30, "join": SLOW_DEADLINE, "respond": SLOW_DEADLINE},
                      "placement": {"sites_per_process": 4}}
    path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    run = subprocess.Popen([sys.executable, "run.py", "run", str(path), "--out", str(out)], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        time.sleep(0.1)
        events = events_of(out) if (out / "events.jsonl").exists() else []
        if any(e["event"] == "session_start" for e in events):
            victim = next(e for e in events if e["event"] == "placement")["pids"]["host-001"]
    assert victim is not None, "the run never started a session"
    os.kill(victim, signal.SIGKILL)
    output, _ = run.communicate(timeout=SLOW_DEADLINE / 2)
    assert run.returncode == 0, output
    events = events_of(out)
    lost = [e for e in events if e["event"] == "dropout" and e.get("session") == 1]
    assert sorted(e["site"] for e in lost) == ["site-004", "site-005", "site-006", "site-007"]
    assert all(e["reason"].startswith("connection lost") for e in lost)
    assert {e["site"] for e in events if e["event"] == "connection_lost"} == {f"site-00{j}" for j in range(4, 8)}
    rows = RunDirectory(out).read_results()
    assert len(rows) == 6 and rows[0]["answered"] in ("4", "4.0")


def test_process_titles_name_the_host_and_its_range(tmp_path):
    from runner.processes import SiteHosts

    trial_zero(tmp_path)
    hosts = SiteHosts([f"site-00{j}" for j in range(5)], SiteService("tcp://127.0.0.1:1", str(tmp_path), idle_timeout=20),
                      tmp_path, sites_per_process=3)
    hosts.start()
    try:
        titles = {}
        for _ in range(100):
            titles = {name: open(f"/proc/{pid}/cmdline").read().strip("\0 ") for name, pid in hosts.pids().items()}
            if all(t.startswith("quorum-") for t in titles.values()):
                break
            time.sleep(0.05)
        assert titles == {"host-000": "quorum-host host-000 site-000..site-002",
                          "host-001": "quorum-host host-001 site-003..site-004"}
    finally:
        for pid in hosts.pids().values():
            os.kill(pid, signal.SIGKILL)
        hosts.stop(timeout=2)


def test_automatic_placement_is_sized_from_cores_and_memory():
    big = 24 * 2**30
    assert placement(50, "auto", cores=2, available=big).sites_per_process == 1
    assert placement(1000, "auto", cores=2, available=big).processes == 4
    assert placement(10_000, "auto", cores=2, available=big).processes == 5  # at most 2,000 sites each
    assert placement(10_000, "auto", cores=16, available=big).processes == 32
    assert placement(30_000, "auto", cores=2, available=big).processes == 15
    assert placement(50, "auto", cores=2, available=2 * 2**30).sites_per_process > 1  # little memory: hosts
    assert placement(10, 4, cores=2, available=big).processes == 3
    assert "auto" in placement(1000, "auto", cores=2, available=big).why


def test_too_few_open_files_fail_before_anything_starts(monkeypatch):
    monkeypatch.setattr(host_module.resource, "getrlimit", lambda which: (1024, 4096))
    with pytest.raises(OSError, match=r"needs 20256 open files.*at most 4096.*ulimit -Hn.*sites_per_process"):
        host_module.raise_open_files(host_module.descriptors_needed(10_000), "a site host")
    assert host_module.raise_open_files(2000, "x", check_only=True) == 1024


def test_a_process_loads_the_model_once_per_trial_and_each_site_scores_its_own_rows(tmp_path, monkeypatch):
    from sites import trials as trials_module

    _, world = trial_zero(tmp_path)
    loads = []
    real = trials_module.read_model
    monkeypatch.setattr(trials_module, "read_model", lambda *a: loads.append(a) or real(*a))
    cache = TrialCache(tmp_path, list(world.shards))
    for site, (X, y) in world.shards.items():
        scores, device = cache.site_rows(0, site)
        assert scores.tolist() == world.model.scores(X, y).tolist() and device == "cpu"
    assert len(loads) == 1 and cache._model is None  # released once every site had scored
    with pytest.raises(LookupError, match="site-999"):
        TrialCache(tmp_path, ["site-999"]).site_rows(0, "site-999")


def test_a_thousand_sites_leaving_at_once_never_block_the_coordinator():
    """1,200 connections close while the coordinator reads nothing: 2,400 monitor events, more
    than a default high-water mark of 1,000 would hold. Closing the channel must not block, and
    every lost connection is named."""
    import threading

    import zmq

    from transport.channel import RouterChannel, DealerChannel

    n = 1200
    host_module.raise_open_files(host_module.descriptors_needed(n, per_socket=4), "this test")
    channel = RouterChannel("tcp://127.0.0.1:*")
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, 2 * n)
    sites = [DealerChannel(channel.endpoint, f"site-{i:04d}", context=context) for i in range(n)]
    for site in sites:
        site.send("hello", 0, {"pid": 1})
    heard = 0
    while heard < n:
        heard += channel.receive(5.0) is not None
    for site in sites:
        site.close()
    time.sleep(1.0)
    closer = threading.Thread(target=channel.close, daemon=True)
    closer.start()
    closer.join(timeout=20)
    assert not closer.is_alive(), "closing the coordinator's channel blocked"
    assert {lost.peer for lost in channel.lost} == {f"site-{i:04d}" for i in range(n)}
    context.term()


def test_keepalive_probes_peers_on_other_machines_only_and_tolerates_lost_probes():
    """ZMTP heartbeats are answered by ZeroMQ's I/O threads, which a loaded machine starves (with
    them, 3,121 live sites were reported lost at 10,000 CurveZMQ sites on 2 cores). Kernel
    keepalive is answered regardless, but thousands of connections idle since the same second are
    probed in one burst that overflows the kernel's input queue: with 3 probes, 1,347 of 10,000 idle
    loopback connections to live peers were aborted (bench/keepalive_bursts.py). So: no keepalive
    where every peer is on this machine (a process here cannot vanish without its kernel closing
    its connections), 9 probes elsewhere, and a listen backlog that holds thousands of connects."""
    import zmq

    from transport import channel as transport

    assert transport.is_loopback("tcp://127.0.0.1:5555") and transport.is_loopback("tcp://127.8.0.1:*")
    assert transport.is_loopback("tcp://localhost:5555") and transport.is_loopback("tcp://[::1]:5555")
    assert transport.is_loopback("ipc:///tmp/quorum.sock") and transport.is_loopback("inproc://x")
    assert not transport.is_loopback("tcp://*:5555") and not transport.is_loopback("tcp://0.0.0.0:5555")
    assert not transport.is_loopback("tcp://10.1.2.3:5555") and not transport.is_loopback("tcp://eth0:5555")
    remote = transport.listener_options("tcp://0.0.0.0:5555")
    assert remote[zmq.TCP_KEEPALIVE] == 1 and remote[zmq.TCP_KEEPALIVE_CNT] >= 9
    assert (remote[zmq.TCP_KEEPALIVE_IDLE], remote[zmq.TCP_KEEPALIVE_INTVL]) == (30, 10)
    assert transport.listener_options("tcp://127.0.0.1:5555")[zmq.TCP_KEEPALIVE] == 0
    coordinator = transport.RouterChannel("tcp://127.0.0.1:*")  # the options reach the socket
    try:
        socket = coordinator.socket
        assert socket.getsockopt(zmq.HEARTBEAT_IVL) == 0 and socket.getsockopt(zmq.HEARTBEAT_TIMEOUT) == -1
        assert socket.getsockopt(zmq.TCP_KEEPALIVE) == 0 and socket.getsockopt(zmq.BACKLOG) >= 4096
        assert socket.getsockopt(zmq.TCP_KEEPALIVE_CNT) == remote[zmq.TCP_KEEPALIVE_CNT]
    finally:
        coordinator.close()


def test_a_late_accept_event_on_a_named_descriptor_blames_no_one_and_a_closing_still_does(monkeypatch):
    """libzmq emits EVENT_ACCEPTED only after handing the new connection to an I/O thread, so with
    two I/O threads a site's first message can be read before its own ACCEPTED (one honest site
    of 10,000 was counted dropped at join by taking that event as the end of an older connection
    on the descriptor; issue 40). Forced here: the site's real hello first, then its ACCEPTED
    delivered late; the site stays. Its connection closing is still reported at once."""
    import zmq

    from transport import channel as channel_module
    from transport.channel import RouterChannel, DealerChannel

    channel = RouterChannel("tcp://127.0.0.1:*")
    site = DealerChannel(channel.endpoint, "site-a")
    try:
        site.send("hello", 0, {"pid": 1})
        incoming = None
        while incoming is None:
            incoming = channel.receive(5.0)
        descriptor = channel._descriptor_of["site-a"]
        late = [{"event": zmq.EVENT_ACCEPTED, "value": descriptor, "endpoint": b""}]
        real_poll, real_recv = channel.monitor.poll, channel_module.recv_monitor_message
        monkeypatch.setattr(channel.monitor, "poll", lambda timeout=0: bool(late) or real_poll(timeout))
        monkeypatch.setattr(channel_module, "recv_monitor_message",
                            lambda monitor: late.pop() if late else real_recv(monitor))
        site.send("hello", 0, {"pid": 1})
        assert channel.receive(5.0).peer == "site-a"
        assert not late and channel.lost == []  # the late event was read, and named no one
        site.close()
        deadline = time.monotonic() + 5
        while not channel.lost and time.monotonic() < deadline:
            channel.receive(0.2)
        assert [lost.peer for lost in channel.lost] == ["site-a"]
    finally:
        channel.close()


def test_a_launcher_reports_lost_sites_from_another_thread_waking_the_coordinator_once_each():
    """A launcher (runner.ray_hosts) that sees a host die reports its sites from its own thread:
    a coordinator blocked in receive wakes at once, and a site is lost once whether its closing
    connection or the report comes first; one that speaks again can be lost again."""
    import threading

    from transport.channel import RouterChannel, DealerChannel

    channel = RouterChannel("tcp://127.0.0.1:*")
    sites = {name: DealerChannel(channel.endpoint, name) for name in ("site-a", "site-b", "site-c")}
    try:
        for site in sites.values():
            site.send("hello", 0, {"pid": 1})
        heard = set()
        while len(heard) < 3:
            incoming = channel.receive(5.0)
            heard |= {incoming.peer} if incoming is not None else set()
        threading.Timer(0.3, channel.report_lost, args=(["site-a", "site-b"], "its host was lost")).start()
        began = time.monotonic()
        assert channel.receive(20.0) is None
        assert time.monotonic() - began < 5.0, "the report did not wake the coordinator"
        assert [(lost.peer, lost.reason) for lost in channel.lost] == [("site-a", "its host was lost"),
                                                                     ("site-b", "its host was lost")]
        channel.lost.clear()
        sites.pop("site-a").close()  # its connection closes after the report: not lost twice
        channel.report_lost(["site-b"], "again")  # already lost, not heard since: not twice
        channel.receive(1.0)
        channel.receive(0.5)
        assert channel.lost == []
        sites["site-c"].close()  # a connection closing first, then the report: once
        sites.pop("site-c")
        deadline = time.monotonic() + 5
        while not channel.lost and time.monotonic() < deadline:
            channel.receive(0.2)
        channel.report_lost(["site-c"], "its host was lost")
        channel.receive(0.5)
        assert [lost.peer for lost in channel.lost] == ["site-c"]
        channel.lost.clear()
        sites["site-b"].send("hello", 0, {"pid": 1})  # speaks again, then is reported again
        assert channel.receive(5.0).peer == "site-b"
        channel.report_lost(["site-b"], "lost later")
        channel.receive(1.0)
        assert [(lost.peer, lost.reason) for lost in channel.lost] == [("site-b", "lost later")]
    finally:
        for site in sites.values():
            site.close()
        channel.close()


def test_the_sweep_finds_every_waiting_message_and_skips_stopped_agents():
    """Sweep: one zmq_poll names the agents whose socket holds a message, whatever their
    descriptors signalled; an agent that stopped (its socket closed) leaves the poll before it
    runs, so a closed socket never reaches zmq_poll (which would raise ENOTSOCK)."""
    import zmq

    class Agent:
        def __init__(self, socket):
            self.channel = type("Channel", (), {"socket": socket})()
            self.running = True

    context = zmq.Context()
    try:
        router = context.socket(zmq.ROUTER)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        agents = []
        for i in range(4):
            dealer = context.socket(zmq.DEALER)
            dealer.setsockopt(zmq.IDENTITY, f"a{i}".encode())
            dealer.connect(f"tcp://127.0.0.1:{port}")
            dealer.send(b"hi")
            agents.append(Agent(dealer))
        for _ in range(4):
            assert router.poll(5000)
            router.recv_multipart()
        sweep = host_module.Sweep(agents)
        assert sweep.ready() == []
        for i in (1, 3):
            router.send_multipart([f"a{i}".encode(), b"work"])
        deadline = time.monotonic() + 5
        while len(sweep.ready()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(agents.index(a) for a in sweep.ready()) == [1, 3]
        agents[3].running = False
        agents[3].channel.socket.close(0)
        sweep.discard(agents)
        assert sweep.ready() == [agents[1]]  # rebuilt without the closed socket
        for agent in agents[:3]:
            agent.channel.socket.close(0)
        router.close(0)
    finally:
        context.term()
