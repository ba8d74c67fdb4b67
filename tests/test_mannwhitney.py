"""Federated Mann-Whitney tests (paper 004 section 4) against scipy and brute force, the null
distribution of each combination by Monte Carlo, and the federated-table statistic (eq. 3)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from stats.kanon import apply_release, first_release, join_release
from stats.mannwhitney import (SiteStatistic, fisher_p_value, null_variance, optimal_weights, p_value,
                               pooled_test, site_statistic, t_sum, t_weighted, u_federated, u_statistic)


def brute_u(x, y):
    return sum(np.sign(yj - xi) for xi, yj in itertools.product(x, y))


@pytest.mark.parametrize("seed", range(6))
def test_u_and_tie_variance_match_brute_force_and_scipy(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 6, rng.integers(1, 25)).astype(float)  # heavy ties
    y = rng.integers(0, 7, rng.integers(1, 25)).astype(float)
    stat = site_statistic(x, y)
    assert stat.u == brute_u(x, y)
    ref = stats.mannwhitneyu(y, x, alternative="greater", use_continuity=False, method="asymptotic")
    assert stat.u == 2 * ref.statistic - len(x) * len(y)
    if stat.variance > 0:
        assert math.isclose(p_value(stat.u / math.sqrt(stat.variance)), ref.pvalue, rel_tol=1e-9, abs_tol=1e-15)


def test_pooled_reference_agrees_with_scipy_on_continuous_data():
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=1500), rng.normal(size=1500) + 0.1
    z, p = pooled_test(x, y)
    ref = stats.mannwhitneyu(y, x, alternative="greater", use_continuity=False, method="asymptotic")
    assert math.isclose(p, ref.pvalue, rel_tol=1e-9)


def test_null_variance_exact_for_small_case_by_enumeration():
    """Var(U | H0) as the variance over all assignments of the pooled values to the groups."""
    pooled = np.array([1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 4.0])
    n = 3
    us = [brute_u(pooled[list(idx)], np.delete(pooled, list(idx)))
          for idx in itertools.combinations(range(pooled.size), n)]
    _, ties = np.unique(pooled, return_counts=True)
    assert math.isclose(np.var(us), null_variance(n, pooled.size - n, ties), rel_tol=1e-12)


def test_weights_follow_sizes_and_weighted_equals_sum_for_equal_sites():
    sites = [SiteStatistic(3.0, null_variance(50, 50, np.ones(100)), 50, 50) for _ in range(3)]
    a = optimal_weights(sites)
    assert np.allclose(a, a[0])
    assert math.isclose(t_weighted(sites), t_sum(sites), rel_tol=1e-12)
    big = SiteStatistic(0.0, null_variance(100, 100, np.ones(200)), 100, 100)
    small = SiteStatistic(0.0, null_variance(10, 10, np.ones(20)), 10, 10)
    ratio = optimal_weights([big, small])
    # m n / sqrt(m n (N + 1) / 3): proportional to sqrt(m n / (N + 1))
    assert math.isclose(ratio[0] / ratio[1], math.sqrt(100 * 100 / 201) / math.sqrt(10 * 10 / 21))


def test_u_federated_equals_u_when_every_value_has_its_own_bin():
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=30), rng.normal(size=20)
    pooled = np.sort(np.concatenate([x, y]))
    fx = np.isin(pooled, x).astype(float)
    fy = np.isin(pooled, y).astype(float)
    u, v = u_federated(fx, fy)
    assert u == u_statistic(x, y)
    assert math.isclose(v, null_variance(30, 20, np.ones(50)))


def test_u_federated_treats_a_bin_as_ties():
    fx, fy = np.array([2.0, 0.0, 1.0]), np.array([1.0, 3.0, 0.0])
    x = np.array([0.0, 0.0, 2.0])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    u, v = u_federated(fx, fy)
    assert u == brute_u(x, y)
    _, ties = np.unique(np.concatenate([x, y]), return_counts=True)
    assert math.isclose(v, null_variance(3, 4, ties))


def _federation(rng, sizes, delta, sigma_alpha=0.1):
    sites = []
    for n in sizes:
        alpha = rng.normal(0, sigma_alpha)
        sites.append((rng.normal(size=n) + alpha, rng.normal(size=n) + alpha + delta))
    return sites


def _p_values(sites, k=10, rng=None):
    stats_ = [site_statistic(x, y) for x, y in sites]
    out = {"sum": p_value(t_sum(stats_)), "weighted": p_value(t_weighted(stats_)),
           "fisher": fisher_p_value([p_value(s.u / math.sqrt(s.variance)) for s in stats_]),
           "pooled": pooled_test(np.concatenate([x for x, _ in sites]), np.concatenate([y for _, y in sites]))[1]}
    table = None
    for x, y in sorted(sites, key=lambda s: -(s[0].size + s[1].size)):
        release = (first_release([x, y], k, rng) if table is None else join_release(table.limits, [x, y], k, rng))
        table = apply_release(table, release)
    u, v = u_federated(np.array(table.counts[0]), np.array(table.counts[1]))
    out["table"] = p_value(u / math.sqrt(v))
    return out


def test_type_one_error_near_nominal_under_the_null():
    """Table 1's 5-centre sizes (scaled down 4x to keep the test fast), delta = 0, centre effects
    sigma_alpha = 0.1: the rejection rate at 0.05 of each test is within 3 binomial standard
    errors of 0.05 over 400 simulated federations."""
    rng = np.random.default_rng(11)
    sizes = [123, 92, 69, 52, 39]
    runs = 400
    rejections = {k: 0 for k in ("sum", "weighted", "fisher", "pooled", "table")}
    for _ in range(runs):
        for name, p in _p_values(_federation(rng, sizes, 0.0), rng=rng).items():
            rejections[name] += p < 0.05
    tolerance = 3 * math.sqrt(0.05 * 0.95 / runs)
    for name, count in rejections.items():
        assert abs(count / runs - 0.05) <= tolerance, (name, count / runs)


def test_weighted_test_closest_to_pooled_under_an_effect():
    """Section 4.6's finding: under delta > 0 the weighted test's p-values track the pooled test's
    (smallest mean |log p_v / p_pooled|) and the sum test loses power to centre effects."""
    rng, table_rng = np.random.default_rng(12), np.random.default_rng(13)  # the data never depend on the table's draws
    sizes = [307, 250, 208, 172, 143, 118, 98, 81, 67, 56]
    gaps = {k: [] for k in ("sum", "weighted", "table")}
    for _ in range(60):
        ps = _p_values(_federation(rng, sizes, 0.1, sigma_alpha=0.2), rng=table_rng)
        for name in gaps:
            gaps[name].append(abs(math.log(ps[name] / ps["pooled"])))
    means = {k: float(np.mean(v)) for k, v in gaps.items()}
    assert means["weighted"] < means["sum"] and means["weighted"] < means["table"], means
