"""Run method sessions with no sockets: the coordinator half talks to the site halves directly.

The same halves and codecs as the multi-process system, including the codec's encode/decode
round trip (and, for shuffled codecs, the shuffler's permutation), so results agree with it; tests use it to check methods in milliseconds.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from quorum.protocol.codecs import PayloadError
from quorum.protocol.methods.base import Method, Outcome, RequestError, Send, guarded
from quorum.protocol.shuffle import anonymous_label, secure_permutation

#: ask(site, phase, request body) -> the site's response as it goes on the wire: the codec's
#: *encoded* body (what `Codec.encode` returns, e.g. `codec.encode(half.answer(phase, body))`),
#: never the site half's plain value; raise RequestError to refuse (the site becomes a dropout)
Ask = Callable[[str, str, dict], Any]


def drive(method: Method, sizes: Mapping[str, int], ask: Ask, rng: np.random.Generator) -> Outcome:
    """Run one session of `method` over the sites in `sizes` ({site: n_j}), asking each through
    `ask` and returning the session's Outcome. `ask` receives the request body as the codec wraps
    it (`Codec.wrap_request`) and returns the encoded response body, which `drive` decodes with the
    method's codec exactly as the coordinator does (an undecodable body is a dropout). `rng` feeds
    the coordinator half's own randomness."""
    codec = method.make_codec()
    half = guarded(method.coordinator, dict(sizes), rng)
    step = half if isinstance(half, Outcome) else guarded(half.start)
    while isinstance(step, Send):
        bodies, dropped = {}, {}
        for site, body in step.requests.items():
            try:
                bodies[site] = ask(site, step.phase, codec.wrap_request(body))
            except RequestError as exc:
                dropped[site] = f"refused: {exc}"
        if codec.route == "shuffler":  # what the shuffler process does: permute, strip the senders
            order = secure_permutation(len(bodies))
            sealed = list(bodies.values())
            bodies = {anonymous_label(i): sealed[j] for i, j in enumerate(order)}
        answers = {}
        for label, body in bodies.items():
            try:
                answers[label] = codec.decode(body)
            except PayloadError as exc:
                dropped[label] = f"undecodable {codec.name} body: {exc}"
        step = guarded(half.advance, step.phase, answers, dropped)
    return step


def run_session(method: Method, site_scores: Mapping[str, np.ndarray],
                rng_for: Callable[[str], np.random.Generator], session: int = 1) -> Outcome:
    """One session over sites given directly by their scores (for tests and benchmarks);
    rng_for("coordinator") seeds the coordinator half."""
    halves = {site: type(method).site_for(np.asarray(scores, dtype=float), rng_for(site), site, session)
              for site, scores in site_scores.items()}
    sizes = {site: int(len(scores)) for site, scores in site_scores.items()}

    def ask(site, phase, body):  # the site side's encoder (make_codec is the coordinator's decoder)
        encoder, request = method.codec_class().for_site(body)
        return encoder.encode(halves[site].answer(phase, request))

    return drive(method, sizes, ask, rng_for("coordinator"))
