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

Limits per key, not per connection (issue 48): under CURVE one key holds at most one live
connection at a secure channel (the coordinator's, the shuffler's), so what ZeroMQ bounds per
connection (RECEIVE_QUEUE messages of at most MAXMSGSIZE, one descriptor) is bounded per key.
While a key is busy, the next connection with it waits in its handshake and any more are refused
(the ZAP handler answers 400, libzmq closes them), however many the key opens; a key is busy
until its connection closed and what it left is read. `Connections` says why waiting rather
than replacing or refusing, and how a connection is matched to its key.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import socket as sockets
import threading
import time
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from protocol.wire import MAX_MESSAGE_BYTES, Envelope, WireError, decode, encode
from transport.base import CONNECTION_CLOSED, Incoming, Lost, Transport
from transport.ledger import message_wire_bytes
from transport.security import (ADMISSION, DEFER_S, ClientKeys, ServerKeys, SiteAuthenticator, secure_client,
                                secure_server)

log = logging.getLogger("quorum.channel")

COORDINATOR_ID = "coordinator"


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
#: messages queued per connection before ZeroMQ stops reading from it (TCP backpressure), and so
#: per key under CURVE (one live connection per key): an honest peer has at most a few in flight;
#: a flooding one holds at most this many of at most MAXMSGSIZE (MAX_MESSAGE_BYTES + 4 KiB) each,
#: 16 x (8 MiB + 4 KiB) = 128.06 MiB (queue_bound; measured 128.5 MiB of RSS, issue 48)
RECEIVE_QUEUE = 16
#: what one message may be on the wire beyond MAX_MESSAGE_BYTES (framing), ZeroMQ's MAXMSGSIZE
MESSAGE_SLACK = 4096
#: I/O threads of a coordinator's (or shuffler's) secure context
IO_THREADS = 2
#: a connection that has not completed its ZMTP/CURVE handshake this long after it was accepted is
#: closed by libzmq (ZMQ_HANDSHAKE_IVL, libzmq's own default made explicit): what bounds a
#: connection that never authenticates (a plain TCP flood holds a descriptor at most this long)
HANDSHAKE_S = 30.0
#: under CURVE, a connection that has carried no message this long after its ACCEPTED was read
#: is closed by the channel, and a key whose holder said nothing this long after its admission is
#: free again (Connections); an honest DealerChannel speaks at once (its presence frame)
SILENT_S = 30.0


def queue_bound(max_bytes: int = MAX_MESSAGE_BYTES) -> int:
    """The most bytes one key (one connection) can have queued at a RouterChannel: RECEIVE_QUEUE
    messages of at most max_bytes + MESSAGE_SLACK (ZeroMQ's MAXMSGSIZE) each."""
    return RECEIVE_QUEUE * (max_bytes + MESSAGE_SLACK)


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


@dataclass
class Holder:
    """The connection that holds a key: admitted by the ZAP handler, named by its first message."""
    site: str
    serial: int  # the admission's number, carried by every message of the connection (ADMISSION)
    position: int  # monitor events read when it was admitted (Connections.position)
    admitted: float  # time.monotonic() at its admission
    fd: int | None = None  # its descriptor, once a message of its came in on it (ZMQ_SRCFD)


@dataclass
class Draining:
    """A key whose connection closed while messages of it may still wait to be read."""
    serial: int  # the closed connection's admission
    since: float  # time.monotonic() when its closing was read
    last_read: int  # Connections.reads when it closed or a message it left was last read


#: serial numbers of released holders kept to tell a connection's leftover messages (delivered)
#: from a holder that outlived its release (refused, its connection closed)
RELEASED_KEPT = 65536
#: a key whose connection closed is free once the ROUTER was seen with nothing to read this long
#: after the closing was read (libzmq reports the closing just before it flushes the
#: connection's last messages into its queue)
SETTLE_S = 0.05


class Connections:
    """One key, one live connection (issue 48): who holds each key at a RouterChannel, from its
    socket monitor, which whichever thread needs it now reads under one lock (the channel before
    it reads a message, the ZAP handler before it admits a key).

    The second connection waits, the third is refused. While a live connection holds a key, the
    ZAP handler holds back its answer to the next handshake with that key
    (transport.security.SiteAuthenticator): that connection waits in its handshake, nothing of
    it is read, and it is admitted the moment the key is free; one that waits DEFER_S is let go
    unanswered, libzmq ends its handshake (HANDSHAKE_S) and its peer redials. Any further
    connection with the key while one waits is refused (ZAP 400: libzmq closes it, and a libzmq
    client never redials after that). Not replaced: a ROUTER cannot close one of its connections
    (ROUTER_HANDOVER hands over client-chosen routing ids, the issue-36 hole), and replacing
    would let any holder of the key push the live one off in a loop. Not refused outright either:
    a refused DEALER gives up for good, so a site that restarts before its old connection's
    closing is read would never get back in. This is the rule "identity is the key" carried to
    connections: the key, not a name or who dialled first among its holders, says who a peer is,
    and the key's first live connection speaks for it until it closes. A machine that vanished
    without closing holds its key until TCP keepalive gives the connection up (KEEPALIVE_*).

    A key is free once its connection closed and every message it left is read: libzmq keeps a
    closed connection's messages readable, so a key that could redial at once could stack one
    receive queue per connection while the channel reads slowly. Every message carries its
    connection's admission serial, and the ROUTER reads its queues in turn (fair queuing), so a
    closed connection's queue is empty once the channel has read more messages than the ROUTER
    has queues (live descriptors and closed connections not yet done) since it last read one of
    that connection's, or once the ROUTER had nothing to read SETTLE_S after the closing (its
    routing id cannot tell: ROUTER_MANDATORY says EHOSTUNREACH for a closing queue with messages
    in it). So one key has at most one receive queue (queue_bound), one live descriptor and one
    more waiting in its handshake.

    A connection is matched to its key by its first message. The ZAP handler sees a key, never
    a descriptor (its request names the peer's IP address only), and the monitor sees
    descriptors, never keys; a message carries both (ZMQ_SRCFD and the admission's serial in ZAP
    metadata). A holder is released when its descriptor's EVENT_DISCONNECTED is read, or, if
    that closing was read before its first message, when that message comes (a closing read
    after the admission, on the descriptor the message came in on, can only be its own). A holder
    that never speaks cannot be matched: it is released `silent_s` after its admission, and
    `tend` closes every connection that has carried nothing `silent_s` after its EVENT_ACCEPTED
    was read (shutdown(2) on a duplicate of the descriptor, after checking by inode and local
    address that it is still that connection of this listener; libzmq then sees the peer go),
    so a released silent holder cannot linger and a key cannot collect silent connections. An
    honest DealerChannel speaks at once (its presence frame, which the channel swallows). A
    holder released for silence that speaks later has its message refused and its connection
    closed.
    """

    def __init__(self, monitor: zmq.Socket, keyed: bool, silent_s: float = SILENT_S) -> None:
        self.monitor: zmq.Socket | None = monitor
        self.keyed, self.silent_s = keyed, silent_s
        self.lock = threading.Lock()
        self.position = 0  # monitor events read so far
        self.closings: collections.deque[int] = collections.deque()  # DISCONNECTED descriptors, for `lost`
        self.holders: dict[str, Holder] = {}
        self.draining: dict[str, Draining] = {}
        self.holder_on: dict[int, Holder] = {}  # descriptor -> the holder whose messages came in on it
        self.accepted: dict[int, tuple[int, float]] = {}  # descriptor -> (socket inode, when ACCEPTED was read)
        self.closed_at: dict[int, int] = {}  # descriptor -> position of its last EVENT_DISCONNECTED
        self.released: collections.OrderedDict[int, tuple[bool, int]] = collections.OrderedDict()
        self.waited: collections.Counter[str] = collections.Counter()  # handshakes held back: key busy
        self.refused: collections.Counter[str] = collections.Counter()  # handshakes refused: one waits already
        self.closed_silent = 0  # connections tend closed
        self.reads = 0  # messages the channel has read
        self.address: tuple[str, object] | None = None  # the listener's (transport, port or path)
        self.on_free = None  # called (any thread) when a key becomes free: the ZAP handler's wake-up
        self._serials = itertools.count(1)

    def listening(self, endpoint: str) -> None:
        """The bound endpoint (tcp://host:port or ipc://path), whose connections alone tend closes."""
        transport, _, address = endpoint.partition("://")
        self.address = ("tcp", int(address.rpartition(":")[2])) if transport == "tcp" else \
            ("ipc", address) if transport == "ipc" else None

    def drain(self) -> int:
        """Read every monitor event waiting; the number read so far."""
        with self.lock:
            return self._drain()

    def _drain(self) -> int:
        monitor = self.monitor
        if monitor is None:
            return self.position
        while monitor.poll(0):
            event = recv_monitor_message(monitor)
            self.position += 1
            kind, fd = event["event"], event["value"]
            if kind == zmq.EVENT_DISCONNECTED:
                self.closings.append(fd)
                self.closed_at[fd] = self.position
                self.accepted.pop(fd, None)
                holder = self.holder_on.pop(fd, None)
                if holder is not None:
                    self._release(holder, expired=False)
            elif kind == zmq.EVENT_ACCEPTED and self.keyed:
                try:  # the inode tells this connection from a later one on the same number
                    self.accepted[fd] = (os.fstat(fd).st_ino, time.monotonic())
                except OSError:  # closed already (its ACCEPTED came late)
                    self.accepted.pop(fd, None)
        return self.position

    def admit(self, site: str) -> int | None:
        """(ZAP handler) The serial number of `site`'s new connection, or None while the key is
        busy: held by a live connection, or its closed one's messages not all read."""
        with self.lock:
            self._drain()
            if site in self.holders or site in self.draining:
                return None
            holder = Holder(site, next(self._serials), self.position, time.monotonic())
            self.holders[site] = holder
            return holder.serial

    def cancel(self, site: str, serial: int) -> None:
        """(ZAP handler) The admission `serial` never reached its connection (gone meanwhile)."""
        with self.lock:
            holder = self.holders.get(site)
            if holder is not None and holder.serial == serial and holder.fd is None:
                del self.holders[site]
        self._freed()

    def heard(self, site: str, serial: int | None, fd: int) -> tuple[bool, str | None]:
        """A message authenticated as `site`, of the admission `serial`, came in on `fd`:
        whether it came on the key's live connection (the channel routes to that one), and a
        reason to refuse it (None to deliver it)."""
        with self.lock:
            self.reads += 1
            draining = self.draining.get(site)
            if draining is not None and draining.serial == serial:
                draining.last_read = self.reads  # its queue is not empty yet
            holder = self.holders.get(site)
            if holder is not None and holder.serial == serial:
                if holder.fd is None:
                    if self.closed_at.get(fd, -1) > holder.position:  # closed since its admission
                        self._release(holder, expired=False)  # (its closing was read first)
                        return False, None
                    holder.fd, self.holder_on[fd] = fd, holder
                return True, None
            released = self.released.get(serial) if serial is not None else None
            if released is not None and released[0]:
                self._close(fd, since=released[1])
                return False, (f"a connection authenticated as {site!r} that said nothing for {self.silent_s:.0f} s "
                               f"after its handshake lost the key and was closed")
            return False, None  # what a closed connection left behind

    def settle(self, empty: bool) -> None:
        """Free the keys whose closed connection left nothing to read: the channel read more
        messages than the ROUTER has queues since it read the last one of that connection's, or
        the ROUTER had nothing to read (`empty`) SETTLE_S after the closing was read."""
        if not self.draining:
            return
        now, freed = time.monotonic(), False
        with self.lock:
            queues = len(self.accepted) + len(self.draining) + 1  # (+1: the ROUTER reads one ahead)
            for site, draining in list(self.draining.items()):
                if (empty and now - draining.since >= SETTLE_S) or self.reads - draining.last_read > queues:
                    del self.draining[site]
                    freed = True
        if freed:
            self._freed()

    def tend(self) -> None:
        """Release keys whose holder said nothing `silent_s` after its admission, and close every
        connection that has carried nothing `silent_s` after its ACCEPTED was read (the caller
        makes sure no message waits to be read: it could be the one that names a connection)."""
        now = time.monotonic()
        with self.lock:
            self._drain()
            for holder in [h for h in self.holders.values() if h.fd is None and now - h.admitted > self.silent_s]:
                self._release(holder, expired=True)
            for fd, (inode, seen) in list(self.accepted.items()):
                if now - seen > self.silent_s and fd not in self.holder_on:
                    del self.accepted[fd]
                    self._close(fd, inode=inode)

    def live(self) -> dict[str, int | None]:
        """Each held key's site and its descriptor (None until its first message)."""
        with self.lock:
            return {site: holder.fd for site, holder in self.holders.items()}

    def _freed(self) -> None:
        if self.on_free is not None:
            self.on_free()

    def _release(self, holder: Holder, expired: bool) -> None:
        if self.holders.get(holder.site) is holder:
            del self.holders[holder.site]
            self.draining[holder.site] = Draining(holder.serial, time.monotonic(), self.reads)
        if holder.fd is not None and self.holder_on.get(holder.fd) is holder:
            del self.holder_on[holder.fd]
        self.released[holder.serial] = (expired, holder.position)
        while len(self.released) > RELEASED_KEPT:
            self.released.popitem(last=False)

    def _close(self, fd: int, inode: int | None = None, since: int | None = None) -> bool:
        """Shut down the connection on `fd` if it is still the one meant: the socket of inode
        `inode`, or one that has not closed since monitor position `since`; and one this
        listener accepted. libzmq then reads its end and closes it (EVENT_DISCONNECTED)."""
        try:
            duplicate = os.dup(fd)  # pins the socket: what is checked below is what is shut down
        except OSError:
            return False
        try:
            connection = sockets.socket(fileno=duplicate)
        except OSError:
            os.close(duplicate)
            return False
        try:
            if since is not None:
                self._drain()  # a closing before the dup is read now
                if self.closed_at.get(fd, -1) > since:
                    return False
            if inode is not None and os.fstat(connection.fileno()).st_ino != inode:
                return False
            if not self._accepted_here(connection):
                return False
            connection.shutdown(sockets.SHUT_RDWR)
            self.closed_silent += 1
            return True
        except OSError:
            return False
        finally:
            connection.close()  # the duplicate only

    def _accepted_here(self, connection: sockets.socket) -> bool:
        if self.address is None:
            return False
        kind, where = self.address
        local = connection.getsockname()
        if kind == "tcp":
            return connection.family in (sockets.AF_INET, sockets.AF_INET6) and local[1] == where
        return connection.family == sockets.AF_UNIX and local == where


class RouterChannel(_Channel, Transport):
    def __init__(self, endpoint: str, *, keys: ServerKeys | None = None, context: zmq.Context | None = None,
                 max_bytes: int = MAX_MESSAGE_BYTES, silent_s: float = SILENT_S,
                 handshake_s: float = HANDSHAKE_S) -> None:
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
        # what one connection, and so under CURVE one key, can have queued here (issues 36, 48: queue_bound)
        socket.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a vanished site raises, not drops
        socket.setsockopt(zmq.MAXMSGSIZE, max_bytes + MESSAGE_SLACK)
        socket.setsockopt(zmq.HANDSHAKE_IVL, int(handshake_s * 1000))
        for option, value in listener_options(endpoint).items():
            socket.setsockopt(option, value)
        if keys is not None:
            secure_server(socket, keys)
        # under CURVE the accepted descriptors too: a connection that never speaks is closed (Connections)
        events = zmq.EVENT_DISCONNECTED | (zmq.EVENT_ACCEPTED if keys is not None else 0)
        self.monitor = _monitor(context, socket, events)
        self.connections = Connections(self.monitor, keyed=keys is not None, silent_s=silent_s)
        if self.authenticator is not None:  # before bind: every handshake is counted
            self.authenticator.connections = self.connections
            self.authenticator.defer_s = min(DEFER_S, 0.8 * handshake_s)  # ends before libzmq ends the handshake
            self.connections.on_free = self.authenticator.wake
        socket.bind(endpoint)
        self.endpoint = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.connections.listening(self.endpoint)
        super().__init__(socket, COORDINATOR_ID, max_bytes, curve=keys is not None)
        self.poller.register(self.monitor, zmq.POLLIN)
        self._tend_every = min(1.0, silent_s / 4)
        self._next_tend = time.monotonic() + self._tend_every
        self._next_settle = 0.0
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
        are in `lost`). Under CURVE a DealerChannel's presence frame is read and not returned;
        while a key waits for its closed connection's queue to be read, it returns within
        SETTLE_S to look again (a handshake may be waiting for that key)."""
        if self.curve and self.connections.draining:
            timeout_s = min(timeout_s, SETTLE_S)
        if not self._poll(timeout_s):
            self._settle(empty=True)
            self.tend()
            return None
        while True:
            self._read_monitor()
            try:
                frames = self.socket.recv_multipart(copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                self._settle(empty=True)
                self.tend()
                return None
            incoming = self._incoming(frames)
            if incoming is not None:
                return incoming

    def _incoming(self, frames: list[zmq.Frame]) -> Incoming | None:
        user_id = frames[1].get("User-Id") if self.curve and len(frames) > 1 else None
        nbytes = message_wire_bytes([len(f.bytes) for f in frames[1:]], self.curve)
        if self.curve:  # named by the key that authenticated the connection, never by its own choice
            if not user_id:
                return Incoming("(unauthenticated)", 0, reason="a connection with no authenticated site id")
            peer = user_id
            fd = frames[-1].get(zmq.SRCFD)
            current, refusal = self.connections.heard(peer, _admission(frames[1]), fd)
            if current:  # the key's live connection (not what a closed one left behind)
                self._route[peer] = frames[0].bytes
                self._remember(fd, peer)
            if refusal is not None:
                return Incoming(peer, nbytes, reason=refusal, user_id=user_id)
            if len(frames) == 2 and len(frames[1].bytes) == 0:
                return None  # presence: DealerChannel's first frame, naming its connection at once
        else:
            peer = frames[0].bytes.decode("utf-8", errors="replace")
            self._remember(frames[-1].get(zmq.SRCFD), peer)
        if len(frames) != 2:
            return Incoming(peer, nbytes, reason=f"expected one message frame, got {len(frames) - 1}",
                            user_id=user_id)
        return self._decode(peer, frames[1].bytes, nbytes, user_id)

    def tend(self) -> None:
        """Under CURVE: free the keys whose closed connection left nothing to read, and, at most
        every second and only while no message waits to be read, the keys whose holder never
        spoke, closing connections that stayed silent (Connections.tend). `receive` calls it when
        it finds nothing; a loop that reads the socket only when it polls ready (the shuffler's)
        calls it itself."""
        if not self.curve:
            return
        empty = not self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN
        self._settle(empty)
        if not empty or time.monotonic() < self._next_tend:
            return
        self._next_tend = time.monotonic() + self._tend_every
        self.connections.tend()

    def _settle(self, empty: bool) -> None:
        """Free the keys whose closed connection left nothing to read (Connections.settle): when
        the ROUTER is empty, else at most every SETTLE_S (thousands may close at once)."""
        if not self.curve or not self.connections.draining:
            return
        now = time.monotonic()
        if not empty and now < self._next_settle:
            return
        self._next_settle = now + SETTLE_S
        self.connections.settle(empty)

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
        self.connections.drain()  # the ZAP handler may have read some already: they wait in `closings`
        self._settle(empty=False)
        closings = self.connections.closings
        while closings:  # only a closing names anyone (module docstring)
            peer = self._peer_of.pop(closings.popleft(), None)
            if peer is None:
                continue
            self._descriptor_of.pop(peer, None)
            self._gone.add(peer)
            self.lost.append(Lost(peer, CONNECTION_CLOSED))

    def close(self) -> None:
        self._read_monitor()
        with self.connections.lock:
            self.connections.monitor = None  # the ZAP handler reads it no more
        self.socket.disable_monitor()
        self.monitor.close(linger=0)
        super().close()
        if self.authenticator is not None:
            self.authenticator.stop()
        if self._own_context is not None:
            self._own_context.term()
        os.close(self._wake_read)
        os.close(self._wake_write)


def _admission(frame: zmq.Frame) -> int | None:
    """The admission serial the ZAP handler gave the frame's connection (None without one)."""
    try:
        return int(frame.get(ADMISSION))
    except (zmq.ZMQError, ValueError, TypeError):
        return None


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
        socket.setsockopt(zmq.MAXMSGSIZE, max_bytes + MESSAGE_SLACK)
        socket.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        if keys is not None:
            secure_client(socket, keys)
        socket.connect(endpoint)
        if keys is not None:  # presence: names this connection at the ROUTER at once (Connections), an
            socket.send(b"", flags=zmq.NOBLOCK)  # empty frame the RouterChannel reads and drops
        super().__init__(socket, site_id, max_bytes, curve=keys is not None)
        self.endpoint, self.dropped = endpoint, 0  # messages send_raw could not queue

    def send(self, mtype: str, session: int, payload: dict) -> None:
        self.send_raw([self._pack(mtype, session, payload)])

    def pack(self, mtype: str, session: int, payload: dict) -> bytes:
        return self._pack(mtype, session, payload)

    def send_raw(self, frames: list[bytes]) -> None:
        """Queue a message for the peer, never blocking: a message no connection can take is
        dropped and counted (`dropped`). A DEALER with no live connection blocks on send, and a
        peer that refused this site's key at the handshake is never redialled by libzmq, so one
        site the shuffler does not admit used to hang its whole host, its host-mates' answers
        queued behind its send (a fresh-clone run of tests/test_shuffler_party.py caught it)."""
        try:
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            log.warning("%s: a message of %d bytes dropped: no connection to %s takes it (refused at the "
                        "handshake, or its queue is full)", self.sender, sum(map(len, frames)), self.endpoint)

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


#: how long forged senders keep their connections, for a handshake the server would accept and the message
FORGED_WAIT_S = 1.0


def send_as_strangers(endpoint: str, server_key: bytes | None, mtype: str, session: int,
                      payloads: dict[str, dict], wait_s: float = FORGED_WAIT_S) -> None:
    """Dial `endpoint` once per name of `payloads`, each under a fresh CURVE key pair (plain when
    `server_key` is None), send its message and hang up: peers nobody admitted (the sybil
    attack's senders, coordinator.adversary), to show what the server makes of them."""
    channels = []
    for name, payload in payloads.items():
        keys = None if server_key is None else ClientKeys(server_key, *zmq.curve_keypair())
        channel = DealerChannel(endpoint, name, keys=keys, context=zmq.Context.instance())
        channel.send(mtype, session, payload)
        channels.append(channel)
    time.sleep(wait_s)
    for channel in channels:
        channel.socket.setsockopt(zmq.LINGER, 0)
        channel.close()


def zeromq_socket_limit() -> int:
    """The most sockets one ZeroMQ context of this libzmq can hold (ZMQ_SOCKET_LIMIT)."""
    return zmq.Context.instance().get(zmq.SOCKET_LIMIT)
