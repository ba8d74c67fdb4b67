"""Beyond one machine: the coordinator and the sites in separate network namespaces, linked by
a veth pair, with addresses that exist only inside those namespaces (`ip netns`, root needed)."""

import csv
import json
import os
import subprocess
import sys

import pytest

from tests.test_cli import ROOT

TINY = str(ROOT / "tests" / "scenarios" / "tiny.yaml")


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def namespaces_unavailable() -> str | None:
    probe = f"qprobe{os.getpid()}"
    try:
        result = _ip("netns", "add", probe, check=False)
    except FileNotFoundError:
        return "the ip command (iproute2) is not installed"
    if result.returncode != 0:
        return f"cannot create network namespaces here: {result.stderr.strip() or 'permission denied'}"
    _ip("netns", "del", probe, check=False)
    return None


REASON = namespaces_unavailable()


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_coordinator_and_sites_on_separate_network_namespaces(tmp_path):
    tag = os.getpid() % 100000
    coord_ns, site_ns = f"qc{tag}", f"qs{tag}"
    coord_if, site_if = f"qvc{tag}", f"qvs{tag}"
    try:
        for ns in (coord_ns, site_ns):
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", coord_if, "type", "veth", "peer", "name", site_if)
        _ip("link", "set", coord_if, "netns", coord_ns)
        _ip("link", "set", site_if, "netns", site_ns)
        _ip("-n", coord_ns, "addr", "add", "10.231.7.1/24", "dev", coord_if)
        _ip("-n", site_ns, "addr", "add", "10.231.7.2/24", "dev", site_if)
        _ip("-n", coord_ns, "link", "set", coord_if, "up")
        _ip("-n", site_ns, "link", "set", site_if, "up")
        keys = tmp_path / "keys"
        subprocess.run([sys.executable, "run.py", "keys", "--dir", str(keys), "--scenario", TINY], cwd=ROOT, check=True,
                       capture_output=True)
        out = tmp_path / "run"
        coordinator = subprocess.Popen(
            ["ip", "netns", "exec", coord_ns, sys.executable, "run.py", "coordinator", "--scenario", TINY,
             "--bind", "tcp://10.231.7.1:5701", "--keys", str(keys), "--out", str(out), "--trials", "1",
             "--hello-timeout", "60"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sites = subprocess.run(
            ["ip", "netns", "exec", site_ns, sys.executable, "run.py", "site", "--connect", "tcp://10.231.7.1:5701",
             "--site-ids", "0-3", "--scenario", TINY, "--keys", str(keys), "--workdir", str(tmp_path / "sitehost"),
             "--idle-timeout", "60", "--accept-study-policy"], cwd=ROOT, capture_output=True, text=True, timeout=240)
        output, _ = coordinator.communicate(timeout=240)
        assert coordinator.returncode == 0, output
        assert sites.returncode == 0, sites.stdout + sites.stderr
        assert "site policy enforced (the study's sites.policy and sites.budget, accepted" in sites.stdout
        rows = list(csv.DictReader(open(out / "results.csv")))
        assert {r["status"] for r in rows} <= {"ok", "infinite"} and len(rows) == 6
        assert all(r["sites"] == "4" for r in rows)
        events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
        start = next(e for e in events if e["event"] == "coordinator_start")
        assert start["endpoint"] == "tcp://10.231.7.1:5701" and start["security"] == "curve"
        hellos = [e for e in events if e["event"] == "hello"]
        assert len(hellos) == 4 and len({e["pid"] for e in hellos}) == 1  # one site host for the range
        # the host built its sites' data itself, in its namespace, once per trial
        log = (tmp_path / "sitehost" / "logs" / "host-000.log").read_text()
        assert all(f"quorum.site.site-00{j}" in log for j in range(4))
    finally:
        for ns in (coord_ns, site_ns):
            _ip("netns", "del", ns, check=False)
