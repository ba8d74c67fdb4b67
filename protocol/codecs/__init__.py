"""Codec registry: a new codec is one module and one line here."""

from protocol.codecs.base import Codec, PayloadError
from protocol.codecs.exp_mech_bins import ExpMechBins
from protocol.codecs.raw_quantile import RawQuantile
from protocol.codecs.raw_scores import RawScores
from protocol.codecs.secagg_ddg import SecAggDDG
from protocol.codecs.shuffle import Shuffle
from protocol.codecs.summary import Summary
from protocol.codecs.tensors import Tensors

CODECS: dict[str, type[Codec]] = {
    RawQuantile.name: RawQuantile,
    RawScores.name: RawScores,
    ExpMechBins.name: ExpMechBins,
    SecAggDDG.name: SecAggDDG,
    Shuffle.name: Shuffle,
    Summary.name: Summary,
    Tensors.name: Tensors,
}

__all__ = ["CODECS", "Codec", "PayloadError"]
