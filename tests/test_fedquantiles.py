"""Federated quantile estimators (paper 004 section 5): the YJ transformation and likelihood
against scipy, federated moments equal to pooled ones, the table estimators on exact small
cases, the quantile loss, and the section 5.4 finding (YJ likelihood best in the tails)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from stats.fedquantiles import (INVPHI, golden_section_step, lambda_grid, naive_table_quantile, quantile_loss_terms,
                                table_cdf,
                                yeo_johnson, yeo_johnson_inverse, yj_likelihood_fit, yj_likelihood_quantile,
                                yj_site_moments, yj_table_fit, yj_table_quantile)
from stats.kanon import apply_release, first_release, join_release


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0, 1.7, 2.0])
def test_yeo_johnson_matches_scipy_and_inverts(lam):
    x = np.linspace(-5, 5, 101)
    assert np.allclose(yeo_johnson(x, lam), stats.yeojohnson(x, lmbda=lam), rtol=1e-12, atol=1e-12)
    assert np.allclose(yeo_johnson_inverse(yeo_johnson(x, lam), lam), x, atol=1e-9)


def test_federated_likelihood_is_the_pooled_likelihood():
    rng = np.random.default_rng(0)
    sites = [rng.gamma(4, 1, n) - 1 for n in (40, 25, 60)]
    grid = lambda_grid(21)
    _, _, _, loglik = yj_likelihood_fit([yj_site_moments(x, grid) for x in sites], grid)
    pooled = np.concatenate(sites)
    expected = [stats.yeojohnson_llf(lam, pooled) for lam in grid]
    assert np.allclose(loglik, expected, rtol=1e-10)


def test_grid_maximizer_is_within_a_step_of_scipys_mle():
    rng = np.random.default_rng(1)
    x = rng.gamma(4, 1, 1500)
    grid = lambda_grid(101)
    lam, mu, sigma, _ = yj_likelihood_fit([yj_site_moments(x, grid)], grid)
    _, mle = stats.yeojohnson(x)
    assert abs(lam - mle) <= 0.02 + 1e-12
    h = yeo_johnson(x, lam)
    assert math.isclose(mu, h.mean()) and math.isclose(sigma, h.std())


def test_naive_quantile_is_the_first_limit_past_p():
    limits = np.array([0.0, 1.0, 2.0, 3.0])
    counts = np.array([10.0, 20.0, 10.0])
    assert list(table_cdf(counts)) == [0.25, 0.75, 1.0]
    assert naive_table_quantile(limits, counts, 0.2) == 1.0
    assert naive_table_quantile(limits, counts, 0.25) == 2.0
    assert naive_table_quantile(limits, counts, 0.9) == 3.0


def test_yj_table_recovers_a_normal_table_exactly():
    """Limits placed at exact normal quantiles: lambda = 1 (identity up to a shift) fits with
    correlation 1, so the estimate is the normal quantile itself."""
    probs = np.array([0.05, 0.2, 0.4, 0.6, 0.8, 0.95])
    limits = np.concatenate([[-10.0], stats.norm.ppf(probs, loc=3, scale=2), [20.0]])
    counts = np.diff(np.concatenate([[0.0], probs, [1.0]])) * 1000
    lam, a0, a1 = yj_table_fit(limits, counts)
    assert math.isclose(yj_table_quantile(limits, counts, 0.5), 3.0, abs_tol=1e-6)
    assert math.isclose(yj_table_quantile(limits, counts, 0.99), stats.norm.ppf(0.99, 3, 2), rel_tol=1e-5)


def test_quantile_loss_slope_changes_sign_at_the_order_statistic():
    rng = np.random.default_rng(2)
    sites = [rng.normal(size=n) for n in (31, 17, 52)]
    pooled = np.sort(np.concatenate(sites))
    p = 0.3
    target = pooled[math.ceil(p * pooled.size) - 1]
    slope = lambda q: sum(quantile_loss_terms(x, q, p)["slope"] for x in sites)  # noqa: E731
    assert slope(target) >= 0 and slope(np.nextafter(target, -np.inf)) < 0
    loss = sum(quantile_loss_terms(x, 0.1, p)["loss"] for x in sites)
    brute = sum((p - 1) * (y - 0.1) if y < 0.1 else p * (y - 0.1) for y in pooled)
    assert math.isclose(loss, brute, rel_tol=1e-12)


def test_yj_likelihood_has_the_lowest_tail_mse():
    """Section 5.4 (5 centres of table 1, Gamma(10), phi = 0.1, 80 simulations): the one-pass
    YJ likelihood estimate of Q_0.02 and Q_0.98 has a smaller MSE than the pooled sample quantile
    that the quantile loss converges to, and than the YJ table estimate."""
    rng = np.random.default_rng(3)
    r, sizes, grid = 10.0, [492, 368, 276, 208, 156], lambda_grid()
    sigma_alpha = math.log((stats.gamma.median(r) + 0.1 * math.sqrt(r)) / stats.gamma.median(r))
    errors = {name: {0.02: [], 0.98: []} for name in ("loss", "yj_likelihood", "yj_table")}
    for _ in range(80):
        alphas = rng.normal(0, sigma_alpha, len(sizes))
        sites = [rng.gamma(r, 1, n) * math.exp(a) for n, a in zip(sizes, alphas)]
        table = None
        for x in sites:
            release = first_release([x], 10, rng) if table is None else join_release(table.limits, [x], 10, rng)
            table = apply_release(table, release)
        moments = [yj_site_moments(x, grid) for x in sites]
        pooled = np.sort(np.concatenate(sites))
        for p in (0.02, 0.98):
            truth = optimize.brentq(lambda q: sum(n / sum(sizes) * stats.gamma.cdf(q / math.exp(a), r)
                                                  for n, a in zip(sizes, alphas)) - p, 1e-6, 200)
            estimates = {"loss": pooled[math.ceil(p * pooled.size) - 1],
                         "yj_likelihood": yj_likelihood_quantile(moments, grid, p),
                         "yj_table": yj_table_quantile(table.limits, table.counts[0], p)}
            for name, value in estimates.items():
                errors[name][p].append((value - truth) / math.sqrt(r))
    for p in (0.02, 0.98):
        mse = {name: float(np.mean(np.square(e[p]))) for name, e in errors.items()}
        assert mse["yj_likelihood"] < mse["loss"] and mse["yj_likelihood"] < mse["yj_table"], (p, mse)


@pytest.mark.parametrize("minimizer", [0.0, 0.37, 1.0, 1.9999, 2.0])
def test_golden_section_keeps_the_minimizer_and_shrinks_by_the_golden_ratio(minimizer):
    """golden_section_step, as the protocol's continuous YJ fit drives it (one value asked per
    step after the first two): the bracket holds the minimizer of a unimodal function after every
    step and its width is (b - a) 0.618^steps; the best point evaluated is within that width."""
    f = lambda v: abs(v - minimizer) ** 1.5
    state, asked = golden_section_step((0.0, 2.0), None, {})
    assert asked == pytest.approx([2 - 2 * INVPHI, 2 * INVPHI])
    seen = {}
    for step in range(1, 41):
        seen.update({v: f(v) for v in asked})
        state, asked = golden_section_step(state, asked, seen)
        assert len(asked) == 1 and state[0] <= minimizer <= state[3]
        assert state[3] - state[0] == pytest.approx(2.0 * INVPHI ** step, rel=1e-6)
        assert state[0] < state[1] < state[2] < state[3] or state[3] - state[0] < 1e-12
    best = min(seen, key=seen.get)
    assert abs(best - minimizer) <= 2.0 * INVPHI ** 39
