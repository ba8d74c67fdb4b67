"""The fast exact discrete Gaussian sampler (protocol.noise_fast, issue 49 point 4) against the
exact N_Z pmf and OpenDP's exact sampler: the pmf (chi-square), the CDF (a DKW band), the tails,
symmetry, the variance (which is below sigma^2 for small sigma), its float bounds against
high-precision values, its exact path forced, and that every bit comes from os.urandom.

The draws come from the OS CSPRNG, so each statistical check is a test with a stated false-alarm
rate: 1e-6 per check unless said otherwise."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

import protocol.noise_fast as nf
from protocol.noise import discrete_gaussian, discrete_gaussian_reference, max_sigma2

ALPHA = 1e-6
SIGMAS = [0.5, 1.0, 3.0, 10.0, 1000.0, 1e6]


def exact_masses(sigma: float, edges: np.ndarray) -> np.ndarray:
    """N_Z(0, sigma^2) masses of the integer ranges [edges[i], edges[i+1]): summed pmf for sigma
    up to 1000 (over |x| <= 40 sigma + 2, beyond which the mass is below e^-800); above that
    Phi((b - 1/2) / sigma) - Phi((a - 1/2) / sigma), whose Euler-Maclaurin error is at most
    1 / (12 sigma^2) per range (1e-13 at sigma = 1e6; N_Z's normaliser differs from sigma sqrt(2 pi)
    by a relative 2 exp(-2 pi^2 sigma^2))."""
    if sigma <= 1000:
        reach = int(40 * sigma) + 2
        xs = np.arange(-reach, reach + 1)
        pmf = np.exp(-xs.astype(np.float64) ** 2 / (2 * sigma * sigma))
        pmf /= pmf.sum()
        cdf = np.concatenate([[0.0], np.cumsum(pmf)])
        index = np.clip(edges + reach, 0, xs.size)
        return np.diff(cdf[index])
    return np.diff(stats.norm.cdf((edges - 0.5) / sigma))


def exact_moments(sigma: float) -> tuple[float, float]:
    """Var and E[X^4] of N_Z(0, sigma^2) by summing the pmf (sigma <= 1000)."""
    reach = int(40 * sigma) + 2
    xs = np.arange(-reach, reach + 1).astype(np.float64)
    pmf = np.exp(-xs ** 2 / (2 * sigma * sigma))
    pmf /= pmf.sum()
    return float((xs ** 2 * pmf).sum()), float((xs ** 4 * pmf).sum())


def binned(draws: np.ndarray, sigma: float, min_expected: float = 20.0):
    """Observed and expected counts in integer-aligned bins of width max(1, sigma / 4) over the
    central mass, bins with fewer than `min_expected` expected draws pooled into one tail bin."""
    width = max(1, int(sigma // 4))
    reach = int(8 * sigma) + 2
    edges = np.arange(-reach - width // 2, reach + width, width)
    expected = exact_masses(sigma, edges) * draws.size
    observed = np.histogram(draws, bins=edges.astype(np.float64) - 0.5)[0]
    keep = expected >= min_expected
    tail_expected = draws.size - expected[keep].sum()
    tail_observed = draws.size - observed[keep].sum()
    return np.append(observed[keep], tail_observed), np.append(expected[keep], tail_expected)


def chi2_pvalue(observed, expected) -> float:
    keep = expected > 0
    statistic = (((observed - expected) ** 2) / expected)[keep].sum()
    return float(stats.chi2.sf(statistic, keep.sum() - 1))


@pytest.mark.parametrize("sigma", SIGMAS)
def test_the_pmf_matches_the_exact_n_z_pmf(sigma):
    """Chi-square on 400,000 draws over the central mass (bins with >= 20 expected draws, the rest
    pooled): the statistic's p-value must exceed 1e-6."""
    draws = nf.discrete_gaussian_vector(sigma * sigma, 400_000)
    assert draws.dtype == np.int64 and draws.size == 400_000
    assert chi2_pvalue(*binned(draws, sigma)) > ALPHA


@pytest.mark.parametrize("sigma", SIGMAS)
def test_the_cdf_stays_in_the_dkw_band(sigma):
    """A KS-like check: sup_x |F_n(x) - F(x)| over integer x <= sqrt(ln(2 / 1e-6) / (2n)) (the
    Dvoretzky-Kiefer-Wolfowitz-Massart bound, which holds for discrete F too), n = 400,000:
    0.0060. Checked on a grid of up to 4,001 integers across +-8 sigma."""
    n = 400_000
    draws = np.sort(nf.discrete_gaussian_vector(sigma * sigma, n))
    reach = int(8 * sigma) + 2
    points = np.unique(np.linspace(-reach, reach, 4001).round().astype(np.int64))
    empirical = np.searchsorted(draws, points, side="right") / n
    edges = np.concatenate([[-10 * reach - 10], points + 1])  # F(x) = mass of [-inf, x + 1)
    exact = np.cumsum(exact_masses(sigma, edges))
    assert np.max(np.abs(empirical - exact)) <= math.sqrt(math.log(2 / ALPHA) / (2 * n))


@pytest.mark.parametrize("sigma", [1.0, 10.0, 1000.0])
def test_the_tails_beyond_4_and_6_sigma(sigma):
    """Frequencies of |x| > 4 sigma and |x| > 6 sigma in 4,000,000 draws against the exact pmf's
    masses (about 6.3e-5 and 2e-9: about 250 and 0.008 draws): each two-sided binomial p-value
    must exceed 1e-6 (for 6 sigma that allows at most 2 draws)."""
    n = 4_000_000
    draws = np.abs(nf.discrete_gaussian_vector(sigma * sigma, n))
    for multiple in (4, 6):
        cut = math.floor(multiple * sigma)  # |x| > multiple sigma <=> |x| > cut
        tail = 1.0 - exact_masses(sigma, np.array([-cut, cut + 1]))[0]
        count = int((draws > cut).sum())
        assert stats.binomtest(count, n, tail).pvalue > ALPHA, (multiple, count, n * tail)


@pytest.mark.parametrize("sigma", [0.5, 3.0, 1e6])
def test_symmetry(sigma):
    """x and -x are equally likely: with c_k the count of value k (values pooled in bins of width
    max(1, sigma/4) for large sigma), sum (c_k - c_-k)^2 / (c_k + c_-k) over the bins with at least
    40 draws is chi-square with one degree of freedom per bin; and the sign of nonzero draws is
    a fair coin (binomial p-value)."""
    draws = nf.discrete_gaussian_vector(sigma * sigma, 1_000_000)
    width = max(1, int(sigma // 4))
    magnitude_bin = (np.abs(draws) - 1) // width  # bins of 1..width, width+1..2 width, ...
    nonzero = draws != 0
    positive = np.bincount(magnitude_bin[nonzero & (draws > 0)])
    negative = np.bincount(magnitude_bin[nonzero & (draws < 0)], minlength=positive.size)
    positive = np.pad(positive, (0, negative.size - positive.size))
    keep = (positive + negative) >= 40
    statistic = ((positive - negative)[keep] ** 2 / (positive + negative)[keep]).sum()
    assert stats.chi2.sf(statistic, keep.sum()) > ALPHA
    assert stats.binomtest(int((draws > 0).sum()), int(nonzero.sum()), 0.5).pvalue > ALPHA


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0, 10.0, 1000.0, 1e6])
def test_the_variance_is_n_z_s_variance(sigma):
    """The sample variance of 1,000,000 draws lies within 6 standard errors (sd = sqrt((E X^4 -
    Var^2) / n), from the exact pmf) of N_Z's variance, summed from the pmf: 0.2150 at sigma = 0.5,
    below sigma^2 = 0.25 by about 80 standard errors (a rounded continuous Gaussian would give
    sigma^2 + 1/12). At sigma = 1e6 N_Z's variance is sigma^2 (the relative difference is below
    exp(-2 pi^2 sigma^2) sigma^2 by Poisson summation) and E X^4 = 3 sigma^4."""
    n = 1_000_000
    if sigma <= 1000:
        variance, fourth = exact_moments(sigma)
    else:
        variance, fourth = sigma ** 2, 3 * sigma ** 4
    draws = nf.discrete_gaussian_vector(sigma * sigma, n).astype(np.float64)
    assert abs(draws.mean()) < 6 * math.sqrt(variance / n)
    se = math.sqrt((fourth - variance ** 2) / n)
    assert abs(np.mean(draws ** 2) - variance) < 6 * se
    if sigma == 0.5:
        assert variance == pytest.approx(0.2150, abs=1e-4) and sigma ** 2 - variance > 60 * se


def pooled_columns(table: np.ndarray, minimum: int) -> np.ndarray:
    """Adjacent columns merged, left to right, until each holds at least `minimum` draws of each
    row (the last merged into its neighbour if short)."""
    columns, current = [], np.zeros(table.shape[0])
    for column in table.T:
        current = current + column
        if current.min() >= minimum:
            columns.append(current)
            current = np.zeros(table.shape[0])
    if current.sum():
        columns[-1] = columns[-1] + current
    return np.array(columns).T


def test_agrees_with_the_reference_exact_sampler():
    """Two-sample tests against OpenDP's exact sampler (tens of thousands of draws a second: 40,000
    draws) at sigma^2 = 2 (values) and sigma = 100 (bins of width 25): a chi-square test of
    homogeneity (adjacent bins merged until each has 20 draws of each sampler) and a two-sample KS
    test (conservative on discrete data), p-values above 1e-6."""
    for sigma2 in (2.0, 1e4):
        reference = discrete_gaussian_reference(sigma2, 40_000)
        fast = nf.discrete_gaussian_vector(sigma2, 400_000)
        width = max(1, int(math.sqrt(sigma2) // 4))
        lo, hi = min(reference.min(), fast.min()), max(reference.max(), fast.max())
        edges = np.arange(lo - width, hi + 2 * width, width) - 0.5
        table = np.array([np.histogram(reference, edges)[0], np.histogram(fast, edges)[0]])
        assert stats.chi2_contingency(pooled_columns(table, minimum=20))[1] > ALPHA
        assert stats.ks_2samp(reference, fast).pvalue > ALPHA


@pytest.mark.parametrize("sigma", [0.5, 10.0, 12345.6, 1e6, math.sqrt(max_sigma2())])
def test_the_float_bounds_contain_the_acceptance_probability(sigma):
    """For magnitudes across the whole fast range (0 to g_max t + t - 1, the far tail included),
    p_lo <= exp(-a) <= p_hi with exp(-a) at 60 digits, and the band is narrow (relative 1e-9)."""
    p = nf._params(sigma * sigma)
    rng = np.random.default_rng(7)  # picks test points, not noise
    top = min(p.g_max * p.t + p.t - 1, 2 ** 62 - 1)
    m = np.unique(np.concatenate([np.arange(0, min(top, 200) + 1), rng.integers(0, top, 2000, endpoint=True),
                                  np.array([top, top - 1])])).astype(np.int64)
    u = m & np.int64(p.t - 1)
    p_lo, p_hi = nf._float_bounds(p, m, u)
    with mpmath.workdps(60):
        s = mpmath.sqrt(mpmath.mpf(p.sigma2))
        lam = mpmath.log(2) * s / p.t
        for mi, ui, lo, hi in zip(m.tolist(), u.tolist(), p_lo, p_hi):
            a = (mpmath.mpf(mi) / s - lam) ** 2 / 2 + mpmath.log(2) * mpmath.mpf(ui) / p.t
            exact = mpmath.exp(-a)
            assert mpmath.mpf(lo) <= exact <= mpmath.mpf(hi), (mi, lo, exact, hi)
            assert hi - lo <= 1e-9 * float(exact) + 2.0 ** -898


@pytest.mark.parametrize("sigma", [0.5, 10.0])
def test_the_exact_path_alone_gives_n_z(monkeypatch, sigma):
    """With the float bounds widened (E scaled by 2^41) and the fast path's magnitudes capped at
    8, most acceptances and every proposal with G t >= 8 go to the exact interval-arithmetic path:
    20,000 draws still pass the chi-square test."""
    monkeypatch.setattr(nf, "_ERROR_SCALE", 2.0 ** -3)
    monkeypatch.setattr(nf, "_FAST_LIMIT", 8)
    nf._params.cache_clear()
    calls = []
    exact = nf._exact_accept
    monkeypatch.setattr(nf, "_exact_accept", lambda *args: calls.append(1) or exact(*args))
    try:
        draws = nf.discrete_gaussian_vector(sigma * sigma, 20_000)
    finally:
        nf._params.cache_clear()
    assert len(calls) > 10_000
    assert chi2_pvalue(*binned(draws, sigma)) > ALPHA


def _deterministic_urandom(seed: int, log: list):
    generator = np.random.Generator(np.random.PCG64(seed))

    def urandom(n: int) -> bytes:
        log.append(n)
        return generator.bytes(n)

    return urandom


@pytest.mark.parametrize("widen", [False, True])
def test_every_bit_comes_from_os_urandom(monkeypatch, widen):
    """With os.urandom replaced by a deterministic byte stream, the draws are a function of the
    stream alone: the same stream gives the same draws, another stream others, and every call
    reads it (also when the exact path and the long-G words are in play: `widen`)."""
    if widen:
        monkeypatch.setattr(nf, "_ERROR_SCALE", 2.0 ** -10)
        monkeypatch.setattr(nf, "_FAST_LIMIT", 64)
    nf._params.cache_clear()

    def run(seed):
        log = []
        monkeypatch.setattr(nf.os, "urandom", _deterministic_urandom(seed, log))
        draws = [nf.discrete_gaussian_vector(s2, 5_000) for s2 in (0.25, 100.0, 1e12)]
        draws.append(discrete_gaussian(100.0, 5_000))  # protocol.noise's sampler is this one
        return draws, log

    try:
        first, log = run(1)
        again, _ = run(1)
        other, _ = run(2)
    finally:
        nf._params.cache_clear()
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other))
    assert len(log) >= 4 and sum(log) >= 4 * 5_000 * 8


def test_sizes_and_limits():
    assert nf.discrete_gaussian_vector(1.0, 0).shape == (0,)
    assert nf.discrete_gaussian_vector(1.0, 1).dtype == np.int64
    with pytest.raises(ValueError):
        nf.discrete_gaussian_vector(0.0, 3)
    with pytest.raises(ValueError):
        nf.discrete_gaussian_vector(float("inf"), 3)
    # at protocol.noise's largest sigma^2 (sigma about 3.4e17, step t = 2^58) draws stay int64
    # and the exact path decides the proposals beyond the fast path's 2^62
    draws = discrete_gaussian(max_sigma2(), 100_000)
    assert draws.dtype == np.int64 and np.all(np.abs(draws) < 2 ** 62)
