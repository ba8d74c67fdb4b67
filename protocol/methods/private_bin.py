"""The site half shared by the local-DP methods: answer with an epsilon-DP bin of a quantile.

Request body {"level": q, "epsilon": eps, "bins": {"lo", "hi", "count"}}: the site runs the
exponential mechanism (stats.dp, paper 000 algorithm 2) on its own scores and answers with
the 0-based bin index only. Nothing else about its scores leaves the site. It checks what it is
asked for, so that a coordinator cannot request an unbounded epsilon or an absurd histogram.

A bin that travels through a shuffler (or into a one-hot secure sum) also carries the central
guarantee the session is planned for, {"central": {"epsilon", "delta", "messages"}}: the site
checks it against the amplification bound (stats.amplification) for that many messages
before it counts the central (epsilon, delta) against its own budget (`bin_spend`); the
shuffler withholds a batch of fewer messages (protocol.shuffle).
"""

from __future__ import annotations

import math


from protocol.accounting import MAX_CLAIMED, Spend
from protocol.methods.base import RequestError, SiteHalf
from stats.amplification import shuffled_epsilon
from stats.dp import Bins, private_quantile_bin

MAX_BINS = 10_000_000


class PrivateQuantileBin(SiteHalf):
    def __init__(self, scores, rng) -> None:
        self.scores, self.rng = scores, rng

    def answer(self, phase, body):
        if set(body) - {"central"} != {"level", "epsilon", "bins"}:
            raise RequestError(f"expected level, epsilon and bins (and central); got {sorted(body)}")
        level, epsilon, bins = body["level"], body["epsilon"], body["bins"]
        if not _number(level) or not 0.0 < level <= 1.0:
            raise RequestError(f"level must lie in (0, 1], got {level!r}")
        if not _number(epsilon) or not 0.0 < epsilon < math.inf:
            raise RequestError(f"epsilon must be a positive number, got {epsilon!r}")
        grid = bins_from_request(bins)
        return private_quantile_bin(self.scores, grid, float(level), float(epsilon), self.rng)


def bin_spend(body) -> Spend:
    """What one exponential-mechanism bin releases: epsilon-LDP at the request's epsilon, or the
    central (epsilon, delta) of a shuffle of at least `messages` such bins when the request
    claims one and FMT21's bound backs the claim (RequestError when it does not)."""
    epsilon = body.get("epsilon") if isinstance(body, dict) else None
    if not _number(epsilon) or not 0.0 < epsilon < math.inf:
        raise RequestError(f"epsilon must be a positive number, got {epsilon!r}")
    central = body.get("central")
    if central is None:
        return Spend("dp", float(epsilon), 0.0, "local")
    if (not isinstance(central, dict) or set(central) != {"epsilon", "delta", "messages"}
            or not all(_number(central[k]) for k in central) or isinstance(central["messages"], float)
            or not 0 < central["epsilon"] < math.inf or not 0 < central["delta"] < 1
            or not 1 <= central["messages"] <= MAX_CLAIMED):
        raise RequestError(f"central must be {{epsilon > 0, delta in (0, 1), messages in [1, {MAX_CLAIMED}]}}, "
                           f"got {central!r}")
    backed = shuffled_epsilon(float(epsilon), int(central["messages"]), float(central["delta"]))
    if backed > central["epsilon"] * (1 + 1e-6):
        raise RequestError(f"the claimed central epsilon {central['epsilon']:g} is not backed: {central['messages']} "
                           f"shuffled messages at local epsilon {epsilon:g} give {backed:.4g} (FMT21)")
    return Spend("dp", float(central["epsilon"]), float(central["delta"]),
                 f"central by amplification of {central['messages']} messages (local epsilon {epsilon:.4g})",
                 contributors=int(central["messages"]))


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
