"""Local DP: the exponential-mechanism quantile (paper 000 alg. 2 / paper 003 alg. 2),
FedCP²-QQ (paper 000 alg. 3) and private prediction sets (paper 003)."""

import math

import numpy as np
import pytest

from protocol.codecs import CODECS, PayloadError
from protocol.inprocess import run_session
from protocol.methods import METHODS, RequestError
from protocol.methods.private_bin import PrivateQuantileBin
from stats.dp import (Bins, correction_order, exponential_mechanism_log_probabilities, optimal_bins_and_gamma,
                      optimal_gamma, private_level, private_quantile_bin)
from stats.planner import choose_gamma
from tests.oracles import binomial_tolerance

LEVELS = [0.3, 0.5, 0.7, 0.9, 0.95, 1.0]


def histogram(scores, bins):
    return np.bincount(bins.index_of(scores), minlength=bins.count)


def literal_probabilities(scores, bins, q, epsilon):
    """Paper 000 algorithm 2 exactly as written (q < 1): w_b, Delta_q, exp(-eps w_b / (2 Delta_q))."""
    discretized = bins.edges[1:][bins.index_of(scores)]
    edges = bins.edges[1:]
    w = np.array([max(np.sum(discretized < e) / q, np.sum(discretized > e) / (1 - q)) for e in edges])
    delta = max(1 / q, 1 / (1 - q))
    p = np.exp(-epsilon * w / (2 * delta))
    return p / p.sum()


@pytest.mark.parametrize("q", [0.3, 0.5, 0.7, 0.9, 0.95])
def test_probabilities_follow_the_literal_algorithm(q):
    rng = np.random.default_rng(1)
    bins = Bins(0.0, 1.0, 9)
    for _ in range(20):
        scores = rng.uniform(-0.2, 1.2, size=rng.integers(1, 30))
        ours = np.exp(exponential_mechanism_log_probabilities(histogram(scores, bins), q, 2.0))
        assert np.allclose(ours, literal_probabilities(scores, bins, q, 2.0), rtol=1e-12, atol=1e-15)


def neighbours(scores, probes):
    """Every data set at distance one: one score removed, added, or replaced (by each probe)."""
    for i in range(len(scores)):
        yield np.delete(scores, i)
        for value in probes:
            replaced = scores.copy()
            replaced[i] = value
            yield replaced
    for value in probes:
        yield np.append(scores, value)


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 5.0])
@pytest.mark.parametrize("count", [1, 3, 7])
def test_privacy_ratio_never_exceeds_e_to_the_epsilon(epsilon, count):
    rng = np.random.default_rng(int(epsilon * 100) + count)
    bins = Bins(0.0, 1.0, count)
    probes = np.concatenate([[-0.5, 0.0, 1.0, 1.5], bins.edges[1:] - 1e-9, (bins.edges[:-1] + bins.edges[1:]) / 2])
    worst = 0.0
    for _ in range(25):
        n = int(rng.integers(0, 9))
        scores = np.round(rng.uniform(-0.2, 1.2, size=n), 1)  # rounding makes ties
        for q in LEVELS:
            base = exponential_mechanism_log_probabilities(histogram(scores, bins), q, epsilon)
            for other in neighbours(scores, probes):
                alt = exponential_mechanism_log_probabilities(histogram(other, bins), q, epsilon)
                worst = max(worst, float(np.max(np.abs(base - alt))))
    assert worst <= epsilon * (1 + 1e-12)
    assert worst > 0.5 * epsilon or count == 1  # the bound is nearly attained: the test has teeth


def test_the_sampler_draws_from_the_computed_distribution():
    bins = Bins(0.0, 1.0, 6)
    scores = np.array([0.05, 0.3, 0.31, 0.6, 0.61, 0.62, 0.9])
    p = np.exp(exponential_mechanism_log_probabilities(histogram(scores, bins), 0.8, 1.5))
    rng = np.random.default_rng(3)
    draws = np.array([private_quantile_bin(scores, bins, 0.8, 1.5, rng) for _ in range(20000)])
    observed = np.bincount(draws, minlength=6) / draws.size
    for b in range(6):
        assert abs(observed[b] - p[b]) <= binomial_tolerance(p[b], draws.size)


def test_utility_lemma_holds_exactly():
    """Paper 000 lemma C.4: P(#{[S_i] <= Q} / n >= q - 2 log(B / delta) / (n eps)) >= 1 - delta."""
    rng = np.random.default_rng(7)
    bins = Bins(0.0, 1.0, 50)
    for _ in range(30):
        n, q, eps, delta = int(rng.integers(20, 300)), float(rng.uniform(0.5, 1.0)), float(rng.uniform(0.3, 8)), 0.05
        scores = rng.uniform(size=n)
        h = histogram(scores, bins)
        p = np.exp(exponential_mechanism_log_probabilities(h, q, eps))
        at_most = np.cumsum(h) / n  # fraction of discretized scores <= e_b
        good = at_most >= q - 2 * math.log(bins.count / delta) / (n * eps)
        assert p[good].sum() >= 1 - delta - 1e-12


def test_correction_order_is_eq10():
    for eps, B, gamma, alpha, m in [(1.0, 100, 0.5, 0.1, 5), (10.0, 20, 0.05, 0.2, 50), (0.3, 1000, 0.9, 0.1, 2)]:
        direct = math.ceil(2 / eps * math.log(B / (1 - (1 - gamma * alpha) ** (1 / m))))
        assert correction_order(eps, B, gamma, alpha, m) == direct


def test_optimal_gamma_minimizes_eq3():
    for n, alpha, eps, B in [(1000, 0.1, 1.0, 100), (200, 0.1, 5.0, 1000), (5000, 0.05, 0.5, 10000), (30, 0.1, 0.2, 100)]:
        gamma = optimal_gamma(n, alpha, eps, B)
        grid = np.linspace(1e-6, 1 - 1e-6, 20001)
        best = min(private_level(n, alpha, eps, B, g) for g in grid)
        assert private_level(n, alpha, eps, B, gamma) <= best + 1e-9


def test_optimal_bins_grow_with_n_epsilon():
    # Where q-tilde < 1 (below that the level is capped at 1 and m* hardly matters), m* ~ n eps.
    small, gamma = optimal_bins_and_gamma(2000, 0.1, 1.0)
    large, _ = optimal_bins_and_gamma(50000, 0.1, 10.0)
    assert private_level(2000, 0.1, 1.0, small, gamma) < 1
    assert 100 <= small < large <= 1_000_000


@pytest.mark.parametrize("body", [
    {"level": 0.9, "epsilon": 1.0},
    {"level": 1.5, "epsilon": 1.0, "bins": {"lo": 0, "hi": 1, "count": 10}},
    {"level": 0.9, "epsilon": 0, "bins": {"lo": 0, "hi": 1, "count": 10}},
    {"level": 0.9, "epsilon": float("inf"), "bins": {"lo": 0, "hi": 1, "count": 10}},
    {"level": 0.9, "epsilon": 1.0, "bins": {"lo": 1, "hi": 0, "count": 10}},
    {"level": 0.9, "epsilon": 1.0, "bins": {"lo": 0, "hi": 1, "count": 0}},
    {"level": 0.9, "epsilon": 1.0, "bins": {"lo": 0, "hi": 1, "count": 10**9}},
    {"level": True, "epsilon": 1.0, "bins": {"lo": 0, "hi": 1, "count": 10}},
])
def test_site_half_refuses_bad_requests(body):
    with pytest.raises(RequestError):
        PrivateQuantileBin(np.arange(5.0), np.random.default_rng(0)).answer("respond", body)


def test_bin_codec_checks_the_range():
    codec = CODECS["exp_mech_bins"](100)
    assert codec.decode(codec.encode(99)) == 99
    for body in [100, -1, 3.0, True, "7"]:
        with pytest.raises(PayloadError):
            codec.decode(body)


def sites(rng, m, n):
    return {f"site-{j:03d}": rng.uniform(size=n) for j in range(m)}


GRID = [(m, n, eps, B) for m in (5, 20) for n in (50, 200) for eps in (1.0, 10.0) for B in (20, 100)]


@pytest.mark.parametrize("m,n,eps,B", GRID)
def test_fedcp2_qq_coverage_over_the_grid(m, n, eps, B):
    rng = np.random.default_rng(m * 7 + n * 3 + int(eps) + B)
    method = METHODS["fedcp2_qq"](0.1, epsilon=eps, bins={"count": B, "lo": 0.0, "hi": 1.0})
    reps, hits = 400, 0
    for _ in range(reps):
        outcome = run_session(method, sites(rng, m, n), lambda s: np.random.default_rng(rng.integers(2**32)))
        assert outcome.status in ("ok", "infinite")
        hits += rng.uniform() <= outcome.threshold
    assert hits / reps >= 0.9 - binomial_tolerance(0.9, reps)


def test_fedcp2_qq_tracks_fedcp_qq_as_epsilon_grows():
    rng = np.random.default_rng(5)
    draws = [sites(rng, 10, 500) for _ in range(30)]

    def mean_threshold(method):
        return np.mean([run_session(method, data, lambda s: np.random.default_rng(rng.integers(2**32))).threshold
                        for data in draws])

    private = [mean_threshold(METHODS["fedcp2_qq"](0.1, epsilon=e, bins={"count": 1000, "lo": 0.0, "hi": 1.0}))
               for e in (1.0, 10.0, 1000.0)]
    plain = mean_threshold(METHODS["fedcp_qq"](0.1))
    assert private[0] > private[1] > private[2] >= plain - 1e-3
    assert private[2] - plain < 0.01


def test_fedcp2_qq_refuses_with_a_reason_when_epsilon_is_too_small():
    outcome = run_session(METHODS["fedcp2_qq"](0.1, epsilon=0.05, bins={"count": 100, "lo": 0.0, "hi": 1.0}),
                          sites(np.random.default_rng(0), 5, 50), lambda s: np.random.default_rng(0))
    assert outcome.status == "infinite" and "ell_cor" in outcome.reason


def test_gamma_search_picks_the_smallest_feasible_proxy():
    gamma, plan, correction, proxy = choose_gamma((200,) * 5, 0.1, 1.0, 100, 50, 0)
    assert plan.ell + correction <= 200  # appendix B.2's epsilon = 1 needs q = 1 exactly here
    for grid in (1, 7, 20):  # coarser grids (their points are not all in ours) find nothing better here
        other = choose_gamma((200,) * 5, 0.1, 1.0, 100, grid, 0)
        assert other is None or other[3] >= proxy - 1e-12


@pytest.mark.parametrize("name", ["private_cp", "private_cp_local"])
@pytest.mark.parametrize("n,eps", [(100, 1.0), (1000, 1.0), (300, 10.0)])
def test_private_cp_coverage(name, n, eps):
    rng = np.random.default_rng(n + int(eps))
    method = METHODS[name](0.1, epsilon=eps, bins={"count": 0, "lo": 0.0, "hi": 1.0})
    reps, hits = 300, 0.0
    for _ in range(reps):
        outcome = run_session(method, sites(rng, 3, n), lambda s: np.random.default_rng(rng.integers(2**32)))
        thresholds = list(outcome.per_site.values()) if outcome.per_site else [outcome.threshold]
        test = rng.uniform()
        hits += np.mean([test <= t for t in thresholds])
    assert hits / reps >= 0.9 - binomial_tolerance(0.9, reps)


def test_private_methods_state_their_privacy():
    bins = {"count": 100, "lo": 0.0, "hi": 1.0}
    assert METHODS["fedcp2_qq"](0.1, epsilon=2.0, bins=bins).privacy == {"epsilon": 2.0, "model": "local"}
    assert METHODS["private_cp"](0.1, epsilon=2.0, bins=bins).privacy == {"epsilon": 2.0, "model": "central"}
    assert METHODS["private_cp_local"](0.1, epsilon=2.0, bins=bins).privacy["model"] == "local"
    assert METHODS["fedcp_qq"](0.1).privacy == {"epsilon": None, "model": "none"}
