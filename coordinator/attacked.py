"""An attack as a sans-I/O wrapper of a session on the wire (issue 50): whatever the backend.

`AttackedSession` wraps a protocol.engine.WireSession with the same calls the pump makes
(`begin`, `next_exchange`, `finished`, `take_events`, `outcome`): it rewrites what each phase
sends (coordinator.adversary.Adversary.rewrite), observes what comes back, and asks what the
attack asks beside the method's own phases (another method in the session, the same question
again), as exchanges of its own. The sybil attack's forged senders ride on the exchange
(`forged`): the pump hands them to its backend's way of reaching the shuffler. Nothing here
knows a socket or a clock, so every attack runs the same over processes and in memory.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from coordinator.adversary import REPEAT_FIRST, SYBIL_PREFIX, Adversary, AttackRecord
from protocol.codecs import PayloadError
from protocol.engine import Requests, WireSession
from protocol.exchange import PhaseExchange, SessionEvent
from protocol.methods import METHODS, Method, Outcome
from protocol.sessions import SESSIONS_PER_TRIAL


class AttackedSession:
    def __init__(self, inner: WireSession, adversary: Adversary, rule: dict, trial: int, label: str,
                 method: Method, sizes: dict[str, int]) -> None:
        self.inner, self.adversary, self.rule, self.trial, self.label = inner, adversary, rule, trial, label
        self.method, self.sizes = method, dict(sizes)
        self.record: AttackRecord = adversary.start(trial, label, rule)
        self.extras: deque = deque()  # (what to do with its answers, the exchange's arguments)
        self.events = [SessionEvent("attack", {"trial": trial, "session": inner.session_id, "label": label,
                                               "attack": rule["attack"]})]
        self._ended: Outcome | None = None

    @property
    def kind(self) -> str:
        return self.rule["attack"]

    def begin(self, trial: int, label: str) -> None:
        forbidden = self.kind == "forbidden_method"  # the method's own phases are never asked
        self.inner.begin(trial, label, start=not forbidden)
        if forbidden:
            self.extras.append(("forbid", None))

    def close(self) -> None:
        self.inner.close()

    def next_exchange(self, timeout: float, now: float, shuffler: bool) -> PhaseExchange | None:
        if self.extras:
            return self._extra(timeout, now)
        if self._ended is not None or not isinstance(self.inner.step, Requests):
            return None
        session, step = self.inner.session, self.inner.step
        requests, minimum = self.adversary.rewrite(self.rule, step.phase, step.requests, step.minimum,
                                                   session.rounds - 1)
        step = self.inner.step = session.ask(requests, minimum)
        if not isinstance(step, Requests):
            return None
        forged = self._sybils(step) if self.kind == "sybil" and step.route == "shuffler" else {}
        exchange = session.exchange(step, self.inner.session_id, timeout, now, shuffler=shuffler,
                                    also_expected=tuple(forged))
        exchange.forged = forged
        return exchange

    def finished(self, exchange: PhaseExchange) -> None:
        if exchange.extra:
            self._extra_finished(exchange)
            return
        if exchange.forged and exchange.batch is not None:
            self.adversary.forged_taken = set(exchange.forged) & set(exchange.batch["senders"])
        requests = dict(self.inner.session.step.requests)
        session = self.inner.session
        decoded = session.take_answers(exchange)
        self._observe(exchange.session, requests, decoded.values, {**exchange.dropped, **decoded.undecodable})
        if session.rounds == 1 and self.kind == "switch_method":
            self.extras.append(("other", None))
        if session.rounds == 1 and self.kind in ("repeat", "replay_request"):
            for k in range(self.rule["times"]):
                again = (self.trial * SESSIONS_PER_TRIAL + REPEAT_FIRST + k if self.kind == "repeat"
                         else exchange.session)
                self.extras.append(("again", (again, exchange.phase, dict(exchange.sends))))
        exchange.decoded = decoded
        self.inner.step = None
        self.inner.step = session.advance(decoded, exchange.dropped)

    def take_events(self) -> list[SessionEvent]:
        events, self.events = self.inner.take_events() + self.events, []
        return events

    @property
    def outcome(self) -> Outcome:
        if self._ended is not None:
            return self.inner.session.end(self._ended)
        return self.inner.outcome

    # -- what the attack asks beside the method's phases ------------------------------------------

    def _extra(self, timeout: float, now: float) -> PhaseExchange:
        what, args = self.extras[0]
        session_id = self.inner.session_id
        if what == "again":
            again, phase, sends = args
            exchange = PhaseExchange(again, phase, sends, timeout, now, extra=True)
        else:  # forbidden_method / switch_method: the method `ask`'s first phase, an empty body
            other = METHODS[self.rule["ask"]]
            phase, codec = other.phase_table().opening(), other.codec_class()()
            sends = {site: ("request", {"method": other.name, "phase": phase, "body": codec.wrap_request({})})
                     for site in sorted(self.sizes)}
            exchange = PhaseExchange(session_id, phase, sends, timeout, now, codec=other.codec, extra=True)
        return exchange

    def _extra_finished(self, exchange: PhaseExchange) -> None:
        what, _ = self.extras.popleft()
        self.events.extend(exchange.events)
        asked = {site: {} for site in exchange.sends}
        if what == "again":
            self.adversary.observe(self.record, self.rule, exchange.session, asked, exchange.payloads, exchange.dropped)
            return
        other = METHODS[self.rule["ask"]]
        codec = other.codec_class()()
        answers, leaked, unreadable = exchange.payloads, 0, 0
        for payload in answers.values():
            try:
                leaked += int(np.size(codec.decode(payload["body"])))
            except (PayloadError, TypeError, ValueError):
                unreadable += 1  # an answer all the same: counted, and said
        self.adversary.observe(self.record, self.rule, exchange.session, asked, answers, exchange.dropped)
        self.record.finding = (f"asked for {other.name} in a session of {self.label}: {len(answers)} of "
                               f"{len(exchange.sends)} sites answered ({leaked} values released"
                               f"{f', {unreadable} answers not readable as {other.codec}' if unreadable else ''}), "
                               f"{self.record.refused} refused")
        if what == "forbid":
            self._ended = Outcome.aborted(f"adversarial coordinator ({self.kind}): {self.record.finding}")

    def _observe(self, session: int, requests, decoded: dict, dropped: dict) -> None:
        self.adversary.observe(self.record, self.rule, session, requests, decoded, dropped)
        if self.kind == "fabricated_table":
            from stats.kanon import KAnonymityError
            from protocol.methods.kanon_table import release_from_summary

            for site, value in decoded.items():
                if not requests.get(site, {}).get("limits"):
                    continue  # the first site bins its own data: no table of the coordinator's in it
                try:
                    release = release_from_summary(value, sum(key.startswith("cells_") for key in value))
                except (KAnonymityError, ValueError, TypeError, AttributeError):
                    continue
                self.adversary.observe_table(self.record, release, site)

    def _sybils(self, step: Requests) -> dict[str, dict]:
        """sybil: `rule["count"]` forged senders, each with a bin sealed to this session's key (its
        own sealing: a copy of another's ciphertext is refused as a replay) and the honest sites'
        own claim (their request digest, key digest and planned messages), so that the batch
        would count it."""
        names = [f"{SYBIL_PREFIX}{i:03d}" for i in range(self.rule["count"])]
        self.adversary.forged_tried, self.adversary.forged_taken = names, set()
        body = next(iter(step.messages.values()))["body"]
        encoder, _ = self.method.codec_class().for_site(body)
        claim = self.method.sealing_claim(step.phase, body)
        return {name: {"phase": step.phase, "ciphertext": encoder.encode(0), "claim": claim} for name in names}
