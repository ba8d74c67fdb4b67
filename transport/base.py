"""The seam between the coordinator's pump and a network (Flower's Grid, for Quorum).

A `Transport` moves packed envelopes between the coordinator and its peers (sites, the
shuffler) and says which peers it lost; the pump (coordinator.driver) decides everything else.
Two implementations: the ZeroMQ ROUTER channel (transport.channel.RouterChannel: real sockets,
CurveZMQ, real time) and the in-memory transport (transport.memory.MemoryTransport: peers called
in this process, on a virtual clock). To add one, implement these five members; the pump, the
ledger, faults, deadlines and events come with it unchanged.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from protocol.wire import Envelope


@dataclass(frozen=True)
class Incoming:
    peer: str  # at a ROUTER: the site id its key authenticated (CURVE) or its routing id (plain)
    nbytes: int  # size on the wire (ZMTP frames, see transport.ledger)
    envelope: Envelope | None = None
    reason: str | None = None  # set when the frames could not be accepted
    user_id: str | None = None  # the site id ZAP authenticated the connection as (CURVE only)


#: why a peer is lost when its connection closed (what both transports report)
CONNECTION_CLOSED = ("its connection closed (the process ended or was killed, or its machine stopped answering "
                     "TCP keepalive probes)")


@dataclass(frozen=True)
class Lost:
    peer: str
    reason: str


class Transport(ABC):
    #: where peers reach it (a ZeroMQ endpoint, or "memory://")
    endpoint: str
    #: whether messages travel under CurveZMQ (the ledger counts its framing)
    curve: bool
    #: peers whose connection closed since the pump last looked (it clears the list)
    lost: list[Lost]

    @abstractmethod
    def pack(self, mtype: str, session: int, payload: dict) -> bytes:
        """One envelope from the coordinator, numbered, as bytes on the wire."""

    @abstractmethod
    def send_raw(self, peer: str, frames: list[bytes]) -> int | None:
        """Send packed bytes to `peer`: their size on the wire, or None when it is not connected."""

    @abstractmethod
    def receive(self, timeout_s: float) -> Incoming | None:
        """The next message within `timeout_s` seconds of the pump's clock, or None."""

    @abstractmethod
    def close(self) -> None:
        """Release what the transport holds."""
