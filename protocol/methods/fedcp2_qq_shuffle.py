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
from protocol.methods.fedcp2_qq import AmplifiedBins


class FedCP2QQShuffled(AmplifiedBins):
    name = "fedcp2_qq_shuffle"
    codec = "shuffle"
    MODEL = "central: eps0-LDP bins, shuffled (FMT21)"

    def make_codec(self):
        return Shuffle(ExpMechBins(self._bins().count))
