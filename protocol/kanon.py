"""K-anonymous federated summary tables (paper 004, section 3 and appendix algorithms 1-6).

A table has bins [c_0, c_1], (c_1, c_2], ..., (c_{B-1}, c_B] and, per group, a (possibly
fractional) frequency per bin. It is built site by site, the largest first:

- the first site bins its own data (`first_release`, section 3.1, algorithms 1-3): each limit is
  the smallest data value a for which every group has 0 or at least K points in the new bin and
  one group has at least K; a tail that cannot stand alone is merged backwards; each limit a_j
  is published as c_j = w a_j + (1 - w) v_{j+1} (v_{j+1} the next data value, w ~ U(0, 1));
- each further site (`join_release`, section 3.2, algorithms 4-6) splits existing bins where its
  own data allow (the same binning inside the bin), then merges, per group, runs of consecutive
  bins left to right until each released count is 0 or at least K;
- extreme limits are infinite, declared public bounds, or privacy buffers (a_0 - d_1, a_B + d_B
  with d the mean gap between consecutive points of the extreme bin), revised by later sites
  whose data go beyond them.

What a site releases is a `Release`: the refined limits and, per group, a partition of the bins
into cells with one count each. `check_release` is the K-anonymity invariant, run by the site
half before anything leaves: every released count is 0 or >= K, and no limit the site adds is one
of its data values. Because a site releases exactly one partition per group, no count can be
recovered by differencing two released numbers. The coordinator's `apply_release` spreads each
cell's count over its bins in proportion to the current table (the paper's reallocation), using
only released numbers.

Deviation from the appendix pseudo-code, deliberately: its next_1d_point counts values strictly
below x[K], which releases fewer than K points when values tie; we cut after the K-th smallest
value with all its ties, as the text of section 3.1 describes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

EXTREMES = ("buffer", "bounds", "infinite")


@dataclass(frozen=True)
class Table:
    limits: tuple[float, ...]  # c_0 < c_1 < ... < c_B
    counts: tuple[tuple[float, ...], ...]  # per group, B frequencies

    @property
    def bins(self) -> int:
        return len(self.limits) - 1


@dataclass(frozen=True)
class Release:
    """What one site sends: limits of the refined bins and, per group, cells (first_bin,
    last_bin, count) partitioning the bins; `withheld[g]` when the site holds 0 < n_g < K."""

    limits: tuple[float, ...]
    cells: tuple[tuple[tuple[int, int, int], ...], ...]
    withheld: tuple[bool, ...]

    def to_wire(self) -> dict:
        return {"limits": list(self.limits), "cells": [[list(c) for c in g] for g in self.cells],
                "withheld": list(self.withheld)}

    @staticmethod
    def from_wire(body: dict) -> "Release":
        return Release(tuple(float(v) for v in body["limits"]),
                       tuple(tuple((int(a), int(b), int(c)) for a, b, c in g) for g in body["cells"]),
                       tuple(bool(w) for w in body["withheld"]))


class KAnonymityError(ValueError):
    """A release that would break the K-anonymity invariant."""


def valid_count(count: float, k: int) -> bool:
    """Paper 004 section 3: a released count is 0 or at least K."""
    return count == 0 or count >= k


def greedy_cuts(groups: list[np.ndarray], k: int) -> tuple[list[float], list[list[int]]]:
    """Section 3.1 / algorithms 1-3 on sorted data: the data-value limits a_1 < ... < a_{B-1} of
    the interior cuts and the per-group counts of the B bins they make.

    Each cut is the smallest remaining data value a with every group's count in (previous cut, a]
    valid and one of them >= K; when none is left the rest is the last bin, merged backwards with
    its predecessors until every group's count there is valid. With a group total in (0, K) no
    cut survives (one bin, its counts returned as they are, for the caller to withhold)."""
    values = np.unique(np.concatenate(groups)) if any(g.size for g in groups) else np.empty(0)
    below = [np.searchsorted(g, values, side="right") for g in groups]  # counts <= value
    cuts, counts, base, i = [], [], [0] * len(groups), 0
    while i < len(values) - 1:
        inside = [b[i:] - b0 for b, b0 in zip(below, base)]
        ok = np.ones(len(values) - i, dtype=bool)
        big = np.zeros(len(values) - i, dtype=bool)
        for c in inside:
            ok &= (c == 0) | (c >= k)
            big |= c >= k
        hits = np.flatnonzero(ok & big)
        if hits.size == 0 or i + hits[0] >= len(values) - 1:
            break  # no cut below the maximum: the rest is the last bin
        j = i + int(hits[0])
        cuts.append(float(values[j]))
        counts.append([int(c[j - i]) for c in inside])
        base = [int(b[j]) for b in below]
        i = j + 1
    tail = [int(g.size) - b0 for g, b0 in zip(groups, base)]
    while cuts and not all(valid_count(c, k) for c in tail):
        cuts.pop()
        tail = [t + c for t, c in zip(tail, counts.pop())]
    counts.append(tail)
    return cuts, counts


def anonymize_limit(cut: float, next_value: float, rng: np.random.Generator) -> float:
    """c_j = w a_j + (1 - w) v_{j+1}, w ~ U(0, 1) (section 3.1): strictly between the two data
    values, so the published limit is none of them."""
    for _ in range(64):
        w = rng.uniform()
        limit = w * cut + (1.0 - w) * next_value
        if cut < limit < next_value:
            return float(limit)
    raise KAnonymityError(f"no number lies strictly between the data values {cut!r} and {next_value!r}")


def anonymized_limits(cuts: list[float], values: np.ndarray, rng: np.random.Generator) -> list[float]:
    """The published limits of `cuts` (sorted distinct site values in `values`). A cut with no
    number strictly between it and the next value (adjacent floats) is dropped: its two bins
    merge, and the sum of two releasable counts is releasable."""
    out = []
    for a in cuts:
        try:
            out.append(anonymize_limit(a, float(values[np.searchsorted(values, a, side="right")]), rng))
        except KAnonymityError:
            continue
    return out


def mean_gap(values: np.ndarray) -> float:
    """d-bar of section 3.1: the mean difference between consecutive sorted points."""
    return float(np.mean(np.diff(values))) if values.size > 1 else 0.0


def lower_buffer(first_bin_values: np.ndarray, inner_limit: float) -> float:
    """c_0 = a_0 - d_1; when every point of the extreme bin is equal (d_1 = 0) the buffer is the
    distance to the inner limit instead, so that c_0 is never a data value."""
    a0 = float(first_bin_values[0])
    gap = mean_gap(first_bin_values)
    return a0 - (gap if gap > 0 else inner_limit - a0)


def upper_buffer(last_bin_values: np.ndarray, inner_limit: float) -> float:
    """c_B = a_B + d_B, mirrored from lower_buffer."""
    aB = float(last_bin_values[-1])
    gap = mean_gap(last_bin_values)
    return aB + (gap if gap > 0 else aB - inner_limit)


def bin_index(limits: np.ndarray, values: np.ndarray) -> np.ndarray:
    """The bin of each value: (c_{b-1}, c_b], the first bin closed at c_0."""
    return np.clip(np.searchsorted(limits, values, side="left") - 1, 0, len(limits) - 2)


def site_counts(limits, groups: list[np.ndarray]) -> list[np.ndarray]:
    """Per group, the site's exact count in each bin."""
    limits = np.asarray(limits, dtype=float)
    return [np.bincount(bin_index(limits, g), minlength=len(limits) - 1) for g in groups]


def k_anonymous_cells(counts: np.ndarray, k: int) -> list[tuple[int, int, int]] | None:
    """Algorithms 5-6 (text of section 3.2): left to right, a bin whose count is neither 0 nor
    >= K is combined with the next ones until the sum is; a remainder at the end joins the cells
    before it. None when the total itself is in (0, K) (the group must be withheld)."""
    total = int(np.sum(counts))
    if not valid_count(total, k):
        return None
    cells, start, running = [], 0, 0
    for b, c in enumerate(counts):
        running += int(c)
        if valid_count(running, k):
            cells.append((start, b, running))
            start, running = b + 1, 0
    while running and not valid_count(running, k):
        first, _, count = cells.pop()
        start, running = first, running + count
    if start < len(counts):
        cells.append((start, len(counts) - 1, running))
    return cells


def _releasable(groups: list[np.ndarray], k: int) -> list[np.ndarray]:
    """The groups whose site total may be released (0 or >= K); the others, withheld, take no
    part in choosing limits."""
    return [g if valid_count(g.size, k) else g[:0] for g in groups]


def _release(limits: list[float], groups: list[np.ndarray], k: int) -> Release:
    counts = site_counts(limits, groups)
    cells, withheld = [], []
    for c in counts:
        part = k_anonymous_cells(c, k)
        withheld.append(part is None)
        cells.append(tuple(part) if part is not None else ())
    return Release(tuple(limits), tuple(cells), tuple(withheld))


def _extremes(groups, limits_inner: list[float], extremes: str, bounds) -> tuple[float, float]:
    pooled = np.sort(np.concatenate(groups))
    if extremes == "infinite":
        return -math.inf, math.inf
    if extremes == "bounds":
        lo, hi = bounds
        return float(lo), float(hi)
    lo_inner = limits_inner[0] if limits_inner else float(pooled[-1])
    hi_inner = limits_inner[-1] if limits_inner else float(pooled[0])
    first = pooled[pooled <= lo_inner] if limits_inner else pooled
    last = pooled[pooled > hi_inner] if limits_inner else pooled
    if not limits_inner:  # one bin: the buffers come from the whole data
        gap = mean_gap(pooled) or 1.0
        return float(pooled[0]) - gap, float(pooled[-1]) + gap
    return lower_buffer(first, lo_inner), upper_buffer(last, hi_inner)


def check_bounds(groups: list[np.ndarray], bounds) -> None:
    lo, hi = bounds
    for g in groups:
        if g.size and (g[0] < lo or g[-1] > hi):
            raise KAnonymityError(f"a value lies outside the declared bounds [{lo:g}, {hi:g}]")


def first_release(groups: list[np.ndarray], k: int, rng: np.random.Generator, extremes: str = "buffer",
                  bounds: tuple[float, float] | None = None) -> Release:
    """The largest site's table (section 3.1, algorithm 1): greedy cuts, anonymized limits and
    extreme limits. `groups` are the site's values per group (one group for quantiles)."""
    if extremes not in EXTREMES:
        raise ValueError(f"extremes must be one of {EXTREMES}, got {extremes!r}")
    groups = [np.sort(np.asarray(g, dtype=float)) for g in groups]
    if extremes == "bounds":
        check_bounds(groups, bounds)
    active = _releasable(groups, k)
    if not any(g.size for g in active):
        raise KAnonymityError(f"every group here is empty or has fewer than K = {k} values: nothing can be released")
    cuts, _ = greedy_cuts(active, k)
    pooled = np.unique(np.concatenate(groups))  # withheld values too: no limit may equal any value
    inner = anonymized_limits(cuts, pooled, rng)
    lo, hi = _extremes(groups, inner, extremes, bounds)
    return _release([lo, *inner, hi], groups, k)


def join_release(table_limits, groups: list[np.ndarray], k: int, rng: np.random.Generator,
                 extremes: str = "buffer", bounds: tuple[float, float] | None = None) -> Release:
    """A further site's contribution (section 3.2, algorithm 4): revise the extreme limits if its
    data go beyond them, split each bin where its own data allow, then K-anonymous cells."""
    groups = [np.sort(np.asarray(g, dtype=float)) for g in groups]
    limits = [float(v) for v in table_limits]
    if extremes == "bounds":
        check_bounds(groups, bounds)
    active = _releasable(groups, k)
    pooled = np.sort(np.concatenate(groups))
    if pooled.size and pooled[0] < limits[0]:  # section 3.2, "joining the last bin"
        limits[0] = lower_buffer(pooled[pooled <= limits[1]], limits[1])
    if pooled.size and pooled[-1] > limits[-1]:
        limits[-1] = upper_buffer(pooled[pooled > limits[-2]], limits[-2])
    refined = [limits[0]]
    edges = np.asarray(limits)
    for b in range(len(limits) - 1):
        inside = [g[bin_index(edges, g) == b] for g in active]
        cuts, _ = greedy_cuts(inside, k)
        here = np.unique(pooled[bin_index(edges, pooled) == b]) if cuts else np.empty(0)
        refined += anonymized_limits(cuts, here, rng)
        refined.append(limits[b + 1])
    return _release(refined, groups, k)


def check_release(release: Release, groups: list[np.ndarray], k: int, public_limits=()) -> None:
    """The K-anonymity invariant (issue 9, item 1), checked by the site before it sends:
    cells partition the bins, every count is 0 or >= K and equals the site's data, withheld
    groups release nothing, and no limit outside `public_limits` is one of the site's values."""
    limits = np.asarray(release.limits, dtype=float)
    if limits.size < 2 or np.any(np.diff(limits) <= 0):
        raise KAnonymityError("limits must increase strictly")
    data = np.concatenate([np.asarray(g, dtype=float) for g in groups]) if groups else np.empty(0)
    public = {float(v) for v in public_limits}
    exposed = [v for v in limits if v not in public and np.any(data == v)]
    if exposed:
        raise KAnonymityError(f"limit {exposed[0]!r} is one of the site's data values")
    counts = site_counts(limits, [np.asarray(g, dtype=float) for g in groups])
    for g, (cells, withheld) in enumerate(zip(release.cells, release.withheld)):
        if withheld:
            if cells or valid_count(int(counts[g].sum()), k):
                raise KAnonymityError(f"group {g} withheld without cause, or with cells")
            continue
        expect = 0
        for first, last, count in cells:
            if first != expect or last < first:
                raise KAnonymityError(f"group {g}: cells do not partition the bins at bin {first}")
            if not valid_count(count, k):
                raise KAnonymityError(f"group {g}: count {count} in bins {first}-{last} is in (0, {k})")
            if count != int(counts[g][first:last + 1].sum()):
                raise KAnonymityError(f"group {g}: count {count} in bins {first}-{last} is not the site's")
            expect = last + 1
        if expect != len(limits) - 1:
            raise KAnonymityError(f"group {g}: cells stop at bin {expect}, not {len(limits) - 1}")


def reallocate(total: float, weights: np.ndarray) -> np.ndarray:
    """Spread `total` in proportion to `weights` (equally when they are all zero); section 3.2."""
    weights = np.asarray(weights, dtype=float)
    s = weights.sum()
    return total * (weights / s if s > 0 else np.full(weights.size, 1.0 / weights.size))


def _spread(cells, weights: np.ndarray) -> np.ndarray:
    out = np.zeros(weights.size)
    for first, last, count in cells:
        out[first:last + 1] = reallocate(count, weights[first:last + 1])
    return out


def apply_release(table: Table | None, release: Release) -> Table:
    """The coordinator's side of section 3.2: a split bin's frequencies go to its pieces in
    proportion to the new site's counts there, and each cell's count goes to its bins in
    proportion to the (split) table; the new site's counts are added. Released numbers only."""
    limits = np.asarray(release.limits, dtype=float)
    groups = len(release.cells)
    if table is None:
        counts = [_spread(cells, np.ones(limits.size - 1)) for cells in release.cells]
        return Table(tuple(limits), tuple(tuple(c) for c in counts))
    old_limits = np.asarray(table.limits, dtype=float)
    interior = old_limits[1:-1]
    if not np.all(np.isin(interior, limits)):
        raise KAnonymityError("a release dropped an existing bin limit")
    parent = np.clip(np.searchsorted(interior, limits[1:], side="left"), 0, table.bins - 1)
    pieces = np.bincount(parent, minlength=table.bins)
    new_counts = []
    for g in range(groups):
        teacher_old = np.asarray(table.counts[g], dtype=float)
        prior = teacher_old[parent] / pieces[parent]  # before the split: an equal share per piece
        student = _spread(release.cells[g], prior) if not release.withheld[g] else np.zeros(parent.size)
        teacher = np.empty(parent.size)
        for b in range(table.bins):
            idx = np.flatnonzero(parent == b)
            teacher[idx] = reallocate(teacher_old[b], student[idx])
        student = _spread(release.cells[g], teacher) if not release.withheld[g] else student
        new_counts.append(tuple(teacher + student))
    return Table(tuple(limits), tuple(new_counts))
