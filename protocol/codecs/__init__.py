"""Codec registry: a codec is a class named by an import path. Quorum's own are listed here (a new
one is one module and one line); another package's are entry points in the group
`quorum.codecs`, or import paths in a method's `codec` attribute (specs.plugins)."""

from protocol.codecs.base import Codec, PayloadError
from specs.plugins import Registry, subclass_problem

ROUTES = ("direct", "shuffler")


def check_codec(cls: type) -> str | None:
    """What keeps `cls` from being a codec (None: nothing): the interface of codecs.base.Codec."""
    problem = subclass_problem(cls, Codec)
    if problem:
        return problem
    if cls.route not in ROUTES:
        return f"route must be one of {ROUTES}, got {cls.route!r}"
    return None


CODECS = Registry("codec", "quorum.codecs", {
    "raw_quantile": "protocol.codecs.raw_quantile:RawQuantile",
    "raw_scores": "protocol.codecs.raw_scores:RawScores",
    "exp_mech_bins": "protocol.codecs.exp_mech_bins:ExpMechBins",
    "secagg_ddg": "protocol.codecs.secagg_ddg:SecAggDDG",
    "shuffle": "protocol.codecs.shuffle:Shuffle",
    "summary": "protocol.codecs.summary:Summary",
    "tensors": "protocol.codecs.tensors:Tensors",
    "tensors_secagg": "protocol.codecs.tensors_secagg:TensorsSecAgg",
}, key="name", check=check_codec)

__all__ = ["CODECS", "Codec", "PayloadError", "check_codec"]
