"""Paper 001 figure 3's fast path (bench/paper001_fig3.py) against the live runtime, and the docs'
table against the committed results.

The fast path stacks every client and calls the live halves' own functions (site_step,
server_step, the method's mechanism) with the coordinator's seeded Generator drawn in
TailCoordinator's order; with `noise: seeded` in the sites' policy the live runtime's curator
noise replays from the same Generator, so both give the same final model and so the same test
errors, for every method of the figure.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ROOT / "scenarios/paper001/fig3-small.yaml"


def _bench():
    spec = importlib.util.spec_from_file_location("paper001_fig3", ROOT / "bench/paper001_fig3.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("paper001_fig3", module)  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _bench()


#: figure 3's five methods on fig3-small's world (the paper's central noise for the private ones)
COMMON = {"classes": 10, "rounds": 100, "clients_per_round": 10, "held_out": 20}
METHODS = [
    {"name": "delta_fl", "label": "fedavg", "tail": 0.0, **COMMON},
    {"name": "delta_fl", "label": "delta_fl", "tail": 0.75, **COMMON},
    {"name": "dp_fedavg", "label": "dp_fedavg", "noise": "central", "epsilon": 10.0, "clip": 1.1, **COMMON},
    {"name": "dp_delta_fl", "label": "dp_delta_fl_flat", "noise": "central", "tail": 0.75, "epsilon": 10.0,
     "clip": 1.1, "loss_bound": 1.5, "bins": 16, "quantile_ratio": 0.25, "histogram": "flat", **COMMON},
    {"name": "dp_delta_fl", "label": "dp_delta_fl_hier", "noise": "central", "tail": 0.75, "epsilon": 3.0,
     "clip": 1.1, "loss_bound": 1.5, "bins": 32, "quantile_ratio": 0.5, "histogram": "hierarchical", **COMMON},
    {"name": "dp_delta_fl", "label": "dp_delta_fl_poisson", "noise": "central", "sampling": "poisson", "tail": 0.75,
     "epsilon": 10.0, "clip": 1.1, "loss_bound": 1.5, "bins": 16, "quantile_ratio": 0.25, **COMMON},
]


def _small_scenario(bench) -> dict:
    """fig3-small's world with seeded noise and figure 3's methods."""
    raw = bench.load_scenario(SMALL, {"sites.policy.noise": "seeded"})
    raw["methods"] = copy.deepcopy(METHODS)
    return raw


def _live_errors(scenario: dict, out: Path) -> dict[str, dict]:
    from runner.outputs import RunDirectory
    from runner.study import run_study

    run_study(copy.deepcopy(scenario), out, backend="inprocess")
    rows = RunDirectory(out).read_results()
    errors = {}
    for row in rows:
        assert row["status"] == "ok", row
        details = row["details"] if isinstance(row["details"], dict) else json.loads(row["details"])
        errors[row["method"]] = details
    return errors


def _fast_equals(bench, scenario: dict, live: dict[str, dict]) -> None:
    """The fast path's test errors (and privacy figures) are the live ones, method by method."""
    assert set(live) == {m.get("label", m["name"]) for m in scenario["methods"]}
    spec, validated = bench.world_spec(scenario)
    world = bench.FastWorld.build(spec, 0)
    for label, (index, method) in bench.methods_of(scenario, validated["alpha"]).items():
        fast = bench.run_fast(world, method, index)
        assert fast["test"]["mean_error"] == pytest.approx(live[label]["mean_error"], abs=1e-9), label
        assert fast["test"]["p90_error"] == pytest.approx(live[label]["p90_error"], abs=1e-9), label
        if "mechanism" in fast:
            assert fast["epsilon_central"] == pytest.approx(live[label]["epsilon_central"], rel=1e-9), label
            assert fast["epsilon_site_max"] == pytest.approx(live[label]["epsilon_site_max"], rel=1e-9), label
            assert fast["mechanism"]["sigma_update"] == pytest.approx(live[label]["sigma_update"], rel=1e-12)


def test_the_fast_path_gives_the_live_runtimes_numbers(bench, tmp_path):
    """run.py run --backend inprocess (runner.study.run_study: sites, policy, ledger, codecs and
    the session engine) and the fast path, on fig3-small with seeded noise: FedAvg, Δ-FL,
    DP-FedAvg and DP-Δ-FL on the flat and the hierarchical histogram (and with Poisson sampling)
    give the same test errors and privacy figures."""
    scenario = _small_scenario(bench)
    live = _live_errors(scenario, tmp_path / "run")
    _fast_equals(bench, scenario, live)


def test_the_fast_paths_world_is_the_scenarios(bench):
    """Sites in site order, the last held_out ones held out (the first `validation` of them
    validation clients), each client's rows those a live site serves."""
    from world.trial import build_trial

    scenario = bench.load_scenario(SMALL)
    spec, _ = bench.world_spec(scenario)
    world = bench.FastWorld.build(spec, 0)
    live = build_trial(spec, 0)
    assert world.sites == sorted(live.shards) and world.X1.shape == (80, 100, 21)
    site = world.sites[7]
    assert (world.X1[7, :, :-1] == live.site_scores[site][:, :-1]).all()
    assert (world.y[7] == live.site_scores[site][:, -1]).all()
    training, validation, test = world.roles(20, 5)
    assert list(training) == list(range(60)) and list(validation) == list(range(60, 65))
    assert list(test) == list(range(65, 80))


@pytest.mark.parametrize("name", ["paper001_fig3", "paper001_fig3_poisson", "paper001_fig3_loss_bound"])
def test_the_docs_tables_are_the_committed_results(bench, name):
    """docs/private-training.md's figure 3 tables are bench/results/<name>.json's, as
    bench.docs_table writes them: the figure, the Poisson-sampling counterfactual and the loss
    bounds beyond the paper's grid."""
    result = json.loads((ROOT / f"bench/results/{name}.json").read_text())
    docs = (ROOT / "docs/private-training.md").read_text()
    section = docs.split("## Paper 001 figure 3", 1)[1].split("\n## ", 1)[0]
    assert bench.docs_table(result) in section
