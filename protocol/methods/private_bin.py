"""The site half shared by the local-DP methods: answer with an epsilon-DP bin of a quantile.

Request body {"level": q, "epsilon": eps, "bins": {"lo", "hi", "count"}}: the site runs the
exponential mechanism (protocol.dp, paper 000 algorithm 2) on its own scores and answers with
the 0-based bin index only. Nothing else about its scores leaves the site. It checks what it is
asked for, so that a coordinator cannot request an unbounded epsilon or an absurd histogram.
"""

from __future__ import annotations

import math

from protocol.dp import Bins, private_quantile_bin
from protocol.methods.base import RequestError, SiteHalf

MAX_BINS = 10_000_000


class PrivateQuantileBin(SiteHalf):
    def __init__(self, scores, rng) -> None:
        self.scores, self.rng = scores, rng

    def answer(self, phase, body):
        if set(body) != {"level", "epsilon", "bins"}:
            raise RequestError(f"expected level, epsilon and bins; got {sorted(body)}")
        level, epsilon, bins = body["level"], body["epsilon"], body["bins"]
        if not _number(level) or not 0.0 < level <= 1.0:
            raise RequestError(f"level must lie in (0, 1], got {level!r}")
        if not _number(epsilon) or not 0.0 < epsilon < math.inf:
            raise RequestError(f"epsilon must be a positive number, got {epsilon!r}")
        grid = bins_from_request(bins)
        return private_quantile_bin(self.scores, grid, float(level), float(epsilon), self.rng)


def bins_from_request(bins, min_count: int = 1, max_count: int = MAX_BINS) -> Bins:
    """The public bins {lo, hi, count} of a request, checked by the site (RequestError if not)."""
    if not isinstance(bins, dict) or set(bins) != {"lo", "hi", "count"}:
        raise RequestError(f"bins must be {{lo, hi, count}}, got {bins!r}")
    count = bins["count"]
    if isinstance(count, bool) or not isinstance(count, int) or not min_count <= count <= max_count:
        raise RequestError(f"bin count must be an integer in [{min_count}, {max_count}], got {count!r}")
    try:
        return Bins(float(bins["lo"]), float(bins["hi"]), count)
    except (TypeError, ValueError) as exc:
        raise RequestError(str(exc)) from None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
