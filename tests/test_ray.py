"""Site hosts on a Ray cluster (runner.ray_hosts): a local multi-node cluster on 127.0.0.1,
started by these tests with Ray's own cluster utilities (three nodes of one CPU each, the last
declaring one GPU, so that Ray's placement is forced and visible)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from runner.outputs import RunDirectory
from runner.study import run_study
from tests.test_hosts import comparable, events_of, scenario
from transport.security import read_site_publics

# pytest-xdist (make test runs on several workers): one local Ray cluster for the module (two clusters at once would contend for ports and /tmp/ray)
pytestmark = pytest.mark.xdist_group("test_ray")

ray = pytest.importorskip("ray")  # a pinned requirement: skipped only outside `make`'s .venv


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    loopback = {"node_ip_address": "127.0.0.1", "object_store_memory": 80 * 2**20}
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, **loopback})
    nodes.add_node(num_cpus=1, **loopback)
    nodes.gpu_node = nodes.add_node(num_cpus=1, num_gpus=1, **loopback)
    yield nodes
    if ray.is_initialized():
        ray.shutdown()
    nodes.shutdown()


def on_ray(cluster, hosts, faults=(), resources=None, trials=2, **runtime):
    launcher = {"kind": "ray", "address": cluster.address, "hosts": hosts}
    if resources:
        launcher["resources"] = resources
    runtime.setdefault("deadlines", {"hello": 120, "join": 120, "respond": 120})
    return scenario(1, faults, trials=trials, launcher=launcher, **runtime)


def publics_of(run: Path) -> dict[str, bytes]:
    return read_site_publics(run / "keys")


def test_a_run_on_ray_spreads_hosts_over_nodes_and_equals_the_local_run(cluster, tmp_path):
    local = tmp_path / "local"
    run_study(scenario(3), local)
    out = tmp_path / "ray"
    summary = run_study(on_ray(cluster, hosts=3), out)
    assert comparable(RunDirectory(out).read_results()) == comparable(RunDirectory(local).read_results())
    # the sites kept their privacy accounts in the run's directory, as local sites do
    assert (out / "privacy.csv").read_text() == (local / "privacy.csv").read_text()
    assert len((out / "privacy.csv").read_text().splitlines()) == 1 + 8 * 3
    events = events_of(out)
    placed = next(e for e in events if e["event"] == "placement")
    assert placed["processes"] == 3 and summary["placement"]["processes"] == 3
    assert len({where["node"] for where in placed["nodes"].values()}) == 3  # one host per node
    assert placed["why"].startswith("ray (") and "3 nodes" in placed["why"]
    assert next(e for e in events if e["event"] == "coordinator_start")["security"] == "curve"
    assert not [e for e in events if e["event"] in ("dropout", "host_lost", "rejected")]
    # each host made its sites' key pairs in memory: the coordinator holds their public halves only
    assert len(publics_of(out)) == 8 and not list((out / "keys").glob("site-*.key_secret"))
    assert next(e for e in events if e["event"] == "keys")["made_by"] == "ray hosts"
    sessions = {Path(node.get_session_dir_path()) for node in cluster.list_all_nodes()}
    assert sessions and all(session.is_dir() for session in sessions)
    assert not [p for session in sessions for p in session.rglob("*.key_secret")]


def test_hosts_asking_for_a_gpu_land_on_the_node_that_has_one(cluster, tmp_path):
    out = tmp_path / "gpu"
    run_study(on_ray(cluster, hosts=1, resources={"num_cpus": 1, "num_gpus": 1}, trials=1), out)
    placed = next(e for e in events_of(out) if e["event"] == "placement")
    gpu_node = cluster.gpu_node.node_id
    assert placed["nodes"]["host-000"]["node"] == gpu_node and placed["nodes"]["host-000"]["gpus"] == ["0"]
    rows = RunDirectory(out).read_results()
    assert rows and all(r["status"] in ("ok", "infinite") for r in rows)


def test_hosts_ray_cannot_place_fail_the_run_in_bounded_time_saying_why(cluster, tmp_path):
    out = tmp_path / "too-big"
    began = time.monotonic()
    with pytest.raises(RuntimeError, match=r"2 site hosts asking for 8 CPU each .*resources.num_cpus.* 3 CPUs"):
        run_study(on_ray(cluster, hosts=2, resources={"num_cpus": 8, "num_gpus": 0}, trials=1,
                         deadlines={"hello": 5, "join": 30, "respond": 30}), out)
    assert time.monotonic() - began < 60
    assert (out / "events.jsonl").exists()


def test_a_host_actor_killed_by_a_scripted_fault_is_a_lost_host(cluster, tmp_path):
    kill = {"action": "kill_host", "sites": "site-004", "phase": "respond", "trials": 0, "method": "fedcp_qq"}
    out = tmp_path / "kill"
    began = time.monotonic()
    run_study(on_ray(cluster, hosts=3, faults=[kill]), out)
    assert time.monotonic() - began < 60  # at once, not at the deadlines
    events = events_of(out)
    lost = [e for e in events if e["event"] == "host_lost"]
    assert [e["host"] for e in lost] == ["host-001"] and lost[0]["sites"] == ["site-003", "site-004", "site-005"]
    assert lost[0]["node"] and lost[0]["address"] == "127.0.0.1" and lost[0]["reason"]
    dropped = {e["site"] for e in events if e["event"] == "dropout" and e.get("session") == 1}
    assert "site-004" in dropped and dropped <= {"site-003", "site-004", "site-005"}
    rows = RunDirectory(out).read_results()
    assert {r["sites"] for r in rows if r["trial"] == "1"} == {"5"}  # the survivors carry trial 1


def test_a_node_lost_mid_run_makes_its_sites_dropouts_and_the_run_completes(cluster, tmp_path):
    victim = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80 * 2**20)
    out = tmp_path / "node"
    events_path = out / "events.jsonl"

    def remove_when_trial_zero_ends():  # trial 0's three sessions: trial 1's open is on its way
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if events_path.exists() and events_path.read_text().count('"session_end"') >= 3:
                cluster.remove_node(victim, allow_graceful=False)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=remove_when_trial_zero_ends, daemon=True)
    killer.start()
    # every site answers trial 1's open 6 s late: the node goes while the coordinator waits
    late = {"action": "delay", "phase": "join", "trials": 1, "seconds": 6.0}
    began = time.monotonic()
    run_study(on_ray(cluster, hosts=4, trials=3, faults=[late]), out)
    killer.join(timeout=5)
    assert time.monotonic() - began < 90
    events = events_of(out)
    placed = next(e for e in events if e["event"] == "placement")
    host = next(name for name, where in placed["nodes"].items() if where["node"] == victim.node_id)
    lost = [e for e in events if e["event"] == "host_lost"]
    assert [(e["host"], e["node"]) for e in lost] == [(host, victim.node_id)]
    joins = [e for e in events if e["event"] == "dropout" and e["phase"] == "join"]
    assert sorted(e["site"] for e in joins if e["reason"].startswith("connection lost")) == lost[0]["sites"]
    opened = [e["ts"] for e in events if e["event"] == "trial_open"]  # written once the joins are in
    noticed = [e for e in events if e["event"] == "connection_lost"]
    assert sorted(e["site"] for e in noticed) == lost[0]["sites"]
    assert all(e["ts"] < opened[1] - 3 for e in noticed) and lost[0]["ts"] < opened[1] - 3  # not after the 6 s
    rows = RunDirectory(out).read_results()
    assert len(rows) == 9 and all(r["status"] in ("ok", "infinite") for r in rows)
    survivors = str(8 - len(lost[0]["sites"]))
    assert {r["sites"] for r in rows if r["trial"] in ("1", "2")} == {survivors}


def test_the_local_launcher_never_imports_ray_and_a_bad_launcher_is_named(tmp_path):
    import subprocess
    import sys

    from specs.schema import ScenarioError
    from tests.test_cli import ROOT

    code = ("import sys, pathlib; from runner.study import run_study; from tests.test_hosts import scenario; "
            f"run_study(scenario(1, count=2, trials=1), pathlib.Path({str(tmp_path / 'local')!r})); "
            "import quorum.cli; assert 'ray' not in sys.modules, 'ray was imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)
    with pytest.raises(ScenarioError, match=r"runtime.launcher.kind.*local.*ray"):
        scenario(1, launcher={"kind": "slurm"})
    with pytest.raises(ScenarioError, match=r"runtime.launcher.resources.num_gpus"):
        scenario(1, launcher={"kind": "ray", "resources": {"num_gpus": -1}})
