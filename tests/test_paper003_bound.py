"""Paper 003's coverage upper bound (theorem 3, corollary 1): stats/private_coverage.py against the
formula worked by hand, against Monte Carlo of algorithm 3 and against exact enumeration."""

import itertools
import math

import numpy as np
import pytest
from scipy.stats import multinomial

from stats.dp import Bins, exponential_mechanism_log_probabilities, optimal_gamma, private_level
from stats.private_coverage import (corollary1_parameters, corollary1_rate, coverage_upper_bound,
                                    heaviest_bin_share)


def test_theorem3_equals_the_formula_worked_by_hand():
    n, alpha, eps, m, gamma, p_max = 10_000, 0.1, 5.0, 100, 0.5, 0.01
    q = 10_001 * 0.9 / (10_000 * 0.95) + 2 / 50_000 * math.log(100 / 0.05)          # eq. (3): 0.9478
    by_hand = 1 - 0.5 * 0.1 + 0.95 * (0.02 + 2 * (1 + q / (1 - q)) * math.log(2000) / (10_001 * 5))
    assert coverage_upper_bound(n, alpha, eps, m, gamma, p_max) == pytest.approx(by_hand, rel=1e-12)
    assert by_hand < 1  # the case is not the cap


def test_the_bound_is_one_when_the_level_reaches_one():
    assert private_level(20, 0.1, 0.5, 100, 0.5) >= 1
    assert coverage_upper_bound(20, 0.1, 0.5, 100, 0.5, 0.01) == 1.0


def _mechanism_coverage(histogram, level, eps, cdf_at_right_edges):
    return float(np.exp(exponential_mechanism_log_probabilities(histogram, level, eps)) @ cdf_at_right_edges)


def test_monte_carlo_coverage_lies_between_theorem_2_and_theorem_3():
    """Uniform scores on [0, 1] with 100 uniform bins (p_max = 1/100): the coverage of algorithm 3,
    E[F(s-hat)] = E[s-hat], is the mechanism's exact expectation averaged over 300 data sets."""
    n, alpha, eps, m = 1000, 0.1, 5.0, 100
    gamma = optimal_gamma(n, alpha, eps, m)
    level = min(private_level(n, alpha, eps, m, gamma), 1.0)
    bins, rng = Bins(0.0, 1.0, m), np.random.default_rng(3)
    coverage = np.mean([_mechanism_coverage(np.bincount(bins.index_of(rng.uniform(size=n)), minlength=m), level, eps,
                                            bins.edges[1:]) for _ in range(300)])
    bound = coverage_upper_bound(n, alpha, eps, m, gamma, 1.0 / m)
    assert 1 - alpha <= coverage <= bound < 1
    assert bound - coverage < 0.1  # the bound says something (0.973 against 0.911)


@pytest.mark.parametrize("n, m, alpha, eps, probabilities", [
    (20, 4, 0.3, 50.0, [0.25] * 4),
    (24, 3, 0.35, 40.0, [0.5, 0.3, 0.2]),
])
def test_exact_coverage_by_enumeration_is_at_least_one_minus_alpha_and_at_most_the_bound(
        n, m, alpha, eps, probabilities):
    """Every histogram of n scores over m bins with its multinomial probability: the exact
    coverage of algorithm 3 (theorem 2's lower bound holds, theorem 3 is not beaten)."""
    gamma = optimal_gamma(n, alpha, eps, m)
    level = min(private_level(n, alpha, eps, m, gamma), 1.0)
    cdf = np.cumsum(probabilities)
    exact = 0.0
    for cut in itertools.combinations(range(n + m - 1), m - 1):
        histogram = np.diff([-1, *cut, n + m - 1]) - 1
        exact += multinomial.pmf(histogram, n, probabilities) * _mechanism_coverage(histogram, level, eps, cdf)
    assert 1 - alpha <= exact <= coverage_upper_bound(n, alpha, eps, m, gamma, max(probabilities))


def test_corollary_1_excess_coverage_shrinks_at_its_rate():
    """m = n epsilon, gamma = 1/m, p_max = 1/m: the excess over 1 - alpha divided by
    log(n epsilon / alpha) / (n epsilon) settles to a constant (corollary 1)."""
    ratios = []
    for n in (10_000, 100_000, 1_000_000):
        m, gamma = corollary1_parameters(n, 1.0)
        excess = coverage_upper_bound(n, 0.1, 1.0, m, gamma, 1.0 / m) - 0.9
        ratios.append(excess / corollary1_rate(n, 0.1, 1.0))
    assert max(ratios) / min(ratios) < 1.1
    assert corollary1_parameters(1000, 2.0) == (2000, 1 / 2000)


def test_heaviest_bin_share():
    assert heaviest_bin_share([3, 5, 2]) == 0.5
    assert heaviest_bin_share(np.ones(40)) == 1 / 40
    with pytest.raises(ValueError):
        heaviest_bin_share([0, 0])


def test_private_cp_reports_theorem_3_in_its_results_columns():
    """private_cp (central) and private_cp_local (per site) carry theorem 3's inputs; the results
    columns evaluate it with the calibration scores' heaviest bin (results.conformal)."""
    from types import SimpleNamespace

    from protocol.methods import METHODS
    from protocol.methods.base import Planned

    rng = np.random.default_rng(5)
    scores = {"a": rng.uniform(size=600), "b": rng.uniform(size=400)}
    truth = SimpleNamespace(world=SimpleNamespace(site_scores=scores))
    central = METHODS["private_cp"](0.1, epsilon=5.0, bins={"count": 100, "lo": 0.0, "hi": 1.0})
    outcome = central.combine({"a": 600, "b": 400}, Planned({"a": {}, "b": {}}), scores, set(), rng)
    upper, p_max = outcome.coverage_upper_bound(truth)
    bins = Bins(0.0, 1.0, 100)
    share = heaviest_bin_share(np.bincount(bins.index_of(np.concatenate([scores["a"], scores["b"]])), minlength=100))
    assert p_max == share
    assert upper == coverage_upper_bound(1000, 0.1, 5.0, 100, outcome.details["gamma"], share) < 1
    assert "coverage_upper_bound" in type(outcome).COLUMNS

    local = METHODS["private_cp_local"](0.1, epsilon=5.0, bins={"count": 100, "lo": 0.0, "hi": 1.0})
    planned = local.plan({"a": 600, "b": 400})
    outcome = local.combine({"a": 600, "b": 400}, planned, {"a": 90, "b": 91}, set(), rng)
    upper, _ = outcome.coverage_upper_bound(truth)
    per_site = [coverage_upper_bound(n, 0.1, 5.0, 100, optimal_gamma(n, 0.1, 5.0, 100),
                                     heaviest_bin_share(np.bincount(bins.index_of(scores[s]), minlength=100)))
                for s, n in (("a", 600), ("b", 400))]
    assert upper == pytest.approx(np.mean(per_site))
