"""The site process: a generic driver that moves messages between the coordinator and SiteLocal.

It validates every message (envelope, direction, sequence), answers `open` with `join` and a
`request` with a `response`, replies `error` with the reason to any request it cannot serve,
and exits on `shutdown`, when its parent process disappears, or after `idle_timeout` seconds
without a message. A bad message is logged and dropped; it never ends the process.

Scripted faults (transport.faults) act here and nowhere else on the site side: before
answering, the injector may make the process crash, stay silent, or answer late; everything
sent goes through an Outbox that may drop, duplicate, hold back or corrupt it.
"""

from __future__ import annotations

import logging
import os
import time

from protocol.methods import RequestError
from protocol.phases import SequenceGuard
from protocol.randomness import SESSIONS_PER_TRIAL
from protocol.wire import COORDINATOR_TO_SITE
from sites.local import SiteLocal
from transport.channel import SiteChannel, orphaned
from transport.faults import FaultInjector, kill_self
from transport.outbox import Outbox
from transport.security import ClientKeys

log = logging.getLogger("quorum.site")


def serve(site_id: str, endpoint: str, workdir: str, *, parent_alive=None,
          idle_timeout: float | None = None, keys: ClientKeys | None = None,
          faults: FaultInjector | None = None, scenario: dict | None = None,
          shuffler: str | None = None, shuffler_keys: ClientKeys | None = None, budget: dict | None = None) -> int:
    """Serve until shutdown; `parent_alive()` (optional) says whether the launcher still runs.
    `shuffler`: the shuffler's endpoint, where answers of shuffled codecs go (sealed)."""
    channel = SiteChannel(endpoint, site_id, keys=keys)
    local = SiteLocal(site_id, workdir, scenario=scenario, budget=budget)
    outbox = Outbox(lambda peer, data: channel.send_raw([data]) or 0, faults)
    to_shuffler = None
    if shuffler is not None:
        shuffle_channel = SiteChannel(shuffler, site_id, keys=shuffler_keys)
        to_shuffler = (shuffle_channel, Outbox(lambda peer, data: shuffle_channel.send_raw([data]) or 0, faults))
    guard = SequenceGuard()
    outbox.send(channel.pack("hello", 0, {"pid": os.getpid()}), "hello", phase="hello")
    log.info("%s (pid %d) connected to %s%s", site_id, os.getpid(), endpoint, " with CURVE" if keys else "")
    last_heard = time.monotonic()
    try:
        while True:
            wait = outbox.timeout(1.0) if to_shuffler is None else to_shuffler[1].timeout(outbox.timeout(1.0))
            incoming = channel.receive(timeout_s=wait)
            outbox.flush()
            if to_shuffler is not None:
                to_shuffler[1].flush()
            _log_faults(faults)
            if incoming is None:
                reason = orphaned(parent_alive, last_heard, idle_timeout)
                if reason:
                    log.warning(reason)
                    return 1
                continue
            last_heard = time.monotonic()
            envelope = incoming.envelope
            reason = incoming.reason
            if envelope is not None and envelope.type not in COORDINATOR_TO_SITE:
                reason = f"message type {envelope.type!r} is not sent by the coordinator"
            if envelope is not None and reason is None:
                reason = guard.check(envelope)
            if reason:
                log.warning("rejected a message of %d bytes: %s", incoming.nbytes, reason)
                continue
            if envelope.type == "shutdown":
                log.info("shutdown received")
                outbox.flush()
                return 0
            _handle(channel, outbox, local, envelope, faults, to_shuffler)
    finally:
        channel.close()
        if to_shuffler is not None:
            to_shuffler[0].close()


def _handle(channel: SiteChannel, outbox: Outbox, local: SiteLocal, envelope, faults, to_shuffler=None) -> None:
    payload, session = envelope.payload, envelope.session
    if envelope.type == "close":
        local.close_session(session)
        return
    if envelope.type == "open":
        trial, phase, method = payload["trial"], "join", None
    else:
        trial, phase, method = session // SESSIONS_PER_TRIAL, payload["phase"], payload["method"]
    delay = 0.0
    behaviour = faults.behaviour(trial, phase, method) if faults is not None else None
    if behaviour is not None:
        action, seconds = behaviour
        log.warning("scripted fault: %s in trial %s, phase %s", action, trial, phase)
        if action == "crash":
            logging.shutdown()
            kill_self()
        if action == "straggle":
            return
        delay = seconds

    def reply(mtype, body):
        outbox.send(channel.pack(mtype, session, body), mtype, trial=trial, phase=phase, method=method, delay=delay)

    if envelope.type == "open":
        try:
            n = local.open_trial(trial, payload["seed"])
        except Exception as exc:  # a broken shard or model must not end the site
            log.exception("cannot open trial %s", trial)
            reply("error", {"phase": "join", "reason": f"cannot open trial {trial}: {exc}"})
            return
        reply("join", {"n": n, "device": local.device})
        return
    try:
        body = local.answer(session, method, phase, payload["body"])
    except RequestError as exc:
        log.warning("refused request in session %d: %s", session, exc)
        reply("error", {"phase": phase, "reason": str(exc)})
        return
    except Exception as exc:  # a failing site half is reported, not fatal
        log.exception("site half failed in session %d", session)
        reply("error", {"phase": phase, "reason": f"site failure: {type(exc).__name__}: {exc}"})
        return
    if local.route(method) != "shuffler":
        reply("response", {"phase": phase, "body": body})
    elif to_shuffler is None:
        reply("error", {"phase": phase, "reason": "this site was given no shuffler endpoint"})
    else:
        shuffle_channel, shuffle_outbox = to_shuffler
        shuffle_outbox.send(shuffle_channel.pack("sealed", session, {"phase": phase, "ciphertext": body}), "sealed",
                            trial=trial, phase=phase, method=method, delay=delay)


def _log_faults(faults: FaultInjector | None) -> None:
    if faults is None:
        return
    for rule, where in faults.fired:
        log.warning("scripted fault %d (%s) applied: %s", rule.index, rule.action, where)
    faults.fired.clear()

