"""Plugins (specs.plugins): a method, codec, model kind and data source that live outside the
repository, named by import path in a scenario, validated before anything starts, and loaded by
site processes too; lookups by name never import anything."""

from __future__ import annotations

import csv
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from data.sources import SOURCES
from models import MODELS
from protocol.codecs import CODECS
from protocol.methods import METHODS
from scenarios.scenario import validate_scenario
from specs import plugins
from specs.plugins import PluginError, Registry
from specs.schema import ScenarioError

ROOT = Path(__file__).resolve().parent.parent

PLUGIN = '''
"""A lab's own components, outside Quorum."""
import numpy as np

from data.sources import Dataset, DataSource
from models.value import Value
from protocol.codecs.base import Codec, PayloadError
from protocol.methods.base import OneShotMethod, Planned, SiteHalf
from results.conformal import Threshold


class Largest(Codec):
    name = "largest"

    def encode(self, value):
        return float(value)

    def decode(self, body):
        if not isinstance(body, float):
            raise PayloadError("largest: a float")
        return body

    def information_bits(self, value):
        return 64


class MaxOfMaxes(OneShotMethod):
    """Each site sends its largest score; the threshold is the largest of them (covers every
    calibration point, so at least 1 - alpha of exchangeable test points)."""
    name = "max_of_maxes"
    codec = "labplugin:Largest"

    def plan(self, sizes):
        return Planned({site: {} for site in sizes})

    def combine(self, sizes, planned, answers, dropped, rng):
        return Threshold.ok(max(answers.values()), answered=len(answers))

    @classmethod
    def site(cls, rows, rng, site_id):
        return Largest_(rows)


class Largest_(SiteHalf):
    def __init__(self, scores):
        self.scores = scores

    def answer(self, phase, body):
        return float(np.max(self.scores))


class Uniform(DataSource):
    name = "uniform_rows"
    PARAMS = {"n": {"type": "int", "min": 2}}

    @staticmethod
    def task(params):
        return "regression"

    @staticmethod
    def rows(params):
        return params["n"]

    @staticmethod
    def load(params, rng):
        X = rng.uniform(size=(params["n"], 1))
        return Dataset(X, X[:, 0] * 10.0)


class Absolute(Value):
    kind = "absolute_value"


class NotAMethod:
    name = "not_a_method"


class Abstract(OneShotMethod):
    name = "abstract"
    codec = "raw_quantile"


class UnknownCodec(MaxOfMaxes):
    name = "unknown_codec"
    codec = "no_such_codec"
'''


@pytest.fixture(autouse=True)
def registries_as_they_were():
    """Classes loaded by a test stay registered in this process; forget them afterwards, so that
    other tests see Quorum's own components only."""
    saved = [(registry, dict(registry._classes)) for registry in (METHODS, CODECS, MODELS, SOURCES)]
    yield
    for registry, classes in saved:
        registry._classes = classes


@pytest.fixture()
def plugin_dir(tmp_path, monkeypatch):
    (tmp_path / "labplugin.py").write_text(PLUGIN)
    (tmp_path / "broken_plugin.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def scenario(method="labplugin:MaxOfMaxes", source="labplugin:Uniform", kind="labplugin:Absolute") -> dict:
    return {"name": "plugins", "trials": 2, "seed": 1, "data": {"source": source, "n": 400},
            "sites": {"count": 4, "policy": {"non_private": "allow"}}, "model": {"kind": kind}, "methods": [{"name": method}, {"name": "centralized"}],
            "runtime": {"deadlines": {"hello": 60, "join": 10, "respond": 5}}}


def test_a_scenario_names_a_method_codec_model_and_data_source_by_import_path(plugin_dir, tmp_path):
    from runner.study import run_study

    spec = validate_scenario(scenario())
    assert spec["methods"][0]["label"] == "max_of_maxes"
    assert METHODS["max_of_maxes"].__name__ == "MaxOfMaxes" and CODECS["labplugin:Largest"].name == "largest"
    assert MODELS["absolute_value"].__name__ == "Absolute" and SOURCES["uniform_rows"].__name__ == "Uniform"
    summary = run_study(spec, tmp_path / "run", backend="inprocess")
    assert summary["methods"]["max_of_maxes"]["ok"] == 2
    assert summary["methods"]["max_of_maxes"]["coverage_mean"] >= summary["methods"]["centralized"]["coverage_mean"]


@pytest.mark.parametrize(("field", "value", "reason"), [
    ("method", "broken_plugin:Thing", "importing 'broken_plugin' failed: ModuleNotFoundError"),
    ("method", "labplugin:NoSuch", "module 'labplugin' has no attribute 'NoSuch'"),
    ("method", "labplugin:NotAMethod", "does not subclass quorum.plugin.Method"),
    ("method", "labplugin:Abstract", "leaves abstract ['combine', 'plan', 'site'] undefined"),
    ("method", "labplugin:UnknownCodec", "its codec: no codec is registered as 'no_such_codec'"),
    ("method", "labplugin:Uniform", "does not subclass quorum.plugin.Method"),
    ("kind", "labplugin:MaxOfMaxes", "does not subclass quorum.plugin.Model"),
    ("source", "labplugin:Absolute", "does not subclass quorum.plugin.DataSource"),
])
def test_a_plugin_that_does_not_load_or_fit_the_interface_is_named_with_the_reason(plugin_dir, field, value,
                                                                                  reason):
    where = {"method": r"methods\[0\]\.name", "kind": r"model\.kind", "source": r"data\.source"}[field]
    with pytest.raises(ScenarioError, match=where) as caught:
        validate_scenario(scenario(**{field: value}))
    assert reason in str(caught.value)


def test_an_unknown_plain_name_still_lists_the_choices():
    with pytest.raises(ScenarioError, match=r"methods\[0\]\.name.*fedcp_qq"):
        validate_scenario(scenario(method="fedcp_q"))


def test_looking_up_a_name_never_imports_a_module():
    before = set(sys.modules)
    assert METHODS.get("antigravity:fly") is None and "json:dumps" not in CODECS
    with pytest.raises(KeyError):
        MODELS["this_module_does_not_exist:Model"]
    assert "antigravity" not in set(sys.modules) - before


def test_an_entry_point_is_registered_under_its_name_and_may_not_take_a_built_in_name(monkeypatch):
    def fake(group):
        return [EntryPoint("centralized", "protocol.methods.fedcp_qq:FedCPQQ", group)]
    monkeypatch.setattr(plugins, "entry_points", fake)
    registry = Registry("method", "quorum.methods", {"centralized": "protocol.methods.centralized:Centralized"},
                        key="name", check=lambda cls: None)
    with pytest.raises(PluginError, match="takes the name of Quorum's own method"):
        list(registry)

    def renamed(group):
        return [EntryPoint("qq", "protocol.methods.fedcp_qq:FedCPQQ", group)]
    monkeypatch.setattr(plugins, "entry_points", renamed)
    registry = Registry("method", "quorum.methods", {}, key="name", check=lambda cls: None)
    with pytest.raises(PluginError, match="registered as 'qq' but names itself 'fedcp_qq'"):
        registry["qq"]  # a registered name whose class does not load says why (a KeyError would not)


def test_site_processes_load_the_plugins_the_scenario_names(tmp_path):
    """Over site processes (a host of 2 sites and one of 2), with the plugin only on PYTHONPATH,
    not installed: the hosts load it from the scenario and answer the method by its name."""
    (tmp_path / "labplugin.py").write_text(PLUGIN)
    import yaml

    spec = scenario()
    spec["runtime"]["placement"] = {"sites_per_process": 2}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}"}
    done = subprocess.run([sys.executable, str(ROOT / "run.py"), "run", str(tmp_path / "s.yaml"), "--out",
                           str(tmp_path / "run")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "results.csv")) if r["method"] == "max_of_maxes"]
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["answered"] == "4" for r in rows)
