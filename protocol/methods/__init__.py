"""Method registry: a method is a class named by an import path. Quorum's own are listed here
(a new one is one module and one line); another package's are entry points in the group
`quorum.methods` or import paths in a scenario (specs.plugins)."""

from protocol.methods.base import Method, Outcome, RequestError, Send
from specs.plugins import PluginError, Registry, params_problem, subclass_problem

DATA_KINDS = ("scores", "two_sample", "examples")


def check_method(cls: type) -> str | None:
    """What keeps `cls` from being a method (None: nothing): the interface of methods.base.Method."""
    from protocol.codecs import CODECS

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
    try:
        cls.phase_table()
    except (ValueError, TypeError) as exc:
        return f"its phases: {exc} (a PhaseTable, or a non-empty tuple of distinct names)"
    if cls.data not in DATA_KINDS:
        return f"data must be one of {DATA_KINDS}, got {cls.data!r}"
    from results import check_result

    family = cls.result
    problem = check_result(family) if isinstance(family, type) else f"not a class: {family!r}"
    if problem:
        return f"its result family {family!r}: {problem}"
    return None


METHODS = Registry("method", "quorum.methods", {
    "fedcp_qq": "protocol.methods.fedcp_qq:FedCPQQ",
    "fedcp_avg": "protocol.methods.fedcp_avg:FedCPAvg",
    "centralized": "protocol.methods.centralized:Centralized",
    "fedcp2_qq": "protocol.methods.fedcp2_qq:FedCP2QQ",
    "fedcp2_qq_shuffle": "protocol.methods.fedcp2_qq_shuffle:FedCP2QQShuffled",
    "fedcp2_qq_secagg": "protocol.methods.fedcp2_qq_secagg:FedCP2QQSecAgg",
    "private_cp": "protocol.methods.private_cp:PrivateCP",
    "private_cp_local": "protocol.methods.private_cp:PrivateCPLocal",
    "ddg_quantile": "protocol.methods.ddg_quantile:DDGQuantile",
    "pooled_values": "protocol.methods.pooled_values:PooledValues",
    "mwu_sites": "protocol.methods.mwu:MWUSites",
    "mwu_table": "protocol.methods.mwu:MWUTable",
    "kanon_quantiles": "protocol.methods.fed_quantiles:KAnonQuantiles",
    "yj_likelihood": "protocol.methods.fed_quantiles:YJLikelihood",
    "quantile_loss": "protocol.methods.fed_quantiles:QuantileLoss",
    "local_only": "protocol.methods.fedtype:LocalOnly",
    "fedavg": "protocol.methods.fedtype:FedAvg",
    "fedtype": "protocol.methods.fedtype:FedType",
    "fedtype_personal": "protocol.methods.fedtype_personal:FedTypePersonal",
    "delta_fl": "protocol.methods.delta_fl:DeltaFL",
    "dp_delta_fl": "protocol.methods.delta_fl:DPDeltaFL",
    "dp_fedavg": "protocol.methods.delta_fl:DPFedAvg",
    "fml": "protocol.methods.fml:FML",
    "fedproto": "protocol.methods.fedproto:FedProto",
}, key="name", check=check_method)

__all__ = ["METHODS", "Method", "Outcome", "RequestError", "Send", "check_method"]
