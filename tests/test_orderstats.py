"""The exact coverage core M[ell, k] (paper 000 eq. 5, appendix A.2-A.3)."""

import numpy as np
import pytest

from stats.orderstats import max_per_site_coverage, qq_coverage, qq_coverage_table
from tests.oracles import binomial_tolerance, eq5_brute_force, eq5_exact


@pytest.mark.parametrize("m,n", [(1, 1), (1, 4), (2, 3), (3, 2), (3, 3), (4, 2), (2, 5)])
def test_matches_the_literal_sums_of_eq5(m, n):
    for ell in range(1, n + 1):
        for k in range(1, m + 1):
            assert abs(qq_coverage(m, n, ell, k) - float(eq5_brute_force(m, n, ell, k))) < 1e-13


def test_exact_oracle_agrees_with_literal_sums():
    for m, n in [(2, 3), (3, 3), (4, 2)]:
        for ell in range(1, n + 1):
            for k in range(1, m + 1):
                assert eq5_exact(m, n, ell, k) == eq5_brute_force(m, n, ell, k)


@pytest.mark.parametrize("m,n", [(5, 10), (10, 20)])
def test_full_table_matches_exact_rationals(m, n):
    table = qq_coverage_table(m, n)
    exact = np.array([[float(eq5_exact(m, n, ell, k)) for k in range(1, m + 1)] for ell in range(1, n + 1)])
    assert np.max(np.abs(table - exact)) < 1e-12


def test_large_sizes_against_exact_rationals_at_random_orders():
    rng = np.random.default_rng(5)
    m, n = 25, 40
    for _ in range(6):
        ell, k = int(rng.integers(1, n + 1)), int(rng.integers(1, m + 1))
        assert abs(qq_coverage(m, n, ell, k) - float(eq5_exact(m, n, ell, k))) < 1e-12


def test_published_value_for_m5_n10():
    # The authors' notebook (computation_of_M.ipynb) prints (k, ell) = (3, 10): 0.9256259545517654.
    assert abs(qq_coverage(5, 10, 10, 3) - 0.9256259545517654) < 1e-12


@pytest.mark.parametrize("m,n", [(5, 10), (20, 7), (200, 3), (1000, 1000)])
def test_max_per_site_closed_form(m, n):
    ks = np.arange(1, m + 1)
    assert np.max(np.abs(qq_coverage(m, n, n, ks) - max_per_site_coverage(m, n, ks))) < 1e-11


def test_degenerate_cases_reduce_to_split_conformal():
    m, n = 17, 23
    assert np.allclose(qq_coverage(m, 1, 1, np.arange(1, m + 1)), np.arange(1, m + 1) / (m + 1), atol=1e-14)
    assert np.allclose(qq_coverage(1, n, np.arange(1, n + 1), 1), np.arange(1, n + 1) / (n + 1), atol=1e-14)


def test_monotone_in_both_orders():
    table = qq_coverage_table(12, 30)
    assert np.all(np.diff(table, axis=0) >= -1e-14)
    assert np.all(np.diff(table, axis=1) >= -1e-14)


@pytest.mark.parametrize("m,n,ell,k", [(10, 20, 19, 5), (50, 20, 18, 35), (7, 3, 2, 4)])
def test_monte_carlo_coverage_equals_M_for_continuous_scores(m, n, ell, k):
    rng = np.random.default_rng(m * 1000 + n)
    reps = 20000
    scores = rng.standard_normal((reps, m, n))
    local = np.sort(scores, axis=2)[:, :, ell - 1]
    qq = np.sort(local, axis=1)[:, k - 1]
    covered = rng.standard_normal(reps) <= qq
    target = qq_coverage(m, n, ell, k)
    assert abs(covered.mean() - target) <= binomial_tolerance(target, reps)


def test_coverage_is_a_lower_bound_with_ties():
    # Theorem 3.2: with atoms in the score law, P(S <= Q) >= M (not equality).
    m, n, ell, k = 8, 10, 9, 5
    rng = np.random.default_rng(1)
    reps = 20000
    scores = rng.integers(0, 4, (reps, m, n)).astype(float)
    qq = np.sort(np.sort(scores, axis=2)[:, :, ell - 1], axis=1)[:, k - 1]
    covered = rng.integers(0, 4, reps) <= qq
    assert covered.mean() >= qq_coverage(m, n, ell, k) - binomial_tolerance(0.9, reps)


def test_rejects_orders_outside_the_table():
    with pytest.raises(ValueError):
        qq_coverage(5, 10, 11, 1)
    with pytest.raises(ValueError):
        qq_coverage(5, 10, 1, 0)
