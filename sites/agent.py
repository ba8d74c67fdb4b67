"""One site inside a site host: the generic site driver, for one site.

A site agent is a site in every way the protocol can see: its own routing identity, its own
CurveZMQ key pair and ZeroMQ connection (a DEALER to the coordinator, and one to the shuffler
when the run has one), its own sequence guard, privacy account, RNG streams (derived from its
id), scripted faults and log lines (logger `quorum.site.SITE_ID`). What it shares with the
other agents of its host is the process: the event loop (sites.host) and the trial's model
and rows (sites.trials.TrialCache).

It validates every message (envelope, direction, sequence), answers `open` with `join` and a
`request` with a `response`, replies `error` with the reason to any request it cannot serve,
and finishes on `shutdown`. A bad message is logged and dropped; it never ends the agent.

Scripted faults (transport.faults) act here and nowhere else on the site side: before
answering, the injector may make the agent crash (its sockets close at once and it never
answers again; the host decides whether that ends the process), kill its whole host, stay
silent, or answer late; everything sent goes through an Outbox that may drop, duplicate, hold
back or corrupt it.
"""

from __future__ import annotations

import logging
import os

import zmq

from protocol.phases import SequenceGuard
from protocol.wire import COORDINATOR_TO_SITE
from sites.local import SiteLocal
from sites.reply import SHUFFLER, site_replies, where
from sites.storage import GroupCommit
from sites.trials import TrialCache
from transport.channel import DealerChannel
from transport.faults import FaultInjector, kill_self
from transport.outbox import Outbox
from transport.security import ClientKeys

_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)  # plain ints: the enum's `&` costs 1.3 us a check


class SiteAgent:
    def __init__(self, site_id: str, endpoint: str, workdir, trials: TrialCache, *, context: zmq.Context,
                 keys: ClientKeys | None = None, faults: FaultInjector | None = None, shuffler: str | None = None,
                 shuffler_keys: ClientKeys | None = None, budget: dict | None = None, policy: dict | None = None,
                 on_crash=None, commit: GroupCommit | None = None, identity=None) -> None:
        """commit: the host's group commit (a reply waits for the account records it follows to be
        made durable by the host's next flush); None: each record is fsync'ed before its reply."""
        self.site_id, self.faults, self.on_crash, self.commit = site_id, faults, on_crash, commit
        self.log = logging.getLogger(f"quorum.site.{site_id}")
        self.channel = DealerChannel(endpoint, site_id, keys=keys, context=context)
        self.local = SiteLocal(site_id, workdir, budget=budget, trials=trials, policy=policy, commit=self.commit,
                               identity=identity)
        self.outbox = Outbox(lambda peer, data: self.channel.send_raw([data]) or 0, faults)
        self.to_shuffler = None
        if shuffler is not None:
            shuffle_channel = DealerChannel(shuffler, site_id, keys=shuffler_keys, context=context)
            self.to_shuffler = (shuffle_channel,
                                Outbox(lambda peer, data: shuffle_channel.send_raw([data]) or 0, faults))
        self.guard = SequenceGuard()
        self.running = True  # False once shut down or crashed
        self.log.info("%s (pid %d) connecting to %s%s", site_id, os.getpid(), endpoint, " with CURVE" if keys else "")

    @property
    def fd(self) -> int:
        """The descriptor that signals this agent's socket (edge-triggered: see sites.host)."""
        return self.channel.socket.getsockopt(zmq.FD)

    def hello(self) -> None:
        self.outbox.send(self.channel.pack("hello", 0, {"pid": os.getpid()}), "hello", phase="hello")

    def drain(self) -> int:
        """Handle every message waiting on the socket; the number handled. ZeroMQ's descriptor
        only signals a change, so this reads until the socket says nothing is left (the replies
        sent meanwhile are checked too)."""
        handled = 0
        while self.running and self.channel.socket.getsockopt(_EVENTS) & _POLLIN:
            incoming = self.channel.receive(timeout_s=0)
            if incoming is None:
                break
            handled += 1
            self._on_incoming(incoming)
        return handled

    def next_due(self) -> float | None:
        """When a delayed or held-back message of this agent must leave (None: nothing waits)."""
        outboxes = [self.outbox] + ([self.to_shuffler[1]] if self.to_shuffler else [])
        return min((t for t in (o.next_due() for o in outboxes) if t is not None), default=None)

    def flush(self) -> None:
        self.outbox.flush()
        if self.to_shuffler is not None:
            self.to_shuffler[1].flush()
        self._log_faults()

    def close(self, linger_ms: int | None = None) -> None:
        """Close the agent's sockets; `linger_ms=0` drops whatever has not left (a crash)."""
        self.running = False
        channels = [self.channel] + ([self.to_shuffler[0]] if self.to_shuffler else [])
        for channel in channels:
            if linger_ms is not None:
                channel.socket.setsockopt(zmq.LINGER, linger_ms)
            channel.close()

    def _on_incoming(self, incoming) -> None:
        envelope, reason = incoming.envelope, incoming.reason
        if envelope is not None and envelope.type not in COORDINATOR_TO_SITE:
            reason = f"message type {envelope.type!r} is not sent by the coordinator"
        if envelope is not None and reason is None:
            reason = self.guard.check(envelope)
        if reason:
            self.log.warning("rejected a message of %d bytes: %s", incoming.nbytes, reason)
            return
        if envelope.type == "shutdown":
            self.log.info("shutdown received")
            if self.commit is not None:
                self.commit.flush()  # answers waiting for their accounts leave first
            self.flush()
            self.close()
            return
        self._handle(envelope)
        self._log_faults()

    def _handle(self, envelope) -> None:
        session = envelope.session
        trial, phase, _ = where(envelope) if envelope.type != "close" else (None, None, None)
        delay = 0.0
        behaviour = self.faults.behaviour(trial, phase, session) if (
            self.faults is not None and envelope.type != "close") else None
        if behaviour is not None:
            action, seconds = behaviour
            self.log.warning("scripted fault: %s in trial %s, phase %s", action, trial, phase)
            if action == "kill_host":
                logging.shutdown()
                kill_self()
            if action == "crash":
                self._crash()
                return
            if action == "straggle":
                return
            delay = seconds
        for to, mtype, body in site_replies(self.local, envelope, self.to_shuffler is not None, self.log):
            channel, outbox = self.to_shuffler if to == SHUFFLER else (self.channel, self.outbox)
            message = channel.pack(mtype, session, body)

            def send(message=message, mtype=mtype, outbox=outbox):
                if self.running:
                    outbox.send(message, mtype, trial=trial, phase=phase, session=session, delay=delay)
                return self

            # nothing leaves before the account records it follows are durable (the host's group commit)
            if self.commit is None:
                send()
            else:
                self.commit.after(send)

    def _crash(self) -> None:
        """End this agent as a crash would: nothing more leaves, its connections drop now."""
        if self.on_crash is not None:
            self.on_crash(self)  # a host serving this agent alone dies with it (a real crash)
        self.close(linger_ms=0)
        self.local.trials.forget(self.site_id)
        self.log.warning("crashed (scripted): connections closed, this site answers nothing more")

    def _log_faults(self) -> None:
        if self.faults is None:
            return
        for rule, where in self.faults.fired:
            self.log.warning("scripted fault %d (%s) applied: %s", rule.index, rule.action, where)
        self.faults.fired.clear()
