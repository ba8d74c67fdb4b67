"""K-anonymous federated tables (paper 004 section 3): the invariant under random and adversarial
data (ties, tiny sites, one group empty), the paper's worked example, and conservation of counts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stats.kanon import (KAnonymityError, Release, Table, apply_release, check_release, first_release,
                         greedy_cuts, join_release, k_anonymous_cells, site_counts, valid_count)

# Values on a coarse grid make ties common; sizes from 0 up, so tiny sites and empty groups occur.
values = st.lists(st.integers(-6, 6).map(lambda v: v / 2), min_size=0, max_size=60)
continuous = st.lists(st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False), min_size=0, max_size=60)
K = st.integers(1, 12)
EXTREMES = st.sampled_from(["buffer", "infinite", "bounds"])


def _assert_released_counts_valid(release: Release, k: int) -> None:
    for cells in release.cells:
        for _, _, count in cells:
            assert valid_count(count, k)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(values, continuous), min_size=1, max_size=4), st.lists(st.one_of(values, continuous),
       min_size=1, max_size=4), K, EXTREMES, st.integers(0, 2 ** 32 - 1))
def test_invariant_holds_for_every_site_of_a_federation(xs, ys, k, extremes, seed):
    """Every release, first or joining, passes the site's own check: counts 0 or >= K, equal to
    the site's data, no added limit equal to a data value; totals are conserved in the table."""
    rng = np.random.default_rng(seed)
    sites = [(np.array(x), np.array(y)) for x, y in zip(xs, ys)]
    sites.sort(key=lambda s: -(s[0].size + s[1].size))
    bounds = (-1e3, 1e3)
    table, released = None, [0.0, 0.0]
    for x, y in sites:
        groups = [x, y]
        try:
            if table is None:
                release = first_release(groups, k, rng, extremes, bounds)
            else:
                release = join_release(table.limits, groups, k, rng, extremes, bounds)
        except KAnonymityError as exc:
            assert "nothing can be released" in str(exc) and table is None
            assert all(g.size == 0 or not valid_count(g.size, k) for g in groups)
            continue
        public = (() if table is None else table.limits) + (bounds if extremes == "bounds" else ())
        check_release(release, groups, k, public_limits=public)
        _assert_released_counts_valid(release, k)
        for g, group in enumerate(groups):
            assert release.withheld[g] == (not valid_count(group.size, k))
            if not release.withheld[g]:
                released[g] += group.size
        table = apply_release(table, release)
        assert np.allclose([sum(c) for c in table.counts], released)
        limits = np.array(table.limits)
        assert np.all(np.diff(limits) > 0)
        # every released value lies inside the table, but for fewer than K of a site's points
        # beyond a buffer it had no evidence to move (they are counted in the extreme bin)
        released_values = np.concatenate([g for g, w in zip(groups, release.withheld) if not w] or [np.empty(0)])
        assert np.count_nonzero(released_values < limits[0]) < max(k, 1)
        assert np.count_nonzero(released_values > limits[-1]) < max(k, 1)


@settings(max_examples=200, deadline=None)
@given(values, values, K)
def test_greedy_cuts_give_valid_bins_that_hold_everything(x, y, k):
    groups = [np.sort(np.array(x)), np.sort(np.array(y))]
    cuts, counts = greedy_cuts(groups, k)
    assert np.all(np.diff(cuts) > 0)
    assert [sum(c[g] for c in counts) for g in range(2)] == [len(x), len(y)]
    if cuts:  # several bins: each one is releasable as it stands
        assert all(valid_count(c, k) for row in counts for c in row)
        edges = np.array([-np.inf, *cuts, np.inf])
        for g in range(2):
            exact = np.histogram(groups[g], bins=edges)[0] if len(groups[g]) else np.zeros(len(cuts) + 1)
            # np.histogram's bins are [a, b); ours are (a, b]: compare through searchsorted
            ours = np.bincount(np.searchsorted(np.array(cuts), groups[g], side="left"), minlength=len(cuts) + 1)
            assert [row[g] for row in counts] == list(ours)
            assert exact.sum() == len(groups[g])


def test_ties_never_release_fewer_than_k():
    """The appendix's next_1d_point cuts at x[K] and counts the values strictly below it: with
    five 0s, eight 1s and K = 10 that is x[10] = 1 and a bin of 5. We cut after the K-th smallest
    value with all its ties: 13."""
    x = np.array([0.0] * 5 + [1.0] * 8 + [2.0] * 12)
    cuts, counts = greedy_cuts([x], 10)
    assert cuts == [1.0] and counts == [[13], [12]]


def test_limits_are_strictly_between_data_values():
    rng = np.random.default_rng(1)
    x = np.arange(40, dtype=float)
    release = first_release([x], 5, rng)
    inner = np.array(release.limits[1:-1])
    assert inner.size == 7 and not np.any(np.isin(inner, x))
    assert np.all((inner > np.arange(4, 39, 5)) & (inner < np.arange(5, 40, 5)))
    # buffers: the mean gap 1 times a random factor in [1, 2)
    assert -2.0 < release.limits[0] <= -1.0 and 40.0 <= release.limits[-1] < 41.0


def test_tiny_site_is_withheld_and_join_releases_nothing_for_it():
    rng = np.random.default_rng(2)
    table = apply_release(None, first_release([np.arange(50.0), np.arange(50.0) + 0.5], 10, rng))
    release = join_release(table.limits, [np.array([3.0, 4.0]), np.arange(30.0)], 10, rng)
    assert release.withheld == (True, False) and release.cells[0] == ()
    check_release(release, [np.array([3.0, 4.0]), np.arange(30.0)], 10, table.limits)


def test_paper_table_2_example():
    """Appendix, table 2 (K = 10): bin (4, 6] splits at the new centre; its 10 / 14 go 5 / 5 and
    7 / 7; the new centre's 3 + 7 (x) and 4 + 10 (y) are merged and reallocated 12:10 and 10:10."""
    table = Table((0.0, 2.0, 4.0, 6.0, 8.0), ((12, 10, 10, 13), (10, 10, 14, 13)))
    release = Release((0.0, 2.0, 4.0, 5.0, 6.0, 8.0),
                      (((0, 1, 10), (2, 2, 10), (3, 3, 10), (4, 4, 10)),
                       ((0, 1, 14), (2, 2, 10), (3, 3, 10), (4, 4, 10))), (False, False))
    out = apply_release(table, release)
    assert np.allclose(out.counts[0], [12 + 10 * 12 / 22, 10 + 10 * 10 / 22, 15, 15, 23])
    assert np.allclose(out.counts[1], [17, 17, 17, 17, 23])


def test_joining_site_splits_where_its_data_allow():
    rng = np.random.default_rng(3)
    table = Table((0.0, 4.0, 8.0), ((20.0, 20.0),))
    x = np.concatenate([np.linspace(4.1, 4.9, 10), np.linspace(5.1, 5.9, 10), [1.0] * 3])
    release = join_release(table.limits, [x], 10, rng)
    assert len(release.limits) == 4 and 4.9 < release.limits[2] < 5.1
    assert release.cells[0] == ((0, 1, 13), (2, 2, 10))  # the 3 below 4 merge right
    check_release(release, [x], 10, table.limits)
    out = apply_release(table, release)
    assert np.isclose(sum(out.counts[0]), 63)


def test_joining_site_beyond_the_extremes_revises_them_with_its_own_buffer():
    rng = np.random.default_rng(4)
    table = apply_release(None, first_release([np.linspace(0, 10, 50)], 10, rng))
    new = np.concatenate([np.linspace(-5, -1, 10), np.linspace(12, 14, 10)])
    release = join_release(table.limits, [new], 10, rng)
    assert release.limits[0] < -5 and release.limits[-1] > 14
    check_release(release, [new], 10, table.limits)


def test_bounds_mode_counts_values_outside_in_the_extreme_bins():
    """A value beyond a declared (public) bound is counted in the extreme bin, never refused: a
    refusal would tell the coordinator that one point lies outside."""
    x = np.array([-1.0] + [1.0] * 20)
    release = first_release([x], 5, np.random.default_rng(0), "bounds", (0.0, 10.0))
    assert release.limits[0] == 0.0 and release.limits[-1] == 10.0
    assert sum(count for _, _, count in release.cells[0]) == 21
    check_release(release, [x], 5, public_limits=(0.0, 10.0))


@pytest.mark.parametrize("tamper", ["small", "wrong", "gap", "exposed"])
def test_check_release_catches_each_violation(tamper):
    x = np.arange(30.0)
    k = 10
    release = Release((-0.5, 9.5, 19.5, 29.5), (((0, 0, 10), (1, 1, 10), (2, 2, 10)),), (False,))
    check_release(release, [x], k)
    bad = {"small": Release((-0.5, 4.5, 29.5), (((0, 0, 5), (1, 1, 25)),), (False,)),
           "wrong": Release((-0.5, 9.5, 29.5), (((0, 0, 11), (1, 1, 19)),), (False,)),
           "gap": Release((-0.5, 9.5, 29.5), (((0, 0, 10),),), (False,)),
           "exposed": Release((-0.5, 10.0, 29.5), (((0, 1, 30),),), (False,))}[tamper]
    with pytest.raises(KAnonymityError):
        check_release(bad, [x], k)


def test_cells_merge_left_to_right_and_a_short_tail_joins_the_previous_cell():
    assert k_anonymous_cells(np.array([3, 7, 10, 0, 12, 4]), 10) == [(0, 1, 10), (2, 2, 10), (3, 3, 0), (4, 5, 16)]
    assert k_anonymous_cells(np.array([0, 5, 0]), 10) is None
    assert k_anonymous_cells(np.array([10, 0, 2]), 10) == [(0, 2, 12)]


def test_site_counts_use_right_closed_bins():
    assert [list(c) for c in site_counts([0.0, 1.0, 2.0], [np.array([0.0, 1.0, 1.5, 2.0])])] == [[2, 2]]


def test_release_travels_as_msgpack_unchanged():
    import msgpack

    release = first_release([np.arange(40.0), np.arange(25.0) + 0.25], 10, np.random.default_rng(5))
    assert Release.from_wire(msgpack.unpackb(msgpack.packb(release.to_wire()))) == release
    with pytest.raises(ValueError, match="extremes"):
        first_release([np.arange(40.0)], 10, np.random.default_rng(5), "none")
