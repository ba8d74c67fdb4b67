"""The K-anonymous federated table as a session (paper 004, sections 3.1-3.2, algorithms 1-6).

The coordinator asks the sites one at a time, the largest n_j first (the sizes are what the
sites announced when they joined): the first site that can release anything bins its own data
(`first_release`), each further site refines the current limits with its own (`join_release`).
Each phase has one member, so each answer carries one site's release. The site half runs
`check_release` on what it built before it answers: a count in (0, K) or a limit equal to one of
its values never leaves the site, whatever the coordinator asked. The coordinator folds each
release into the table with `apply_release` (released numbers only); a site that drops out, or
refuses (all its groups under K at the first position, say), is skipped and named in the result.

Releases travel through the `summary` codec as `limits` (float64), `cells_g` (int64 triples
first, last, count, per group g) and `withheld` (one 0/1 per group).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from protocol.accounting import Spend, request_key
from protocol.codecs.summary import Summary
from protocol.methods.base import CoordinatorHalf, Outcome, RequestError, Send, SiteHalf, checked
from protocol.phases import Phase, PhaseStep, PhaseTable
from stats.kanon import (EXTREMES, KAnonymityError, Release, Table, apply_release, check_release,
                         first_release, join_release)

MAX_SITES = 256
#: one phase per site in turn, table-0, table-1, ...: each passes the table on to the next
PHASES = PhaseTable(PhaseStep("table", then=("table",), numbered=True), rounds=MAX_SITES)
TABLE_PARAMS = {
    "k": {"type": "int", "min": 2, "default": 10},
    "extremes": {"type": "str", "choices": list(EXTREMES), "default": "buffer"},
    "bounds": {"type": "list", "of": {"type": "float"}, "default": []},
}


def table_codec(groups: int) -> Summary:
    fields = {"limits": "floats", "withheld": "ints", **{f"cells_{g}": "ints" for g in range(groups)}}
    return Summary(fields, {"withheld": groups})


def release_to_summary(release: Release) -> dict:
    body = {"limits": np.asarray(release.limits, dtype=float),
            "withheld": np.asarray(release.withheld, dtype=np.int64)}
    for g, cells in enumerate(release.cells):
        body[f"cells_{g}"] = np.asarray(cells, dtype=np.int64).reshape(-1)
    return body


def release_from_summary(value: dict, groups: int) -> Release:
    """A decoded summary -> Release, refusing shapes no site half would send."""
    cells = []
    for g in range(groups):
        flat = value[f"cells_{g}"]
        if flat.size % 3:
            raise KAnonymityError(f"cells_{g} holds {flat.size} integers, not triples")
        cells.append(tuple(tuple(int(v) for v in row) for row in flat.reshape(-1, 3)))
    if not np.all(np.isin(value["withheld"], (0, 1))):
        raise KAnonymityError("withheld must be 0 or 1 per group")
    return Release(tuple(float(v) for v in value["limits"]), tuple(cells), tuple(bool(w) for w in value["withheld"]))


def check_public_cells(release: Release, k: int, bins: int) -> None:
    """The coordinator's own look at a release (the site is the one that must not leak): cells
    partition the bins and every count is 0 or >= K."""
    for g, cells in enumerate(release.cells):
        expect = 0
        for first, last, count in cells:
            if first != expect or last < first or (0 < count < k) or count < 0:
                raise KAnonymityError(f"group {g}: cell ({first}, {last}, {count}) breaks the partition or K")
            expect = last + 1
        if cells and expect != bins:
            raise KAnonymityError(f"group {g}: cells cover {expect} of {bins} bins")


class KAnonTableCoordinator(CoordinatorHalf):
    def __init__(self, sizes: dict[str, int], request: dict, groups: int,
                 finish: Callable[[Table, list[str], dict[str, str]], Outcome]) -> None:
        if len(sizes) > MAX_SITES:
            raise ValueError(f"a K-anonymous table session takes at most {MAX_SITES} sites")
        self.order = sorted(sizes, key=lambda s: (-sizes[s], s))  # section 3.2: decreasing size
        self.request, self.groups, self.finish = request, groups, finish
        self.table: Table | None = None
        self.position = 0
        self.contributed: list[str] = []
        self.skipped: dict[str, str] = {}

    def start(self):
        return self._next()

    def _next(self):
        if self.position >= len(self.order):
            if self.table is None:
                why = "; ".join(f"{site}: {reason}" for site, reason in list(self.skipped.items())[:3])
                return Outcome.aborted(f"no site could release a K-anonymous table ({why})", skipped=self.skipped)
            return self.finish(self.table, self.contributed, self.skipped)
        limits = [] if self.table is None else list(self.table.limits)
        site = self.order[self.position]
        return Send(Phase("table", self.position), {site: {**self.request, "limits": limits}})

    def advance(self, phase, answers, dropped):
        site = self.order[self.position]
        self.position += 1
        if site not in answers:
            self.skipped[site] = dropped.get(site, "no answer")
            return self._next()
        try:
            release = release_from_summary(answers[site], self.groups)
            check_public_cells(release, self.request["k"], len(release.limits) - 1)
            self.table = apply_release(self.table, release)
            self.contributed.append(site)
        except (KAnonymityError, ValueError, IndexError) as exc:
            self.skipped[site] = f"unusable release: {exc}"
        return self._next()


class KAnonTableSite(SiteHalf):
    """Answers a table request with this site's checked release of `groups` (value arrays)."""

    def __init__(self, groups: list[np.ndarray], rng: np.random.Generator) -> None:
        self.groups, self.rng = groups, rng

    def answer(self, phase, body):
        k, extremes, bounds, limits = parse_table_request(body)
        try:
            if limits:
                release = join_release(limits, self.groups, k, self.rng, extremes, bounds)
            else:
                release = first_release(self.groups, k, self.rng, extremes, bounds)
            # the table it was sent and the declared bounds are public limits, not data (issue 35)
            check_release(release, self.groups, k, public_limits=[*limits, *(bounds or ())], joined=bool(limits))
        except KAnonymityError as exc:
            raise RequestError(f"no K-anonymous release: {exc}") from None
        return release_to_summary(release)


#: a table request: K, how the extremes are protected, declared bounds, the table so far
TABLE_REQUEST = {"type": "map", "fields": {
    "k": {"type": "int", "min": 2},
    "extremes": {"type": "str", "choices": list(EXTREMES)},
    "bounds": {"type": "list", "of": {"type": "float"}, "max_len": 2},
    "limits": {"type": "list", "of": {"type": "float"}},
}}


def parse_table_request(body) -> tuple[int, str, tuple[float, float] | None, list[float]]:
    request = checked(TABLE_REQUEST, body, "table request")
    k, extremes, bounds, limits = request["k"], request["extremes"], request["bounds"], request["limits"]
    if extremes == "bounds":
        if len(bounds) != 2 or not bounds[0] < bounds[1]:
            raise RequestError(f"bounds must be [lo, hi] with lo < hi, got {bounds!r}")
        bounds = (bounds[0], bounds[1])
    else:
        bounds = None
    if len(limits) == 1 or any(b <= a for a, b in zip(limits, limits[1:])):
        raise RequestError("limits must be empty (first site) or at least two increasing numbers")
    return k, extremes, bounds, limits


def table_spend(layout: str, body) -> Spend:
    """A K-anonymous release (protocol.accounting): keyed by the table's group layout and the
    whole request, so that only an identical request on the same data gets the earlier release
    back; any other counts against the site's `kanon_releases`."""
    k, extremes, bounds, limits = parse_table_request(body)
    return Spend("kanon", model=f"K-anonymous table (K = {k}, {layout})",
                 key=request_key(layout, k, extremes, list(bounds or ()), limits), k=k)


def table_request(k: int, extremes: str, bounds: list[float]) -> dict:
    """The public part of every table request (the current limits are added per phase)."""
    if extremes == "bounds" and len(bounds) != 2:
        raise ValueError("extremes: bounds needs bounds: [lo, hi]")
    return {"k": int(k), "extremes": extremes, "bounds": [float(v) for v in bounds]}
