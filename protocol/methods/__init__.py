"""Method registry: a method is a class named by an import path. Quorum's own are listed here
(a new one is one module and one line); another package's are entry points in the group
`quorum.methods` or import paths in a scenario (specs.plugins)."""

from quorum.protocol.methods.base import Method, Outcome, RequestError, Send
from quorum.specs.plugins import PluginError, Registry, params_problem, subclass_problem

DATA_KINDS = ("scores", "two_sample", "examples")


def check_method(cls: type) -> str | None:
    """What keeps `cls` from being a method (None: nothing): the interface of methods.base.Method."""
    from quorum.protocol.codecs import CODECS

    problem = subclass_problem(cls, Method) or params_problem(cls.PARAMS)
    if problem:
        return problem
    codec = getattr(cls, "codec", None)
    if not isinstance(codec, str):
        return "it sets no codec (a registered codec name or an import path)"
    try:
        CODECS.load(codec)
    except PluginError as exc:
        return f"its codec: {exc}"
    phases = cls.phases
    if not isinstance(phases, tuple) or not phases or not all(isinstance(p, str) and p for p in phases):
        return f"phases must be a non-empty tuple of names, got {phases!r}"
    if cls.data not in DATA_KINDS:
        return f"data must be one of {DATA_KINDS}, got {cls.data!r}"
    return None


METHODS = Registry("method", "quorum.methods", {
    "fedcp_qq": "quorum.protocol.methods.fedcp_qq:FedCPQQ",
    "fedcp_avg": "quorum.protocol.methods.fedcp_avg:FedCPAvg",
    "centralized": "quorum.protocol.methods.centralized:Centralized",
    "fedcp2_qq": "quorum.protocol.methods.fedcp2_qq:FedCP2QQ",
    "fedcp2_qq_shuffle": "quorum.protocol.methods.fedcp2_qq_shuffle:FedCP2QQShuffled",
    "fedcp2_qq_secagg": "quorum.protocol.methods.fedcp2_qq_secagg:FedCP2QQSecAgg",
    "private_cp": "quorum.protocol.methods.private_cp:PrivateCP",
    "private_cp_local": "quorum.protocol.methods.private_cp:PrivateCPLocal",
    "ddg_quantile": "quorum.protocol.methods.ddg_quantile:DDGQuantile",
    "pooled_values": "quorum.protocol.methods.pooled_values:PooledValues",
    "mwu_sites": "quorum.protocol.methods.mwu:MWUSites",
    "mwu_table": "quorum.protocol.methods.mwu:MWUTable",
    "kanon_quantiles": "quorum.protocol.methods.fed_quantiles:KAnonQuantiles",
    "yj_likelihood": "quorum.protocol.methods.fed_quantiles:YJLikelihood",
    "quantile_loss": "quorum.protocol.methods.fed_quantiles:QuantileLoss",
    "local_only": "quorum.protocol.methods.fedtype:LocalOnly",
    "fedavg": "quorum.protocol.methods.fedtype:FedAvg",
    "fedtype": "quorum.protocol.methods.fedtype:FedType",
    "fedtype_personal": "quorum.protocol.methods.fedtype_personal:FedTypePersonal",
    "fml": "quorum.protocol.methods.fml:FML",
    "fedproto": "quorum.protocol.methods.fedproto:FedProto",
}, key="name", check=check_method)

__all__ = ["METHODS", "Method", "Outcome", "RequestError", "Send", "check_method"]
