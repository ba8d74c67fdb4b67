"""What a site answers to a coordinator's message, sans-I/O: the site process's agent
(sites.agent) and the in-memory site of the in-process backend (sites.memory) both call this,
so a site behaves the same whatever carries its messages.

`open` is answered `join` ({n, device}); a `request` goes through the site's policy, account
and method half (sites.local.SiteLocal.answer) and is answered `response`, or, for a shuffled
codec, `sealed` to the shuffler; anything the site cannot serve is answered `error` with the
reason; `close` ends a session's half. Faults, durability and sockets are the callers'.
"""

from __future__ import annotations

import logging

from protocol.methods import RequestError
from protocol.sessions import SESSIONS_PER_TRIAL
from protocol.wire import device_name, refusal
from sites.local import SiteLocal

#: to whom a reply goes
COORDINATOR, SHUFFLER = "coordinator", "shuffler"


def where(envelope) -> tuple[int, str, str | None]:
    """(trial, phase, method) a coordinator's `open` or `request` concerns (scripted faults match them)."""
    if envelope.type == "open":
        return envelope.payload["trial"], "join", None
    return envelope.session // SESSIONS_PER_TRIAL, envelope.payload["phase"], envelope.payload["method"]


def site_replies(local: SiteLocal, envelope, has_shuffler: bool, log: logging.Logger) -> list[tuple[str, str, dict]]:
    """The site's replies to one accepted `open`, `request` or `close`: [(to, type, payload)]."""
    payload, session = envelope.payload, envelope.session
    if envelope.type == "close":
        local.close_session(session)
        return []
    trial, phase, method = where(envelope)
    if envelope.type == "open":
        try:
            n = local.open_trial(trial, payload["seed"])
        except Exception as exc:  # a broken shard or model must not end the site
            log.exception("cannot open trial %s", trial)
            return [(COORDINATOR, "error", refusal("join", f"cannot open trial {trial}: {exc}"))]
        return [(COORDINATOR, "join", {"n": n, "device": device_name(local.device)})]
    if not has_shuffler and local.route(method) == "shuffler":  # before anything is booked
        return [(COORDINATOR, "error", refusal(phase, "this site was given no shuffler endpoint"))]
    try:
        body = local.answer(session, method, phase, payload["body"])
    except RequestError as exc:
        log.warning("refused request in session %d: %s", session, exc)
        return [(COORDINATOR, "error", refusal(phase, str(exc)))]
    except Exception as exc:  # a failing site half is reported, not fatal
        log.exception("site half failed in session %d", session)
        return [(COORDINATOR, "error", refusal(phase, f"site failure: {type(exc).__name__}: {exc}"))]
    if local.route(method) != "shuffler":
        return [(COORDINATOR, "response", {"phase": phase, "body": body})]
    claim = local.sealing_claim(method, phase, payload["body"])
    return [(SHUFFLER, "sealed", {"phase": phase, "ciphertext": body, "claim": claim})]
