"""The shuffler process: between the sites and the coordinator, holding ciphertexts only.

A ROUTER where sites connect (one DEALER each, their routing id their site id; CURVE with an
allow-list of site keys when the run has keys) and a DEALER to the coordinator, routing id
`shuffler`. The coordinator opens a batch (`batch_open`: phase, expected sites, deadline in
seconds, minimum number of messages) and the shuffler answers `batch_ready` once it holds the
batch (`batch_lost` later names expected sites whose connection the coordinator saw close: the
batch stops waiting for them); only then does the coordinator ask the sites, so a sealed message can never arrive before
its batch. Sites send `sealed` messages; the batch (protocol.shuffle.ShuffleBatch) is forwarded
as one `batch` message when complete or at its deadline (without its ciphertexts when fewer than
the minimum arrived), and closed: a sealed message for a forwarded batch is refused as late. Every refusal is logged with its reason; the log names
senders, sessions and byte counts, never a ciphertext's content. The process has no key that
opens a ciphertext: the session keys live in the coordinator's codec. Under a scenario's network
(transport.emulation) a sealed message is held until its sender's uplink delivers it.
"""

from __future__ import annotations

import logging
import os
import time

import zmq

from protocol.wire import SHUFFLER_ID
from shuffler.core import ShufflerCore
from transport.channel import RouterChannel, DealerChannel, orphaned
from transport.emulation import Held, LinkEmulator
from transport.security import ClientKeys, ServerKeys

log = logging.getLogger("quorum.shuffler")


def serve(bind: str, coordinator_endpoint: str, *, on_bound=None, server_keys: ServerKeys | None = None,
          client_keys: ClientKeys | None = None, parent_alive=None, idle_timeout: float | None = None,
          links: LinkEmulator | None = None) -> int:
    """Serve until the coordinator says shutdown. on_bound(endpoint) is called once the sites'
    socket is bound (the launcher passes the endpoint on to the sites)."""
    sites = RouterChannel(bind, keys=server_keys)
    upstream = DealerChannel(coordinator_endpoint, SHUFFLER_ID, keys=client_keys)
    if on_bound is not None:
        on_bound(sites.endpoint)
    upstream.send("hello", 0, {"pid": os.getpid()})
    log.info("shuffler (pid %d): sites connect to %s; forwarding to %s", os.getpid(), sites.endpoint,
             coordinator_endpoint)
    poller = zmq.Poller()
    poller.register(sites.socket, zmq.POLLIN)
    poller.register(upstream.socket, zmq.POLLIN)
    core = ShufflerCore()
    held = Held()  # sealed messages on their way over their senders' uplinks (a scenario's network)
    last_heard = time.monotonic()

    def flush_log() -> None:
        for line in core.log:
            (log.warning if line.startswith("refused") else log.info)("%s", line)
        core.log.clear()

    try:
        while True:
            due = core.next_due() or time.monotonic() + 1.0
            due = min(due, held.next_due() or due)
            ready = dict(poller.poll(max(0, int(1000 * min(1.0, due - time.monotonic())))))
            if upstream.socket in ready:
                last_heard = time.monotonic()
                incoming = upstream.receive(0)
                status, replies = core.from_coordinator(incoming.envelope if incoming else None,
                                                        incoming.reason if incoming else "nothing received",
                                                        time.monotonic())
                for mtype, session, payload in replies:
                    upstream.send(mtype, session, payload)
                flush_log()
                if status == "shutdown":
                    log.info("shutdown received")
                    return 0
            if sites.socket in ready:
                incoming = sites.receive(0)
                sites.lost.clear()  # the coordinator tells which sites it lost (batch_lost)
                arrival = time.monotonic() if incoming is None or links is None else \
                    links.arrival(incoming.peer, "up", incoming.nbytes, time.monotonic())
                if arrival is None:
                    log.info("a message of %d bytes from %s was lost on its link", incoming.nbytes, incoming.peer)
                elif arrival > time.monotonic():
                    held.put(arrival, incoming)
                elif incoming is not None:
                    core.from_site(incoming)
            while (released := held.pop_due(time.monotonic())) is not None:
                core.from_site(released)
            sites.tend()  # one key, one connection: frees keys whose connection closed or stayed silent
            for mtype, session, payload in core.due(time.monotonic()):
                upstream.send(mtype, session, payload)
            flush_log()
            if not ready:
                reason = orphaned(parent_alive, last_heard, idle_timeout, " from the coordinator")
                if reason:
                    log.warning(reason)
                    return 1
    finally:
        sites.close()
        upstream.close()
