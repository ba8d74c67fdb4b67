"""The coordinator process's driver: membership, trial joins and method sessions over ZeroMQ.

Generic: it runs whatever phases a method's coordinator half asks for, sends each site its
request, accepts answers through the phase table (protocol.phases) until every site answered
or the phase deadline passed, decodes bodies with the method's codec, and hands the answers
back. Sites that miss a deadline, refuse, or send an undecodable body are dropouts for that
session; so is a site whose connection closes (the channel's socket monitor says so at once,
e.g. its process was killed), without waiting for the deadline. Every refusal and dropout is written to the event log with its reason, and every message
sent or received, with its wire size, to the communication ledger (transport.ledger). Scripted
faults on the coordinator's side (messages to sites dropped, delayed, duplicated, held back or
corrupted; the coordinator killed when a phase begins) are applied here, by transport.faults.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import zmq

from coordinator.events import EventLog
from protocol.codecs import PayloadError
from protocol.engine import Requests, Session, batch_answers, join_problem
from protocol.inert import MAX_NAME_CHARS, inert
from protocol.methods import Method, Outcome
from protocol.noise import coordinator_rng
from protocol.phases import PhaseCollector, SequenceGuard, phase_spec
from protocol.sessions import SESSIONS_PER_TRIAL, join_session, method_session
from protocol.wire import SHUFFLER_ID, SHUFFLER_TO_COORDINATOR, SITE_TO_COORDINATOR, Envelope
from stats.randomness import site_rng
from transport.channel import COORDINATOR_ID, DealerChannel, RouterChannel, Incoming
from transport.emulation import Held, LinkEmulator
from transport.faults import FaultInjector, kill_self
from transport.ledger import Ledger, handshake_bytes, message_wire_bytes
from transport.outbox import Outbox
from transport.security import ClientKeys


BATCH_GRACE = 5.0  # seconds the coordinator waits for the shuffler's batch beyond the phase deadline
FORGED_WAIT_S = 1.0  # the sybil attack: how long its forged senders keep their connections to the shuffler


@dataclass(frozen=True)
class Deadlines:
    hello: float = 60.0  # seconds for every site process to announce itself
    join: float = 120.0  # seconds for sites to load and score their data when a trial opens
    respond: float = 30.0  # seconds for each method phase


class Coordinator:
    def __init__(self, channel: RouterChannel, events: EventLog, deadlines: Deadlines,
                 ledger: Ledger | None = None, faults: FaultInjector | None = None, adversary=None,
                 seeded_noise: bool = False, max_n: int = 10**8, links: LinkEmulator | None = None) -> None:
        self.channel, self.events, self.deadlines = channel, events, deadlines
        self.adversary = adversary  # coordinator.adversary.Adversary: scripted attacks on the sites
        self.seeded_noise = seeded_noise  # the sites' policy says `noise: seeded` (protocol.noise)
        self.max_n = max_n  # the largest n_j a site may announce at join (runtime.max_n)
        self.ledger = ledger if ledger is not None else Ledger()
        self.faults = faults
        #: the scenario's network (transport.emulation): each site's link, applied at this socket
        self.links = links if links is not None and links.network.emulated else None
        self._held = Held()  # what sites sent, held until their link delivers it: (incoming, when received)
        self.outbox = Outbox(lambda site, data: channel.send_raw(site, [data]), faults, self._sent,
                             link=self._downlink if self.links is not None else None)
        self.members: dict[str, int] = {}  # site id -> pid it reported
        self.shuffler_pid: int | None = None  # set when the shuffler process said hello
        #: where the sites dial the shuffler and its public key (None: plain), for the sybil attack
        self.shuffler_dial: tuple[str, bytes | None] | None = None
        self._batch: Envelope | None = None
        self.guard = SequenceGuard()
        self.seed = 0
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
        deadline = time.monotonic() + self.deadlines.hello
        while (waiting or (shuffler and self.shuffler_pid is None)) and time.monotonic() < deadline:
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
        """The join phase: sites load and score their trial data and answer with n_j."""
        session = join_session(trial)
        self.seed = seed
        self.ledger.context = {"trial": trial, "session": session, "method": "", "codec": "", "phase": "join"}
        self._maybe_die(trial, "join", session)
        sends = {site: ("open", {"trial": trial, "seed": seed}) for site in sites}
        began = time.monotonic()
        answers, dropped, _ = self._phase(session, "join", sends, self.deadlines.join, trial=trial)
        seconds = time.monotonic() - began
        self.ledger.flush()
        sizes = {}
        # shown in events, summary.json and the terminal: a short name on the wire, inert here too
        self.devices = {site: inert(payload["device"], MAX_NAME_CHARS) for site, payload in answers.items()}
        for site, payload in sorted(answers.items()):
            problem = join_problem(payload["n"], self.max_n)
            if problem:
                dropped[site] = problem
                self.events.write("dropout", site=site, session=session, phase="join", reason=dropped[site])
            else:
                sizes[site] = payload["n"]
        self.events.write("trial_open", trial=trial, session=session, sizes=sizes, dropped=dropped,
                          devices=sorted(set(self.devices.values())), seconds=round(seconds, 6))
        return sizes, dropped

    def shutdown(self) -> None:
        self.ledger.context = {"trial": "", "session": "", "method": "", "codec": "", "phase": "shutdown"}
        for site in sorted(self.members) + ([SHUFFLER_ID] if self.shuffler_pid is not None else []):
            nbytes = self.channel.send(site, "shutdown", 0, {})
            if nbytes is not None:
                self.ledger.record(site=site, direction="down", mtype="shutdown", nbytes=nbytes)
        self.ledger.flush()

    def _sent(self, site: str, mtype: str, nbytes: int, handed: float) -> None:
        """What actually left (after any scripted fault and the site's link), into the ledger: when
        it was handed to the link (`sent`) and when the link delivered it (`arrived`, now)."""
        self.ledger.record(site=site, direction="down", mtype=mtype, nbytes=nbytes, sent=_wall(handed),
                           link=self._link_name(site, handed))

    def _downlink(self, peer: str, data: bytes, due: float) -> float | None:
        """When a message handed over at `due` reaches `peer` over its link (None: dropped)."""
        if peer == SHUFFLER_ID:  # the shuffler is infrastructure, on the coordinator's own network
            return due
        arrival = self.links.arrival(peer, "down", message_wire_bytes([len(data)], self.channel.curve), due)
        if arrival is None:
            self.events.write("lost", site=peer, direction="down", phase=self.ledger.context.get("phase"),
                              trial=self.ledger.context.get("trial"))
        return arrival

    def _link_name(self, site: str, at: float) -> str:
        return self.links.link(site, at) if self.links is not None and site != SHUFFLER_ID else ""

    def offline(self, site: str) -> bool:
        """The site's link says it is offline now (a scenario's network availability)."""
        return self.links is not None and site != SHUFFLER_ID and not self.links.online(site)

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
        """One session of `method`, run by the session engine (protocol.engine.Session): this
        driver only moves its requests and answers, keeps the deadline, meters and logs."""
        session_id = method_session(trial, index)
        label = label or method.name
        session = Session(method, sizes, coordinator_rng(site_rng(self.seed, trial, session_id, COORDINATOR_ID),
                                                         self.seeded_noise), keep_transcript=self.transcripts is not None)
        self.events.write("session_start", **session.opening(trial, session_id, label))
        with cycle_collection_paused():
            step = self._run_session(session, trial, session_id, label, method, sizes)
        if self.transcripts is not None:
            self.transcripts.append((trial, label, session.transcript))
        self.ledger.flush()
        self.events.write("session_end", **session.closing(trial, session_id, label))
        return step

    def _run_session(self, session: Session, trial: int, session_id: int, label: str, method: Method,
                     sizes: dict[str, int]) -> Requests | Outcome:
        rule = self.adversary.rule_for(trial, label) if self.adversary is not None else None
        record = self.adversary.start(trial, label, rule) if rule is not None else None
        if rule is not None:
            self.events.write("attack", trial=trial, session=session_id, label=label, attack=rule["attack"])
        if rule is not None and rule["attack"] == "forbidden_method":
            step = session.end(self._ask_other(trial, session_id, label, rule, record, sizes))
        else:
            step = session.start()
        while isinstance(step, Requests):
            self.ledger.context = {"trial": trial, "session": session_id, "method": label, "codec": method.codec,
                                   "phase": step.phase}
            self._maybe_die(trial, step.phase, session_id)
            if rule is not None:  # the scripted adversarial coordinator (coordinator.adversary)
                step = session.ask(*self.adversary.rewrite(rule, step.phase, step.requests, step.minimum,
                                                           session.rounds - 1))
            sends = {site: ("request", message) for site, message in step.messages.items()}
            if step.route == "shuffler":
                forge = self._sybils(session_id, step, method, rule) if (
                    rule is not None and rule["attack"] == "sybil") else None
                answers, dropped, rows = self._shuffled_phase(session_id, step.phase, sends, self.deadlines.respond,
                                                        trial=trial, minimum=step.minimum, forge=forge)
            else:
                answers, dropped, rows = self._phase(session_id, step.phase, sends, self.deadlines.respond,
                                                     trial=trial)
            decoded = session.decode({site: payload["body"] for site, payload in answers.items()})
            for site, reason in decoded.undecodable.items():
                answer_row(rows, site)["accepted"] = 0
                self.events.write("rejected", site=site, session=session_id, phase=step.phase, reason=reason)
            for site, bits in decoded.info_bits.items():
                row = answer_row(rows, site)
                row["info_bits"] = row.get("info_bits", 0) + bits
            if rule is not None:
                self._observe_attack(rule, record, session_id, step.requests, decoded.values,
                                     {**dropped, **decoded.undecodable})
                if rule["attack"] == "switch_method" and session.rounds == 1:
                    self._ask_other(trial, session_id, label, rule, record, sizes)
                if rule["attack"] in ("repeat", "replay_request") and session.rounds == 1:
                    self._ask_again(trial, session_id, step.phase, sends, rule, record)
            self.ledger.flush()  # the phase's rows are final: to disk now, not held until the session ends
            # the phase's requests, raw answers and rows are done with: freed before the half works
            # out the next phase (at 10,000 sites, tens of MB while it builds as much again)
            step = sends = answers = rows = None
            step = session.advance(decoded, dropped)
        return step

    def _observe_attack(self, rule, record, session, requests, decoded, dropped) -> None:
        self.adversary.observe(record, rule, session, requests, decoded, dropped)
        if rule["attack"] == "fabricated_table":
            from stats.kanon import KAnonymityError
            from protocol.methods.kanon_table import release_from_summary

            for site, value in decoded.items():
                if not requests.get(site, {}).get("limits"):
                    continue  # the first site bins its own data: no table of the coordinator's in it
                try:
                    release = release_from_summary(value, sum(key.startswith("cells_") for key in value))
                except (KAnonymityError, ValueError, TypeError, AttributeError):
                    continue
                self.adversary.observe_table(record, release, site)

    def _sybils(self, session: int, step, method: Method, rule: dict):
        """sybil: (the names of `rule["count"]` forged senders, and what sends their sealed
        messages): each dials the shuffler under a CURVE key pair of the coordinator's own making
        and sends a bin sealed to this session's key with the honest sites' own claim (their
        request digest, key digest and planned messages), so that the batch would count it."""
        from coordinator.adversary import SYBIL_PREFIX

        names = [f"{SYBIL_PREFIX}{i:03d}" for i in range(rule["count"])]
        self.adversary.forged_tried, self.adversary.forged_taken = names, set()
        body = next(iter(step.messages.values()))["body"]

        def send() -> None:
            if self.shuffler_dial is None:
                return
            endpoint, shuffler_key = self.shuffler_dial
            encoder, _ = method.codec_class().for_site(body)
            claim = method.sealing_claim(step.phase, body)
            channels = []
            for name in names:
                keys = None if shuffler_key is None else ClientKeys(shuffler_key, *zmq.curve_keypair())
                channel = DealerChannel(endpoint, name, keys=keys, context=zmq.Context.instance())
                channel.send("sealed", session, {"phase": step.phase, "ciphertext": encoder.encode(0), "claim": claim})
                channels.append(channel)
            time.sleep(FORGED_WAIT_S)  # time for a handshake the shuffler would accept, and the message
            for channel in channels:
                channel.socket.setsockopt(zmq.LINGER, 0)
                channel.close()

        return names, send

    def _ask_again(self, trial, session, phase, sends, rule, record) -> None:
        """repeat / replay_request: send the sites the phase's request again, `rule["times"]`
        times, in fresh sessions of the trial or in this one, and record who answered (the
        answers themselves are the coordinator's to average; the sites' budgets decide how many)."""
        from coordinator.adversary import REPEAT_FIRST

        for k in range(rule["times"]):
            again = trial * SESSIONS_PER_TRIAL + REPEAT_FIRST + k if rule["attack"] == "repeat" else session
            answers, dropped, _ = self._phase(again, phase, dict(sends), self.deadlines.respond, trial=trial)
            self.adversary.observe(record, rule, again, {site: {} for site in sends}, answers, dropped)

    def _ask_other(self, trial, session, label, rule, record, sizes) -> Outcome:
        """forbidden_method / switch_method: ask every joined site for the method `rule["ask"]` in
        this session (its first phase, an empty body) and record who answered; the session
        ends aborted when the request replaced the method's own (forbidden_method)."""
        from protocol.methods import METHODS

        other = METHODS[rule["ask"]]
        phase, codec = other.phase_table().opening(), other.codec_class()()
        sends = {site: ("request", {"method": other.name, "phase": phase, "body": codec.wrap_request({})})
                 for site in sorted(sizes)}
        self.ledger.context = {"trial": trial, "session": session, "method": label, "codec": other.codec,
                               "phase": phase}
        answers, dropped, _ = self._phase(session, phase, sends, self.deadlines.respond, trial=trial)
        leaked, unreadable = 0, 0
        for payload in answers.values():
            try:
                leaked += int(np.size(codec.decode(payload["body"])))
            except (PayloadError, TypeError, ValueError):
                unreadable += 1  # an answer all the same: counted, and said
        self.adversary.observe(record, rule, session, {site: {} for site in sends}, answers, dropped)
        record.finding = (f"asked for {other.name} in a session of {label}: {len(answers)} of {len(sends)} sites "
                          f"answered ({leaked} values released"
                          f"{f', {unreadable} answers not readable as {other.codec}' if unreadable else ''}), "
                          f"{record.refused} refused")
        return Outcome.aborted(f"adversarial coordinator ({rule['attack']}): {record.finding}")

    # -- one phase ---------------------------------------------------------------------------

    def _phase(self, session: int, phase: str, sends: dict[str, tuple[str, dict]], timeout: float,
               trial=None, until=None, log_missing=True, on_lost=None):
        """Send each site its message and collect the answers until all came (or were lost),
        the deadline passed, or `until()` holds (a shuffled phase waits for the shuffler's
        batch). `on_lost({site: reason})`: called as connections of awaited sites close. Returns
        (answers, dropped, rows): rows holds the ledger row of each accepted answer, for the
        caller to complete (information bits, or a body the codec then refused)."""
        dropped: dict[str, str] = {}
        reachable = []
        rows: dict[str, dict] = {}  # the ledger row of each accepted answer (the batch's under SHUFFLER_ID)
        for site, (mtype, payload) in sends.items():
            assert mtype == phase_spec(phase).sent, f"phase {phase} opens with {phase_spec(phase).sent}"
            if self.offline(site):  # the scenario's network: the site is not online when asked
                dropped[site] = "offline"
                continue
            data = self.channel.pack(mtype, session, payload)
            if self.outbox.send(data, mtype, peer=site, trial=trial, phase=phase, session=session):
                reachable.append(site)
            else:
                dropped[site] = "not connected"
        self._log_faults()
        collector = PhaseCollector(session, phase, frozenset(reachable))
        deadline = time.monotonic() + timeout
        while (not collector.complete if until is None else not until()) and time.monotonic() < deadline:
            envelope, row = self._receive(deadline)
            lost = {site: f"connection lost: {self.disconnected[site]}" for site in self._take_lost()
                    if collector.lose(site, f"connection lost: {self.disconnected[site]}")}
            if lost and on_lost is not None:
                on_lost(lost)
            if envelope is None:
                continue
            if envelope.type == "batch":
                reason = self._offer_batch(envelope, session, phase)
                if reason:
                    row["accepted"] = 0
                    self._reject_envelope(envelope, reason)
                else:
                    rows[SHUFFLER_ID] = row  # the batch's information bits go here
                continue
            reason = collector.offer(envelope)
            if reason:
                row["accepted"] = 0
                self._reject_envelope(envelope, reason)
            else:
                rows[envelope.sender] = row
        for site, reason in collector.refusals.items():  # the site's own words: inert from here on
            dropped[site] = f"refused: {inert(reason)}"
        dropped.update(collector.lost)
        if not log_missing:
            return collector.answers, dropped, rows
        for site in collector.missing():
            dropped[site] = f"no answer within the {phase} deadline ({timeout:g} s)"
        for site, reason in dropped.items():
            self.events.write("dropout", site=site, session=session, phase=phase, reason=reason)
        return collector.answers, dropped, rows

    def _offer_batch(self, envelope: Envelope, session: int, phase: str) -> str | None:
        if envelope.session != session or envelope.payload["phase"] != phase:
            return (f"batch for session {envelope.session}, phase {envelope.payload['phase']!r}, while "
                    f"session {session}, phase {phase!r} is open")
        if self._batch is not None:
            return "second batch for the same phase"
        self._batch = envelope
        return None

    def _shuffled_phase(self, session: int, phase: str, sends: dict[str, tuple[str, dict]], timeout: float,
                        trial=None, minimum: int = 0, forge=None):
        """A phase whose answers go through the shuffler: open a batch there and wait until the
        shuffler says it holds it (`batch_ready`), then send the requests, take `error`s from
        sites directly and the permuted batch from the shuffler. Asking only after the shuffler
        is ready means no sealed answer can reach it before its batch, whatever the load.
        Answers come back under anonymous labels (their place in the batch); sites are dropouts
        when they refused, or when the shuffler forwarded nothing from them (with its reason,
        e.g. a batch withheld because fewer than `minimum` messages arrived). `forge()` (the sybil
        attack): the names of senders the coordinator forges, whose messages the batch also expects;
        called once the batch is open, it sends their sealed messages."""
        self._batch = None
        forged, send_forged = forge if forge is not None else ([], None)
        dropped = {}
        if self.shuffler_pid is None:
            dropped = {site: "no shuffler is connected to this run" for site in sends}
        else:
            open_payload = {"phase": phase, "expected": sorted([*sends, *forged]), "deadline": timeout,
                            "minimum": int(minimum)}
            self.outbox.send(self.channel.pack("batch_open", session, open_payload), "batch_open", peer=SHUFFLER_ID,
                             trial=trial, phase=phase, session=session)
            self._log_faults()
            if not self._await_batch_ready(session, phase, time.monotonic() + timeout):
                dropped = {site: f"not asked: the shuffler did not confirm the batch within {timeout:g} s"
                           for site in sends}
        if dropped:
            for site, reason in dropped.items():
                self.events.write("dropout", site=site, session=session, phase=phase, reason=reason)
            return {}, dropped, {}
        def tell_shuffler(lost: dict[str, str]) -> None:  # its batch need not wait for them
            sites = {site: inert(reason) for site, reason in lost.items()}  # within the wire's bound on text
            self.outbox.send(self.channel.pack("batch_lost", session, {"phase": phase, "sites": sites}), "batch_lost",
                             peer=SHUFFLER_ID, trial=trial, phase=phase, session=session)

        if send_forged is not None:  # the sybil attack: its senders have sent; the batch need not wait for more
            send_forged()
            tell_shuffler({name: "a forged sender gave up" for name in forged})
        answers, dropped, rows = self._phase(session, phase, sends, timeout + BATCH_GRACE, trial=trial,
                                       until=lambda: self._batch is not None, log_missing=False,
                                       on_lost=tell_shuffler)
        batch, self._batch = self._batch, None
        if forged and batch is not None:
            self.adversary.forged_taken = set(forged) & set(batch.payload["senders"])
        for site in answers:  # a site that sent its answer past the shuffler
            dropped[site] = "answered the coordinator directly in a shuffled phase"
        if batch is not None:
            for site, size in batch.payload["received"].items():
                self.ledger.record(site=site, direction="up", mtype="sealed", nbytes=int(size))
        bodies, lost = batch_answers(batch.payload if batch is not None else None, list(sends), timeout + BATCH_GRACE)
        answers = {label: {"body": body} for label, body in bodies.items()}
        dropped = {**{site: inert(reason) for site, reason in lost.items()}, **dropped}
        for site, reason in dropped.items():
            self.events.write("dropout", site=site, session=session, phase=phase, reason=reason)
        return answers, dropped, rows

    def _await_batch_ready(self, session: int, phase: str, deadline: float) -> bool:
        """Wait for the shuffler's `batch_ready` of this session and phase; anything else that
        arrives meanwhile (late answers of earlier phases) is refused with the reason."""
        while time.monotonic() < deadline:
            envelope, row = self._receive(deadline)
            if envelope is None:
                continue
            if (envelope.type == "batch_ready" and envelope.session == session
                    and envelope.payload["phase"] == phase):
                return True
            row["accepted"] = 0
            self._reject_envelope(envelope, f"{envelope.type!r} while waiting for the shuffler to open "
                                            f"session {session}, phase {phase!r}")
        return False

    def _receive(self, deadline: float) -> tuple[Envelope | None, dict | None]:
        """Next acceptable envelope before `deadline` and its ledger row; hellos are absorbed
        into membership. Every message received is in the ledger, accepted or not."""
        self.outbox.flush()
        held = self._held.pop_due(time.monotonic())
        if held is not None:
            incoming, received = held
        else:
            incoming, received = self._arriving(deadline), time.monotonic()
            if incoming is None:
                return None, None
        self.disconnected.pop(incoming.peer, None)
        reason = incoming.reason or self._check(incoming)
        mtype = incoming.envelope.type if incoming.envelope is not None else "malformed"
        row = self.ledger.record(site=incoming.peer, direction="up", mtype=mtype, nbytes=incoming.nbytes,
                                 accepted=reason is None, sent=_wall(received), link=self._link_name(incoming.peer, received))
        if reason:
            self.events.write("rejected", peer=incoming.peer, bytes=incoming.nbytes, reason=reason)
            return None, row
        envelope = incoming.envelope
        if envelope.type == "hello" and envelope.sender == SHUFFLER_ID:
            row.update(phase="hello", method="", codec="", trial="", session="")
            self.shuffler_pid = envelope.payload["pid"]
            self.events.write("hello", site=SHUFFLER_ID, pid=self.shuffler_pid)
            return None, row
        if envelope.type == "hello":
            row.update(phase="hello", method="", codec="", trial="", session="")
            if envelope.sender not in self.members:
                self._record_handshake(envelope.sender)
            self.members[envelope.sender] = envelope.payload["pid"]
            self.events.write("hello", site=envelope.sender, pid=envelope.payload["pid"])
            return None, row
        return envelope, row

    def _arriving(self, deadline: float) -> Incoming | None:
        """What the socket receives before `deadline` (or a held message falls due) that has
        arrived: a site's message is held until its link delivers it (transport.emulation)."""
        now = time.monotonic()
        wait = self.outbox.timeout(max(0.0, deadline - now))
        if self._held.next_due() is not None:
            wait = max(0.0, min(wait, self._held.next_due() - now))
        incoming = self.channel.receive(timeout_s=wait)
        self.outbox.flush()
        for lost in self.channel.lost:
            self.disconnected[lost.peer] = lost.reason
            self._newly_lost.append(lost.peer)
            self.events.write("connection_lost", site=lost.peer, reason=lost.reason,
                              trial=self.ledger.context.get("trial"), phase=self.ledger.context.get("phase"))
        self.channel.lost.clear()
        if incoming is None or self.links is None or incoming.peer == SHUFFLER_ID:
            return incoming
        hello = incoming.envelope is not None and incoming.envelope.type == "hello"
        received = time.monotonic()
        # a hello is the connection coming up (TCP's, reliable): delayed by the link, never lost
        arrival = self.links.arrival(incoming.peer, "up", incoming.nbytes, received, lossless=hello)
        if arrival is None:
            self.events.write("lost", site=incoming.peer, direction="up", phase=self.ledger.context.get("phase"),
                              trial=self.ledger.context.get("trial"))
            return None
        if arrival > time.monotonic():
            self._held.put(arrival, (incoming, received))
            return None
        return incoming

    def _take_lost(self) -> list[str]:
        """Sites whose connection closed since the last call (and that have not spoken since)."""
        lost, self._newly_lost = [s for s in self._newly_lost if s in self.disconnected], []
        return lost

    def _record_handshake(self, site: str) -> None:
        """Connection setup (greeting and handshake), once per site (see transport.ledger)."""
        tags = {"phase": "connect", "method": "", "codec": "", "trial": "", "session": ""}
        curve = self.channel.curve
        # under CURVE a site's DEALER sets no routing id (the key names it: transport.channel)
        self.ledger.record(site=site, direction="up", mtype="handshake",
                           nbytes=handshake_bytes(curve, "DEALER", b"" if curve else site.encode(), client=True),
                           **tags)
        self.ledger.record(site=site, direction="down", mtype="handshake",
                           nbytes=handshake_bytes(curve, "ROUTER", b"", client=False), **tags)

    def _check(self, incoming: Incoming) -> str | None:
        envelope = incoming.envelope
        if self.channel.curve and envelope.sender != incoming.peer:
            return (f"connection authenticated as {incoming.peer!r} (by its key) sent as {envelope.sender!r}: "
                    f"a site cannot speak for another")
        if envelope.sender != incoming.peer:
            return f"sender field says {envelope.sender!r} but the message came from {incoming.peer!r}"
        if envelope.sender == SHUFFLER_ID:
            if envelope.type not in SHUFFLER_TO_COORDINATOR:
                return f"message type {envelope.type!r} is not sent by the shuffler"
        elif envelope.type not in SITE_TO_COORDINATOR:
            return f"message type {envelope.type!r} is not sent by sites"
        if envelope.type == "hello":
            self.guard.forget(envelope.sender)  # a (re)started site numbers from zero again
        return self.guard.check(envelope)

    def _reject_envelope(self, envelope: Envelope, reason: str) -> None:
        self.events.write("rejected", site=envelope.sender, session=envelope.session,
                          type=envelope.type, reason=reason)


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


def _wall(monotonic: float) -> float:
    """A time.monotonic() instant as Unix time (the ledger's clock)."""
    return time.time() - (time.monotonic() - monotonic)
