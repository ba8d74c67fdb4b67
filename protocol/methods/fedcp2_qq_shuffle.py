"""FedCP²-QQ through a shuffler (paper 000 section 4, 'Privacy amplification by shuffling or
aggregation'; Feldman, McMillan and Talwar 2021).

The scenario asks for a central (epsilon, delta). Each site runs the exponential mechanism of
FedCP²-QQ with the largest epsilon_0 whose shuffle of the m - dropouts messages the coordinator
is sure to receive is (epsilon, delta)-DP (stats.amplification.local_epsilon_for); ell_cor
uses that epsilon_0, so it shrinks roughly as 1 / sqrt(m). Bins are sealed to the coordinator's
session key and travel through the shuffler process; the coordinator takes the k-th smallest of
the anonymous batch exactly as FedCP²-QQ does (coverage >= 1 - alpha by theorem 4.1 at
epsilon_0). The report gives epsilon_0 and the central epsilon for the number of bins actually
shuffled.

The central epsilon holds only when at least m - dropouts bins are shuffled. Each request names
that number (`central`, checked by each site before it counts the central epsilon against its
budget; under `on_shortfall: report` the claim is what one message gives, since fewer than
planned may then be released), and the shuffler withholds a smaller batch, so by default (`on_shortfall: abort`) a
session where more sites than planned dropped out releases nothing and aborts with the reason.
`on_shortfall: report` lets the batch through and returns the threshold with status
`shortfall`, its reason naming the epsilon obtained against the one asked.

Assumption, as in the paper: the amplification theorem needs each site's message to be
epsilon_0-DP between any two of its inputs (local DP). The exponential mechanism is epsilon_0-DP
against a change of one calibration score; that is the whole input of a site holding one score,
and the reading paper 000 section 4 takes for sites holding many.
"""

from __future__ import annotations


from protocol.codecs.exp_mech_bins import ExpMechBins
from protocol.codecs.shuffle import Shuffle
from protocol.accounting import Spend
from protocol.methods.base import SHORTFALL_SPEC, Outcome, Planned
from protocol.methods.fedcp2_qq import FedCP2QQ
from stats.amplification import local_epsilon_for, shuffled_epsilon

DELTA_SPEC = {"type": "float", "gt": 0, "lt": 1, "default": 1e-6}


class FedCP2QQShuffled(FedCP2QQ):
    name = "fedcp2_qq_shuffle"
    codec = "shuffle"
    PARAMS = {**FedCP2QQ.PARAMS, "delta": DELTA_SPEC, "on_shortfall": SHORTFALL_SPEC}
    MODEL = "central: eps0-LDP bins, shuffled (FMT21)"

    def __init__(self, alpha, epsilon, bins, gamma_grid=50, dropouts=0, delta=1e-6, on_shortfall="abort"):
        super().__init__(alpha, epsilon, bins, gamma_grid, dropouts)
        self.params["delta"] = self.delta = float(delta)
        self.params["on_shortfall"] = self.on_shortfall = on_shortfall

    @property
    def privacy(self):
        return {"epsilon": self.epsilon, "model": self.MODEL}

    def planned_messages(self, sites: int) -> int:
        """The fewest bins the amplification is planned for: every site but the dropouts allowed."""
        return max(1, sites - self.dropouts)

    def local_epsilon(self, sites: int) -> float:
        return local_epsilon_for(self.epsilon, self.planned_messages(sites), self.delta)

    def make_codec(self):
        return Shuffle(ExpMechBins(self._bins().count))

    def plan(self, sizes):
        planned = super().plan(sizes)
        if isinstance(planned, Outcome):
            return planned
        central = self.guaranteed(len(sizes), 1)
        return Planned({s: {**body, "central": central} for s, body in planned.requests.items()}, planned.state,
                       minimum=central["messages"] if self.on_shortfall == "abort" else 0)

    def guaranteed(self, sites: int, floor: int) -> dict:
        """The central guarantee each site may count (its `central` claim): with the abort policy
        the one asked, for the planned number of messages, which the shuffler or the unmask step
        enforces; with `report` only what `floor` messages (the fewest any release can hold)
        give, since a shortfall may then be released."""
        if self.on_shortfall == "abort":
            return {"epsilon": self.epsilon, "delta": self.delta, "messages": self.planned_messages(sites)}
        epsilon0 = self.local_epsilon(sites)
        return {"epsilon": shuffled_epsilon(epsilon0, floor, self.delta) * (1 + 1e-9) or epsilon0,
                "delta": self.delta, "messages": floor}

    def planned_spend(self, sites):
        central = self.guaranteed(sites, 1)
        return Spend("dp", central["epsilon"], central["delta"], self.MODEL, contributors=central["messages"])

    def combine(self, sizes, planned, answers, dropped, rng):
        outcome = super().combine(sizes, planned, answers, dropped, rng)
        privacy = central_privacy(self.local_epsilon(len(sizes)), len(answers), self.epsilon, self.delta)
        outcome.details.update(privacy)
        if not privacy["privacy_shortfall"] or outcome.status != "ok":
            return outcome
        reason = shortfall_reason(len(answers), self.planned_messages(len(sizes)), privacy["epsilon_obtained"],
                                  self.epsilon, self.delta)
        if self.on_shortfall == "abort":
            return Outcome.aborted(reason + "; nothing released (on_shortfall: abort)", **outcome.details)
        return outcome.short_of_privacy(reason)


def shortfall_reason(inputs: int, planned: int, obtained: float, epsilon: float, delta: float) -> str:
    return (f"privacy shortfall: {inputs} private inputs where {planned} were planned for, so the release is "
            f"(epsilon {obtained:.4g}, delta {delta:g})-DP, not the epsilon {epsilon:g} asked")


def central_privacy(epsilon0: float, messages: int, epsilon: float, delta: float) -> dict:
    """What the report says of a shuffled (or one-hot aggregated) session: both guarantees."""
    obtained = shuffled_epsilon(epsilon0, messages, delta) if messages else 0.0
    return {"epsilon_local": epsilon0, "epsilon_obtained": obtained, "delta": delta, "messages": messages,
            "privacy_shortfall": obtained > epsilon * (1 + 1e-6)}
