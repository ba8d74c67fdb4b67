"""A newcomer's first hour (issue 37): the plugin surface, the scaffold, the API as documented."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import quorum
import quorum.plugin
from runner.report import summarize
from quorum.scaffold import ScaffoldError, new_method

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "scenarios" / "tiny.yaml"
B2 = ROOT / "scenarios" / "dp-appendix-b2.yaml"

CODEC_BY_PATH = '''
from quorum.plugin import Codec, OneShotMethod, PayloadError, Planned, SiteHalf, Threshold


class Doubled(Codec):
    name = "doubled"

    def encode(self, value):
        return 2 * float(value)

    def decode(self, body):
        if not isinstance(body, float):
            raise PayloadError("doubled: a float")
        return body / 2

    def information_bits(self, value):
        return 64


class Largest(OneShotMethod):
    name = "largest_by_path"
    codec = "labcodecs:Doubled"
    PARAMS = {"scale": {"type": "float", "gt": 0, "default": 1.0}, "floor": {"type": "float"}}

    def plan(self, sizes):
        return Planned({site: {} for site in sizes})

    def combine(self, sizes, planned, answers, dropped, rng):
        return Threshold.ok(max(max(answers.values()), self.params["floor"]) * self.params["scale"],
                          answered=len(answers), per_site=sorted(answers.values()), note="extra")

    @classmethod
    def site(cls, rows, rng, site_id):
        return Top(rows)


class Top(SiteHalf):
    def __init__(self, scores):
        self.scores = scores

    def answer(self, phase, body):
        return float(max(self.scores))
'''


@pytest.fixture()
def labcodecs(tmp_path, monkeypatch):
    (tmp_path / "labcodecs.py").write_text(CODEC_BY_PATH)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    return importlib.import_module("labcodecs")


def test_the_plugin_module_holds_what_the_docs_list():
    page = (ROOT / "docs" / "plugins.md").read_text()
    for name in quorum.plugin.__all__:
        assert getattr(quorum.plugin, name) is not None
        assert f"`{name}" in page, f"docs/plugins.md does not describe quorum.plugin.{name}"
    from protocol.methods.base import Method

    assert quorum.plugin.Method is Method


def test_a_method_built_directly_gets_its_defaults_and_names_a_missing_parameter(labcodecs):
    assert labcodecs.Largest(0.1, floor=0.0).params == {"scale": 1.0, "floor": 0.0}
    with pytest.raises(quorum.ScenarioError, match=r"field 'largest_by_path.floor'.*\(required\)"):
        labcodecs.Largest(0.1)
    with pytest.raises(quorum.ScenarioError, match=r"largest_by_path.scale"):
        labcodecs.Largest(0.1, floor=0.0, scale=-1)


def test_a_codec_named_by_import_path_works_in_process(labcodecs):
    """The method is built directly, never registered: its codec still loads, in both directions."""
    rng = np.random.default_rng(0)
    sites = {f"s{j}": rng.uniform(size=10) for j in range(4)}
    outcome = quorum.plugin.run_session(labcodecs.Largest(0.1, floor=0.0, scale=2.0), sites,
                                        lambda name: np.random.default_rng(0))
    assert outcome.threshold == 2 * max(float(max(v)) for v in sites.values())
    bodies = []
    outcome = quorum.plugin.drive(labcodecs.Largest(0.1, floor=0.0), {s: 10 for s in sites},
                                  lambda site, phase, body: bodies.append(site) or 5.0, np.random.default_rng(0))
    assert outcome.threshold == 2.5 and len(bodies) == 4  # decoded by the codec, as the coordinator does


def test_a_results_extra_values_reach_the_details_column(labcodecs, tmp_path):
    scenario = quorum.load_scenario(TINY, {"trials": 1, "methods": [{"name": "labcodecs:Largest", "floor": 0.5}]})
    run = quorum.run(scenario, tmp_path / "run", backend="inprocess")
    details = json.loads(run.results.details[0])
    assert details["note"] == "extra" and len(details["per_site"]) == 4 and "answered" not in details


def test_the_scaffold_writes_a_plugin_whose_tests_pass(tmp_path):
    folder = new_method("trimmed_max", tmp_path)
    assert (folder / "pyproject.toml").read_text().count('trimmed_max = "quorum_trimmed_max.method:TrimmedMax"') == 1
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder / "tests")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(folder)})
    assert result.returncode == 0 and "passed" in result.stdout, result.stdout[-3000:]
    with pytest.raises(ScaffoldError, match="already exists"):
        new_method("trimmed_max", tmp_path)
    with pytest.raises(ScaffoldError, match="lower case"):
        new_method("Trimmed-Max", tmp_path)


def test_a_star_override_sets_the_methods_that_have_the_field_and_says_which_it_skipped():
    with pytest.warns(UserWarning, match=r"methods\.\*\.epsilon: skipped methods\[0\] \(fedcp_qq has no field"):
        scenario = quorum.load_scenario(B2, {"methods.*.epsilon": 2.0})
    methods = scenario["methods"]
    assert [m.get("epsilon") for m in methods] == [None if "epsilon" not in m else 2.0 for m in methods]
    assert sum(m.get("epsilon") == 2.0 for m in methods) == 5
    assert len(scenario.skipped) == 2 and "centralized has no field 'epsilon'" in scenario.skipped[1]
    with pytest.raises(quorum.ScenarioError, match=r"methods\.\*\.rounds.*at least one item of methods"):
        quorum.load_scenario(B2, {"methods.*.rounds": 3})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing skipped, nothing said
        assert quorum.load_scenario(TINY, {"methods.*.label": "x", "methods": [{"name": "fedcp_qq"}]}).skipped == []


def test_the_command_line_prints_what_a_star_override_skipped():
    result = subprocess.run([sys.executable, "run.py", "validate", str(B2), "--set", "methods.*.epsilon=2"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    assert "note: methods.*.epsilon: skipped methods[0] (fedcp_qq has no field 'epsilon')" in result.stderr


def test_only_what_needs_a_process_is_refused_in_process_before_anything_runs(tmp_path):
    """Issue 50: faults, attacks and networks run in-process (one pump over memory); killing the
    coordinator needs its process, and a virtual clock cannot drive site processes."""
    killed = quorum.load_scenario(ROOT / "scenarios" / "faults-coordinator-kill.yaml")
    with pytest.raises(quorum.ScenarioError, match=r"field 'faults': expected no kill_coordinator with backend='inprocess'"):
        quorum.run(killed, tmp_path / "run", backend="inprocess")
    assert not (tmp_path / "run").exists()
    with pytest.raises(quorum.ScenarioError, match="kill_coordinator"):
        quorum.sweep(killed, {"alpha": [0.1]}, tmp_path / "sweep", backend="inprocess")
    crash = quorum.load_scenario(ROOT / "scenarios" / "faults-site-crash.yaml")
    with pytest.raises(quorum.ScenarioError, match=r"field 'runtime.clock'"):
        quorum.run(crash.override({"runtime.clock": "virtual"}), tmp_path / "virtual", backend="processes")
    run = quorum.run(crash.override({"trials": 2}), tmp_path / "ok", backend="inprocess")
    assert set(run.results.status) <= {"ok", "infinite"} and len(run.results) == 8


def test_every_aggregate_says_what_it_averages_over():
    rows = [{"method": "m", "result": "conformal", "codec": "c", "privacy": "none", "epsilon": "", "status": status, "coverage": cov,
             "size": size, "guarantee": "0.9"} for status, cov, size in
            [("ok", "0.9", "2.0"), ("ok", "0.91", "2.1"), ("infinite", "1.0", "inf"), ("aborted", "nan", "nan")]]
    stats = summarize(rows)["m"]
    assert stats["coverage_mean"] == pytest.approx(0.905)
    over = stats["averaged_over"]
    assert "the 2 trials with status ok" in over["coverage_mean"] and "the 2 infinite" in over["coverage_mean"]
    assert over["size_median"] == over["coverage_mean"]
    assert "guarantee" in over["guarantee_mean"] and "4" in over["guarantee_mean"]
    assert {key for key in stats if key.endswith(("_mean", "_std", "_min", "_median"))} <= set(over)


@pytest.mark.parametrize("fault, field, expectation", [
    ({"action": "crash", "sites": "site-001", "phase": "reponse"}, "faults[0].phase", "a phase of the run or of"),
    ({"action": "crash", "sites": "site-001", "trials": 7}, "faults[0].trials", "trials of this run, 0..1"),
    ({"action": "crash", "sites": "site-001", "trials": [0, 2]}, "faults[0].trials", "trials of this run, 0..1"),
    ({"action": "crash", "sites": "site-009"}, "faults[0].sites", "a site id of this scenario"),
    ({"action": "crash", "sites": {"fraction": 0.1}}, "faults[0].sites", "a fraction that selects at least one of the 4 sites"),
    ({"action": "crash", "method": "fedcp_q"}, "faults[0].method", "one of the methods' labels"),
])
def test_a_fault_that_could_never_fire_is_refused_naming_the_field(fault, field, expectation):
    with pytest.raises(quorum.ScenarioError, match=rf"field '{re.escape(field)}': expected {re.escape(expectation)}"):
        quorum.load_scenario(TINY, {"faults": [fault]})


def test_fewer_trials_by_override_leave_later_faults_out_and_say_so():
    crash = ROOT / "scenarios" / "faults-site-crash.yaml"  # crash in trial 1, stragglers in trial 3 of 5
    with pytest.warns(UserWarning, match=r"trials=2: faults\[1\] \(trials 3\) left out: the run has trials 0\.\.1"):
        scenario = quorum.load_scenario(crash, {"trials": 2})
    assert [f["action"] for f in scenario["faults"]] == ["crash"]
    written = quorum.load_scenario(crash).written()
    written["faults"][1]["trials"] = [1, 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert quorum.Scenario.from_dict(written, ["trials=2"])["faults"][1]["trials"] == [1]
