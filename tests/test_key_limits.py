"""Limits per key, not per connection (issue 48, point 5), over real sockets on 127.0.0.1.

Before: 400 connections on one valid key kept an honest site from being heard, and 4 of them
queued 537 MiB where the docs promised at most 128 MiB per peer. Now one key holds one live
connection at a RouterChannel (the coordinator's and the shuffler's): a second waits in its
handshake until the key is free, any more are refused (transport.channel.Connections).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import zmq

from coordinator.driver import Coordinator, Deadlines
from coordinator.events import EventLog
from protocol.wire import Envelope, encode
from transport.channel import RECEIVE_QUEUE, DealerChannel, RouterChannel, queue_bound
from transport.security import ClientKeys, ServerKeys, new_key_pair, secure_client

ROOT = Path(__file__).resolve().parents[1]


def keys(*sites):
    """A server key pair and one client pair per site: (ServerKeys, {site: ClientKeys})."""
    server_public, server_secret = new_key_pair()
    pairs = {site: new_key_pair() for site in sites}
    return (ServerKeys(server_public, server_secret, {public: site for site, (public, _) in pairs.items()}),
            {site: ClientKeys(server_public, public, secret) for site, (public, secret) in pairs.items()})


def dealer(context, endpoint, client: ClientKeys, linger_ms=0):
    socket_ = context.socket(zmq.DEALER)
    socket_.setsockopt(zmq.LINGER, linger_ms)
    secure_client(socket_, client)
    socket_.connect(endpoint)
    return socket_


def hello(sender, pid):
    return encode(Envelope("hello", 0, sender, 0, {"pid": pid}))


def established(port: int) -> int:
    """TCP connections in ESTABLISHED state whose local port is `port` (the server's ends)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                count += 1
    return count


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def next_message(channel: RouterChannel, timeout_s: float = 3.0):
    """The channel's next message (receive returns None on connection events too), or None."""
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        incoming = channel.receive(0.1)
        if incoming is not None:
            return incoming
    return None


def test_sixty_connections_on_one_key_give_one_live_connection_and_an_honest_site_is_heard():
    """(a) 60 connections with one valid key: the coordinator hears exactly one of them, holds
    at most two of their descriptors (the live one and one waiting in its handshake; 60 before),
    and an honest site that connects afterwards completes its hello and is answered."""
    server, clients = keys("site-000", "site-001")
    channel = RouterChannel("tcp://127.0.0.1:*", keys=server)
    coordinator = Coordinator(channel, EventLog(None), Deadlines(hello=5, join=5, respond=5))
    context = zmq.Context()
    flood = [dealer(context, channel.endpoint, clients["site-001"]) for _ in range(60)]
    honest = None
    try:
        for pid, socket_ in enumerate(flood):
            socket_.send(hello("site-001", pid), flags=zmq.NOBLOCK)
        heard, descriptors = set(), []
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            incoming = channel.receive(0.05)
            if incoming is not None and incoming.envelope is not None:
                heard.add((incoming.peer, incoming.envelope.payload["pid"]))
            descriptors.append(established(port_of(channel.endpoint)))
        assert len(heard) == 1 and next(iter(heard))[0] == "site-001", heard  # one connection speaks for the key
        settled = descriptors[len(descriptors) // 2:]  # once the first burst of handshakes is answered
        assert max(settled) <= 2, descriptors
        connections = channel.connections
        assert list(connections.live()) == ["site-001"]
        assert connections.waited["site-001"] + connections.refused["site-001"] == 59

        honest = DealerChannel(channel.endpoint, "site-000", keys=clients["site-000"], context=context)
        honest.send("hello", 0, {"pid": 1})
        began = time.monotonic()
        assert coordinator.await_members(["site-000"]) == ["site-000"]
        assert channel.send("site-000", "open", 0, {"trial": 0, "seed": 1}) is not None
        answer = honest.receive(3.0)
        assert answer is not None and answer.envelope.type == "open"
        assert time.monotonic() - began < 2.0
    finally:
        for socket_ in flood:
            socket_.close(0)
        if honest is not None:
            honest.close()
        channel.close()
        context.term()


SERVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    import zmq
    from transport.channel import RouterChannel
    from transport.security import ServerKeys

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024

    channel = RouterChannel("tcp://127.0.0.1:*", keys=ServerKeys({public!r}, {secret!r}, {{{client!r}: "site-x"}}),
                            max_bytes={max_bytes})
    time.sleep(0.2)
    base = rss_mib()
    print(channel.endpoint, flush=True)
    sys.stdin.readline()  # the flood is over: it never reads a message meanwhile
    print(rss_mib() - base, flush=True)
    channel.close()
""")


def test_a_key_queues_at_most_one_receive_queue_however_many_connections_it_floods_on():
    """(b) One key floods a coordinator that reads nothing, over 8 connections: what the
    coordinator's process holds grows by at most queue_bound (RECEIVE_QUEUE messages of at most
    max_bytes + 4 KiB), measured in a fresh process; per connection it was 8 times that."""
    max_bytes = 1 << 20
    server_public, server_secret = new_key_pair()
    public, secret = new_key_pair()
    script = SERVER.format(root=str(ROOT), public=server_public, secret=server_secret, client=public,
                           max_bytes=max_bytes)
    process = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, cwd=ROOT)
    context = zmq.Context()
    flood = []
    try:
        endpoint = process.stdout.readline().strip()
        client = ClientKeys(server_public, public, secret)
        flood = [dealer(context, endpoint, client) for _ in range(8)]
        for socket_ in flood:
            socket_.setsockopt(zmq.SNDHWM, 2)
        message, sent = b"\0" * max_bytes, 0
        until = time.monotonic() + 2.0
        while time.monotonic() < until:
            progressed = False
            for socket_ in flood:
                try:
                    socket_.send(message, flags=zmq.NOBLOCK)
                    sent, progressed = sent + 1, True
                except zmq.Again:
                    pass
            if not progressed:
                time.sleep(0.01)
        process.stdin.write("done\n")
        process.stdin.flush()
        grown = float(process.stdout.readline())
        assert sent > RECEIVE_QUEUE  # it did flood: more than one queue's worth left its sockets
        bound = queue_bound(max_bytes) / 2**20  # 16.06 MiB
        assert grown <= bound + 2.0, (grown, bound, sent)  # 2 MiB: the process's own noise
    finally:
        for socket_ in flood:
            socket_.close(0)
        context.term()
        process.kill()
        process.wait()


def test_a_key_connects_again_only_once_its_closed_connections_queue_is_read():
    """A key cannot stack queues by reconnecting: libzmq keeps a closed connection's messages
    readable, so the key's next connection waits in its handshake until they are all read;
    then it is admitted at once, and its hello comes after every message of the first."""
    server, clients = keys("site-x")
    channel = RouterChannel("tcp://127.0.0.1:*", keys=server)
    context = zmq.Context()
    first = DealerChannel(channel.endpoint, "site-x", keys=clients["site-x"], context=context)
    second = None
    try:
        first.send("hello", 0, {"pid": 0})
        incoming = next_message(channel)  # the presence, then the hello: the key's holder is named
        assert incoming is not None and incoming.envelope.payload["pid"] == 0
        for pid in range(1, 13):
            first.send("hello", 0, {"pid": pid})
        time.sleep(0.3)
        first.close()  # its 12 messages wait at the coordinator, unread
        time.sleep(0.3)
        second = DealerChannel(channel.endpoint, "site-x", keys=clients["site-x"], context=context)
        second.send("hello", 0, {"pid": 100})
        until = time.monotonic() + 0.8
        while time.monotonic() < until:  # the channel watches its connections, reading nothing
            channel.connections.drain()
            channel.tend()
            time.sleep(0.05)
        assert channel.connections.live() == {} and "site-x" in channel.connections.draining
        assert channel.connections.waited["site-x"] == 1  # the second connection waits in its handshake
        order = []
        until = time.monotonic() + 3.0
        while 100 not in order and time.monotonic() < until:
            incoming = channel.receive(0.1)
            if incoming is not None and incoming.envelope is not None:
                order.append(incoming.envelope.payload["pid"])
        assert order == [*range(1, 13), 100], order
        assert list(channel.connections.live()) == ["site-x"]
    finally:
        for end in (first, second):
            if end is not None:
                end.close()
        channel.close()
        context.term()


def test_a_connection_that_waits_longer_than_the_handshake_limit_redials_and_gets_in():
    """A second connection with a held key is never refused (a refused libzmq client never
    redials): its handshake waits, is let go unanswered before the handshake limit, libzmq closes
    it, its DEALER redials, and once the holder closes it is admitted and heard."""
    server, clients = keys("site-x")
    channel = RouterChannel("tcp://127.0.0.1:*", keys=server, handshake_s=0.5)
    context = zmq.Context()
    first = DealerChannel(channel.endpoint, "site-x", keys=clients["site-x"], context=context)
    second = None
    try:
        first.send("hello", 0, {"pid": 0})
        assert next_message(channel).envelope.payload["pid"] == 0
        second = DealerChannel(channel.endpoint, "site-x", keys=clients["site-x"], context=context)
        second.send("hello", 0, {"pid": 1})
        until = time.monotonic() + 2.0  # four handshake limits
        while time.monotonic() < until:
            assert channel.receive(0.1) is None
        assert channel.connections.waited["site-x"] >= 3 and channel.connections.refused["site-x"] == 0
        first.close()
        incoming = next_message(channel)
        assert incoming is not None and incoming.envelope.payload["pid"] == 1
    finally:
        for end in (first, second):
            if end is not None:
                end.close()
        channel.close()
        context.term()


def test_a_connection_whose_closing_is_read_before_its_first_message_frees_its_key():
    """The monitor can report a connection's closing before the channel reads the first
    message that names it (its presence): that message still frees the key (a closing read
    after the admission, on the descriptor it came in on, can only be its own), what it left is
    delivered, and the site's next connection is admitted."""
    server, clients = keys("site-x")
    channel = RouterChannel("tcp://127.0.0.1:*", keys=server)
    context = zmq.Context()
    first = DealerChannel(channel.endpoint, "site-x", keys=clients["site-x"], context=context)
    second = None
    try:
        first.send("hello", 0, {"pid": 0})
        time.sleep(0.3)
        first.close()
        until = time.monotonic() + 2.0
        while not channel.connections.closings and time.monotonic() < until:
            channel.connections.drain()  # the closing is read, nothing else
            time.sleep(0.02)
        assert channel.connections.closings and list(channel.connections.live()) == ["site-x"]
        incoming = next_message(channel)
        assert incoming is not None and incoming.envelope.payload["pid"] == 0  # delivered
        assert channel.connections.live() == {}
        second = DealerChannel(channel.endpoint, "site-x", keys=clients["site-x"], context=context)
        second.send("hello", 0, {"pid": 1})
        incoming = next_message(channel)
        assert incoming is not None and incoming.envelope.payload["pid"] == 1
        assert channel.send("site-x", "open", 0, {"trial": 0, "seed": 1}) is not None
        answer = second.receive(3.0)
        assert answer is not None and answer.envelope.type == "open"  # routed to the new connection
    finally:
        for end in (first, second):
            if end is not None:
                end.close()
        channel.close()
        context.term()


def test_a_site_that_restarts_gets_its_key_back_and_a_silent_holder_is_closed():
    """A site whose connection closed gets its key back as soon as the closing is read; a
    connection that completes its handshake and says nothing is closed `silent_s` later (it
    could hold its key, or one more descriptor, for ever) and its key comes free."""
    server, clients = keys("site-x", "site-y")
    channel = RouterChannel("tcp://127.0.0.1:*", keys=server, silent_s=0.6)
    context = zmq.Context()
    ends = []
    try:
        for pid in range(3):  # three lives of one site, each its own connection
            site = DealerChannel(channel.endpoint, "site-x", keys=clients["site-x"], context=context)
            ends.append(site)
            site.send("hello", 0, {"pid": pid})
            incoming = next_message(channel)
            assert incoming is not None and incoming.envelope.payload["pid"] == pid
            site.close()

        silent = dealer(context, channel.endpoint, clients["site-y"])  # a handshake, then nothing
        ends.append(silent)
        monitor = silent.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        events = []
        until = time.monotonic() + 4.0
        while zmq.EVENT_DISCONNECTED not in events and time.monotonic() < until:
            channel.receive(0.1)
            while monitor.poll(0):
                events.append(zmq.utils.monitor.recv_monitor_message(monitor)["event"])
        assert events[:2] == [zmq.EVENT_HANDSHAKE_SUCCEEDED, zmq.EVENT_DISCONNECTED], events
        assert channel.connections.closed_silent >= 1
        silent.disable_monitor()
        monitor.close(0)
        silent.close(0)
        again = DealerChannel(channel.endpoint, "site-y", keys=clients["site-y"], context=context)
        ends.append(again)
        again.send("hello", 0, {"pid": 7})
        incoming = next_message(channel)
        assert incoming is not None and incoming.peer == "site-y"
    finally:
        for end in ends:
            end.close() if isinstance(end, DealerChannel) else end.close(0)
        channel.close()
        context.term()


def test_connections_that_never_complete_a_handshake_are_closed_after_the_handshake_limit():
    """Plain TCP connections with no key at all are bounded in time, not in number: libzmq
    closes each one `handshake_s` after it was accepted (ZMQ_HANDSHAKE_IVL); an honest site is
    heard meanwhile."""
    server, clients = keys("site-000")
    channel = RouterChannel("tcp://127.0.0.1:*", keys=server, handshake_s=1.0, silent_s=60.0)
    context = zmq.Context()
    raw = [socket.create_connection(("127.0.0.1", port_of(channel.endpoint))) for _ in range(40)]
    honest = DealerChannel(channel.endpoint, "site-000", keys=clients["site-000"], context=context)
    try:
        honest.send("hello", 0, {"pid": 1})
        incoming = next_message(channel)
        assert incoming is not None and incoming.peer == "site-000"
        began = time.monotonic()
        for connection in raw:
            connection.settimeout(5.0)
            try:
                while connection.recv(4096):  # the server's greeting, then its end of the connection
                    pass
            except ConnectionResetError:
                pass
        assert time.monotonic() - began < 3.0
        assert established(port_of(channel.endpoint)) == 1  # the honest site's alone
    finally:
        for connection in raw:
            connection.close()
        honest.close()
        channel.close()
        context.term()


def test_the_shuffler_holds_one_connection_per_key_too():
    """The shuffler's socket for the sites is a RouterChannel too: 30 connections on one site's
    key hold at most 2 of its descriptors, and another site's handshake succeeds at once."""
    import threading

    from shuffler.driver import serve

    server, clients = keys("site-000", "site-001")
    coordinator = RouterChannel("tcp://127.0.0.1:*")  # plain: the shuffler's upstream here
    bound: list[str] = []
    shuffler = threading.Thread(target=serve, args=("tcp://127.0.0.1:*", coordinator.endpoint),
                                kwargs={"on_bound": bound.append, "server_keys": server}, daemon=True)
    shuffler.start()
    context = zmq.Context()
    flood, honest = [], None
    try:
        hello_from_shuffler = next_message(coordinator)
        assert hello_from_shuffler is not None and hello_from_shuffler.envelope.type == "hello" and bound
        endpoint = bound[0]
        flood = [dealer(context, endpoint, clients["site-001"]) for _ in range(30)]
        descriptors, until = [], time.monotonic() + 1.5
        while time.monotonic() < until:
            descriptors.append(established(port_of(endpoint)))
            time.sleep(0.05)
        assert max(descriptors[len(descriptors) // 2:]) <= 2, descriptors
        honest = dealer(context, endpoint, clients["site-000"])
        monitor = honest.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        assert monitor.poll(2000), "the honest site's handshake did not succeed"
        honest.disable_monitor()
        monitor.close(0)
    finally:
        for socket_ in [*flood, *([honest] if honest is not None else [])]:
            socket_.close(0)
        coordinator.send("shuffler", "shutdown", 0, {})
        shuffler.join(timeout=5)
        coordinator.close()
        context.term()
