"""ZeroMQ plumbing shared by every driver, named by socket role: a `RouterChannel` binds and
serves many authenticated peers (the coordinator's for sites and the shuffler; the shuffler's
for sites), a `DealerChannel` connects one peer to it (a site; the shuffler to the coordinator).

A channel sends envelopes (numbering them) and receives frames, decoding them into an
`Incoming`: either an envelope or the reason it was refused. It knows nothing of phases.
With keys it runs CurveZMQ (transport.security); a secure coordinator channel owns its own
ZeroMQ context, whose ZAP handler admits allow-listed site keys only.

Identity is the key (issue 36). Under CURVE a site does not choose its routing id: its DEALER
sets none, the ROUTER gives each connection its own, and the coordinator's channel names every
connection by the site id whose public key authenticated it (ZAP's User-Id) and routes messages
for that site to the connection that last spoke with that key. A peer holding site-001's key is
site-001 whatever it calls itself: a message whose sender field names another site is refused
naming both, and nothing meant for another site can reach it (before, a peer that took the
routing id `site-002` first received site-002's messages and locked the real site out). In
plain mode (debugging only) there is no identity but the routing id the peer chose.

The coordinator's channel also watches its connections (ZeroMQ's socket monitor): a peer whose
connection closes (its process died, was killed, or crashed its sockets shut) or, on another
machine, whose kernel stops answering TCP keepalive probes is reported in `lost` at once, so
the coordinator need not wait for a deadline to learn it. The monitor reports descriptors, not peers: every message received
records the descriptor it came in on (ZMQ_SRCFD), which names the peer when that descriptor
closes. Only that closing (EVENT_DISCONNECTED) names a peer lost: libzmq reports it before it
closes the descriptor, so before any new connection can take the same number, and it is read
before the messages that follow it. A new connection's EVENT_ACCEPTED is no such mark: libzmq
emits it only after handing the connection to an I/O thread, so with two I/O threads that
connection's first messages can come first, and taking ACCEPTED on a named descriptor as the old
peer's end blamed the new peer (one honest site of 10,000, counted dropped at join; issue 40).
"""

from __future__ import annotations

import collections
import itertools
import os
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from protocol.wire import MAX_MESSAGE_BYTES, Envelope, WireError, decode, encode
from transport.ledger import message_wire_bytes
from transport.security import ClientKeys, ServerKeys, SiteAuthenticator, secure_client, secure_server

COORDINATOR_ID = "coordinator"


@dataclass(frozen=True)
class Incoming:
    peer: str  # at a ROUTER: the site id its key authenticated (CURVE) or its routing id (plain)
    nbytes: int  # size on the wire (ZMTP frames, see transport.ledger)
    envelope: Envelope | None = None
    reason: str | None = None  # set when the frames could not be accepted
    user_id: str | None = None  # the site id ZAP authenticated the connection as (CURVE only)


class _Channel:
    def __init__(self, socket: zmq.Socket, sender: str, max_bytes: int, curve: bool) -> None:
        self.socket, self.sender, self.max_bytes, self.curve = socket, sender, max_bytes, curve
        self._seq = itertools.count()
        self.poller = zmq.Poller()
        self.poller.register(socket, zmq.POLLIN)

    def _pack(self, mtype: str, session: int, payload: dict) -> bytes:
        return encode(Envelope(mtype, session, self.sender, next(self._seq), payload))

    def _poll(self, timeout_s: float) -> bool:
        return bool(self.poller.poll(max(0, int(timeout_s * 1000))))

    def _decode(self, peer: str, data: bytes, nbytes: int, user_id: str | None = None) -> Incoming:
        try:
            return Incoming(peer, nbytes, envelope=decode(data, max_bytes=self.max_bytes), user_id=user_id)
        except WireError as exc:
            return Incoming(peer, nbytes, reason=str(exc), user_id=user_id)

    def close(self) -> None:
        self.socket.close(linger=0)


#: A vanished peer whose connection never closed (a machine gone, a network cut) is found by TCP
#: keepalive: the kernels probe an idle connection after KEEPALIVE_IDLE_S, every
#: KEEPALIVE_INTERVAL_S, and give it up after KEEPALIVE_PROBES unanswered probes (2 minutes).
#: Not ZMTP heartbeats: those are answered by ZeroMQ's I/O threads, which a loaded machine can
#: starve. Not with few probes either: connections that went idle together are probed together,
#: and a burst of thousands of probes overflows the kernel's input queue (net.core.netdev_max_backlog)
#: so some are dropped; with 3 probes, 1,347 of 10,000 idle loopback connections to live peers
#: were aborted in 40 s, with 9 none (bench/keepalive_bursts.py). Only for peers on other
#: machines: a process on this one cannot vanish without its kernel closing its connections.
KEEPALIVE_IDLE_S = 30
KEEPALIVE_INTERVAL_S = 10
KEEPALIVE_PROBES = 9
#: Connections the kernel holds for ZeroMQ to accept (ZeroMQ's default is 100; thousands of sites
#: connect at once; the kernel caps it at net.core.somaxconn).
ACCEPT_BACKLOG = 4096
#: messages queued per peer before ZeroMQ stops reading from it (TCP backpressure): an honest
#: peer has at most a few in flight; a flooding one holds at most this many of MAX_MESSAGE_BYTES
RECEIVE_QUEUE = 16
#: I/O threads of a coordinator's (or shuffler's) secure context
IO_THREADS = 2


def is_loopback(endpoint: str) -> bool:
    """Whether every peer of a socket bound at `endpoint` runs on this machine: an ipc or inproc
    endpoint, or TCP on a loopback address (127.0.0.0/8, ::1, localhost)."""
    transport, _, address = endpoint.partition("://")
    if transport in ("ipc", "inproc"):
        return True
    host = address.rpartition(":")[0].strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


def listener_options(endpoint: str) -> dict[int, int]:
    """The socket options of a ROUTER bound at `endpoint`: the accept backlog, and TCP keepalive
    for peers on other machines only (see KEEPALIVE_PROBES)."""
    return {zmq.BACKLOG: ACCEPT_BACKLOG, zmq.TCP_KEEPALIVE: 0 if is_loopback(endpoint) else 1,
            zmq.TCP_KEEPALIVE_IDLE: KEEPALIVE_IDLE_S, zmq.TCP_KEEPALIVE_INTVL: KEEPALIVE_INTERVAL_S,
            zmq.TCP_KEEPALIVE_CNT: KEEPALIVE_PROBES}


@dataclass(frozen=True)
class Lost:
    peer: str
    reason: str


class RouterChannel(_Channel):
    def __init__(self, endpoint: str, *, keys: ServerKeys | None = None, context: zmq.Context | None = None,
                 max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.authenticator = None
        self._own_context = None
        if keys is not None:
            # two I/O threads: thousands of CURVE handshakes at once (four X25519 each, about 0.4 ms) use both cores
            context = self._own_context = zmq.Context(io_threads=IO_THREADS)
            self.authenticator = SiteAuthenticator(context, keys.sites)
            self.authenticator.start()
        context = context or zmq.Context.instance()
        socket = context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)  # what one peer can have queued here (issue 36)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished site raises, not drops
        socket.setsockopt(zmq.MAXMSGSIZE, max_bytes + 4096)
        for option, value in listener_options(endpoint).items():
            socket.setsockopt(option, value)
        if keys is not None:
            secure_server(socket, keys)
        self.monitor = _monitor(context, socket, zmq.EVENT_DISCONNECTED)
        socket.bind(endpoint)
        self.endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        super().__init__(socket, COORDINATOR_ID, max_bytes, curve=keys is not None)
        self.poller.register(self.monitor, zmq.POLLIN)
        self.lost: list[Lost] = []  # connections lost since the caller last emptied the list
        self._route: dict[str, bytes] = {}  # CURVE: site id -> routing id of its authenticated connection
        self._peer_of: dict[int, str] = {}  # descriptor -> the peer whose messages came in on it
        self._descriptor_of: dict[str, int] = {}
        self._gone: set[str] = set()  # peers reported lost that have not spoken since
        self._reports: collections.deque[Lost] = collections.deque()  # from report_lost (any thread)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self.poller.register(self._wake_read, zmq.POLLIN)

    def allow(self, public: bytes, site: str) -> None:
        """Admit `site` by the public key (Z85) its host made and sent (CURVE only)."""
        if self.authenticator is not None:
            self.authenticator.allow(public, site)

    def send(self, site: str, mtype: str, session: int, payload: dict) -> int | None:
        """The message's size on the wire, or None when the site is not connected."""
        return self.send_raw(site, [self._pack(mtype, session, payload)])

    def pack(self, mtype: str, session: int, payload: dict) -> bytes:
        return self._pack(mtype, session, payload)

    def send_raw(self, site: str, frames: list[bytes]) -> int | None:
        route = self._route.get(site) if self.curve else site.encode("utf-8")
        if route is None:
            return None  # under CURVE: no connection has authenticated as this site yet
        try:
            self.socket.send_multipart([route, *frames], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            return None
        return message_wire_bytes([len(f) for f in frames], self.curve)

    def receive(self, timeout_s: float) -> Incoming | None:
        """The next message, or None at the timeout or when only connection events came (they
        are in `lost`)."""
        if not self._poll(timeout_s):
            return None
        self._read_monitor()
        try:
            frames = self.socket.recv_multipart(copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            return None
        user_id = frames[1].get("User-Id") if self.curve and len(frames) > 1 else None
        if self.curve:  # named by the key that authenticated the connection, never by its own choice
            if not user_id:
                return Incoming("(unauthenticated)", 0, reason="a connection with no authenticated site id")
            peer = user_id
            self._route[peer] = frames[0].bytes
        else:
            peer = frames[0].bytes.decode("utf-8", errors="replace")
        self._remember(frames[-1].get(zmq.SRCFD), peer)
        nbytes = message_wire_bytes([len(f.bytes) for f in frames[1:]], self.curve)
        if len(frames) != 2:
            return Incoming(peer, nbytes, reason=f"expected one message frame, got {len(frames) - 1}",
                            user_id=user_id)
        return self._decode(peer, frames[1].bytes, nbytes, user_id)

    def report_lost(self, peers, reason: str) -> None:
        """Report `peers` as lost from another thread (a launcher that saw their process or
        machine die before, or without, their connections closing); a waiting `receive` wakes.
        A peer already reported lost, and not heard from since, is not reported twice."""
        for peer in peers:
            self._reports.append(Lost(peer, reason))
        os.write(self._wake_write, b"x")

    def _remember(self, fd: int, peer: str) -> None:
        self._gone.discard(peer)
        old = self._descriptor_of.get(peer)
        if old is not None and old != fd and self._peer_of.get(old) == peer:
            del self._peer_of[old]
        self._peer_of[fd], self._descriptor_of[peer] = peer, fd

    def _read_monitor(self) -> None:
        try:
            os.read(self._wake_read, 4096)
        except BlockingIOError:
            pass
        while self._reports:
            lost = self._reports.popleft()
            if lost.peer in self._gone:
                continue
            fd = self._descriptor_of.pop(lost.peer, None)
            if fd is not None:
                self._peer_of.pop(fd, None)  # its closing, when reported, then names no one
            self._gone.add(lost.peer)
            self.lost.append(lost)
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)
            if event["event"] != zmq.EVENT_DISCONNECTED:  # only a closing names anyone (module docstring)
                continue
            peer = self._peer_of.pop(event["value"], None)
            if peer is None:
                continue
            self._descriptor_of.pop(peer, None)
            self._gone.add(peer)
            self.lost.append(Lost(peer, "its connection closed (the process ended or was killed, or its "
                                        "machine stopped answering TCP keepalive probes)"))

    def close(self) -> None:
        self._read_monitor()
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        super().close()
        if self.authenticator is not None:
            self.authenticator.stop()
        if self._own_context is not None:
            self._own_context.term()
        os.close(self._wake_read)
        os.close(self._wake_write)


def _monitor(context: zmq.Context, socket: zmq.Socket, events: int) -> zmq.Socket:
    """The reading end of `socket`'s monitor, with no high-water mark: thousands of sites
    leaving at once must never fill it (a full monitor pipe blocks whoever emits the next event,
    pyzmq's get_monitor_socket leaves the default of 1,000)."""
    address = f"inproc://monitor.{id(socket):x}"
    socket.monitor(address, events)
    reader = context.socket(zmq.PAIR)
    reader.setsockopt(zmq.RCVHWM, 0)
    reader.setsockopt(zmq.LINGER, 0)
    reader.connect(address)
    return reader


class DealerChannel(_Channel):
    def __init__(self, endpoint: str, site_id: str, *, keys: ClientKeys | None = None,
                 context: zmq.Context | None = None, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        context = context or zmq.Context.instance()
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 1000)  # let a last answer leave before exit
        if keys is None:  # plain: the routing id is the only name; under CURVE the key is (above)
            socket.setsockopt(zmq.ROUTING_ID, site_id.encode("utf-8"))
        socket.setsockopt(zmq.MAXMSGSIZE, max_bytes + 4096)
        socket.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        if keys is not None:
            secure_client(socket, keys)
        socket.connect(endpoint)
        super().__init__(socket, site_id, max_bytes, curve=keys is not None)

    def send(self, mtype: str, session: int, payload: dict) -> None:
        self.send_raw([self._pack(mtype, session, payload)])

    def pack(self, mtype: str, session: int, payload: dict) -> bytes:
        return self._pack(mtype, session, payload)

    def send_raw(self, frames: list[bytes]) -> None:
        self.socket.send_multipart(frames)

    def receive(self, timeout_s: float) -> Incoming | None:
        if not self._poll(timeout_s):
            return None
        frames = self.socket.recv_multipart()
        nbytes = message_wire_bytes(len(f) for f in frames)
        if len(frames) != 1:
            return Incoming(COORDINATOR_ID, nbytes, reason=f"expected one frame, got {len(frames)}")
        return self._decode(COORDINATOR_ID, frames[0], nbytes)


def orphaned(parent_alive, last_heard: float, idle_timeout: float | None, heard_from: str = "") -> str | None:
    """Why a started process (site or shuffler) should exit while it waits: its launcher is gone,
    or nothing was heard for `idle_timeout` seconds; None to keep waiting."""
    if parent_alive is not None and not parent_alive():
        return "the launching process is gone; exiting"
    if idle_timeout is not None and time.monotonic() - last_heard > idle_timeout:
        return f"nothing heard{heard_from} for {idle_timeout:.0f} s; exiting"
    return None
