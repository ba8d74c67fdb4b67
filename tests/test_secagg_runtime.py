"""Secure aggregation over real site processes: a site lost in any of the four phases, and too
many lost, with the DDG quantile method (scenario faults applied by the generic drivers)."""

import csv

import numpy as np
import pytest
import yaml

from runner.outputs import RunDirectory
from runner.study import run_study
from scenarios.scenario import validate_scenario
from stats.dp import Bins
from stats.ddg import flat_histogram, quantile_index
from world.trial import WorldSpec, build_trial
from tests.support import TINY

BINS = {"count": 16, "lo": 0.0, "hi": 3.0}
# epsilon this weak makes c so large that the noise cannot move the estimate off the noiseless
# bin: the threshold then checks that the securely aggregated histogram is the survivors' own
METHOD = {"name": "ddg_quantile", "epsilon": 5000.0, "bins": BINS, "count": "exact", "secagg": {"graph": "full"}}


def scenario(faults, **method) -> dict:
    raw = yaml.safe_load(TINY.read_text())
    raw.update(trials=1, methods=[{**METHOD, **method}], faults=faults, sites={"count": 6, "sizes": "equal",
                                                                          # epsilon 5000 and, under report, a
                                                                          # claim resting on t inputs
                                                                          "policy": {"max_epsilon": "unlimited",
                                                                                     "min_contributors": 2},
                                                                          "budget": {"epsilon": "unlimited"}})
    raw["data"]["n"] = 600
    raw["runtime"] = {"deadlines": {"hello": 30, "join": 10, "respond": 2}}
    return validate_scenario(raw)


def noiseless_threshold(spec, included):
    world = build_trial(WorldSpec.of(spec), 0)
    values = np.concatenate([world.site_scores[s] for s in included])
    edges = Bins(BINS["lo"], BINS["hi"], BINS["count"]).edges
    cdf = np.cumsum(flat_histogram(values, edges)) / values.size
    level = min(1.0, np.ceil(0.9 * (values.size + 1)) / values.size)
    return edges[quantile_index(cdf, level)]


@pytest.mark.parametrize("phase", ["advertise", "share", "mask", "unmask"])
def test_a_site_crashing_in_any_phase_leaves_the_exact_sum_of_the_others(tmp_path, phase):
    spec = scenario([{"action": "crash", "sites": "site-002", "phase": phase}], dropouts=1)
    run_study(spec, tmp_path)
    (row,) = RunDirectory(tmp_path).read_results()
    assert row["status"] == "ok", row["reason"]
    # a site lost in unmask had already sent its masked input: the sum still includes it
    answered = 6 if phase == "unmask" else 5
    assert int(row["answered"]) == answered
    included = [f"site-{i:03d}" for i in range(6) if phase == "unmask" or i != 2]
    assert float(row["threshold"]) == pytest.approx(noiseless_threshold(spec, included), abs=0)
    # the noise was planned for 5 sites (dropouts: 1): the privacy asked holds either way
    assert float(row["epsilon_obtained"]) <= 5000.0 * (1 + 1e-9)


@pytest.mark.parametrize("policy", ["abort", "report"])
def test_a_dropout_the_noise_was_not_planned_for_is_never_a_silent_ok(tmp_path, policy):
    """Noise planned for all 6 sites, one lost in the mask phase: by default the sum is never
    unmasked (no site is asked to unmask) and the session aborts naming the shortfall; with
    on_shortfall: report the threshold is released with status 'shortfall'."""
    spec = scenario([{"action": "crash", "sites": "site-002", "phase": "mask"}], on_shortfall=policy)
    run_study(spec, tmp_path)
    (row,) = RunDirectory(tmp_path).read_results()
    assert "privacy shortfall: 5 noisy inputs where the noise was planned for 6" in row["reason"]
    ledger = (tmp_path / "ledger.csv").read_text()
    if policy == "abort":
        assert row["status"] == "aborted" and "not unmasked" in row["reason"]
        assert ",unmask," not in ledger  # nothing was asked that could reveal the sum
    else:
        assert row["status"] == "shortfall" and float(row["epsilon_obtained"]) > 5000.0
        assert float(row["threshold"]) == pytest.approx(
            noiseless_threshold(spec, [f"site-{i:03d}" for i in range(6) if i != 2]), abs=0)
    # what each site counted against its budget: the epsilon asked where the unmask step enforces
    # the planned inputs, or what the secagg threshold's inputs give where a shortfall may be released
    with open(tmp_path / "privacy.csv") as handle:
        spent = [float(r["epsilon_basic"]) for r in csv.DictReader(handle) if r["method"] == "total"]
    assert len(spent) == 6 and all((e == pytest.approx(5000.0)) == (policy == "abort") for e in spent)
    assert all(e >= 5000.0 for e in spent)


def test_too_many_dropouts_end_in_an_explained_abort(tmp_path):
    spec = scenario([{"action": "straggle", "sites": ["site-000", "site-001", "site-003"], "phase": "mask"}])
    run_study(spec, tmp_path)
    (row,) = RunDirectory(tmp_path).read_results()
    assert row["status"] == "aborted"
    # the active mode's threshold: more than two thirds of the 6 holders of each secret
    assert "threshold is 5" in row["reason"] and "mask" in row["reason"]
