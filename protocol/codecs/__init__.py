"""Codec registry: a new codec is one module and one line here."""

from protocol.codecs.base import Codec, PayloadError
from protocol.codecs.exp_mech_bins import ExpMechBins
from protocol.codecs.raw_quantile import RawQuantile
from protocol.codecs.raw_scores import RawScores
from protocol.codecs.secagg_ddg import SecAggDDG

CODECS: dict[str, type[Codec]] = {
    RawQuantile.name: RawQuantile,
    RawScores.name: RawScores,
    ExpMechBins.name: ExpMechBins,
    SecAggDDG.name: SecAggDDG,
}

__all__ = ["CODECS", "Codec", "PayloadError"]
