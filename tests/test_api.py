"""The Python API (issue 24, point 3): what docs/api.md shows, run as a notebook would run it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

import quorum
from tests.support import TINY

ROOT = Path(__file__).resolve().parent.parent


def tiny_dict() -> dict:
    return yaml.safe_load(TINY.read_text())


def test_a_scenario_from_a_dict_or_a_path_with_overrides():
    from_path = quorum.load_scenario(TINY, {"trials": 1, "sites.count": 3})
    from_dict = quorum.Scenario.from_dict(tiny_dict(), {"trials": 1, "sites.count": 3})
    assert from_path.to_dict() == from_dict.to_dict()
    assert from_path["sites"]["count"] == 3 and from_path.name == "tiny"
    cli_style = quorum.load_scenario(TINY, ["trials=1", "sites.count=3"])
    assert cli_style.to_dict() == from_path.to_dict()
    changed = from_path.override({"alpha": 0.2})
    assert changed["alpha"] == 0.2 and from_path["alpha"] == 0.1  # override returns a new scenario
    again = quorum.Scenario.from_dict(changed.to_dict())  # a run's scenario.yaml loads back
    assert again.to_dict() == changed.to_dict()
    assert "3 sites" in repr(from_path)


def test_every_problem_comes_back_as_one_error():
    data = tiny_dict()
    data.update(alpha=3, trials=0)
    data["methods"][0]["epsilonn"] = 1
    with pytest.raises(quorum.ScenarioError) as caught:
        quorum.Scenario.from_dict(data)
    assert [p.field for p in caught.value.problems] == ["trials", "alpha", "methods[0].epsilonn"]
    with pytest.raises(quorum.ScenarioError, match=r"tiny.yaml: field 'sites.count'"):
        quorum.load_scenario(TINY, {"sites.count": -1})


def test_run_in_process_gives_dataframes_and_the_cli_run_directory(tmp_path):
    scenario = quorum.load_scenario(TINY, {"trials": 2})
    run = quorum.run(scenario, tmp_path / "api", backend="inprocess")
    results = run.results
    assert isinstance(results, pd.DataFrame) and len(results) == 2 * 6
    assert list(results["method"][:6]) == [m["label"] for m in scenario["methods"]]
    assert results["coverage"].between(0, 1).all()
    assert run.summary == json.loads((run.path / "summary.json").read_text())
    events = run.events
    assert {"run_start", "session_start", "session_end", "run_end"} <= set(events["event"])
    assert {p.name for p in run.path.iterdir()} >= {"scenario.yaml", "results.csv", "events.jsonl", "summary.json",
                                                   "privacy.csv", "trace.json", "timeline.png"}
    reopened = quorum.open_run(run.path)
    assert reopened.results.equals(results) and reopened.scenario.to_dict() == scenario.to_dict()
    with pytest.raises(quorum.RunDirectoryError, match="already holds results.csv"):
        quorum.run(scenario, run.path, backend="inprocess")
    with pytest.raises(quorum.RunDirectoryError, match="not a run directory"):
        quorum.open_run(tmp_path)


def test_run_over_processes_gives_the_ledger_and_events(tmp_path):
    run = quorum.run(str(TINY), tmp_path / "procs", backend="processes")  # a path works too
    ledger = run.ledger
    assert {"site", "direction", "type", "bytes", "ts"} <= set(ledger.columns)
    events = run.events
    start, end = events["ts"].min(), events["ts"].max()
    assert (ledger["bytes"] > 0).all() and ledger["ts"].between(start - 5, end).all()
    assert ledger.query("direction == 'up' and type == 'response'")["site"].nunique() == 4
    assert run.summary["communication"]["fedcp_qq"]["bytes_per_trial"] > 0
    assert "hello" in set(events["event"])
    # every aggregate says what it is taken over (issue 37)
    summary = run.summary
    assert "the 2 trials with a message" in summary["communication"]["fedcp_qq"]["averaged_over"]["bytes_per_trial"]
    assert "the 4 sites that reported" in summary["privacy"]["averaged_over"]["epsilon_composed_max"]
    assert "trials" in summary["heterogeneity"]["averaged_over"]["spread"]
    assert summary["methods"]["fedcp_qq"]["averaged_over"]["coverage_mean"] == "all 2 trials (every one ok)"


def test_plan_is_what_the_cli_prints():
    api = quorum.plan(alpha=0.1, sites=50, n=20)
    cli = json.loads(subprocess.run([sys.executable, "run.py", "plan", "--alpha", "0.1", "--sites", "50", "--n", "20",
                                     "--json"], cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    assert api == cli and (api["ell"], api["k"]) == (18, 35)
    unequal = quorum.plan(alpha=0.1, sizes=[30, 80, 200], optimize=True)
    assert len(unequal["ell"]) == 3 and unequal["coverage"] >= 0.9
    with pytest.raises(ValueError, match="alpha must lie in"):
        quorum.plan(alpha=1.5, sites=3, n=3)
    with pytest.raises(ValueError, match="either sizes or sites"):
        quorum.plan(alpha=0.1, sites=3, n=3, sizes=[3, 3])


def test_sweep_returns_its_table(tmp_path):
    table = quorum.sweep(quorum.load_scenario(TINY, {"trials": 1}), {"alpha": [0.1, 0.2]}, tmp_path / "sweep",
                         backend="inprocess")
    assert set(table["alpha"]) == {0.1, 0.2} and len(table) == 2 * 6
    assert all((tmp_path / "sweep" / name / "results.csv").exists() for name in set(table["run"]))


def test_a_notebook_style_script_from_another_directory(tmp_path):
    """The documented example, run as a script outside the checkout with the processes backend
    and a scripted crash."""
    script = tmp_path / "notebook.py"
    script.write_text(f'''
import quorum

if __name__ == "__main__":
    scenario = quorum.load_scenario({str(TINY)!r}, {{"trials": 1}})
    scenario = scenario.override({{"faults": [{{"action": "crash", "sites": "site-001", "phase": "respond",
                                                "method": "centralized"}}]}})
    run = quorum.run(scenario, "out")
    df = run.results
    print(df.loc[df.method == "centralized", "answered"].iloc[0], run.summary["trials"],
          int((run.events.event == "dropout").sum()) >= 1)
''')
    env = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH: `make` installed Quorum (editable) in .venv
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["3", "1", "True"]
    assert (tmp_path / "out" / "timeline.png").exists()


def test_the_readme_snippet_run_verbatim_as_a_script_starts_one_coordinator(tmp_path):
    """Issue 37, point 1: the README's "From Python" block, unguarded, run as a script: the site
    processes do not re-run it (one coordinator_start, not one per site); run again into the same
    directory, it says what to do."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert "__main__" not in block  # the snippet as a newcomer copies it: no guard
    (tmp_path / "scenarios").symlink_to(Path(__file__).resolve().parents[1] / "scenarios")
    script = tmp_path / "snippet.py"
    script.write_text(block)
    env = {"PATH": "/usr/bin:/bin"}
    first = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=300)
    assert first.returncode == 0, first.stderr
    events = (tmp_path / "runs" / "tour-api" / "events.jsonl").read_text()
    assert events.count('"coordinator_start"') == 1 and '"run_end"' in events
    again = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=300)
    assert again.returncode != 0 and "already holds results.csv; choose another directory, or resume" in again.stderr
