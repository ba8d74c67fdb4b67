"""Run method sessions with no sockets: the coordinator half talks to the site halves directly.

The same halves and codecs as the multi-process system, including the codec's encode/decode
round trip, so results agree bit for bit with it; tests use it to check methods in milliseconds.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from protocol.codecs import CODECS
from protocol.methods.base import Method, Outcome, RequestError, Send

#: ask(site, phase, request body) -> the site's encoded response body (or RequestError)
Ask = Callable[[str, str, dict], Any]


def drive(method: Method, sizes: Mapping[str, int], ask: Ask, rng: np.random.Generator) -> Outcome:
    """Run one session of `method` over the sites in `sizes`, asking each through `ask`;
    `rng` feeds the coordinator half's own randomness."""
    codec = method.make_codec()
    half = method.coordinator(dict(sizes), rng)
    step = half.start()
    while isinstance(step, Send):
        answers, dropped = {}, {}
        for site, body in step.requests.items():
            try:
                answers[site] = codec.decode(ask(site, step.phase, body))
            except RequestError as exc:
                dropped[site] = f"refused: {exc}"
        step = half.advance(step.phase, answers, dropped)
    return step


def run_session(method: Method, site_scores: Mapping[str, np.ndarray],
                rng_for: Callable[[str], np.random.Generator], session: int = 1) -> Outcome:
    """One session over sites given directly by their scores (for tests and benchmarks);
    rng_for("coordinator") seeds the coordinator half."""
    codec = CODECS[method.codec]()  # the site side's encoder (make_codec is the coordinator's decoder)
    halves = {site: type(method).site_for(np.asarray(scores, dtype=float), rng_for(site), site, session)
              for site, scores in site_scores.items()}
    sizes = {site: int(len(scores)) for site, scores in site_scores.items()}
    return drive(method, sizes, lambda site, phase, body: codec.encode(halves[site].answer(phase, body)),
                 rng_for("coordinator"))
