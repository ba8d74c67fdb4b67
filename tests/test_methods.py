"""The three methods, run in-process through their coordinator and site halves."""

import math

import numpy as np
import pytest

from protocol.inprocess import drive, run_session
from protocol.methods import METHODS, RequestError
from protocol.methods.base import LocalOrderStatistic
from stats.conformal import order_statistic, split_conformal_order
from stats.orderstats import qq_coverage
from stats.planner import plan_quantile_of_quantiles, replan_server_order
from tests.oracles import binomial_tolerance


def sites(rng, m, n):
    return {f"site-{j:03d}": rng.standard_normal(n) for j in range(m)}


def no_rng(site):
    return np.random.default_rng(0)


def test_fedcp_qq_is_the_quantile_of_quantiles():
    rng = np.random.default_rng(0)
    data = sites(rng, 50, 20)
    outcome = run_session(METHODS["fedcp_qq"](0.1), data, no_rng)
    plan = plan_quantile_of_quantiles(50, 20, 0.1)
    local = sorted(np.sort(s)[plan.ell - 1] for s in data.values())
    assert outcome.status == "ok"
    assert outcome.threshold == local[plan.k - 1]
    assert (outcome.details["ell"], outcome.details["k"]) == (plan.ell, plan.k)
    assert outcome.details["guarantee"] == plan.coverage


def test_fedcp_avg_averages_local_split_conformal_quantiles():
    rng = np.random.default_rng(1)
    data = sites(rng, 10, 30)
    outcome = run_session(METHODS["fedcp_avg"](0.1), data, no_rng)
    order = split_conformal_order(30, 0.1)
    assert outcome.threshold == pytest.approx(np.mean([np.sort(s)[order - 1] for s in data.values()]), abs=1e-15)


def test_fedcp_avg_is_infinite_when_sites_are_too_small():
    data = sites(np.random.default_rng(1), 4, 5)  # ceil(6 * 0.9) = 6 > 5 points
    outcome = run_session(METHODS["fedcp_avg"](0.1), data, no_rng)
    assert outcome.status == "infinite" and outcome.threshold == math.inf


def test_centralized_is_split_conformal_on_the_pooled_scores():
    rng = np.random.default_rng(2)
    data = sites(rng, 7, 13)
    outcome = run_session(METHODS["centralized"](0.1), data, no_rng)
    pooled = np.concatenate(list(data.values()))
    assert outcome.threshold == order_statistic(pooled, split_conformal_order(pooled.size, 0.1))
    assert outcome.details["pooled"] == 91


@pytest.mark.parametrize("m,n", [(10, 20), (30, 5)])
def test_fedcp_qq_coverage_by_monte_carlo(m, n):
    rng = np.random.default_rng(10 * m + n)
    method = METHODS["fedcp_qq"](0.1)
    reps, hits = 3000, 0
    for _ in range(reps):
        outcome = run_session(method, sites(rng, m, n), no_rng)
        hits += rng.standard_normal() <= outcome.threshold
    target = plan_quantile_of_quantiles(m, n, 0.1).coverage
    assert abs(hits / reps - target) <= binomial_tolerance(target, reps)


def refusing_ask(data, refuse):
    """An `ask` where the sites in `refuse` decline, as a dropped site would."""
    def ask(site, phase, body):
        if site in refuse:
            raise RequestError("simulated dropout")
        return float(LocalOrderStatistic(data[site]).answer(phase, body))
    return ask


def test_fedcp_qq_replans_k_for_the_sites_that_answered():
    rng = np.random.default_rng(4)
    data = sites(rng, 50, 20)
    refuse = set(list(data)[:10])
    sizes = {s: 20 for s in data}
    outcome = drive(METHODS["fedcp_qq"](0.1), sizes, refusing_ask(data, refuse), np.random.default_rng(0))
    plan = plan_quantile_of_quantiles(50, 20, 0.1)
    replanned = replan_server_order(40, 20, plan.ell, 0.1)
    answered = sorted(np.sort(data[s])[plan.ell - 1] for s in data if s not in refuse)
    assert outcome.details["answered"] == 40 and len(outcome.details["dropped"]) == 10
    assert outcome.details["k"] == replanned.k != plan.k
    assert outcome.threshold == answered[replanned.k - 1]


def test_coverage_holds_under_dropouts_by_monte_carlo():
    rng = np.random.default_rng(6)
    method = METHODS["fedcp_qq"](0.1)
    m, n, reps, hits = 20, 15, 3000, 0
    sizes = {f"site-{j:03d}": n for j in range(m)}
    for _ in range(reps):
        data = sites(rng, m, n)
        refuse = set(rng.choice(list(data), size=5, replace=False))
        outcome = drive(method, sizes, refusing_ask(data, refuse), np.random.default_rng(0))
        hits += rng.standard_normal() <= outcome.threshold
    ell = plan_quantile_of_quantiles(m, n, 0.1).ell
    target = qq_coverage(15, n, ell, replan_server_order(15, n, ell, 0.1).k)
    assert target >= 0.9
    assert abs(hits / reps - target) <= binomial_tolerance(target, reps)


def test_fedcp_qq_refuses_with_a_reason_when_too_few_answer():
    # m=50, n=20 plans ell=18; one site alone gives at most 18/21 < 0.9 (with 10 sites, whose
    # plan is ell=19, one site would still reach 19/21 >= 0.9).
    rng = np.random.default_rng(5)
    data = sites(rng, 50, 20)
    refuse = set(list(data)[:49])
    outcome = drive(METHODS["fedcp_qq"](0.1), {s: 20 for s in data}, refusing_ask(data, refuse), np.random.default_rng(0))
    assert outcome.status == "infinite" and outcome.threshold == math.inf
    assert "1 answering sites" in outcome.reason


def test_eq6_planner_refuses_unequal_sizes_with_the_reason():
    data = {"a": np.zeros(10), "b": np.zeros(12)}
    outcome = run_session(METHODS["fedcp_qq"](0.1, planner="optimal"), data, no_rng)
    assert outcome.status == "aborted" and "needs equal site sizes" in outcome.reason


def test_unequal_sizes_are_planned_per_site():
    rng = np.random.default_rng(8)
    sizes = [30, 25, 20, 15, 12, 40, 9, 33]
    data = {f"site-{j}": rng.standard_normal(n) for j, n in enumerate(sizes)}
    for planner in ("auto", "paper_rule", "optimized"):
        outcome = run_session(METHODS["fedcp_qq"](0.1, planner=planner), data, no_rng)
        assert outcome.status == "ok" and outcome.details["guarantee"] >= 0.9 - 1e-12


def test_no_answers_aborts():
    outcome = drive(METHODS["fedcp_qq"](0.1), {"a": 20}, refusing_ask({"a": np.zeros(20)}, {"a"}), np.random.default_rng(0))
    assert outcome.status == "aborted" and "no site answered" in outcome.reason


@pytest.mark.parametrize("body", [{}, {"ell": 0}, {"ell": "3"}, {"ell": True}, {"ell": 3, "x": 1}])
def test_site_half_refuses_malformed_requests(body):
    with pytest.raises(RequestError):
        LocalOrderStatistic(np.arange(5.0)).answer("respond", body)
