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

from protocol.accounting import MAX_CLAIMED, Spend
from protocol.methods.base import RequestError, SiteHalf, checked
from stats.amplification import shuffled_epsilon
from stats.dp import Bins, private_quantile_bin

MAX_BINS = 10_000_000


#: a central claim: the guarantee of a shuffle (or one-hot sum) of at least `messages` bins
CENTRAL = {"type": "map", "fields": {"epsilon": {"type": "float", "gt": 0, "finite": True},
                                     "delta": {"type": "float", "gt": 0, "lt": 1},
                                     "messages": {"type": "int", "min": 1, "max": MAX_CLAIMED}}}
#: a bin request: the level and epsilon of the exponential mechanism, the public bins, a claim
REQUEST = {"type": "map", "fields": {
    "level": {"type": "float", "gt": 0, "le": 1},
    "epsilon": {"type": "float", "gt": 0, "finite": True},
    "bins": {"type": "any"},  # bins_from_request
    "central": {"type": "any", "default": None},  # the shuffled and summed variants' claim (CENTRAL)
}}


class PrivateQuantileBin(SiteHalf):
    def __init__(self, scores, rng) -> None:
        self.scores, self.rng = scores, rng

    def answer(self, phase, body):
        request = checked(REQUEST, body, f"{phase} request")
        level, epsilon = request["level"], request["epsilon"]
        grid = bins_from_request(request["bins"])
        return private_quantile_bin(self.scores, grid, float(level), float(epsilon), self.rng)


def bin_spend(body, amplified: bool = False) -> Spend:
    """What one exponential-mechanism bin releases: epsilon-LDP at the request's epsilon, or the
    central (epsilon, delta) of a shuffle of at least `messages` such bins when the request
    claims one and FMT21's bound backs the claim (RequestError when it does not). `amplified`:
    whether the answer really travels through the shuffler or into a sum, which the method knows
    from its own codec; a central claim on a bin that goes to the coordinator as it is would book
    the amplified epsilon for a release that has none, and is refused."""
    epsilon = checked(REQUEST["fields"]["epsilon"], body.get("epsilon") if isinstance(body, dict) else None,
                      "epsilon")
    if body.get("central") is None:
        return Spend("dp", float(epsilon), 0.0, "local")
    if not amplified:
        raise RequestError("a central claim on a bin that goes to the coordinator unshuffled and unsummed: its "
                           f"release is epsilon {epsilon:g} local DP, not amplified; this site answers only an "
                           "unclaimed request")
    central = checked(CENTRAL, body["central"], "central")
    backed = shuffled_epsilon(float(epsilon), int(central["messages"]), float(central["delta"]))
    if backed > central["epsilon"] * (1 + 1e-6):
        raise RequestError(f"the claimed central epsilon {central['epsilon']:g} is not backed: {central['messages']} "
                           f"shuffled messages at local epsilon {epsilon:g} give {backed:.4g} (FMT21)")
    return Spend("dp", float(central["epsilon"]), float(central["delta"]),
                 f"central by amplification of {central['messages']} messages (local epsilon {epsilon:.4g})",
                 contributors=int(central["messages"]))


def bins_from_request(bins, min_count: int = 1, max_count: int = MAX_BINS) -> Bins:
    """The public bins {lo, hi, count} of a request, checked by the site (RequestError if not)."""
    bins = checked({"type": "map", "fields": {"lo": {"type": "float", "finite": True},
                                              "hi": {"type": "float", "finite": True},
                                              "count": {"type": "int", "min": min_count, "max": max_count}}},
                   bins, "bins")
    try:
        return Bins(bins["lo"], bins["hi"], bins["count"])
    except (TypeError, ValueError) as exc:
        raise RequestError(str(exc)) from None
