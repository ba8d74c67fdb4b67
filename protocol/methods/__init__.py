"""Method registry: a new method is one module and one line here."""

from protocol.methods.base import Method, Outcome, RequestError, Send
from protocol.methods.centralized import Centralized
from protocol.methods.ddg_quantile import DDGQuantile
from protocol.methods.fedcp_avg import FedCPAvg
from protocol.methods.fedcp2_qq import FedCP2QQ
from protocol.methods.fedcp2_qq_secagg import FedCP2QQSecAgg
from protocol.methods.fedcp2_qq_shuffle import FedCP2QQShuffled
from protocol.methods.fedcp_qq import FedCPQQ
from protocol.methods.fedtype import FedAvg, FedType, LocalOnly
from protocol.methods.fed_quantiles import KAnonQuantiles, QuantileLoss, YJLikelihood
from protocol.methods.mwu import MWUSites, MWUTable
from protocol.methods.pooled_values import PooledValues
from protocol.methods.private_cp import PrivateCP, PrivateCPLocal

METHODS: dict[str, type[Method]] = {
    FedCPQQ.name: FedCPQQ,
    FedCPAvg.name: FedCPAvg,
    Centralized.name: Centralized,
    FedCP2QQ.name: FedCP2QQ,
    FedCP2QQShuffled.name: FedCP2QQShuffled,
    FedCP2QQSecAgg.name: FedCP2QQSecAgg,
    PrivateCP.name: PrivateCP,
    PrivateCPLocal.name: PrivateCPLocal,
    DDGQuantile.name: DDGQuantile,
    PooledValues.name: PooledValues,
    MWUSites.name: MWUSites,
    MWUTable.name: MWUTable,
    KAnonQuantiles.name: KAnonQuantiles,
    YJLikelihood.name: YJLikelihood,
    QuantileLoss.name: QuantileLoss,
    LocalOnly.name: LocalOnly,
    FedAvg.name: FedAvg,
    FedType.name: FedType,
}

__all__ = ["METHODS", "Method", "Outcome", "RequestError", "Send"]
