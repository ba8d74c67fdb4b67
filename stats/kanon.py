"""K-anonymous federated summary tables (paper 004, section 3 and appendix algorithms 1-6).

A table has bins [c_0, c_1], (c_1, c_2], ..., (c_{B-1}, c_B] and, per group, a (possibly
fractional) frequency per bin. It is built site by site, the largest first:

- the first site bins its own data (`first_release`, section 3.1, algorithms 1-3): each limit is
  the smallest data value a for which every group has 0 or at least K points in the new bin and
  one group has at least K; a tail that cannot stand alone is merged backwards; each limit a_j
  is published as c_j = w a_j + (1 - w) v_{j+1} (v_{j+1} the next data value, w ~ U(0, 1));
- each further site (`join_release`, section 3.2, algorithms 4-6) splits existing bins where its
  own data allow (the same binning inside the bin), then merges, per group, runs of consecutive
  bins into cells of at least K values each, closed at random limits in the gaps between its
  values (`join_cells`: the paper closes at the first limit past K and releases empty bins as
  cells, which a fabricated table of narrow bins turns into a locator, issue 35);
- extreme limits are infinite, declared public bounds, or privacy buffers (a_0 - d_1, a_B + d_B
  with d the mean gap between consecutive points of the extreme bin, scaled by a random factor
  here: `buffer_width`), revised by a later site when at least K of its points go beyond them;
  fewer are counted in the extreme bin (`top_code`), as are values beyond declared bounds.

What a site releases is a `Release`: the refined limits and, per group, a partition of the bins
into cells with one count each. `check_release` is the K-anonymity invariant, run by the site
half before anything leaves: every released count is 0 or >= K, and no limit the site adds is one
of its data values. Because a site releases exactly one partition per group, no count can be
recovered by differencing two released numbers. The coordinator's `apply_release` spreads each
cell's count over its bins in proportion to the current table (the paper's reallocation), using
only released numbers.

What a release reveals, and what it protects (issue 20). Public by design: each site's size and
its groups' sizes (the largest-first order and paper 004's weights need them), whether a group
was withheld (its size is public), and the table itself: limits and cell counts. Protected:
every released count covers 0 or at least K of the site's points; no limit is a data value
(declared bounds and limits received from the table are public, not data); no limit is a
deterministic function of the data (interior limits are w a_j + (1 - w) v_{j+1}, buffers carry
a random factor), so limits bound values but never determine one; an extreme limit moves only on
the evidence of at least K points; a withheld group takes no part in anything released (limits,
buffers, refusals), so nothing about its values or per-bin counts leaves the site. What a site
released before on the same data is the one thing a single release cannot see: the site's own
account (protocol.accounting) sends an identical request the identical release again and
refuses a different one beyond its `kanon_releases`, so no two tables of the same data can be
differenced.

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
    """A federated summary table (paper 004, section 3): bin limits and, per group, the frequencies."""

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


#: a privacy buffer is never narrower than this many units in the last place of max(|extreme|, 1)
BUFFER_FLOOR_ULPS = 2.0 ** 20


def buffer_width(extreme_bin: np.ndarray, extreme: float, inner_limit: float | None,
                 rng: np.random.Generator) -> float:
    """How far beyond the extreme value a privacy buffer puts the extreme limit (section 3.1:
    c_0 = a_0 - d_1, c_B = a_B + d_B). The paper's width is the mean gap d-bar of the extreme
    bin; when its points are all equal, their distance to the inner limit. Deviation, for
    privacy: the width is scaled by a fresh factor 1 + U, U ~ U(0, 1), and is at least
    BUFFER_FLOOR_ULPS units in the last place of max(|extreme value|, 1). Deterministic buffers let
    the limits determine a value (a bin of one distinct value and its inner limit c_1 give
    a_0 = (c_0 + c_1) / 2; one bin gives the midpoint of the minimum and the maximum), and at
    adjacent floats a_0 - d-bar rounds onto a_0 itself."""
    gap = mean_gap(extreme_bin)
    if gap <= 0 and inner_limit is not None and math.isfinite(inner_limit):
        gap = abs(inner_limit - extreme)
    floor = BUFFER_FLOOR_ULPS * float(np.spacing(max(abs(extreme), 1.0)))
    return max(gap, floor) * (1.0 + rng.uniform())


def lower_buffer(first_bin_values: np.ndarray, inner_limit: float | None, rng: np.random.Generator) -> float:
    """c_0 = a_0 - width (buffer_width): strictly below every value of the bin."""
    a0 = float(first_bin_values[0])
    return a0 - buffer_width(first_bin_values, a0, inner_limit, rng)


def upper_buffer(last_bin_values: np.ndarray, inner_limit: float | None, rng: np.random.Generator) -> float:
    """c_B = a_B + width, mirrored from lower_buffer."""
    aB = float(last_bin_values[-1])
    return aB + buffer_width(last_bin_values, aB, inner_limit, rng)


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


#: a table a site is asked to refine may have at most this many bins (a bound on the work and
#: memory a request can cause; finer tables are harmless to privacy, see join_cells)
MAX_TABLE_BINS = 1 << 20


def check_table(limits) -> None:
    """A site's check of the table it is asked to refine, before it looks at its data (issue 35):
    limits increasing and at most MAX_TABLE_BINS bins (KAnonymityError names what is wrong).
    Bins finer than the site's data are not refused but made harmless by join_cells: an honest
    table can hold bins narrower than any floor (a first site's limits lie strictly between two
    of its values, which may be adjacent floats), so a width rule would refuse honest tables."""
    limits = np.asarray(limits, dtype=float)
    if limits.size - 1 > MAX_TABLE_BINS:
        raise KAnonymityError(f"the table has {limits.size - 1} bins, more than the {MAX_TABLE_BINS} a site refines")
    if limits.size < 2 or np.any(~(np.diff(limits) > 0)):
        raise KAnonymityError("the table's limits must increase strictly")


def join_cells(limits: np.ndarray, values: np.ndarray, k: int, noise) -> list[tuple[int, int, int]] | None:
    """One group's cells on a table it did not make (a joining site, section 3.2), by a rule that
    no table can turn into a locator (issue 35). Walking up the group's sorted values, a cell may
    close once it holds at least K of them, and only in a gap between two consecutive distinct
    values v_t < v_{t+1}: at a limit c with v_t <= c < v_{t+1}, drawn uniformly from the table's
    limits in that gap (a gap with none cannot close a cell; the walk goes on). A remainder of
    fewer than K joins the last cell; every cell holds at least K values (an empty bin is never a
    cell of its own; a group with no value is one empty cell). None when the total is in (0, K).

    Why this is as safe as the paper's own limits: a closing limit tells only that it lies in a
    gap between two of the site's values, as c_j = w a_j + (1 - w) v_{j+1} of section 3.1 does;
    which limit of the gap is drawn carries nothing more, and the count of a cell says nothing
    of where inside it the values lie. The paper's rule (close at the first limit once K are
    reached; empty bins as cells) lets a fabricated table of narrow bins locate the K-th, 2K-th,
    ... values to a bin's width, and every value that follows an empty stretch."""
    values = np.sort(np.asarray(values, dtype=float))
    bins = len(limits) - 1
    if values.size == 0:
        return [(0, bins - 1, 0)]
    if values.size < k:
        return None
    interior = np.asarray(limits[1:-1], dtype=float)
    cells, first_bin, start = [], 0, 0
    for t in range(k - 1, values.size - 1):
        if t + 1 - start < k or values[t + 1] == values[t]:
            continue
        lo = int(np.searchsorted(interior, values[t], side="left"))
        hi = int(np.searchsorted(interior, values[t + 1], side="left"))
        if hi <= lo:
            continue
        limit = lo + min(int(noise.random() * (hi - lo)), hi - lo - 1)  # interior[limit] ends bin `limit`
        cells.append((first_bin, limit, t + 1 - start))
        first_bin, start = limit + 1, t + 1
    if values.size - start >= k or not cells:
        cells.append((first_bin, bins - 1, values.size - start))
    else:
        first, _, count = cells.pop()
        cells.append((first, bins - 1, count + values.size - start))
    return cells


def _releasable(groups: list[np.ndarray], k: int) -> list[np.ndarray]:
    """The groups whose site total may be released (0 or >= K); the others, withheld, take no
    part in anything the site releases (limits, extremes, refusals)."""
    return [g if valid_count(g.size, k) else g[:0] for g in groups]


def _pooled(groups: list[np.ndarray]) -> np.ndarray:
    return np.sort(np.concatenate(groups)) if groups else np.empty(0)


def _release(limits: list[float], groups: list[np.ndarray], k: int, noise=None) -> Release:
    """The release of `groups` on `limits`: the first site's cells on its own bins
    (k_anonymous_cells), or with `noise` a joining site's (join_cells)."""
    counts = site_counts(limits, groups)
    cells, withheld = [], []
    for c, g in zip(counts, groups):
        part = k_anonymous_cells(c, k) if noise is None else join_cells(np.asarray(limits), g, k, noise)
        withheld.append(part is None)
        cells.append(tuple(part) if part is not None else ())
    return Release(tuple(limits), tuple(cells), tuple(withheld))


def _extremes(pooled: np.ndarray, inner: list[float], extremes: str, bounds, rng) -> tuple[float, float]:
    """c_0 and c_B of the first release, from the releasable groups' sorted values: infinite,
    the declared bounds, or privacy buffers around the extreme bins (each holds at least K of
    the site's points: greedy_cuts makes every bin so)."""
    if extremes == "infinite":
        return -math.inf, math.inf
    if extremes == "bounds":
        return float(bounds[0]), float(bounds[1])
    first = pooled[pooled <= inner[0]] if inner else pooled
    last = pooled[pooled > inner[-1]] if inner else pooled
    return (lower_buffer(first, inner[0] if inner else None, rng),
            upper_buffer(last, inner[-1] if inner else None, rng))


def top_code(groups: list[np.ndarray], lo: float, hi: float) -> list[np.ndarray]:
    """Values beyond the extreme limits counted at them (in the extreme bins): declared bounds
    are public and are not moved by the data, and a joining site moves a buffer only on the
    evidence of at least K of its points (join_release), so a few outliers are top-coded."""
    return [np.clip(g, lo, hi) for g in groups]


def first_release(groups: list[np.ndarray], k: int, rng: np.random.Generator, extremes: str = "buffer",
                  bounds: tuple[float, float] | None = None) -> Release:
    """The largest site's table (section 3.1, algorithm 1): greedy cuts, anonymized limits and
    extreme limits. `groups` are the site's values per group (one group for quantiles). Only
    the groups with 0 or at least K values take part; with `bounds`, values beyond them are
    counted in the extreme bins (top_code)."""
    if extremes not in EXTREMES:
        raise ValueError(f"extremes must be one of {EXTREMES}, got {extremes!r}")
    groups = [np.sort(np.asarray(g, dtype=float)) for g in groups]
    active = _releasable(groups, k)
    if not any(g.size for g in active):
        raise KAnonymityError(f"every group here is empty or has fewer than K = {k} values: nothing can be released")
    if extremes == "bounds":
        active = top_code(active, *bounds)
    cuts, _ = greedy_cuts(active, k)
    pooled = _pooled(active)
    inner = anonymized_limits(cuts, np.unique(pooled), rng)
    lo, hi = _extremes(pooled, inner, extremes, bounds, rng)
    return _release([lo, *inner, hi], groups, k)


#: how a joining site closes its cells: "hardened" (join_cells, the default and the only rule the
#: protocol's sites use) or "paper" (algorithms 5-6 as printed, k_anonymous_cells on the table's
#: bins: a cell closes at the first limit once its count is 0 or >= K, empty bins are cells).
#: "paper" does NOT hold against a lying coordinator: a fabricated table of narrow bins locates
#: the K-th, 2K-th, ... values and every value after an empty stretch (issue 35). It exists only
#: to reproduce paper 004's tables (bench/paper004.py, issue 51).
CELL_RULES = ("hardened", "paper")


def join_release(table_limits, groups: list[np.ndarray], k: int, rng: np.random.Generator,
                 extremes: str = "buffer", bounds: tuple[float, float] | None = None,
                 cells: str = "hardened") -> Release:
    """A further site's contribution (section 3.2, algorithm 4): revise the extreme limits if its
    data go beyond them, split each bin where its own data allow, then K-anonymous cells.

    Deviations, for privacy: the table is checked first (check_table) and the cells follow
    join_cells, not the paper's first-limit rule; a buffer limit moves only when at least K of the
    site's releasable points lie beyond it (the paper moves it for one point, and the moved limit then bounds that
    point's value, or with the inner limit determines it); fewer are counted in the extreme bin
    (top_code). The new limit is a buffer (buffer_width) around the site's own extreme bin.
    `cells="paper"` closes the cells by the paper's rule instead (CELL_RULES; not safe against
    a lying coordinator, for reproducing the paper only)."""
    if cells not in CELL_RULES:
        raise ValueError(f"cells must be one of {CELL_RULES}, got {cells!r}")
    check_table(table_limits)
    groups = [np.sort(np.asarray(g, dtype=float)) for g in groups]
    limits = [float(v) for v in table_limits]
    active = _releasable(groups, k)
    pooled = _pooled(active)
    if extremes == "buffer" and np.count_nonzero(pooled < limits[0]) >= k:  # section 3.2, "joining the last bin"
        limits[0] = lower_buffer(pooled[pooled <= limits[1]], limits[1], rng)
    if extremes == "buffer" and np.count_nonzero(pooled > limits[-1]) >= k:
        limits[-1] = upper_buffer(pooled[pooled > limits[-2]], limits[-2], rng)
    active = top_code(active, limits[0], limits[-1])
    pooled = _pooled(active)
    edges = np.asarray(limits)
    pooled_bins = bin_index(edges, pooled)
    group_bins = [bin_index(edges, g) for g in active]
    added: list[float] = []
    # only a bin holding at least K of the site's values can be split (greedy_cuts needs K in a
    # piece), so the work grows with the data, not with the table's bins
    for b in np.flatnonzero(np.bincount(pooled_bins, minlength=len(limits) - 1) >= k):
        cuts, _ = greedy_cuts([g[at == b] for g, at in zip(active, group_bins)], k)
        if cuts:
            added += anonymized_limits(cuts, np.unique(pooled[pooled_bins == b]), rng)
    return _release(sorted(limits + added), groups, k, noise=rng if cells == "hardened" else None)


def check_release(release: Release, groups: list[np.ndarray], k: int, public_limits=(), joined: bool = False) -> None:
    """The K-anonymity invariant (issue 9, item 1), checked by the site before it sends:
    cells partition the bins, every count is 0 or >= K and equals the site's data, withheld
    groups release nothing, and no limit outside `public_limits` (the table it was given, the
    declared bounds) is one of the values of its releasable groups. `joined` (a release on a
    table the site did not make, join_cells): no empty cell unless it is the group's only one."""
    limits = np.asarray(release.limits, dtype=float)
    if limits.size < 2 or np.any(np.diff(limits) <= 0):
        raise KAnonymityError("limits must increase strictly")
    data = _pooled([np.asarray(g, dtype=float) for g in _releasable(list(groups), k)])
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
            if joined and count == 0 and len(cells) > 1:
                raise KAnonymityError(f"group {g}: the empty bins {first}-{last} would be a cell of their own")
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
