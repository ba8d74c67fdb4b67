"""The in-memory transport: the coordinator's peers called in this process, on a virtual clock.

A `MemoryTransport` is a Transport (transport.base) whose peers (`MemoryPeer`: the in-memory
sites of sites.memory, the in-memory shuffler of shuffler.memory) live in this process. It is a
discrete-event network: every message is packed and carried as bytes on the wire (the same
envelopes, sizes and checks as over ZeroMQ, so the ledger counts what the sockets would), queued
by the instant it reaches its destination, and delivered in that order; `receive` hands the
coordinator the next message due within its timeout, advancing the virtual clock (transport.clock)
to it, and running whatever peers do in between (a site answering, the shuffler forwarding a
batch at its deadline, a held message released). On a virtual clock nobody sleeps: a deadline of
30 s passes in no time when nothing is due before it; on the real clock (transport.clock) the
same network runs in real time, waiting as the sockets would.

A peer's answer leaves when it was asked plus, with `service_time`, the seconds the peer took to
compute it (measured here as the CPU time of this thread, time.thread_time: what the site's own
process would spend, not what other jobs on a loaded machine or a disk's fsync add); without, at
once, so that two runs give the same events in the same order. A peer that crashes (a scripted fault) is
reported lost, as the ZeroMQ channel's socket monitor reports a closed connection.
"""

from __future__ import annotations

import heapq
import itertools
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

from protocol.wire import MAX_MESSAGE_BYTES, Envelope, WireError, decode, encode
from transport.base import CONNECTION_CLOSED, Incoming, Lost, Transport
from transport.clock import Clock
from transport.ledger import message_wire_bytes

COORDINATOR_ID = "coordinator"


@dataclass(frozen=True)
class Outbound:
    """A message a peer sends: when it leaves, to whom (COORDINATOR_ID or a peer's name), its bytes."""

    at: float
    to: str
    data: bytes


class MemoryPeer(ABC):
    name: str
    alive: bool = True  # False once it crashed or shut down: it receives nothing more
    crashed: bool = False  # it ended as a crash would (reported lost)
    #: whether it ever acts on its own (`next_wake`): only those are asked when, so that delivering
    #: a message costs the same at 10 peers as at 10,000
    wakes: bool = False

    @abstractmethod
    def deliver(self, sender: str, data: bytes, nbytes: int, now: float) -> list[Outbound]:
        """A message reaches the peer at `now`: what it sends in reply."""

    def next_wake(self) -> float | None:
        """When the peer must act on its own (a batch's deadline, a held message); None: never."""
        return None

    def wake(self, now: float) -> list[Outbound]:
        """The peer's own time came: what it sends."""
        return []


class Packer:
    """Numbers and packs one party's envelopes, as a channel does."""

    def __init__(self, sender: str) -> None:
        self.sender, self._seq = sender, itertools.count()

    def pack(self, mtype: str, session: int, payload: dict) -> bytes:
        return encode(Envelope(mtype, session, self.sender, next(self._seq), payload))


def unpack(peer: str, data: bytes, curve: bool = False, max_bytes: int = MAX_MESSAGE_BYTES) -> Incoming:
    """Bytes received from `peer` as an Incoming (the envelope, or why it is refused), sized as
    the sockets would carry them (under CurveZMQ when `curve`)."""
    nbytes = message_wire_bytes([len(data)], curve)
    try:
        return Incoming(peer, nbytes, envelope=decode(data, max_bytes=max_bytes))
    except WireError as exc:
        return Incoming(peer, nbytes, reason=str(exc))


class MemoryTransport(Transport):
    endpoint = "memory://"

    def __init__(self, clock: Clock, service_time: bool = False, curve: bool = False, durable=None) -> None:
        """curve: size every message as CurveZMQ would carry it (the run's `runtime.security`), so
        the ledger counts what the processes backend's would; nothing is encrypted in memory.
        durable(): called before any message reaches the coordinator (the peers' group commit,
        sites.storage.GroupCommit.flush: no answer is seen before the release it accounts for is
        on disk, and the answers of one instant share one sync, as a site host's do)."""
        self.clock, self.service_time, self.curve, self.durable = clock, service_time, curve, durable
        self.peers: dict[str, MemoryPeer] = {}
        self._waking: list[MemoryPeer] = []  # the peers that act on their own
        self.lost: list[Lost] = []
        self._packer = Packer(COORDINATOR_ID)
        self._queue: list[tuple[float, int, str, str, bytes]] = []  # (due, order, to, from, data)
        self._order = itertools.count()

    def attach(self, peer: MemoryPeer, hello: list[Outbound] = ()) -> None:
        """A peer joins the network (its first messages, e.g. its hello, sent)."""
        self.peers[peer.name] = peer
        if peer.wakes:
            self._waking.append(peer)
        self._post(peer.name, hello)

    def pack(self, mtype: str, session: int, payload: dict) -> bytes:
        return self._packer.pack(mtype, session, payload)

    def send_raw(self, peer: str, frames: list[bytes]) -> int | None:
        target = self.peers.get(peer)
        if target is None or not target.alive:
            return None
        data = b"".join(frames)
        heapq.heappush(self._queue, (self.clock.now(), next(self._order), peer, COORDINATOR_ID, data))
        return message_wire_bytes([len(f) for f in frames], self.curve)

    def inject(self, sender: str, to: str, data: bytes) -> None:
        """A message from a party that is no peer of the network (an attack's forged sender)."""
        heapq.heappush(self._queue, (self.clock.now(), next(self._order), to, sender, data))

    def receive(self, timeout_s: float) -> Incoming | None:
        deadline = self.clock.now() + max(0.0, timeout_s)
        while True:
            wake, waking = min(((t, p) for p in self._waking if p.alive and (t := p.next_wake()) is not None),
                               default=(None, None), key=lambda item: item[0])
            due = self._queue[0][0] if self._queue else None
            if wake is not None and (due is None or wake < due) and wake <= deadline:
                self.clock.sleep_until(wake)
                self._post(waking.name, waking.wake(self.clock.now()))
                continue
            if due is None or due > deadline:
                self.clock.sleep_until(deadline)
                return None
            _, _, to, sender, data = heapq.heappop(self._queue)
            self.clock.sleep_until(due)
            if to == COORDINATOR_ID:
                if self.durable is not None:
                    self.durable()
                return unpack(sender, data, self.curve)
            target = self.peers.get(to)
            if target is None or not target.alive:
                continue
            began = time.thread_time()
            replies = target.deliver(sender, data, message_wire_bytes([len(data)], self.curve), self.clock.now())
            spent = time.thread_time() - began if self.service_time else 0.0
            self._post(to, replies, spent)
            if target.crashed:
                self.lost.append(Lost(to, CONNECTION_CLOSED))
                return None

    def _post(self, sender: str, messages, delay: float = 0.0) -> None:
        for message in messages:
            heapq.heappush(self._queue, (message.at + delay, next(self._order), message.to, sender, message.data))

    def close(self) -> None:
        self.peers.clear()
        self._waking.clear()
        self._queue.clear()
