"""Session numbers: a function of the trial and the method's place in the scenario, so that both
backends (and a resumed run) agree on them, and so on the randomness derived from them
(stats.randomness.site_rng takes the session)."""

from __future__ import annotations

#: Sessions per trial: session 0 of a trial is its join, method i gets session i + 1.
SESSIONS_PER_TRIAL = 1000


def join_session(trial: int) -> int:
    return trial * SESSIONS_PER_TRIAL


def method_index(session: int | None) -> int | None:
    """The method's place in the scenario for a method session; None for a join (or no session)."""
    if session is None or session == "" or int(session) % SESSIONS_PER_TRIAL == 0:
        return None
    return int(session) % SESSIONS_PER_TRIAL - 1


def method_session(trial: int, method_index: int) -> int:
    if not 0 <= method_index < SESSIONS_PER_TRIAL - 1:
        raise ValueError(f"at most {SESSIONS_PER_TRIAL - 1} methods per scenario")
    return trial * SESSIONS_PER_TRIAL + method_index + 1
