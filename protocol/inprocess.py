"""Method unit tests with no wire: a Session stepped by hand (protocol.engine), halves called directly.

Not a backend (the in-process backend is the coordinator's pump over the in-memory transport,
runner.federation.InProcessFederation, with envelopes, faults and events); this is the plugin
author's and the method tests' harness. The same Session as the pump (codec wrapping and decoding, dropouts, rounds, the
transcript), the same site halves and codecs, and for shuffled codecs the shuffler's own batch
(protocol.shuffle.ShuffleBatch: claims checked, each computed by the site half's method from the
request it received, as a site does: messages, key and request digest; a short batch, or one
mixing keys or questions, withheld; a fresh permutation), so results agree with the
multi-process system; tests use it to check methods in milliseconds. `rewrite` lets a test play
the adversarial coordinator (coordinator.adversary) without processes.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from protocol.secagg.identity import identities_in_memory

from protocol.engine import Requests, Session
from protocol.exchange import batch_answers
from protocol.methods.base import Method, Outcome, RequestError
from protocol.shuffle import ShuffleBatch

#: ask(site, phase, request body) -> the site's response as it goes on the wire: the codec's
#: *encoded* body (what `Codec.encode` returns, e.g. `codec.encode(half.answer(phase, body))`),
#: never the site half's plain value; raise RequestError to refuse (the site becomes a dropout)
Ask = Callable[[str, str, dict], Any]
#: rewrite(requests of the phase now open) -> (the requests sent instead, the batch's minimum):
#: an adversarial coordinator's rewrite (coordinator.adversary.Adversary.rewrite)
Rewrite = Callable[[Requests], tuple[dict[str, dict], int]]


def drive(method: Method, sizes: Mapping[str, int], ask: Ask, rng: np.random.Generator,
          session: Session | None = None, rewrite: Rewrite | None = None) -> Outcome:
    """Run one session of `method` over the sites in `sizes` ({site: n_j}), asking each through
    `ask` and returning the session's Outcome. `ask` receives the request body as the codec wraps
    it (`Codec.wrap_request`) and returns the encoded response body, which is decoded with the
    method's codec exactly as the coordinator does (an undecodable body is a dropout). `rng` feeds
    the coordinator half's own randomness. Pass `session` to keep its transcript, `rewrite` to
    send other requests than the half's (as the socket driver does for a scenario's attacks)."""
    session = session or Session(method, sizes, rng)
    step = session.start()
    while isinstance(step, Requests):
        if rewrite is not None:
            step = session.ask(*rewrite(step))
            if not isinstance(step, Requests):
                break
        bodies, dropped = {}, {}
        for site, message in step.messages.items():
            try:
                bodies[site] = ask(site, step.phase, message["body"])
            except RequestError as exc:
                dropped[site] = f"refused: {exc}"
        if step.route == "shuffler":  # what the shuffler process does: check claims, permute, strip senders
            batch = ShuffleBatch(0, step.phase, frozenset(bodies), step.minimum)
            for site, body in bodies.items():
                batch.offer(site, step.phase, body, claim=method.sealing_claim(step.phase, step.messages[site]["body"]))
            bodies, lost = batch_answers(batch.forward(), sorted(bodies), 0)
            dropped = {**lost, **dropped}
        step = session.advance(session.decode(bodies), dropped)
    return step


def run_session(method: Method, site_rows: Mapping[str, np.ndarray],
                rng_for: Callable[[str], np.random.Generator], rewrite: Rewrite | None = None) -> Outcome:
    """One session over sites given directly by their data ({site: rows}: scores, two_sample
    rows or examples, as the method's `data`), for tests and benchmarks; rng_for(site) seeds
    each site half and rng_for("coordinator") the coordinator half; `rewrite` as in drive."""
    halves = {site: type(method).site(np.asarray(rows, dtype=float), rng_for(site), site)
              for site, rows in site_rows.items()}
    for site, identity in identities_in_memory(halves).items():  # each site's signing key; one registry
        halves[site].identity = identity
    sizes = {site: int(len(rows)) for site, rows in site_rows.items()}

    def ask(site, phase, body):  # the site side's encoder (make_codec is the coordinator's decoder)
        encoder, request = method.codec_class().for_site(body)
        return encoder.encode(halves[site].answer(phase, request))

    return drive(method, sizes, ask, rng_for("coordinator"), rewrite=rewrite)
