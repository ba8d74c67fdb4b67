"""Unequal site sizes and dropouts (paper 000 appendix A.1, A.3, theorem 3.3; issue 3)."""

import itertools

import numpy as np
import pytest

from stats.optimizer import plan_optimized
from stats.orderstats import qq_coverage
from stats.planner import (COVERAGE_TOLERANCE, QQPlan, plan_paper_rule, plan_quantile_of_quantiles,
                           replan_after_dropouts)
from stats.unbalanced import coverage_unbalanced
from tests.oracles import appendix_a1_brute_force, appendix_a1_exact, binomial_tolerance

PAPER004_TEN = (307, 250, 208, 172, 143, 118, 98, 81, 67, 56)


@pytest.mark.parametrize("sizes", [(2, 3, 1), (3, 2, 2), (1, 4), (2, 2, 3, 1)])
def test_matches_the_literal_sums_of_appendix_a1(sizes):
    for ells in itertools.product(*[range(1, n + 2) for n in sizes]):  # n + 1: an infinite answer
        for k in range(1, len(sizes) + 1):
            exact = appendix_a1_brute_force(sizes, ells, k)
            assert abs(coverage_unbalanced(sizes, ells, k) - float(exact)) < 1e-13


def test_exact_oracle_agrees_with_literal_sums():
    for sizes, ells in [((2, 3, 1), (2, 2, 1)), ((3, 2, 2), (3, 1, 2)), ((2, 2, 3, 1), (1, 2, 3, 2))]:
        for k in range(1, len(sizes) + 1):
            assert appendix_a1_exact(sizes, ells, k) == appendix_a1_brute_force(sizes, ells, k)


def test_against_exact_rationals_at_moderate_sizes():
    rng = np.random.default_rng(3)
    for _ in range(4):
        sizes = tuple(int(n) for n in rng.integers(3, 30, size=6))
        ells = tuple(int(rng.integers(1, n + 1)) for n in sizes)
        k = int(rng.integers(1, 7))
        assert abs(coverage_unbalanced(sizes, ells, k) - float(appendix_a1_exact(sizes, ells, k))) < 1e-13


def test_paper004_partition_against_exact_rationals():
    ells = tuple(int(np.ceil(0.9 * (n + 1))) for n in PAPER004_TEN)
    assert abs(coverage_unbalanced(PAPER004_TEN, ells, 5) - float(appendix_a1_exact(PAPER004_TEN, ells, 5))) < 1e-13


def test_equal_sizes_reduce_to_eq5():
    for ell, k in [(18, 35), (20, 50), (1, 1), (9, 12)]:
        assert abs(coverage_unbalanced((20,) * 50, (ell,) * 50, k) - qq_coverage(50, 20, ell, k)) < 1e-13


def test_infinite_answers_never_count_among_the_k_smallest():
    # Two sites asked beyond their size answer +inf; with k = 3 of the 2 finite ones, Q = +inf.
    assert coverage_unbalanced((5, 5, 10, 10), (6, 6, 9, 9), 3) == 1.0
    assert coverage_unbalanced((5, 5, 10, 10), (6, 6, 9, 9), 2) == pytest.approx(
        coverage_unbalanced((10, 10), (9, 9), 2), abs=1e-14)


def simulate(sizes, ells, k, reps, rng, dropout_count=0):
    """Monte Carlo coverage of the quantile of quantiles with continuous scores."""
    hits = 0
    m = len(sizes)
    for _ in range(reps):
        answered = np.sort(rng.choice(m, size=m - dropout_count, replace=False))
        local = [np.sort(rng.standard_normal(sizes[j]))[ells[j] - 1] if ells[j] <= sizes[j] else np.inf
                 for j in answered]
        kk = k if not dropout_count else replan_after_dropouts([sizes[j] for j in answered],
                                                                [ells[j] for j in answered], 0.1).k
        hits += rng.standard_normal() <= np.sort(local)[kk - 1]
    return hits / reps


def test_paper_rule_plan_and_its_monte_carlo_coverage():
    plan = plan_paper_rule(PAPER004_TEN, 0.1)
    assert plan.ells == tuple(int(np.ceil(0.9 * (n + 1))) for n in PAPER004_TEN)
    assert plan.coverage >= 0.9 and coverage_unbalanced(PAPER004_TEN, plan.ells, plan.k - 1) < 0.9
    rate = simulate(PAPER004_TEN, plan.ells, plan.k, 4000, np.random.default_rng(11))
    assert abs(rate - plan.coverage) <= binomial_tolerance(plan.coverage, 4000)


def test_optimized_plan_is_strictly_closer_on_the_paper004_sizes():
    paper = plan_paper_rule(PAPER004_TEN, 0.1)
    best = plan_optimized(PAPER004_TEN, 0.1)
    exact = float(appendix_a1_exact(PAPER004_TEN, best.ells, best.k))  # independent check
    assert abs(exact - best.coverage) < 1e-13
    assert 0.9 <= exact < paper.coverage
    assert best.coverage - 0.9 < 0.25 * (paper.coverage - 0.9)
    rate = simulate(PAPER004_TEN, best.ells, best.k, 4000, np.random.default_rng(12))
    assert abs(rate - best.coverage) <= binomial_tolerance(best.coverage, 4000)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_optimized_is_valid_and_never_worse_than_the_paper_rule(seed):
    rng = np.random.default_rng(seed)
    sizes = tuple(int(n) for n in rng.integers(5, 200, size=int(rng.integers(5, 40))))
    paper, best = plan_paper_rule(sizes, 0.1), plan_optimized(sizes, 0.1)
    assert coverage_unbalanced(sizes, best.ells, best.k) >= 0.9 - COVERAGE_TOLERANCE
    assert best.coverage <= paper.coverage
    assert all(1 <= e <= n for e, n in zip(best.ells, sizes))


def test_optimized_beats_eq6_with_equal_sizes():
    equal = plan_quantile_of_quantiles(50, 20, 0.1)
    best = plan_optimized((20,) * 50, 0.1)
    assert 0.9 <= best.coverage < equal.coverage


@pytest.mark.parametrize("planner", ["optimized", "optimal"])
def test_dropout_robust_plans_admit_a_valid_k_for_every_subset(planner):
    sizes = (12, 9, 15, 7, 10, 11) if planner == "optimized" else (10,) * 6
    d = 2
    plan = (plan_optimized(sizes, 0.1, d) if planner == "optimized"
            else plan_quantile_of_quantiles(6, 10, 0.1, d))
    assert not plan.infinite
    for size in range(len(sizes) - d, len(sizes) + 1):
        for subset in itertools.combinations(range(len(sizes)), size):
            replanned = replan_after_dropouts([sizes[j] for j in subset], [plan.ells[j] for j in subset], 0.1)
            assert not replanned.infinite, subset
            assert replanned.coverage >= 0.9 - COVERAGE_TOLERANCE


def test_coverage_holds_under_scripted_dropouts_by_monte_carlo():
    sizes = PAPER004_TEN
    plan = plan_optimized(sizes, 0.1, 3)
    rng = np.random.default_rng(21)
    reps = 3000
    rate = simulate(sizes, plan.ells, plan.k, reps, rng, dropout_count=3)
    assert rate >= 0.9 - binomial_tolerance(0.9, reps)


def test_refuses_when_no_plan_can_absorb_the_dropouts():
    plan = plan_paper_rule((10, 10, 10, 10), 0.1, 3)  # one site alone: at most 10/11 ... of its max
    equal = plan_quantile_of_quantiles(4, 3, 0.1, 3)   # 1 site of 3 points: at most 3/4 < 0.9
    assert equal.infinite and "whole line" in equal.reason
    assert plan.infinite or plan.coverage >= 0.9
    optimized = plan_optimized((3, 3, 3, 3), 0.1, 3)
    assert optimized.infinite and "3 dropout(s)" in optimized.reason


def test_conditional_bound_of_theorem_3_3():
    holds = QQPlan((20,) * 5, 0.1, (19,) * 5, 5, 0.95)  # ell * k = 95 >= 0.9 * 100
    assert holds.conditional_bound(0.05) == pytest.approx(0.1 + np.sqrt(np.log(20) / 200))
    fails = QQPlan((20,) * 50, 0.1, (18,) * 50, 35, 0.9017)  # 630 < 900
    assert fails.conditional_bound() is None
    assert plan_quantile_of_quantiles(50, 20, 0.1).as_dict()["conditional"] is None
