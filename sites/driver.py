"""The site process: a generic driver that moves messages between the coordinator and SiteLocal.

It validates every message (envelope, direction, sequence), answers `open` with `join` and a
`request` with a `response`, replies `error` with the reason to any request it cannot serve,
and exits on `shutdown`, when its parent process disappears, or after `idle_timeout` seconds
without a message. A bad message is logged and dropped; it never ends the process.
"""

from __future__ import annotations

import logging
import os
import time

from protocol.methods import RequestError
from protocol.phases import SequenceGuard
from protocol.wire import COORDINATOR_TO_SITE
from sites.local import SiteLocal
from transport.channel import SiteChannel

log = logging.getLogger("quorum.site")


def serve(site_id: str, endpoint: str, workdir: str, *, parent_pid: int | None = None,
          idle_timeout: float | None = None) -> int:
    channel = SiteChannel(endpoint, site_id)
    local = SiteLocal(site_id, workdir)
    guard = SequenceGuard()
    channel.send("hello", 0, {"pid": os.getpid()})
    log.info("%s (pid %d) connected to %s", site_id, os.getpid(), endpoint)
    last_heard = time.monotonic()
    try:
        while True:
            incoming = channel.receive(timeout_s=1.0)
            if incoming is None:
                if parent_pid is not None and not _alive(parent_pid):
                    log.warning("parent process %d is gone; exiting", parent_pid)
                    return 1
                if idle_timeout is not None and time.monotonic() - last_heard > idle_timeout:
                    log.warning("nothing heard for %.0f s; exiting", idle_timeout)
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
                return 0
            _handle(channel, local, envelope)
    finally:
        channel.close()


def _handle(channel: SiteChannel, local: SiteLocal, envelope) -> None:
    payload, session = envelope.payload, envelope.session
    if envelope.type == "open":
        try:
            n = local.open_trial(payload["trial"], payload["seed"])
        except Exception as exc:  # a broken shard or model must not end the site
            log.exception("cannot open trial %s", payload["trial"])
            channel.send("error", session, {"phase": "join",
                                            "reason": f"cannot open trial {payload['trial']}: {exc}"})
            return
        channel.send("join", session, {"n": n})
    elif envelope.type == "request":
        try:
            body = local.answer(session, payload["method"], payload["phase"], payload["body"])
        except RequestError as exc:
            log.warning("refused request in session %d: %s", session, exc)
            channel.send("error", session, {"phase": payload["phase"], "reason": str(exc)})
            return
        except Exception as exc:  # a failing site half is reported, not fatal
            log.exception("site half failed in session %d", session)
            channel.send("error", session, {"phase": payload["phase"],
                                            "reason": f"site failure: {type(exc).__name__}: {exc}"})
            return
        channel.send("response", session, {"phase": payload["phase"], "body": body})
    elif envelope.type == "close":
        local.close_session(session)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
