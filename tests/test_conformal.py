"""Order statistics, split conformal, scores and prediction sets."""

import math

import numpy as np
import pytest

from models.scores import (absolute_residual_interval, absolute_residual_score, coverage_and_size,
                           cqr_interval, cqr_score)
from stats.conformal import (average_of_quantiles, order_statistic, quantile_of_quantiles,
                             split_conformal_order, split_conformal_threshold)
from tests.oracles import binomial_tolerance


def test_order_statistic_against_sorting():
    rng = np.random.default_rng(0)
    values = rng.standard_normal(57)
    ordered = np.sort(values)
    for k in range(1, 58):
        assert order_statistic(values, k) == ordered[k - 1]
    assert order_statistic(values, 58) == math.inf  # eq. (2): beyond the sample, +inf
    with pytest.raises(ValueError):
        order_statistic(values, 0)


@pytest.mark.parametrize("n,alpha,order", [(29, 0.1, 27), (9, 0.1, 9), (19, 0.05, 19), (1000, 0.1, 901), (5, 0.1, 6)])
def test_split_conformal_order_rounds_exact_products_correctly(n, alpha, order):
    assert split_conformal_order(n, alpha) == order


def test_split_conformal_coverage_is_exact_for_continuous_scores():
    rng = np.random.default_rng(3)
    n, alpha, reps = 30, 0.1, 40000
    scores = rng.exponential(size=(reps, n))
    thresholds = np.sort(scores, axis=1)[:, split_conformal_order(n, alpha) - 1]
    covered = rng.exponential(size=reps) <= thresholds
    target = split_conformal_order(n, alpha) / (n + 1)
    assert abs(covered.mean() - target) <= binomial_tolerance(target, reps)
    assert split_conformal_threshold(scores[0], alpha) == thresholds[0]


def test_server_aggregates():
    values = [3.0, 1.0, 2.0, 5.0]
    assert quantile_of_quantiles(values, 2) == 2.0
    assert average_of_quantiles(values) == 2.75
    assert average_of_quantiles([1.0, math.inf]) == math.inf


def test_scores_and_sets_are_consistent():
    rng = np.random.default_rng(2)
    y = rng.standard_normal(200)
    pred = rng.standard_normal(200)
    bounds = np.sort(rng.standard_normal((200, 2)), axis=1)
    q = 0.7
    for score, interval, base in [(absolute_residual_score, absolute_residual_interval, pred),
                                  (cqr_score, cqr_interval, bounds)]:
        lower, upper = interval(base, q)
        assert np.array_equal(score(y, base) <= q, (lower <= y) & (y <= upper))


def test_coverage_and_size_counts_empty_sets_as_zero_length():
    y = np.array([0.0, 1.0, 2.0])
    coverage, size = coverage_and_size(y, np.array([-1.0, 2.0, 1.5]), np.array([1.0, 1.5, 2.5]))
    assert coverage == pytest.approx(2 / 3)
    assert size == pytest.approx((2.0 + 0.0 + 1.0) / 3)
