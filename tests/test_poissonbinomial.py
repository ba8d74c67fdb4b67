"""The Poisson-binomial law at thousands of sites (issue 21: planning for unequal sizes at scale).

Each fast path is checked against a slow, obviously correct one: the product tree against the
recursion, tail certificates against exact tails, the leave-one-out law against recomputing W
without the site, the window search for k against a scan of every k, and the planner at
m = 1,000 against its own verification and the paper's rule.
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stats import poissonbinomial as pb
from stats.optimizer import plan_optimized
from stats.planner import COVERAGE_TOLERANCE, plan_paper_rule
from stats.unbalanced import coverage_unbalanced, coverage_window, site_cdfs, smallest_order_reaching


def _orders_at(tau, sizes):
    return np.clip(np.ceil(tau * (sizes + 1) - 1e-9), 1, sizes)


@pytest.mark.parametrize("m", [257, 700, 2000])
def test_product_tree_matches_the_recursion(m):
    rng = np.random.default_rng(m)
    sizes = rng.integers(5, 501, size=m).astype(float)
    p = site_cdfs(np.linspace(0.8, 0.97, 40), sizes, _orders_at(0.9, sizes))
    p[:, :5] = [0.0, 1.0, 0.5, 1e-300, 1.0 - 1e-16]  # degenerate and extreme sites
    tree = pb.pmf_by_product_tree(p)
    exact = pb.pmf_by_recursion(p, m + 1)
    assert np.abs(np.cumsum(tree, axis=1) - np.cumsum(exact, axis=1)).max() < 1e-13
    assert tree.shape == (40, m + 1) and tree.min() >= 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=60), st.integers(0, 61), st.integers(0, 61))
@example(probabilities=[2.225073858507203e-309], k_low=0, k_high=0)  # subnormal mean: count / mu overflowed
def test_tail_certificates_never_certify_a_tail_above_1e16(probabilities, k_low, k_high):
    p = np.array([probabilities])
    m = p.shape[1]
    k_low, k_high = min(max(k_low, 1), m), min(max(k_high, 1), m)
    left, right = pb.certified_tails(p, k_low, k_high)
    pmf = pb.pmf_by_recursion(p, m + 1)[0]
    if left[0]:
        assert pmf[k_low:].sum() <= 1e-16 * (1 + 1e-9)  # P(W >= k_low)
    if right[0]:
        assert pmf[:k_high].sum() <= 1e-16 * (1 + 1e-9)  # P(W <= k_high - 1)


def test_tail_certificates_hold_near_the_ends_of_the_count():
    # Chernoff certifies small counts that Bernstein cannot (P(W >= 12) with mean 1e-3).
    p = np.full((1, 1000), 1e-6)
    left, _ = pb.certified_tails(p, 12, 12)
    assert left[0]
    _, right = pb.certified_tails(1.0 - p, 989, 989)
    assert right[0]


@pytest.mark.parametrize("m", [40, 600])
def test_leave_one_out_matches_removing_the_site(m):
    rng = np.random.default_rng(7)
    sizes = rng.integers(5, 300, size=m).astype(float)
    p = site_cdfs(np.linspace(0.85, 0.95, 16), sizes, _orders_at(0.9, sizes))
    pmf = pb.poisson_binomial_pmf(p)
    c = int(np.median(p.sum(axis=1)))
    fast = pb.leave_one_out_at(pmf, p, c)
    for j in list(range(0, m, max(1, m // 12))):
        without = pb.pmf_by_recursion(np.delete(p, j, axis=1), m)
        assert np.abs(fast[:, j] - without[:, c]).max() < 1e-11


def test_coverage_window_agrees_with_one_k_at_a_time():
    rng = np.random.default_rng(9)
    sizes = tuple(int(n) for n in rng.integers(5, 400, size=300))
    ells = tuple(int(e) for e in _orders_at(0.9, np.array(sizes)))
    window = coverage_window(sizes, ells, 120, 140)
    for k in (120, 131, 140):
        assert abs(window[k - 120] - coverage_unbalanced(sizes, ells, k)) < 1e-13
    assert np.all(np.diff(window) > 0)


@pytest.mark.parametrize("tau", [0.6, 0.85, 0.9, 0.99])
def test_window_search_finds_the_smallest_order_a_scan_finds(tau):
    rng = np.random.default_rng(11)
    sizes = rng.integers(5, 120, size=60)
    ells = tuple(int(e) for e in _orders_at(tau, sizes))
    sizes = tuple(int(n) for n in sizes)
    level = 0.9 - COVERAGE_TOLERANCE
    scan = coverage_window(sizes, ells, 1, 60)
    finite = sum(e <= n for e, n in zip(ells, sizes))
    valid = [k for k in range(1, finite + 1) if scan[k - 1] >= level]
    k, coverage = smallest_order_reaching(sizes, ells, level)
    assert k == (valid[0] if valid else 0)
    if valid:
        assert coverage == pytest.approx(scan[k - 1], abs=1e-13)


def test_planning_a_thousand_unequal_sites_is_verified_and_closer_than_the_paper_rule():
    sizes = tuple(int(n) for n in np.random.default_rng(0).integers(5, 501, size=1000))
    paper, best = plan_paper_rule(sizes, 0.1), plan_optimized(sizes, 0.1)
    assert coverage_unbalanced(sizes, paper.ells, paper.k - 1) < 0.9 <= paper.coverage
    verified = coverage_unbalanced(sizes, best.ells, best.k)
    assert verified == pytest.approx(best.coverage, abs=1e-13)
    assert 0.9 - COVERAGE_TOLERANCE <= verified <= paper.coverage
    assert best.coverage - 0.9 < 0.1 * (paper.coverage - 0.9)
