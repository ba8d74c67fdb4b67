"""Split conformal prediction across sites by bisection on counts.

The threshold of centralized split CP is the k-th smallest of the N pooled calibration scores,
k = ceil((N + 1)(1 - alpha)) (paper 000, eq. 2). Here no score leaves a site: in round r the
coordinator sends every site a threshold t_r, and each site answers how many of its scores are
<= t_r (one integer, the `count` codec). Round 0 asks at `hi`; if fewer than k scores lie there,
no finite threshold is known to cover and the set is the whole line. Then each round halves the
bracket [lo, hi] with count(hi) >= k. The result is hi: at least the k-th smallest pooled score,
so coverage is at least that of centralized split CP (>= 1 - alpha), and at most
(hi - lo) / 2^rounds above it.

Dropouts: counts are kept per site and threshold, so when a site stops answering, the bracket
is rebuilt from the counts of the sites that answered every round (their own N and k) and the
bisection goes on; the guarantee is that of split CP on the survivors' scores. A count that is
negative, above the site's n_j or smaller than its count at a lower threshold is refused.
"""

from __future__ import annotations

import numpy as np

from quorum.plugin import CoordinatorHalf, Method, Outcome, Phase, PhaseStep, PhaseTable, Send, SiteHalf, checked
from quorum.stats.conformal import split_conformal_order
from quorum_bisection.result import Bracket

MAX_ROUNDS = 60


class BisectionCP(Method):
    name = "bisection_cp"
    codec = "count"
    result = Bracket                # its own result family (quorum_bisection.result)
    # round 0, round 1, ... (round-0, round-1, ... on the wire), each after the one before
    phases = PhaseTable(PhaseStep("round", then=("round",), numbered=True), rounds=MAX_ROUNDS + 1)
    PARAMS = {
        "rounds": {"type": "int", "min": 1, "max": MAX_ROUNDS, "default": 30},
        "lo": {"type": "float", "default": 0.0},  # a public bracket for the scores
        "hi": {"type": "float"},
    }

    def coordinator(self, sizes, rng) -> CoordinatorHalf:
        return Bisection(self.alpha, dict(sizes), float(self.params["lo"]), float(self.params["hi"]),
                         int(self.params["rounds"]))

    @classmethod
    def site(cls, rows, rng, site_id) -> SiteHalf:
        return CountBelow(rows)


class Bisection(CoordinatorHalf):
    def __init__(self, alpha: float, sizes: dict[str, int], lo: float, hi: float, rounds: int) -> None:
        self.alpha, self.sizes, self.lo0, self.hi0, self.rounds = alpha, sizes, lo, hi, rounds
        self.asked: list[float] = []  # thresholds, in the order asked
        self.counts: dict[str, dict[float, int]] = {site: {} for site in sizes}
        self.left: dict[str, str] = {}  # site -> why it no longer counts

    def start(self):
        if not self.sizes:
            return Outcome.aborted("no site joined the session")
        if not self.lo0 < self.hi0:
            return Outcome.aborted(f"bisection_cp needs lo < hi, got [{self.lo0}, {self.hi0}]")
        return self._ask(0, self.hi0)

    def _ask(self, r: int, t: float) -> Send:
        self.asked.append(t)
        return Send(Phase("round", r), {site: {"t": t} for site in self.counts})

    def advance(self, phase, answers, dropped):
        t = self.asked[-1]
        for site in list(self.counts):
            count = answers.get(site)
            reason = dropped.get(site, "no answer") if count is None else self._inconsistent(site, t, count)
            if reason:
                self.left[site] = f"{phase}: {reason}"
                del self.counts[site]
            else:
                self.counts[site][t] = count
        if not self.counts:
            return Outcome.aborted(f"no site answered every round (last: {phase})", dropped=self.left)
        n = sum(self.sizes[site] for site in self.counts)
        k = split_conformal_order(n, self.alpha)
        details = {"pooled": n, "order": k, "rounds": len(self.asked), "answered": len(self.counts),
                   "dropped": dict(self.left)}
        if k > n:
            return Bracket.infinite(f"{n} scores are too few for alpha = {self.alpha}", **details)
        total = {s: sum(self.counts[site][s] for site in self.counts) for s in self.asked}
        if total[self.hi0] < k:
            return Bracket.infinite(f"only {total[self.hi0]} of the {k} scores needed are <= hi = {self.hi0}",
                                    **details)
        hi = min(s for s in self.asked if total[s] >= k)
        lo = max([self.lo0] + [s for s in self.asked if total[s] < k])
        if len(self.asked) > self.rounds:
            return Bracket("ok", "", {"guarantee": min(1.0, k / (n + 1)), **details}, hi, lo=lo)
        return self._ask(len(self.asked), lo + (hi - lo) / 2)

    def _inconsistent(self, site: str, t: float, count: int) -> str:
        if count > self.sizes[site]:
            return f"count {count} above the site's {self.sizes[site]} scores"
        earlier = self.counts[site]
        if any((s < t and c > count) or (s > t and c < count) for s, c in earlier.items()):
            return f"count {count} at {t} contradicts the site's earlier counts"
        return ""


class CountBelow(SiteHalf):
    """A site's half: how many of its scores are <= the threshold asked."""

    REQUEST = {"type": "map", "fields": {"t": {"type": "float"}}}  # the spec language, as PARAMS

    def __init__(self, scores) -> None:
        self.scores = np.sort(np.asarray(scores, dtype=float))

    def answer(self, phase, body):
        t = checked(self.REQUEST, body, f"{phase} request")["t"]  # RequestError names what is wrong
        return int(np.searchsorted(self.scores, t, side="right"))
