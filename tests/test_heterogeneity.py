"""The heterogeneity report and proposition 3.4 of paper 000 (issue 8, point 3)."""

from __future__ import annotations

import numpy as np
import pytest

from runner.heterogeneity import HeterogeneityReport, NotEstimable, proposition_34, site_summary
from stats.optimizer import plan_orders
from scenarios.scenario import validate_scenario
from stats.conformal import order_statistic, quantile_of_quantiles
from stats.unbalanced import coverage_unbalanced
from world.trial import WorldSpec, build_trial
from tests.oracles import binomial_tolerance


def scenario(kind="none", **heterogeneity):
    return validate_scenario({
        "name": "h", "seed": 5, "trials": 1,
        "data": {"source": "synthetic", "generator": "romano2019", "n": 6000},
        "sites": {"count": 6, "sizes": 100, "heterogeneity": {"kind": kind, **heterogeneity},
                  "policy": {"non_private": "allow"}},
        "model": {"kind": "ridge"}, "methods": [{"name": "fedcp_qq"}]})


def tv_of(s):
    world = build_trial(WorldSpec.of(s), 0)
    sizes = [len(y) for _, y in world.shards.values()]
    ells = list(plan_orders(tuple(sizes), s["alpha"]).ells)
    return proposition_34(world, s["sites"]["heterogeneity"], sizes, ells, np.random.default_rng(0))


def test_exchangeable_sites_lose_nothing():
    assert tv_of(scenario()) == 0.0
    assert tv_of(scenario("location", sigma=0.0)) == 0.0  # every site law is the reference


def test_the_bound_grows_with_the_shift():
    small, large = tv_of(scenario("location", sigma=0.05)), tv_of(scenario("location", sigma=1.0))
    assert 0 < small < large <= 1
    assert tv_of(scenario("scale", sigma=0.5)) > 0


def test_sort_partitions_are_estimated_from_the_test_set():
    mixed = tv_of(scenario("response", strength=0.0))
    sorted_ = tv_of(scenario("response", strength=1.0))
    assert sorted_ > 0.5 and mixed < sorted_ / 3
    with pytest.raises(NotEstimable, match="cluster heterogeneity"):  # not estimable: reported as such
        tv_of(scenario("cluster"))


def test_prop34_tv_is_a_coverage_loss_bound_for_a_location_shift():
    """Proposition 3.4: coverage >= M - E[d_TV]. Sites shifted by alpha_j draw their n_j scores
    from the test pool; over many draws FedCP-QQ's coverage of the unshifted test set must not
    fall below the plan's exact coverage minus the estimated TV term (Monte Carlo)."""
    s = scenario("location", sigma=0.6)
    world = build_trial(WorldSpec.of(s), 0)
    sizes = [len(y) for _, y in world.shards.values()]
    plan = plan_orders(tuple(sizes), s["alpha"])
    tv = proposition_34(world, s["sites"]["heterogeneity"], sizes, list(plan.ells), np.random.default_rng(0))
    rng = np.random.default_rng(1)
    scores = np.abs(world.y_test - world.test_base)
    covered = []
    for _ in range(400):
        local = []
        for alpha_j, n_j, ell in zip(world.shifts, sizes, plan.ells):
            draw = rng.choice(len(scores), n_j)
            local.append(order_statistic(np.abs(world.y_test[draw] + alpha_j - world.test_base[draw]), ell))
        covered.append(np.mean(scores <= quantile_of_quantiles(local, plan.k)))
    bound = coverage_unbalanced(sizes, list(plan.ells), plan.k) - tv
    assert 0 < tv < 1
    assert np.mean(covered) >= bound - binomial_tolerance(bound, 400)


def test_report_lists_each_sites_size_and_a_spread():
    s = scenario("location", sigma=1.0)
    world = build_trial(WorldSpec.of(s), 0)
    summary = site_summary(world)
    assert [v["n"] for v in summary.values()] == [100] * 6
    report = HeterogeneityReport(s["sites"]["heterogeneity"], s["alpha"])
    report.add(world, np.random.default_rng(0))
    out = report.summary()
    assert out["kind"] == "location" and out["proposition_34_tv"] > 0 and out["spread"] > 0
    assert set(out["sites"]) == set(world.shards)


def test_a_bound_not_estimated_says_why_in_the_summary_and_the_printed_line():
    """Issue 24: 6,000 rows, a 0.2 test fraction and 60 sites leave 20 test points per sorted
    block, below MIN_BLOCK = 30: the summary's null comes with the reason, and so does the line."""
    from runner.report import sites_line

    s = validate_scenario({**scenario("response", strength=1.0), "sites": {
        **scenario("response")["sites"], "count": 60, "sizes": 30}})
    report = HeterogeneityReport(s["sites"]["heterogeneity"], s["alpha"])
    report.add(build_trial(WorldSpec.of(s), 0), np.random.default_rng(0))
    out = report.summary()
    assert out["proposition_34_tv"] is None
    assert "holds 20 of the 1200 test points, fewer than the 30" in out["proposition_34_why"]
    line = sites_line({"heterogeneity": out, "site_devices": ["cpu"]})
    assert "proposition 3.4 bound not estimated: response partition" in line
    computed = HeterogeneityReport(scenario("location", sigma=1.0)["sites"]["heterogeneity"], 0.1)
    computed.add(build_trial(WorldSpec.of(scenario("location", sigma=1.0)), 0), np.random.default_rng(0))
    assert computed.summary()["proposition_34_why"] is None


@pytest.mark.parametrize("kind", ["sort", "cluster", "dirichlet"])
def test_heterogeneity_kinds_in_scenarios(kind):
    if kind == "dirichlet":
        with pytest.raises(ValueError, match="classification data only"):
            scenario(kind)
    else:
        world = build_trial(WorldSpec.of(scenario(kind)), 0)
        assert sum(len(y) for _, y in world.shards.values()) == 600


def test_sorted_blocks_span_the_whole_range_when_sites_hold_a_subset():
    world = build_trial(WorldSpec.of(scenario("response")), 0)
    means = [np.mean(y) for _, y in world.shards.values()]
    assert means == sorted(means)
    pooled = np.concatenate([y for _, y in world.shards.values()])
    assert np.max(pooled) > np.quantile(world.y_test, 0.95)  # the top block reaches the top
