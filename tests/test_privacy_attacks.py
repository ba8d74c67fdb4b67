"""Issue 20: privacy attacked with data and timing nobody chose.

K-anonymous tables: a withheld group takes no part in a release; a few outliers never move a
buffer (the midpoint attack); buffers are random; bounds equal to data values and values at
adjacent floats are released. Differencing: a site sends an identical request the identical
release and refuses a different one beyond its budget. DP budgets: each site refuses what would
take it past its epsilon, under basic or PLD composition (checked against exact optimal
composition), across restarts. Shortfalls are never a silent ok.
"""

from __future__ import annotations

import csv
import math

import msgpack
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from protocol.accounting import Budget, SiteAccount, Spend, basic_composition, pld_composition
from protocol.methods import RequestError
from protocol.methods.kanon_table import table_request
from protocol.methods.private_bin import bin_spend
from runner.outputs import RunDirectory
from runner.study import run_study
from scenarios.scenario import validate_scenario
from specs.schema import ScenarioError
from sites.local import SiteLocal
from stats.kanon import KAnonymityError, check_release, first_release, join_release
from tests.support import TINY

SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
seeds = st.integers(0, 2**32 - 1)
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


def adjacent_run(start: float, count: int) -> list[float]:
    """`count` consecutive floats from `start`: no number lies strictly between two of them."""
    values = [float(start)]
    for _ in range(count - 1):
        values.append(float(np.nextafter(values[-1], math.inf)))
    return values


# -- K-anonymous releases: what a single release reveals ------------------------------------------


@SLOW
@given(st.lists(finite, min_size=10, max_size=40), st.lists(finite, min_size=1, max_size=4),
       st.lists(finite, min_size=1, max_size=4), st.sampled_from(["buffer", "infinite"]), seeds)
def test_a_withheld_group_takes_no_part_in_the_release(active, withheld_a, withheld_b, extremes, seed):
    """Two sites that differ only in the values of a group under K release exactly the same
    table, first or joining: nothing about the withheld values or their per-bin counts leaves."""
    k = 5
    x = np.array(active)
    releases = []
    for w in (withheld_a[: k - 1], withheld_b[: len(withheld_a[: k - 1])]):
        if len(w) != len(withheld_a[: k - 1]):
            return  # the two withheld groups must have the same (public) size
        first = first_release([x, np.array(w)], k, np.random.default_rng(seed), extremes)
        joined = join_release([-2e6, -1.0, 1.0, 2e6], [x, np.array(w)], k, np.random.default_rng(seed), extremes)
        releases.append((first, joined))
    assert releases[0] == releases[1]
    assert releases[0][0].withheld == (False, True) and releases[0][0].cells[1] == ()


@SLOW
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=20, max_size=60),
       st.lists(st.floats(1.5, 1e9, allow_nan=False), min_size=1, max_size=4), st.booleans(), seeds)
def test_fewer_than_k_outliers_never_move_a_buffer(base, outliers, low, seed):
    """The midpoint attack of issue 20: a joining site's lone point beyond the table moved the
    buffer to 2 v - c_1, so (c_1 + c_B) / 2 = v. Now fewer than K points beyond a limit leave it
    where it is (they are counted in the extreme bin), whatever their values."""
    k = 5
    rng = np.random.default_rng(seed)
    table = first_release([np.array(base)], k, rng)
    scale = table.limits[-1] - table.limits[0] + 1.0
    beyond = [table.limits[0] - o * scale for o in outliers] if low else [table.limits[-1] + o * scale for o in outliers]
    joiner = np.array(sorted(base)[:10] + beyond)
    release = join_release(table.limits, [joiner], k, rng)
    assert release.limits[0] == table.limits[0] and release.limits[-1] == table.limits[-1]
    check_release(release, [joiner], k, public_limits=table.limits)
    limits = np.array(release.limits)
    midpoints = (limits[:, None] + limits[None, :]) / 2
    assert not np.any(np.isin(np.array(beyond), midpoints))


@SLOW
@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=20, max_size=60), st.integers(5, 12),
       st.floats(2.0, 1e6, allow_nan=False), seeds)
def test_k_outliers_move_a_buffer_to_a_random_place_beyond_them(base, count, spread, seed):
    k = 5
    table = first_release([np.array(base)], k, np.random.default_rng(seed))
    top = table.limits[-1]
    beyond = top + 1.0 + np.linspace(0.0, spread, count)
    joiner = np.concatenate([np.sort(base)[:5], beyond])
    a = join_release(table.limits, [joiner], k, np.random.default_rng(seed))
    b = join_release(table.limits, [joiner], k, np.random.default_rng(seed + 1))
    assert a.limits[-1] > beyond.max() and b.limits[-1] > beyond.max()
    assert a.limits[-1] != b.limits[-1]  # random: the limit bounds the maximum, never determines it
    check_release(a, [joiner], k, public_limits=table.limits)


def test_the_issue_example_no_longer_reveals_the_outlier():
    rng = np.random.default_rng(0)
    table = first_release([np.arange(20.0)], 5, rng)
    release = join_release(table.limits, [np.array([0.5, 1.5, 2.5, 3.5, 4.5, 100.0])], 5, rng)
    limits = np.array(release.limits)
    assert limits[-1] == table.limits[-1] < 100.0
    assert 100.0 not in (limits[:, None] + limits[None, :]) / 2
    assert release.cells == (((0, len(limits) - 2, 6),),)  # one cell: all six points together


@SLOW
@given(st.floats(-1e3, 1e3, allow_nan=False), st.integers(1, 30), st.integers(0, 20), st.integers(2, 10),
       st.sampled_from(["buffer", "bounds", "infinite"]), seeds)
def test_bounds_equal_to_data_and_adjacent_floats_are_released(start, run, equal_to_bounds, k, extremes, seed):
    """Paper 004's own example (a lower limit 0 that sites hold) and values at adjacent floats:
    whenever the site holds at least K values, a release exists and passes the site's check."""
    lo, hi = start - 1.0, start + 1.0
    values = np.array(adjacent_run(start, run) + [lo] * equal_to_bounds + [hi] * (equal_to_bounds // 2))
    bounds = (lo, hi) if extremes == "bounds" else None
    public = bounds or ()
    if values.size < k:
        with pytest.raises(KAnonymityError, match="nothing can be released"):
            first_release([values], k, np.random.default_rng(seed), extremes, bounds)
        return
    first = first_release([values], k, np.random.default_rng(seed), extremes, bounds)
    check_release(first, [values], k, public_limits=public)
    joined = join_release(first.limits, [values], k, np.random.default_rng(seed + 1), extremes, bounds)
    check_release(joined, [values], k, public_limits=tuple(first.limits) + tuple(public))


# -- differencing across sessions: the site's own account ------------------------------------------


def two_sample_site(tmp_path, budget=None, site="site-0", seed=0):
    rng = np.random.default_rng(seed)
    rows = np.column_stack([rng.normal(0, 1, 120), rng.integers(0, 2, 120)]).astype(float)
    local = SiteLocal(site, tmp_path, budget=budget)
    local.hold(0, 1, rows)
    return local


def ask_table(local, session, method, limits=(), k=10, extremes="buffer"):
    from protocol.codecs import CODECS

    body = {**table_request(k, extremes, []), "limits": list(limits)}
    return local.answer(session, method, "table-0", CODECS["summary"]().wrap_request(body))


def test_an_identical_table_request_gets_the_identical_release_and_a_different_one_is_refused(tmp_path):
    local = two_sample_site(tmp_path)
    first = ask_table(local, 1, "kanon_quantiles")
    again = ask_table(local, 2, "kanon_quantiles")  # another session, same request: nothing new
    assert msgpack.packb(first) == msgpack.packb(again)
    with pytest.raises(RequestError, match="K-anonymous release"):
        ask_table(local, 3, "mwu_table")  # the same data grouped otherwise: could be differenced
    with pytest.raises(RequestError, match="K-anonymous release"):
        ask_table(local, 4, "kanon_quantiles", limits=[-10.0, 0.0, 10.0])
    # a restarted site reads its account back and still refuses
    restarted = two_sample_site(tmp_path)
    with pytest.raises(RequestError, match="K-anonymous release"):
        ask_table(restarted, 5, "kanon_quantiles", k=5)
    assert msgpack.packb(ask_table(restarted, 6, "kanon_quantiles")) == msgpack.packb(first)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["kanon_quantiles", "mwu_table"]), st.sampled_from([5, 10]),
                          st.sampled_from([(), (-10.0, 0.0, 10.0), (-10.0, 1.0, 10.0)])), min_size=1, max_size=8),
       st.integers(1, 3))
def test_no_sequence_of_requests_gets_more_distinct_tables_than_the_budget(tmp_path_factory, requests, budget):
    local = two_sample_site(tmp_path_factory.mktemp("site"), budget={"kanon_releases": budget})
    answers = {}
    for session, (method, k, limits) in enumerate(requests, start=1):
        key = (method, k, limits)
        try:
            body = msgpack.packb(ask_table(local, session, method, limits, k))
        except RequestError as exc:
            assert "privacy budget" in str(exc) and key not in answers
            assert len(answers) == budget
            continue
        assert answers.setdefault(key, body) == body  # the same request: the same bytes
    assert len(answers) <= budget


# -- DP budgets ------------------------------------------------------------------------------------


def optimal_homogeneous_epsilon(epsilon: float, k: int, delta: float) -> float:
    """The exact optimal composition of k epsilon-DP mechanisms (Kairouz, Oh and Viswanath
    2015, theorem 3.3), by brute force over the binomial privacy loss of randomized response."""
    x = np.arange(k + 1)
    p = stats.binom.pmf(x, k, math.exp(epsilon) / (1 + math.exp(epsilon)))  # x 'agreeing' outcomes
    loss = epsilon * (2 * x - k)

    def delta_at(eps):
        return float(np.sum(p * np.maximum(0.0, 1.0 - np.exp(eps - loss))))

    lo, hi = 0.0, k * epsilon
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if delta_at(mid) <= delta else (mid, hi)
    return hi


@pytest.mark.parametrize("epsilon,k,delta", [(0.1, 50, 1e-5), (0.5, 20, 1e-6), (1.0, 10, 1e-3), (0.05, 400, 1e-6)])
def test_pld_composition_is_the_exact_optimal_composition(epsilon, k, delta):
    exact = optimal_homogeneous_epsilon(epsilon, k, delta)
    pld = pld_composition([(epsilon, 0.0)] * k, delta)
    assert exact - 1e-9 <= pld <= exact + 5e-3 and pld <= k * epsilon


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0.01, 5.0), st.sampled_from([0.0, 1e-8, 1e-6])), min_size=1, max_size=20))
def test_pld_never_worse_than_basic(events):
    eps_basic, delta_basic = basic_composition(events)
    assert pld_composition(events, delta_basic + 1e-5) <= eps_basic + 1e-9


def bin_request(epsilon, central=None):
    from protocol.codecs import CODECS

    body = {"level": 0.9, "epsilon": epsilon, "bins": {"lo": -3.0, "hi": 3.0, "count": 20}}
    if central is not None:
        body["central"] = central
    return CODECS["exp_mech_bins"](20).wrap_request(body)


@pytest.mark.parametrize("composition", ["basic", "pld"])
def test_a_site_refuses_a_request_past_its_epsilon_even_after_a_restart(tmp_path, composition):
    budget = {"epsilon": 1.0, "delta": 1e-6, "composition": composition}
    local = SiteLocal("site-0", tmp_path, budget=budget)
    local.hold(0, 1, np.random.default_rng(0).normal(size=50))
    local.answer(1, "fedcp2_qq", "respond", bin_request(0.4))
    local.answer(2, "fedcp2_qq", "respond", bin_request(0.4))
    with pytest.raises(RequestError, match="over its budget 1"):
        local.answer(3, "fedcp2_qq", "respond", bin_request(0.4))
    restarted = SiteLocal("site-0", tmp_path, budget=budget)
    restarted.hold(0, 1, local.rows)
    with pytest.raises(RequestError, match="spent so far: 0.8"):
        restarted.answer(4, "fedcp2_qq", "respond", bin_request(0.3))
    restarted.answer(5, "fedcp2_qq", "respond", bin_request(0.15))  # 0.95 fits
    kinds = [r["kind"] for r in restarted.account.records]
    assert kinds == ["dp", "dp", "refused", "refused", "dp"]
    # a new trial's data (scope trial) starts afresh; a new trial number over the same data does
    # not (issue 36: the scope is the data's fingerprint); under scope dataset neither would
    restarted.hold(1, 1, local.rows)
    with pytest.raises(RequestError, match="over its budget 1"):
        restarted.answer(1001, "fedcp2_qq", "respond", bin_request(0.9))
    restarted.hold(2, 1, local.rows + 100.0)
    restarted.answer(2001, "fedcp2_qq", "respond", bin_request(0.9))
    dataset = SiteLocal("site-1", tmp_path, budget={**budget, "scope": "dataset"})
    dataset.hold(0, 1, local.rows)
    dataset.answer(1, "fedcp2_qq", "respond", bin_request(0.9))
    dataset.hold(1, 1, local.rows)
    with pytest.raises(RequestError, match="per dataset"):
        dataset.answer(1001, "fedcp2_qq", "respond", bin_request(0.9))


def test_a_site_counts_the_central_epsilon_only_when_amplification_backs_it():
    from stats.amplification import shuffled_epsilon

    backed = shuffled_epsilon(2.0, 1000, 1e-6)
    spend = bin_spend({"epsilon": 2.0, "central": {"epsilon": backed * 1.001, "delta": 1e-6, "messages": 1000}},
                      amplified=True)
    assert spend.epsilon == pytest.approx(backed * 1.001) and spend.delta == 1e-6
    for lie in ({"epsilon": backed / 2, "delta": 1e-6, "messages": 1000},  # claims more privacy than 1000 give
                {"epsilon": backed * 1.001, "delta": 1e-6, "messages": 1000.0},
                {"epsilon": backed * 1.001, "delta": 0, "messages": 1000}):
        with pytest.raises(RequestError):
            bin_spend({"epsilon": 2.0, "central": lie}, amplified=True)


def test_an_account_refuses_a_delta_it_cannot_hold():
    account = SiteAccount(Budget(epsilon=10.0, delta=1e-6, composition="pld"))
    with pytest.raises(ValueError, match="delta 1e-06"):
        account.admit(0, "", Spend("dp", 0.5, 2e-6))


# -- a run: refusals, reuse and privacy.csv --------------------------------------------------------


def run_tiny(tmp_path, methods, budget, **scenario):
    raw = yaml.safe_load(TINY.read_text())
    raw.update(trials=1, methods=methods, **scenario)
    raw["sites"] = {**raw["sites"], "budget": budget}
    run_study(validate_scenario(raw), tmp_path, backend="inprocess")
    rows = {r["method"]: r for r in RunDirectory(tmp_path).read_results()}
    with open(tmp_path / "privacy.csv") as handle:
        spent = list(csv.DictReader(handle))
    return rows, spent


def test_a_run_stops_at_each_sites_budget_and_reports_what_each_site_spent(tmp_path, monkeypatch):
    """The sites' own check at run time, whatever the study checked before: with the harness's
    budget check switched off (a study that did not plan for its sites' budget), the second
    epsilon-4 release is refused by every site and reported."""
    import scenarios.scenario

    bins = {"count": 20, "lo": "training", "hi": "training"}
    with pytest.raises(ScenarioError, match="sites.budget.epsilon"):  # what validation says first
        run_tiny(tmp_path / "checked", [{"name": "fedcp2_qq", "label": "first", "epsilon": 4.0, "bins": bins},
                                        {"name": "fedcp2_qq", "label": "second", "epsilon": 4.0, "bins": bins}],
                 {"epsilon": 6.0, "composition": "basic"})
    monkeypatch.setattr(scenarios.scenario, "_budget_checks", lambda s: iter(()))
    rows, spent = run_tiny(tmp_path, [{"name": "fedcp2_qq", "label": "first", "epsilon": 4.0, "bins": bins},
                                      {"name": "fedcp2_qq", "label": "second", "epsilon": 4.0, "bins": bins},
                                      {"name": "fedcp_qq"}],
                           {"epsilon": 6.0, "composition": "basic"})
    assert rows["first"]["status"] == "ok" and rows["second"]["status"] == "aborted"
    assert "privacy budget" in rows["second"]["reason"]
    totals = {r["site"]: r for r in spent if r["method"] == "total"}
    assert len(totals) == 4
    for row in totals.values():
        assert float(row["epsilon_basic"]) == pytest.approx(4.0) and int(row["refused"]) == 1
        assert int(row["non_private"]) == 1  # fedcp_qq's raw local quantile, listed
    second = [r for r in spent if r["method"] == "second"]
    assert all(int(r["refused"]) == 1 and float(r["epsilon_basic"]) == 0.0 for r in second)
    summary = RunDirectory(tmp_path).summary.read_text()
    assert '"refused": 4' in summary


def test_two_sessions_on_the_same_table_reuse_it_and_a_differently_grouped_one_is_refused(tmp_path):
    raw_scenario = {"data": {"source": "synthetic", "generator": "paper004_shift", "n": 900, "n_test": 10,
                             "options": {"delta": 0.1}},
                    "split": {"train": 0.02, "calibration": 0.98, "test": 0.0}, "model": {"kind": "two_sample"},
                    "sites": {"count": 3, "sizes": [400, 280, 150]}}
    methods = [{"name": "kanon_quantiles", "label": "naive", "estimator": "naive"},
               {"name": "kanon_quantiles", "label": "yj", "estimator": "yj_table"},
               {"name": "mwu_table", "label": "table"}]
    rows, spent = run_tiny(tmp_path, methods, {}, **raw_scenario)
    assert rows["naive"]["status"] == "ok" and rows["yj"]["status"] == "ok"
    assert rows["table"]["status"] == "aborted" and "privacy budget" in rows["table"]["reason"]
    by = {(r["site"], r["method"]): r for r in spent}
    for site in ("site-000", "site-001", "site-002"):
        assert int(by[(site, "yj")]["reused"]) == 1 and int(by[(site, "yj")]["releases"]) == 0
        assert int(by[(site, "total")]["kanon_tables"]) == 1
