"""FedCP²-QQ through a shuffler (paper 000 section 4, 'Privacy amplification by shuffling or
aggregation'; Feldman, McMillan and Talwar 2021).

The scenario asks for a central (epsilon, delta). Each site runs the exponential mechanism of
FedCP²-QQ with the largest epsilon_0 whose shuffle of the m - dropouts messages the coordinator
is sure to receive is (epsilon, delta)-DP (protocol.amplification.local_epsilon_for); ell_cor
uses that epsilon_0, so it shrinks roughly as 1 / sqrt(m). Bins are sealed to the coordinator's
session key and travel through the shuffler process; the coordinator takes the k-th smallest of
the anonymous batch exactly as FedCP²-QQ does (coverage >= 1 - alpha by theorem 4.1 at
epsilon_0). The report gives epsilon_0 and the central epsilon for the number of bins actually
shuffled (a larger one, `privacy_shortfall`, if more sites than planned dropped out).

Assumption, as in the paper: the amplification theorem needs each site's message to be
epsilon_0-DP between any two of its inputs (local DP). The exponential mechanism is epsilon_0-DP
against a change of one calibration score; that is the whole input of a site holding one score,
and the reading paper 000 section 4 takes for sites holding many.
"""

from __future__ import annotations

from functools import lru_cache

from protocol.amplification import local_epsilon_for, shuffled_epsilon
from protocol.codecs.exp_mech_bins import ExpMechBins
from protocol.codecs.shuffle import Shuffle
from protocol.methods.fedcp2_qq import FedCP2QQ

DELTA_SPEC = {"type": "float", "gt": 0, "lt": 1, "default": 1e-6}


class FedCP2QQShuffled(FedCP2QQ):
    name = "fedcp2_qq_shuffle"
    codec = "shuffle"
    PARAMS = {**FedCP2QQ.PARAMS, "delta": DELTA_SPEC}
    MODEL = "central: eps0-LDP bins, shuffled (FMT21)"

    def __init__(self, alpha, epsilon, bins, gamma_grid=50, dropouts=0, delta=1e-6):
        super().__init__(alpha, epsilon, bins, gamma_grid, dropouts)
        self.params["delta"] = self.delta = float(delta)

    @property
    def privacy(self):
        return {"epsilon": self.epsilon, "model": self.MODEL}

    def local_epsilon(self, sites: int) -> float:
        return amplified_local_epsilon(self.epsilon, max(1, sites - self.dropouts), self.delta)

    def make_codec(self):
        return Shuffle(ExpMechBins(self._bins().count))

    def combine(self, sizes, planned, answers, dropped, rng):
        outcome = super().combine(sizes, planned, answers, dropped, rng)
        outcome.details.update(central_privacy(self.local_epsilon(len(sizes)), len(answers), self.epsilon,
                                               self.delta))
        return outcome


@lru_cache(maxsize=256)
def amplified_local_epsilon(epsilon: float, parties: int, delta: float) -> float:
    return local_epsilon_for(epsilon, parties, delta)


def central_privacy(epsilon0: float, messages: int, epsilon: float, delta: float) -> dict:
    """What the report says of a shuffled (or one-hot aggregated) session: both guarantees."""
    obtained = shuffled_epsilon(epsilon0, messages, delta) if messages else 0.0
    return {"epsilon_local": epsilon0, "epsilon_obtained": obtained, "delta": delta, "messages": messages,
            "privacy_shortfall": obtained > epsilon * (1 + 1e-6)}
