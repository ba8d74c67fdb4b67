"""Distributed discrete Gaussian quantiles (paper 001): privacy accounting, sampling, histograms,
the quantile estimate, and the ddg_quantile method end to end over secure aggregation."""

from __future__ import annotations

import math

import numpy as np
import opendp.prelude as dp
import pytest
from scipy import stats
from scipy.special import logsumexp

from protocol.inprocess import run_session
from protocol.methods import METHODS, RequestError
from protocol.methods.ddg_quantile import check_public
from protocol.noise import discrete_gaussian, max_sigma2
from stats.dp import Bins
from stats.ddg import (ddg_concentrated_epsilon, dyadic_partition, estimated_cdf, flat_histogram,
                       hierarchical_cumulative, hierarchical_from_flat, histogram_concentrated_epsilon,
                       histogram_epsilon, histogram_sensitivities, psi, quantile_error, quantile_index,
                       ring_bits_required, scaling_for_epsilon, zcdp_delta, zcdp_to_approx_dp)

dp.enable_features("contrib")


@pytest.mark.parametrize("rho,delta", [(0.01, 1e-5), (0.25, 1e-5), (1.0, 1e-6), (8.0, 1e-9)])
def test_zcdp_conversion_matches_opendp(rho, delta):
    # OpenDP's zCDP -> approx-DP map on a Gaussian measurement whose map gives exactly rho
    scale = 1.0 / math.sqrt(2 * rho)
    meas = dp.m.make_gaussian(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=scale)
    reference = dp.c.make_zCDP_to_approxDP(meas).map(1.0).epsilon(delta)
    assert zcdp_to_approx_dp(rho, delta) == pytest.approx(reference, rel=1e-9)
    assert zcdp_delta(rho, zcdp_to_approx_dp(rho, delta)) == pytest.approx(delta, rel=1e-6)


def test_psi_and_lemma_9():
    direct = 10 * sum(math.exp(-2 * math.pi**2 * 0.5 * i / (i + 1)) for i in range(1, 7))
    assert psi(7, 0.5) == pytest.approx(direct, rel=1e-12)
    # i / (i + 1) lies in [1/2, 1): the paper's "psi <= 10 (n-1) exp(-2 pi^2 sigma^2)" is in fact a
    # lower bound; exp(-pi^2 sigma^2) gives the upper one. We always use the exact sum.
    assert 10 * 6 * math.exp(-2 * math.pi**2 * 0.5) <= psi(7, 0.5) <= 10 * 6 * math.exp(-math.pi**2 * 0.5)
    s, n, s2, d = 3.0, 4, 1.0, 1
    p = psi(n, s2)
    expected = min(math.sqrt(s**2 / (n * s2) + p * d / 2), s / math.sqrt(n * s2) + p * math.sqrt(d))
    assert ddg_concentrated_epsilon(s, n, s2, d) == pytest.approx(expected, rel=1e-12)


def test_lemma_9_bounds_the_exact_renyi_divergence():
    """Privacy by exact computation: the pmf of the sum of n discrete Gaussians (by convolution),
    shifted by the sensitivity, has Renyi divergence D_a <= a eps^2 / 2 at every order tried."""
    n, sigma2, c = 4, 1.0, 3
    eps = ddg_concentrated_epsilon(c, n, sigma2, 1)
    for a in (1.5, 2, 5, 10, 30):
        assert shifted_sum_renyi_divergence(n, sigma2, c, a) <= a * eps**2 / 2 + 1e-9


def shifted_sum_renyi_divergence(n: int, sigma2: float, c: int, a: float) -> float:
    """D_a(S(. - c) || S) for S the pmf of the sum of n N_Z(0, sigma2), by exact convolution on
    the common support."""
    support = np.arange(-60, 61)
    one = np.exp(-support.astype(float) ** 2 / (2 * sigma2))
    one /= one.sum()
    total = one
    for _ in range(n - 1):
        total = np.convolve(total, one)
    p, q = total[c:], total[:-c]
    mask = (p > 1e-300) & (q > 1e-300)
    return float(logsumexp(a * np.log(p[mask]) + (1 - a) * np.log(q[mask])) / (a - 1))


def test_exact_hierarchical_accounting_bounds_the_exact_renyi_divergence():
    """One client moves c on each of L levels: the noise sum is a product over entries, so the
    exact Renyi divergence is L times the one-entry value. Lemma 9 with S2 = c sqrt(L), S1 = c L
    must bound it at every order; the printed theorem 2 (S = c L) is looser still."""
    n, sigma2, c, levels = 3, 1.0, 2, 3
    bins = 1 << levels
    exact = histogram_concentrated_epsilon(c, n, sigma2, bins, True, "exact")
    printed = histogram_concentrated_epsilon(c, n, sigma2, bins, True, "paper")
    assert exact < printed
    s2, s1, d = histogram_sensitivities(c, bins, True, "exact")
    assert (s2, s1, d) == pytest.approx((c * math.sqrt(levels), c * levels, 2 * bins - 2))
    for a in (1.5, 2, 5, 10, 30):
        assert levels * shifted_sum_renyi_divergence(n, sigma2, c, a) <= a * exact**2 / 2 + 1e-9
    # flat histograms: both accountings agree (S1 = S2 = c)
    assert histogram_concentrated_epsilon(c, n, sigma2, bins, False, "exact") == \
        histogram_concentrated_epsilon(c, n, sigma2, bins, False, "paper")
    with pytest.raises(ValueError, match="accounting"):
        histogram_sensitivities(c, bins, True, "loose")


def test_discrete_gaussian_sampler_matches_the_pmf():
    """OpenDP draws from the OS CSPRNG (unseedable by design); the test's false-alarm rate is 1e-6."""
    sigma2 = 2.0
    draws = discrete_gaussian(sigma2, 20_000)
    support = np.arange(-8, 9)
    pmf = np.exp(-support**2 / (2 * sigma2))
    pmf /= np.exp(-np.arange(-60, 61) ** 2 / (2 * sigma2)).sum()
    observed = np.array([(draws == k).sum() for k in support] + [(np.abs(draws) > 8).sum()])
    expected = np.append(pmf, 1 - pmf.sum()) * draws.size
    keep = expected > 5
    chi2 = (((observed - expected) ** 2) / expected)[keep].sum()
    assert stats.chi2.sf(chi2, keep.sum() - 1) > 1e-6
    assert draws.dtype == np.int64


def test_discrete_gaussian_is_not_pinned_at_32_bits():
    """Issue 35: on 32-bit integers a sigma^2 of 1e19 put about half the draws at +-2^31. On 64
    bits nothing sits at a 32-bit limit, and the spread matches sigma: the sample variance of 4,000
    draws is within 5 standard errors (sd of s^2 / sigma^2 is sqrt(2 / n) = 0.022)."""
    sigma2 = 1e19
    draws = discrete_gaussian(sigma2, 4_000)
    assert not np.any(np.abs(draws) == 2**31) and not np.any(np.abs(draws) == 2**31 - 1)
    assert np.mean(np.abs(draws) > 2**31) > 0.4  # sigma = 3.2e9 > 2^31: most draws pass 32 bits
    assert abs(np.var(draws.astype(float)) / sigma2 - 1) < 5 * math.sqrt(2 / draws.size)


def test_a_sigma2_whose_draws_would_not_fit_is_refused():
    """The sampler and the site refuse a sigma^2 above max_sigma2 (draws could reach 2^62), and the
    bound is what the discrete Gaussian's tail gives: P(|X| >= 2^62) <= 2 exp(-2^124 / (2 sigma^2))
    = 2^-128 at the limit."""
    limit = max_sigma2()
    assert 2 * math.exp(-float(2**62) ** 2 / (2 * limit)) == pytest.approx(2.0 ** -128, rel=1e-9)
    with pytest.raises(ValueError, match="64-bit"):
        discrete_gaussian(limit * 1.01, 1)
    assert discrete_gaussian(limit, 3).dtype == np.int64
    public = {"c": 1, "sigma2": limit * 4, "bins": {"lo": 0.0, "hi": 1.0, "count": 4}, "histogram": "flat",
              "central": {"epsilon": 1.0, "delta": 1e-5, "inputs": 10, "accounting": "exact"}}
    with pytest.raises(RequestError, match="64-bit"):
        check_public(public)


@pytest.mark.parametrize("hierarchical,accounting", [(False, "exact"), (True, "exact"), (True, "paper")])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 5.0])
def test_scaling_meets_the_requested_epsilon(hierarchical, accounting, epsilon):
    c, sigma2 = scaling_for_epsilon(epsilon, 1e-5, 128, 2.0, 32, hierarchical, accounting)
    assert isinstance(c, int) and c >= 1 and sigma2 >= 2.0
    obtained = histogram_epsilon(c, 128, sigma2, 32, hierarchical, 1e-5, accounting)
    assert epsilon - 1e-6 <= obtained <= epsilon + 1e-12
    # fewer noise-adding sites than planned: less privacy than asked, reported as such
    assert histogram_epsilon(c, 100, sigma2, 32, hierarchical, 1e-5, accounting) > epsilon


def test_ring_condition_of_theorem_1():
    c, n, s2, b, fail = 61, 512, 2.0, 64, 1e-6
    need = 2 + 2 * c * n + 2 * n * math.sqrt(2 * s2 * math.log(8 * n * b / fail))
    assert ring_bits_required(c, n, n, s2, b, False, fail) == math.ceil(math.log2(need))
    assert ring_bits_required(c, n, n, s2, b, False, fail) <= 18  # the paper's M = 2^18 suffices


def test_dyadic_partition_covers_exactly():
    for b in (2, 4, 8, 64):
        top = int(math.log2(b)) - 1
        for j in range(1, b + 1):
            covered = []
            for r, o in dyadic_partition(j, b):
                assert 0 <= r <= top
                covered += list(range((o - 1) * 2**r + 1, o * 2**r + 1))
            assert covered == list(range(1, j + 1))
    assert dyadic_partition(15, 16) == [(3, 1), (2, 3), (1, 7), (0, 15)]  # paper 001 section 2


def test_histograms_cdfs_and_the_quantile_index():
    rng = np.random.default_rng(0)
    values = rng.uniform(0, 10, 500)
    edges = Bins(0, 10, 16).edges
    flat = flat_histogram(values, edges)
    assert flat.sum() == 500
    assert flat_histogram([10.0, 0.0], edges).tolist() == [1] + [0] * 14 + [1]
    tree = hierarchical_from_flat(flat)
    assert tree.size == 2 * 16 - 2
    assert np.allclose(hierarchical_cumulative(tree, 16), np.cumsum(flat))
    f = estimated_cdf(flat, "exact", 500)
    assert np.allclose(f, estimated_cdf(flat, "estimated"))
    for p in (0.1, 0.5, 0.9):
        j = quantile_index(f, p)
        assert j == 1 + min(range(16), key=lambda i: (abs(f[i] - p), i))
        assert quantile_error(f, j, p) == pytest.approx(min(abs(f - p)))


def run_ddg(values_by_site, **params):
    method = METHODS["ddg_quantile"](0.1, **params)
    return run_session(method, values_by_site, lambda s: np.random.default_rng(0))


@pytest.mark.parametrize("histogram,count", [("flat", "estimated"), ("flat", "exact"), ("hierarchical", "exact")])
def test_weak_privacy_recovers_the_noiseless_quantile(histogram, count):
    rng = np.random.default_rng(1)
    sites = {f"site-{i:02d}": rng.uniform(0, 10, 20) for i in range(6)}
    outcome = run_ddg(sites, epsilon=2000.0, bins={"lo": 0.0, "hi": 10.0, "count": 16},
                      histogram=histogram, count=count)
    assert outcome.status == "ok", outcome.reason
    pooled = np.concatenate(list(sites.values()))
    f = np.cumsum(flat_histogram(pooled, Bins(0, 10, 16).edges)) / pooled.size
    level = outcome.details["level"]
    assert outcome.details["bin"] == quantile_index(f, level)
    assert outcome.threshold == Bins(0, 10, 16).edges[quantile_index(f, level)]
    assert outcome.details["epsilon_obtained"] <= 2000.0 and not outcome.details["privacy_shortfall"]


def test_a_ring_too_small_is_refused_before_anything_is_sent():
    sites = {f"site-{i}": np.full(50, 1.0) for i in range(4)}
    outcome = run_ddg(sites, epsilon=5.0, bins={"lo": 0.0, "hi": 10.0, "count": 8}, modulus_bits=10)
    assert outcome.status == "aborted"
    assert "ring too small" in outcome.reason and "2^10" in outcome.reason


def test_sites_refuse_parameters_that_void_the_analysis():
    from protocol.methods.ddg_quantile import check_public
    from protocol.methods.base import RequestError

    backed = histogram_epsilon(3, 4, 2.0, 8, False, 1e-5, "exact")
    central = {"epsilon": backed, "delta": 1e-5, "inputs": 4, "accounting": "exact"}
    good = {"c": 3, "sigma2": 2.0, "bins": {"lo": 0.0, "hi": 1.0, "count": 8}, "histogram": "flat", "central": central}
    check_public(good)
    for bad in ({**good, "sigma2": 0.1}, {**good, "c": 0}, {**good, "c": 2.5},
                {**good, "histogram": "hierarchical", "bins": {"lo": 0.0, "hi": 1.0, "count": 6}},
                # a central epsilon the noise of 4 sites does not back, or the noise of fewer sites
                {**good, "central": {**central, "epsilon": backed * 0.9}},
                {**good, "central": {**central, "inputs": 3}},
                {**good, "central": {**central, "inputs": True}}):
        with pytest.raises(RequestError):
            check_public(bad)
