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

from protocol.phases import SequenceGuard
from protocol.shuffle import ShuffleBatch
from protocol.wire import COORDINATOR_TO_SHUFFLER, SHUFFLER_ID, SITE_TO_SHUFFLER
from transport.channel import RouterChannel, DealerChannel, orphaned
from transport.emulation import Held, LinkEmulator
from transport.security import ClientKeys, ServerKeys

log = logging.getLogger("quorum.shuffler")
FORGET_AFTER = 10_000  # forwarded (session, phase) pairs remembered to call late messages late


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
    open_batches: dict[tuple[int, str], tuple[ShuffleBatch, float]] = {}
    forwarded: list[tuple[int, str]] = []
    site_guard, coordinator_guard = SequenceGuard(), SequenceGuard()
    held = Held()  # sealed messages on their way over their senders' uplinks (a scenario's network)
    last_heard = time.monotonic()
    try:
        while True:
            due = min((deadline for _, deadline in open_batches.values()), default=time.monotonic() + 1.0)
            due = min(due, held.next_due() or due)
            ready = dict(poller.poll(max(0, int(1000 * min(1.0, due - time.monotonic())))))
            if upstream.socket in ready:
                last_heard = time.monotonic()
                incoming = upstream.receive(0)
                envelope = incoming.envelope if incoming else None
                reason = incoming.reason if incoming else "nothing received"
                if envelope is not None and envelope.type not in COORDINATOR_TO_SHUFFLER:
                    reason = f"message type {envelope.type!r} is not sent to the shuffler"
                if envelope is not None and reason is None:
                    reason = coordinator_guard.check(envelope)
                if reason:
                    log.warning("refused a coordinator message: %s", reason)
                elif envelope.type == "shutdown":
                    log.info("shutdown received")
                    return 0
                elif envelope.type == "batch_lost":
                    opened = open_batches.get((envelope.session, envelope.payload["phase"]))
                    for site, why in envelope.payload["sites"].items():
                        if opened is not None and isinstance(site, str):
                            opened[0].lose(site, f"connection lost: {why}")
                    log.info("session %d, phase %s: %d sites' connections lost (the coordinator says)",
                             envelope.session, envelope.payload["phase"], len(envelope.payload["sites"]))
                else:
                    p = envelope.payload
                    key = (envelope.session, p["phase"])
                    expected = frozenset(s for s in p["expected"] if isinstance(s, str))
                    open_batches[key] = (ShuffleBatch(envelope.session, p["phase"], expected, int(p["minimum"])),
                                         time.monotonic() + float(p["deadline"]))
                    upstream.send("batch_ready", envelope.session, {"phase": p["phase"]})
                    log.info("batch open: session %d, phase %s, %d sites, at least %d messages, %.1f s",
                             envelope.session, p["phase"], len(expected), int(p["minimum"]), float(p["deadline"]))
            if sites.socket in ready:
                incoming = sites.receive(0)
                sites.lost.clear()  # the coordinator tells which sites it lost (batch_lost)
                arrival = time.monotonic() if incoming is None or links is None else \
                    links.arrival(incoming.peer, "up", incoming.nbytes, time.monotonic())
                if arrival is None:
                    log.info("a message of %d bytes from %s was lost on its link", incoming.nbytes, incoming.peer)
                elif arrival > time.monotonic():
                    held.put(arrival, incoming)
                else:
                    _offer(incoming, open_batches, forwarded, site_guard)
            while (released := held.pop_due(time.monotonic())) is not None:
                _offer(released, open_batches, forwarded, site_guard)
            sites.tend()  # one key, one connection: frees keys whose connection closed or stayed silent
            now = time.monotonic()
            for key, (batch, deadline) in list(open_batches.items()):
                if batch.complete or now >= deadline:
                    payload = batch.forward()
                    upstream.send("batch", batch.session, payload)
                    del open_batches[key]
                    forwarded.append(key)
                    del forwarded[:-FORGET_AFTER]
                    log.info("batch forwarded: session %d, phase %s, %d of %d sealed messages%s%s", key[0], key[1],
                             len(payload["senders"]), len(batch.expected),
                             "" if batch.complete else " (deadline passed)",
                             f"; ciphertexts {payload['withheld']}" if payload["withheld"] else "")
            if not ready:
                reason = orphaned(parent_alive, last_heard, idle_timeout, " from the coordinator")
                if reason:
                    log.warning(reason)
                    return 1
    finally:
        sites.close()
        upstream.close()


def _offer(incoming, open_batches, forwarded, guard: SequenceGuard) -> None:
    if incoming is None:
        return
    envelope, reason = incoming.envelope, incoming.reason
    if envelope is not None and reason is None:
        key = (envelope.session, envelope.payload.get("phase"))
        if envelope.type not in SITE_TO_SHUFFLER:
            reason = f"message type {envelope.type!r} is not sent to the shuffler"
        elif envelope.sender != incoming.peer:
            reason = (f"connection authenticated as {incoming.peer!r} (by its key) sent as {envelope.sender!r}"
                      if incoming.user_id else
                      f"sender field says {envelope.sender!r} but the message came from {incoming.peer!r}")
        elif sites_curve_mismatch(incoming):
            reason = f"connection authenticated as {incoming.user_id!r} sent as {incoming.peer!r}"
        elif key in forwarded:  # checked before the sequence: a late message is refused as late
            reason = f"late: the batch of session {key[0]}, phase {key[1]} was already forwarded"
        else:
            reason = guard.check(envelope)
        if reason is None:
            if key in open_batches:
                reason = open_batches[key][0].offer(envelope.sender, key[1], envelope.payload["ciphertext"],
                                                    incoming.nbytes, envelope.payload["claim"])
            else:
                reason = f"no batch is open for session {key[0]}, phase {key[1]}"
    if reason:
        log.warning("refused a message of %d bytes from %s: %s", incoming.nbytes, incoming.peer, reason)
    else:
        log.info("sealed message of %d bytes from %s (session %d)", incoming.nbytes, envelope.sender,
                 envelope.session)


def sites_curve_mismatch(incoming) -> bool:
    return incoming.user_id is not None and incoming.user_id != incoming.peer
