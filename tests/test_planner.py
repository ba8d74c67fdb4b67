"""Choosing (ell*, k*) (paper 000 eq. 6) and re-planning k after dropouts."""

import numpy as np
import pytest

from stats.orderstats import qq_coverage, qq_coverage_table
from stats.planner import COVERAGE_TOLERANCE, plan_quantile_of_quantiles, replan_server_order


def brute_force_plan(m, n, alpha):
    table = qq_coverage_table(m, n)
    feasible = np.where(table >= 1 - alpha - COVERAGE_TOLERANCE, table, np.inf)
    ell, k = np.unravel_index(np.argmin(feasible), table.shape)
    return int(ell) + 1, int(k) + 1, float(table[ell, k])


@pytest.mark.parametrize("m", [1, 2, 5, 10, 37, 50, 100])
@pytest.mark.parametrize("n", [1, 3, 10, 20, 64])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_plan_is_the_argmin_over_the_full_table(m, n, alpha):
    plan = plan_quantile_of_quantiles(m, n, alpha)
    if m * n / (m * n + 1) < 1 - alpha:
        assert plan.infinite and "whole line" in plan.reason
        return
    ell, k, coverage = brute_force_plan(m, n, alpha)
    assert plan.coverage == pytest.approx(coverage, abs=1e-14)
    assert plan.coverage >= 1 - alpha - COVERAGE_TOLERANCE
    # ties in M are possible in principle; the chosen pair must attain the same minimum
    assert qq_coverage(m, n, plan.ell, plan.k) == pytest.approx(coverage, abs=1e-14)


def test_published_plan_m5_n10():
    plan = plan_quantile_of_quantiles(5, 10, 0.1)
    assert (plan.ell, plan.k) == (10, 3)
    assert plan.coverage == pytest.approx(0.9256259545517654, abs=1e-12)


def test_exact_boundary_case_is_not_lost_to_rounding():
    # n = 1: M[1, k] = k / (m + 1); with m = 9, k = 9 reaches exactly 0.9.
    plan = plan_quantile_of_quantiles(9, 1, 0.1)
    assert (plan.ell, plan.k) == (1, 9)


def test_infinite_plan_when_even_the_maximum_falls_short():
    plan = plan_quantile_of_quantiles(1, 5, 0.1)  # best coverage 5/6 < 0.9
    assert plan.infinite and plan.ell is None and plan.coverage == 1.0


@pytest.mark.parametrize("answered", [50, 45, 30, 12, 5])
def test_replanned_k_is_the_smallest_valid_one(answered):
    plan = replan_server_order(answered, 20, 18, 0.1)
    if plan.infinite:
        assert qq_coverage(answered, 20, 18, answered) < 0.9
        return
    assert qq_coverage(answered, 20, 18, plan.k) >= 0.9 - COVERAGE_TOLERANCE
    if plan.k > 1:
        assert qq_coverage(answered, 20, 18, plan.k - 1) < 0.9


def test_replan_refuses_when_too_few_answer():
    plan = replan_server_order(2, 20, 18, 0.1)
    assert plan.infinite and "2 answering sites" in plan.reason
    assert replan_server_order(0, 20, 18, 0.1).infinite


def test_rejects_bad_alpha():
    with pytest.raises(ValueError):
        plan_quantile_of_quantiles(5, 10, 1.0)


def whole_table_plan(m: int, n: int, alpha: float, dropouts: int):
    """Eq. (6) by the whole table: the least M[ell, k] >= 1 - alpha over ells still valid with
    m - dropouts answers (ties: the smallest ell, then the smallest k)."""
    from stats.orderstats import qq_coverage_table
    from stats.planner import COVERAGE_TOLERANCE

    table = qq_coverage_table(m, n)
    threshold = 1 - alpha - COVERAGE_TOLERANCE
    best = None
    for ell in range(1, n + 1):
        if dropouts and table[ell - 1, m - dropouts - 1] < threshold:
            continue
        for k in range(1, m + 1):
            cov = table[ell - 1, k - 1]
            if cov >= threshold and (best is None or cov < best[2]):
                best = (ell, k, cov)
    return best


@pytest.mark.parametrize("m,n,dropouts", [(1, 9, 0), (2, 30, 0), (2, 30, 1), (3, 17, 0), (3, 17, 1), (5, 40, 0),
                                          (5, 40, 1), (8, 12, 0), (8, 12, 1), (12, 50, 0), (12, 50, 1), (20, 7, 0),
                                          (20, 7, 1)])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.25])
def test_planning_k_by_k_gives_the_plan_of_the_whole_table(m, n, alpha, dropouts):
    """Issue 48 point 4: the optimal planner searches k by k (O(m log n)) for large n, ell by ell
    (O(n log m)) otherwise; both give eq. (6)'s plan as the whole table does."""
    from stats.planner import _plan_by_k, plan_quantile_of_quantiles

    expected = whole_table_plan(m, n, alpha, dropouts)
    for plan in (_plan_by_k(m, n, alpha, dropouts), plan_quantile_of_quantiles.__wrapped__(m, n, alpha, dropouts)):
        if expected is None:
            assert plan.infinite
        else:
            assert (plan.ells[0], plan.k) == expected[:2] and plan.coverage == pytest.approx(expected[2], abs=1e-12)


def test_planning_for_a_million_scores_a_site_is_quick_and_the_same_plan():
    """Two sites of a million scores each took 44 s and 1.6 GiB to plan (the issue); k by k it
    is a few dozen evaluations (the bound is timed in bench/plan_time.py, not here). At 50,000
    scores, where the ell-by-ell search still runs in a second, both give the same plan."""
    from stats.planner import _plan_by_k, smallest_valid_k

    plan = plan_quantile_of_quantiles.__wrapped__(2, 10**6, 0.1)
    assert 0.9 <= plan.coverage < 0.9 + 1e-5
    assert plan.coverage == pytest.approx(qq_coverage(2, 10**6, plan.ells[0], plan.k), abs=1e-15)
    m, n = 3, 50_000
    ells = np.arange(1, n + 1)
    ks, covs = smallest_valid_k(m, n, ells, 0.1)
    i = int(np.argmin(np.where(ks > 0, covs, np.inf)))
    by_k = _plan_by_k(m, n, 0.1, 0)
    assert (by_k.ells[0], by_k.k, by_k.coverage) == (int(ells[i]), int(ks[i]), float(covs[i]))
