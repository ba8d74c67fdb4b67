"""The coordinator's driver: one pump over a transport and a clock.

Sessions decide (protocol.engine, protocol.exchange): what each phase sends, what each envelope
that arrives is (taken, or refused with the reason), who dropped out and why, when a deadline
passed, and the events that say so. This pump only moves their messages over a `Transport`
(transport.base: the ZeroMQ ROUTER channel, or the in-memory transport of the in-process backend)
by a `Clock` (transport.clock: real, or a virtual network time), and around them keeps what is
the coordinator's own: membership (hellos), the run-level checks of every envelope (sender, type,
sequence), the communication ledger (every message sent or received, with its wire size),
scripted faults on its side (messages to sites dropped, delayed, duplicated, held back or
corrupted; the coordinator killed when a phase begins; transport.faults), a scenario's links
(transport.emulation: what is sent leaves when its link delivers it, what arrives is held until
its link would have delivered it) and the scripted attacks of coordinator.adversary. Both
backends run this same pump, so they write the same events.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterable

from coordinator.events import EventLog
from coordinator.attacked import AttackedSession
from protocol.engine import JoinSession, Session, WireSession
from protocol.exchange import PhaseExchange, SessionEvent
from protocol.methods import Method, Outcome
from protocol.noise import coordinator_rng
from protocol.membership import Membership
from protocol.sessions import method_session
from protocol.wire import SHUFFLER_ID, Envelope
from stats.randomness import site_rng
from transport.base import Incoming, Transport
from transport.channel import COORDINATOR_ID
from transport.clock import Clock, RealClock
from transport.emulation import LinkEmulator, SocketLinks
from transport.faults import FaultInjector, kill_self
from transport.ledger import Ledger, handshake_bytes
from transport.outbox import Outbox

#: forge({sender: sealed payload}, session): the sybil attack's senders, who reach the shuffler as
#: sites do (the backend's own way: fresh CURVE keys over sockets, or in memory)
Forge = Callable[[dict[str, dict], int], None]


#: `rejected` events logged per peer before the rest are only counted
MAX_REJECTED_LOGGED = 1000


@dataclass(frozen=True)
class Deadlines:
    hello: float = 60.0  # seconds for every site process to announce itself
    join: float = 120.0  # seconds for sites to load and score their data when a trial opens
    respond: float = 30.0  # seconds for each method phase


class Coordinator:
    def __init__(self, transport: Transport, events: EventLog, deadlines: Deadlines,
                 ledger: Ledger | None = None, faults: FaultInjector | None = None, adversary=None,
                 seeded_noise: bool = False, max_n: int = 10**8, links: LinkEmulator | None = None,
                 clock: Clock | None = None, forge: Forge | None = None) -> None:
        self.transport, self.events, self.deadlines = transport, events, deadlines
        self.channel = transport  # the name the federations and tests read
        self.clock = clock if clock is not None else RealClock()
        self.adversary = adversary  # coordinator.adversary.Adversary: scripted attacks on the sites
        self.forge = forge  # how the sybil attack's forged senders reach the shuffler
        self.seeded_noise = seeded_noise  # the sites' policy says `noise: seeded` (protocol.noise)
        self.max_n = max_n  # the largest n_j a site may announce at join (runtime.max_n)
        self.ledger = ledger if ledger is not None else Ledger()
        self.ledger.wall_clock = lambda: self.clock.wall(self.clock.now())
        if self.clock.virtual:  # the log's times are the network's too
            events.wall_clock = self.ledger.wall_clock
        self.faults = faults
        #: the scenario's network (transport.emulation): each site's link, applied at this socket
        self.links = None
        if links is not None and links.network.emulated:
            links.started = self.clock.now()  # the network's trace starts with this pump's clock
            self.links = SocketLinks(links, self.clock.now, self._lost_on_link)
        self.outbox = Outbox(lambda site, data: transport.send_raw(site, [data]), faults, self._sent,
                             link=(lambda peer, data, due: self.links.downlink(peer, data, due, transport.curve))
                             if self.links is not None else None, now=self.clock.now)
        self.membership = Membership()  # who said hello; the run-level checks of every envelope
        self.seed = 0
        self.devices: dict[str, str] = {}
        self.rejections: dict[str, int] = {}  # peer -> messages refused from it (events capped: _rejected)
        self.disconnected: dict[str, str] = {}  # site -> why its connection was lost (until it speaks again)
        self._newly_lost: list[str] = []
        #: (trial, label, transcript) of every session, when a test asks for them (None: not kept)
        self.transcripts: list | None = None

    # -- run level ---------------------------------------------------------------------------

    def await_members(self, expected: Iterable[str], shuffler: bool = False) -> list[str]:
        """The hello phase: wait until every expected site (and the shuffler, if the run has
        one) announced itself, or the deadline."""
        expected = set(expected)
        waiting = expected - set(self.members)  # kept as hellos come: O(1) a message, not O(sites)
        deadline = self.clock.now() + self.deadlines.hello
        while (waiting or (shuffler and self.shuffler_pid is None)) and self.clock.now() < deadline:
            envelope, row = self._receive(deadline)
            if row is not None and row["type"] == "hello" and row["accepted"]:
                waiting.discard(row["site"])
            if envelope is not None:
                row["accepted"] = 0
                self._reject_envelope(envelope, f"{envelope.type!r} before the run started")
        for site in sorted(expected - set(self.members)):
            self.events.write("dropout", site=site, phase="hello",
                              reason=f"no hello within {self.deadlines.hello:g} s")
        if shuffler and self.shuffler_pid is None:
            self.events.write("dropout", site=SHUFFLER_ID, phase="hello",
                              reason=f"the shuffler sent no hello within {self.deadlines.hello:g} s")
        self.ledger.flush()
        return sorted(set(self.members) & expected)

    def open_trial(self, trial: int, seed: int, sites: Iterable[str]) -> tuple[dict[str, int], dict[str, str]]:
        """The join, a session of its own (protocol.engine.JoinSession): sites load and score
        their trial data and answer with n_j."""
        join = JoinSession(trial, seed, sites, self.max_n)
        self.seed = seed
        self.ledger.context = {"trial": trial, "session": join.session, "method": "", "codec": "", "phase": "join"}
        self._maybe_die(trial, "join", join.session)
        began = self.clock.now()
        exchange = join.exchange(self.deadlines.join, began)
        self._pump(exchange, trial)
        self.ledger.flush()
        sizes, dropped, self.devices = join.finish(exchange, seconds=self.clock.now() - began)
        self._write(join.take_events())
        return sizes, dropped

    def shutdown(self) -> None:
        flooded = {peer: count for peer, count in sorted(self.rejections.items()) if count > MAX_REJECTED_LOGGED}
        if flooded:
            self.events.write("rejected_total", peers=flooded)
        self.ledger.context = {"trial": "", "session": "", "method": "", "codec": "", "phase": "shutdown"}
        for site in sorted(self.members) + ([SHUFFLER_ID] if self.shuffler_pid is not None else []):
            nbytes = self.transport.send_raw(site, [self.transport.pack("shutdown", 0, {})])
            if nbytes is not None:
                self.ledger.record(site=site, direction="down", mtype="shutdown", nbytes=nbytes)
        self.ledger.flush()

    def _write(self, events: Iterable[SessionEvent]) -> None:
        """The one writer of what sessions decided, in the order they decided it."""
        for event in events:
            self.events.write(event.name, **event.fields)

    def _sent(self, site: str, mtype: str, nbytes: int, handed: float) -> None:
        """What actually left (after any scripted fault and the site's link), into the ledger: when
        it was handed to the link (`sent`) and when the link delivered it (`arrived`, now)."""
        self.ledger.record(site=site, direction="down", mtype=mtype, nbytes=nbytes, sent=self.clock.wall(handed),
                           link=self._link_name(site, handed))

    def _lost_on_link(self, site: str, direction: str) -> None:
        self.events.write("lost", site=site, direction=direction, phase=self.ledger.context.get("phase"),
                          trial=self.ledger.context.get("trial"))

    def _link_name(self, site: str, at: float) -> str:
        return self.links.link_name(site, at) if self.links is not None else ""

    @property
    def members(self) -> dict[str, int]:
        return self.membership.members

    @property
    def shuffler_pid(self) -> int | None:
        return self.membership.shuffler_pid

    def _maybe_die(self, trial, phase, session) -> None:
        rule = self.faults.kill_coordinator(trial, phase, session) if self.faults is not None else None
        if rule is not None:
            self.events.write("fault", rule=rule.index, action="kill_coordinator", trial=trial, phase=phase)
            self.ledger.flush()
            kill_self()

    def _log_faults(self) -> None:
        if self.faults is None:
            return
        for rule, where in self.faults.fired:
            self.events.write("fault", rule=rule.index, action=rule.action, direction="down", **where)
        self.faults.fired.clear()

    # -- method sessions ---------------------------------------------------------------------

    def run_method(self, trial: int, index: int, method: Method, sizes: dict[str, int],
                   label: str | None = None) -> Outcome:
        """One session of `method`, run by the session engine (protocol.engine): this pump only
        moves its exchanges' messages, keeps their deadlines, meters and logs. A scripted attack
        (coordinator.attacked) wraps the session; the pump is the same."""
        session_id = method_session(trial, index)
        label = label or method.name
        session = Session(method, sizes, coordinator_rng(site_rng(self.seed, trial, session_id, COORDINATOR_ID),
                                                         self.seeded_noise), keep_transcript=self.transcripts is not None)
        wire = WireSession(session, session_id)
        rule = self.adversary.rule_for(trial, label) if self.adversary is not None else None
        if rule is not None:
            wire = AttackedSession(wire, self.adversary, rule, trial, label, method, sizes)
        with cycle_collection_paused():
            wire.begin(trial, label)
            self._write(wire.take_events())
            while (exchange := wire.next_exchange(self.deadlines.respond, self.clock.now(),
                                                  shuffler=self.shuffler_pid is not None)) is not None:
                self.ledger.context = {"trial": trial, "session": session_id, "method": label,
                                       "codec": exchange.codec or method.codec, "phase": exchange.phase}
                if not exchange.extra:
                    self._maybe_die(trial, exchange.phase, session_id)
                rows = self._pump(exchange, trial)
                wire.finished(exchange)
                self._write(wire.take_events())
                if exchange.decoded is not None:
                    for site in exchange.decoded.undecodable:
                        answer_row(rows, site)["accepted"] = 0
                    for site, bits in exchange.decoded.info_bits.items():
                        row = answer_row(rows, site)
                        row["info_bits"] = row.get("info_bits", 0) + bits
                # the phase's rows are final: to disk now; its messages are freed before the half
                # works out the next phase (at 10,000 sites, tens of MB while it builds as much again)
                self.ledger.flush()
                exchange = rows = None
            outcome = wire.outcome
        if self.transcripts is not None:
            self.transcripts.append((trial, label, session.transcript))
        self.ledger.flush()
        wire.close()
        self._write(wire.take_events())
        return outcome

    # -- the pump ----------------------------------------------------------------------------

    def _pump(self, exchange: PhaseExchange, trial) -> dict[str, dict]:
        """Move one phase's messages until the exchange says it is done: send what it gives, hand
        it what arrives (a refusal is a `rejected` event), the sites whose connection closed, and
        the clock's time. Returns the ledger row of each accepted answer (the batch's under
        SHUFFLER_ID), for the caller to complete (information bits, or a body the codec refused).
        An exchange's `forged` senders (the sybil attack) are sent once the shuffler holds the batch."""
        rows: dict[str, dict] = {}
        forged = exchange.forged
        while True:
            self._send(exchange, trial)
            if forged and exchange.stage == "asking" and not exchange.done:
                if self.forge is not None:  # the sybil attack's senders reach the shuffler as sites do
                    self.forge(forged, exchange.session)
                exchange.release(list(forged), "a forged sender gave up")  # the batch need not wait for them
                forged = {}
                continue
            if exchange.done:
                break
            envelope, row = self._receive(exchange.wake_at)
            for site in self._take_lost():
                exchange.lose(site, f"connection lost: {self.disconnected[site]}")
            if envelope is not None:
                reason = exchange.receive(envelope, self.clock.now())
                if reason:
                    row["accepted"] = 0
                    self._reject_envelope(envelope, reason)
                elif envelope.type == "batch":
                    rows[SHUFFLER_ID] = row  # the batch's information bits go here
                elif envelope.sender != SHUFFLER_ID:
                    rows[envelope.sender] = row
            exchange.tick(self.clock.now())
        self._send(exchange, trial)
        if exchange.batch is not None:
            for site, size in exchange.batch["received"].items():
                self.ledger.record(site=site, direction="up", mtype="sealed", nbytes=int(size))
        return rows

    def _send(self, exchange: PhaseExchange, trial) -> None:
        for out in exchange.take():
            if self.links is not None and self.links.offline(out.peer):  # the network: not online when asked
                exchange.not_sent(out.peer, "offline")
                continue
            data = self.transport.pack(out.mtype, exchange.session, out.payload)
            sent = self.outbox.send(data, out.mtype, peer=out.peer, trial=trial, phase=exchange.phase,
                                    session=exchange.session)
            if not sent and out.peer != SHUFFLER_ID:
                exchange.not_sent(out.peer, "not connected")
        self._log_faults()

    def _receive(self, deadline: float) -> tuple[Envelope | None, dict | None]:
        """Next acceptable envelope before `deadline` and its ledger row; hellos are absorbed
        into membership. Every message received is in the ledger, accepted or not."""
        self.outbox.flush()
        held = self.links.held.pop_due(self.clock.now()) if self.links is not None else None
        if held is not None:
            incoming, received = held
        else:
            incoming, received = self._arriving(deadline), self.clock.now()
            if incoming is None:
                return None, None
        self.disconnected.pop(incoming.peer, None)
        reason = incoming.reason or self.membership.check(incoming.peer, incoming.envelope, self.transport.curve)
        mtype = incoming.envelope.type if incoming.envelope is not None else "malformed"
        row = self.ledger.record(site=incoming.peer, direction="up", mtype=mtype, nbytes=incoming.nbytes,
                                 accepted=reason is None, sent=self.clock.wall(received),
                                 link=self._link_name(incoming.peer, received))
        if reason:
            self._rejected(incoming.peer, peer=incoming.peer, bytes=incoming.nbytes, reason=reason)
            return None, row
        if incoming.envelope.type != "hello":
            return incoming.envelope, row
        row.update(phase="hello", method="", codec="", trial="", session="")
        new, event = self.membership.hello(incoming.envelope)
        if new and incoming.peer != SHUFFLER_ID:
            self._record_handshake(incoming.peer)
        self._write([event])
        return None, row

    def _arriving(self, deadline: float) -> Incoming | None:
        """What the transport receives before `deadline` (or a held message falls due) that has
        arrived: a site's message is held until its link delivers it (transport.emulation)."""
        now = self.clock.now()
        wait = self.outbox.timeout(max(0.0, deadline - now))
        if self.links is not None and self.links.held.next_due() is not None:
            wait = max(0.0, min(wait, self.links.held.next_due() - now))
        incoming = self.transport.receive(timeout_s=wait)
        self.outbox.flush()
        for lost in self.transport.lost:
            self.disconnected[lost.peer] = lost.reason
            self._newly_lost.append(lost.peer)
            self.events.write("connection_lost", site=lost.peer, reason=lost.reason,
                              trial=self.ledger.context.get("trial"), phase=self.ledger.context.get("phase"))
        self.transport.lost.clear()
        return incoming if self.links is None else self.links.uplink(incoming)

    def _take_lost(self) -> list[str]:
        """Sites whose connection closed since the last call (and that have not spoken since)."""
        lost, self._newly_lost = [s for s in self._newly_lost if s in self.disconnected], []
        return lost

    def _record_handshake(self, site: str) -> None:
        """Connection setup (greeting and handshake), once per site (see transport.ledger)."""
        tags = {"phase": "connect", "method": "", "codec": "", "trial": "", "session": ""}
        curve = self.transport.curve
        # under CURVE a site's DEALER sets no routing id (the key names it: transport.channel)
        self.ledger.record(site=site, direction="up", mtype="handshake",
                           nbytes=handshake_bytes(curve, "DEALER", b"" if curve else site.encode(), client=True),
                           **tags)
        self.ledger.record(site=site, direction="down", mtype="handshake",
                           nbytes=handshake_bytes(curve, "ROUTER", b"", client=False), **tags)

    def _reject_envelope(self, envelope: Envelope, reason: str) -> None:
        self._rejected(envelope.sender, site=envelope.sender, session=envelope.session, type=envelope.type,
                       reason=reason)

    def _rejected(self, who: str, /, **fields) -> None:
        """A `rejected` event, up to MAX_REJECTED_LOGGED per peer; after that one event says the rest
        are counted, not logged (a peer flooding the coordinator with messages it refuses does not
        fill its disk; the ledger still meters every one of them), and the count is in the
        `rejected_total` event the run ends with (`shutdown`)."""
        count = self.rejections[who] = self.rejections.get(who, 0) + 1
        if count <= MAX_REJECTED_LOGGED:
            self.events.write("rejected", **fields)
        elif count == MAX_REJECTED_LOGGED + 1:
            self.events.write("rejected_suppressed", peer=who, logged=MAX_REJECTED_LOGGED,
                              reason=f"more than {MAX_REJECTED_LOGGED} messages refused from this peer: the rest "
                                     f"are counted (rejected_total), not logged one by one")


@contextmanager
def cycle_collection_paused():
    """No cyclic garbage collection while a session runs. A session at 10,000 sites allocates
    millions of short-lived objects (messages, shares, ledger rows), and CPython's full
    collections, triggered each time the heap grew by a quarter, rescanned every object of the
    run: six of them cost 3-4 s of a 10,000-site secure sum. The session's objects hold no
    reference cycles that matter (freed by reference counting as each phase ends); whatever
    cycles there are wait for the next collection after the session."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def answer_row(rows: dict[str, dict], site: str) -> dict:
    """The ledger row of a site's accepted answer in a phase (`_phase`'s rows); answers that came
    through the shuffler share the batch's row."""
    return rows.get(site) or rows.setdefault(SHUFFLER_ID, {})
