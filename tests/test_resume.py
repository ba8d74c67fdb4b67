"""Nothing lost after a kill: a coordinator killed mid-run, then resumed."""

import json
import os
import time

import pytest
import yaml

from runner.outputs import RunDirectory
from tests.test_cli import ROOT, cli

METHODS = [{"name": "fedcp_qq"}, {"name": "centralized"},
           {"name": "fedcp2_qq", "epsilon": 5.0, "bins": {"count": 50, "lo": -3.0, "hi": 3.0}}]


def write_scenario(path, faults, per_process=1):
    raw = yaml.safe_load((ROOT / "tests" / "scenarios" / "tiny.yaml").read_text())
    raw.update(trials=3, methods=METHODS, faults=faults)
    raw["sites"]["policy"]["noise"] = "seeded"  # the resumed run must match the reference draw for draw
    raw.setdefault("runtime", {})["placement"] = {"sites_per_process": per_process}
    path.write_text(yaml.safe_dump(raw))
    return path


def comparable(rows):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("per_process", [1, 2], ids=["process-per-site", "hosts-of-2"])
def test_a_killed_coordinator_resumes_without_repeating_or_losing_anything(tmp_path, per_process):
    kill = [{"action": "kill_coordinator", "trials": 1, "phase": "respond", "method": "centralized"}]
    scenario = write_scenario(tmp_path / "killed.yaml", kill, per_process)
    out = tmp_path / "run"
    first = cli("run", str(scenario), "--out", str(out), check=False)
    assert first.returncode == -9  # SIGKILL, as scripted
    rundir = RunDirectory(out)
    rows = rundir.read_results()
    assert [(r["trial"], r["method"]) for r in rows] == [("0", "fedcp_qq"), ("0", "centralized"),
                                                          ("0", "fedcp2_qq"), ("1", "fedcp_qq")]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "fault" and e["action"] == "kill_coordinator" for e in events)
    pids = [e["pid"] for e in events if e["event"] == "hello"]
    assert len(pids) == 4 and len(set(pids)) == 4 // per_process  # placed as asked
    deadline = time.time() + 10
    while any(alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids), "site processes outlived their coordinator"

    with open(out / "results.csv", "a") as handle:
        handle.write("1,torn-row-from-a-kil")  # a write interrupted by the kill
    second = cli("run", str(scenario), "--out", str(out), "--resume")
    assert "3 trials" in second.stdout
    resumed = rundir.read_results()
    assert [(r["trial"], r["method"]) for r in resumed] == [(str(t), m["name"]) for t in range(3) for m in METHODS]
    assert rows == resumed[:4]  # the rows written before the kill are untouched

    reference = tmp_path / "reference"
    cli("run", str(write_scenario(tmp_path / "clean.yaml", [])), "--out", str(reference))
    assert comparable(resumed) == comparable(RunDirectory(reference).read_results())


def test_resume_refuses_a_different_scenario(tmp_path):
    scenario = write_scenario(tmp_path / "s.yaml", [])
    out = tmp_path / "run"
    cli("run", str(scenario), "--out", str(out), "--trials", "1")
    result = cli("run", str(scenario), "--out", str(out), "--resume", "--set", "alpha=0.2", check=False)
    assert result.returncode != 0 and "fields alpha" in result.stderr
    again = cli("run", str(scenario), "--out", str(out), check=False)
    assert again.returncode != 0 and "--resume" in again.stderr
