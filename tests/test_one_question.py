"""Issue 47, point 3: one question for every contributor.

A shuffled or securely summed release is private only if every contributor answered the same
question: a site asked for 1,000 bins where the others got 100 is picked out of a shuffled batch,
and answers to different questions summed as one are no sum at all. Each site computes the
request digest of the question it received (Method.request_digest: SHA-256 over the canonical
public parameters, its per-site fields left out); the shuffler withholds a batch whose claims
name different digests, and a secure sum binds its share ciphertexts and mask keys to the digest,
so that a site asked another question than its neighbours ends the session in an explained abort.
"""

from __future__ import annotations

import functools

import msgpack
import numpy as np
import pytest

import protocol.inprocess
from coordinator.adversary import Adversary, attack_problem, equivocated
from protocol.codecs.exp_mech_bins import ExpMechBins
from protocol.codecs.shuffle import Shuffle
from protocol.inprocess import drive, run_session
from protocol.methods import METHODS, RequestError
from protocol.methods.base import canonical
from protocol.secagg import primitives as crypto
from protocol.secagg.identity import SiteIdentity, identities_in_memory
from protocol.secagg.protocol import DIFFERENT_QUESTIONS, FORGED, MODES, SecAggClient
from protocol.shuffle import ShuffleBatch, claim_problem, sealing_claim
from protocol.wire import Envelope, decode, encode

BINS = {"lo": 0.0, "hi": 4.0, "count": 100}
CENTRAL = {"epsilon": 2.0, "delta": 1e-6, "messages": 2}


def bin_request(**change) -> dict:
    return {"level": 0.5, "epsilon": 2.0, "bins": dict(BINS), "central": dict(CENTRAL), **change}


def sites(m=8, n=500, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"site-{i:03d}": 3 * rng.random(n) for i in range(m)}


def rng_for(site: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, site)))


def equivocating(target: str, factor: float = 10.0):
    """The scripted adversary's rewrite: `target` asked `factor` times the bins, every phase."""
    adversary = Adversary([{"attack": "equivocate", "method": "m", "trials": "all", "target": target,
                            "factor": factor}], ["m"], 0)
    rule = adversary.rules[0]
    adversary.start(0, "m", rule)
    return adversary, lambda step: adversary.rewrite(rule, step.phase, step.requests, step.minimum, 0)


# -- the digest -----------------------------------------------------------------------------------


def test_the_digest_changes_with_every_parameter_that_shapes_the_release():
    digest = METHODS["fedcp2_qq_shuffle"].request_digest
    base = digest("respond", bin_request())
    assert len(base) == 32
    for changed in (bin_request(epsilon=2.0000001), bin_request(bins={**BINS, "count": 1000}),
                    bin_request(bins={**BINS, "hi": 5.0}), bin_request(central={**CENTRAL, "messages": 9}),
                    bin_request(central={**CENTRAL, "epsilon": 2.1})):
        assert digest("respond", changed) != base, changed
    assert METHODS["fedcp2_qq"].request_digest("respond", bin_request()) != base  # the method is in it
    assert digest("other", bin_request()) != base  # and the phase
    # K of a K-anonymous table, c and sigma^2 of a DDG sum: the default shape is the whole body
    table = METHODS["mwu_table"].request_digest
    assert table("table", {"k": 5, "limits": [0.0, 1.0]}) != table("table", {"k": 6, "limits": [0.0, 1.0]})


def test_a_per_site_field_leaves_the_digest_alone():
    """A site's own quantile level (unequal sizes) and its own order statistic ell differ between
    the sites of one session by design: they are not in the digest."""
    shuffled = METHODS["fedcp2_qq_shuffle"].request_digest
    assert shuffled("respond", bin_request(level=0.5)) == shuffled("respond", bin_request(level=0.93))
    for name in ("fedcp_qq", "fedcp_avg"):
        assert METHODS[name].request_digest("respond", {"ell": 3}) == METHODS[name].request_digest("respond", {"ell": 41})
    local = METHODS["private_cp_local"].request_digest
    assert local("respond", {"level": 0.9, "epsilon": 1.0, "bins": BINS}) == \
        local("respond", {"level": 0.8, "epsilon": 1.0, "bins": {**BINS, "count": 7}})
    assert local("respond", {"level": 0.9, "epsilon": 1.0, "bins": BINS}) != \
        local("respond", {"level": 0.9, "epsilon": 2.0, "bins": BINS})


def test_a_secure_sums_digest_leaves_out_the_sites_own_level_and_keeps_ring_and_graph():
    summed = METHODS["fedcp2_qq_secagg"].request_digest
    params = {"modulus_bits": 8, "length": 100, "degree": 5, "threshold": 4}
    body = {"params": params, "nonce": 7, "method": {"epsilon": 2.0, "bins": BINS, "central": CENTRAL, "level": 0.5}}
    base = summed("advertise", body)
    assert summed("advertise", {**body, "method": {**body["method"], "level": 0.71}}) == base
    for key, value in (("modulus_bits", 16), ("length", 1000), ("degree", 3), ("threshold", 5)):
        assert summed("advertise", {**body, "params": {**params, key: value}}) != base, key
    assert summed("advertise", {**body, "nonce": 8}) != base
    assert summed("share", {"index": 1, "threshold": 4, "peers": {}}) == summed("share", {"index": 2, "peers": {"x": 1}})
    ddg = METHODS["ddg_quantile"].request_digest
    public = {"c": 10, "sigma2": 2.0, "bins": BINS, "histogram": "flat", "central": CENTRAL}
    assert ddg("advertise", {"params": params, "nonce": 7, "method": public}) != \
        ddg("advertise", {"params": params, "nonce": 7, "method": {**public, "c": 11}})


def test_the_digest_is_of_what_the_site_receives_whatever_order_or_numpy_types():
    """Canonical: keys sorted at every level, and the msgpack round trip of the wire (tuples are
    lists, numpy floats plain floats), so the coordinator's digest of what it sent is the site's."""
    digest = METHODS["fedcp2_qq_shuffle"].request_digest
    shuffled_keys = {"central": dict(reversed(list(CENTRAL.items()))), "bins": dict(reversed(list(BINS.items()))),
                     "epsilon": np.float64(2.0), "level": 0.5}
    assert digest("respond", shuffled_keys) == digest("respond", bin_request())
    received = msgpack.unpackb(msgpack.packb(bin_request(), use_bin_type=True), raw=False)
    assert digest("respond", received) == digest("respond", bin_request())
    assert canonical({"b": (1, 2), "a": {"d": 1, "c": 2}}) == {"a": {"c": 2, "d": 1}, "b": [1, 2]}
    assert list(canonical({"b": 1, "a": 2})) == ["a", "b"]


# -- the shuffler -----------------------------------------------------------------------------------


def sealed_by(coordinator: Shuffle, requests: dict[str, dict]) -> ShuffleBatch:
    """A batch of the sites' sealed answers to `requests`, each with the claim its site computes."""
    method = METHODS["fedcp2_qq_shuffle"]
    batch = ShuffleBatch(1, "respond", frozenset(requests))
    for site, request in requests.items():
        body = coordinator.wrap_request(request)
        encoder, _ = Shuffle.for_site(body)
        assert batch.offer(site, "respond", encoder.encode(3), claim=method.sealing_claim("respond", body)) is None
    return batch


def test_a_site_asked_other_bins_is_left_out_of_its_batch_and_named_and_an_even_split_withheld():
    coordinator = Shuffle(ExpMechBins(1000))
    same = sealed_by(coordinator, {"site-001": bin_request(level=0.5), "site-002": bin_request(level=0.9)})
    forwarded = same.forward()
    assert forwarded["withheld"] == "" and len(forwarded["ciphertexts"]) == 2  # levels may differ
    mixed = sealed_by(coordinator, {"site-001": bin_request(), "site-002": bin_request(),
                                    "site-003": bin_request(bins={**BINS, "count": 1000})})
    payload = mixed.forward()  # the odd one out stays out, named; the two that answer one question go on
    assert len(payload["ciphertexts"]) == 2 and payload["senders"] == ["site-001", "site-002"]
    assert payload["refused"]["site-003"].startswith("left out of the batch: it answers another request (request ")
    assert "than the other 2 messages" in payload["refused"]["site-003"]
    even = sealed_by(coordinator, {"site-001": bin_request(), "site-002": bin_request(),
                                   "site-003": bin_request(bins={**BINS, "count": 1000}),
                                   "site-004": bin_request(bins={**BINS, "count": 1000})})
    payload = even.forward()  # two against two: no question is the batch's, nothing goes on
    assert payload["ciphertexts"] == [] and payload["senders"] == ["site-001", "site-002", "site-003", "site-004"]
    assert payload["withheld"].startswith("withheld by the shuffler: the 4 sealed messages answer 2 different requests: ")


def test_an_inner_codec_of_its_own_is_another_question():
    """The shuffle wrapper's inner codec decides how the opened answer reads: a site told to encode
    with another one could be told apart once opened, so the digest names it."""
    method = METHODS["fedcp2_qq_shuffle"]
    coordinator = Shuffle(ExpMechBins(100))
    body = coordinator.wrap_request(bin_request())
    other = {**body, "shuffle": {**body["shuffle"], "inner": "raw_quantile"}}
    assert method.sealed_digest("respond", body) != method.sealed_digest("respond", other)
    assert method.sealing_claim("respond", body)["request"] == method.sealed_digest("respond", body)


def test_a_claim_without_a_request_digest_is_malformed_and_a_sound_one_crosses_the_wire():
    good = sealing_claim(3, b"k" * 32, bytes(32))
    assert claim_problem(good) is None
    assert "a claim must be" in claim_problem({"messages": 3, "key": good["key"]})
    assert "request digest must be 32 bytes" in claim_problem({**good, "request": bytes(16)})
    assert "request digest must be 32 bytes" in claim_problem({**good, "request": "00" * 32})
    envelope = Envelope("sealed", 5, "site-001", 1, {"phase": "respond", "ciphertext": b"c" * 208, "claim": good})
    assert decode(encode(envelope)).payload["claim"] == good
    before = Envelope("sealed", 5, "site-001", 1, {"phase": "respond", "ciphertext": b"c" * 208,
                                                  "claim": {k: v for k, v in good.items() if k != "request"}})
    assert len(encode(envelope)) - len(encode(before)) == 42  # "request" (8) + bin 8 header (2) + 32


def test_an_equivocated_shuffled_session_releases_nothing_in_process():
    """The target's answer is left out (named); the rest are fewer than the session planned for."""
    adversary, rewrite = equivocating("site-003")
    method = METHODS["fedcp2_qq_shuffle"](0.1, epsilon=1.0, bins={"lo": 0.0, "hi": 4.0, "count": 20})
    honest = run_session(method, sites(), rng_for)
    attacked = run_session(method, sites(), rng_for, rewrite=rewrite)
    assert honest.status == "ok"
    assert attacked.status == "aborted"  # site-003's answer is left out; the 7 others are fewer than planned
    assert "left out of the batch: it answers another request" in attacked.reason
    assert "7 sealed messages of one key and one question arrived, fewer than the 8" in attacked.reason
    assert adversary.asked_otherwise == "site-003 was asked for 200 bins where every other site was asked for 20"


# -- secure sums ----------------------------------------------------------------------------------


def test_a_mask_key_is_bound_to_the_question():
    a, b = crypto.new_private_key(), crypto.new_private_key()
    question, other = bytes(32), bytes([1]) * 32
    key = crypto.agree(a, crypto.public_bytes(b), b"mask", 7, question)
    assert key == crypto.agree(b, crypto.public_bytes(a), b"mask", 7, question)
    assert key != crypto.agree(b, crypto.public_bytes(a), b"mask", 7, other)
    assert key != crypto.agree(a, crypto.public_bytes(b), b"mask", 7)


def secagg_mode(mode: str) -> dict:
    """The method's `secagg` parameter's mode field: none for the active mode (the default)."""
    return {} if mode == "active" else {"mode": mode}


def in_mode(monkeypatch, mode: str) -> dict:
    """secagg_mode, and for the semi-honest mode the in-process sites' identities made with a
    policy that takes it (protocol.policy `secagg: semi-honest`)."""
    if mode == "semi-honest":
        monkeypatch.setattr(protocol.inprocess, "identities_in_memory",
                            functools.partial(identities_in_memory, semi_honest=True))
    return secagg_mode(mode)


def with_identities(halves: dict, mode: str) -> dict:
    """Each site half given its signing key, one registry for all (as run_session does)."""
    for site, identity in identities_in_memory(halves, semi_honest=mode == "semi-honest").items():
        halves[site].identity = identity
    return halves


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name, params", [
    ("fedcp2_qq_secagg", {"epsilon": 1.0, "bins": {"lo": 0.0, "hi": 4.0, "count": 20}}),
    ("fedcp2_qq_secagg", {"epsilon": 1.0, "bins": {"lo": 0.0, "hi": 4.0, "count": 20}, "secagg": {"graph": "full"}}),
    ("ddg_quantile", {"epsilon": 1.0, "bins": {"lo": 0.0, "hi": 4.0, "count": 32}}),
])
def test_a_secure_sum_where_one_site_got_another_question_aborts_naming_it(monkeypatch, name, params, mode):
    """Semi-honest: site-003 and its neighbours find each other's digests in the share ciphertexts
    and refuse to mask. Active: a site signs its advertised keys for the question it was asked, so
    site-003's keys do not verify for its neighbours' question (nor theirs for its own): they
    refuse to share, before any input is computed. Either way nothing is unmasked, naming it."""
    secagg = {**params.get("secagg", {}), **in_mode(monkeypatch, mode)}
    method = METHODS[name](0.1, **{**params, "secagg": secagg})  # {}: every default, the active mode
    assert run_session(method, sites(), rng_for).status == "ok"
    _, rewrite = equivocating("site-003")
    outcome = run_session(method, sites(), rng_for, rewrite=rewrite)
    assert outcome.status == "aborted", outcome.reason
    what, lie = (("keys relayed in a peer's name that it did not sign", FORGED) if mode == "active"
                 else ("different questions in one secure sum", DIFFERENT_QUESTIONS))
    caught = f"secure aggregation: the coordinator's side was caught lying ({what}): "
    assert outcome.reason.startswith(caught), outcome.reason
    assert lie in outcome.reason and "nothing was unmasked" in outcome.reason
    # the refusal quoted is the first refuser's, a neighbour below site-003 (it has six of the seven
    # others), which names site-003: its first peer that fails the check, the lower ones honest
    named = ("the keys relayed for site-003 were not signed by site-003 for this session and question"
             if mode == "active" else "the shares from site-003 answer request")
    assert named in outcome.reason, outcome.reason
    refused = int(outcome.reason.split(f"({what}): ")[1].split()[0])
    assert refused == (8 if params.get("secagg") else 7)  # site-003 and its neighbours (all, under a full graph)
    assert outcome.details["answered"] == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_dropout_before_masking_still_unmasks_exactly_with_the_bound_keys(mode):
    """The coordinator rebuilds a dropped site's pairwise masks with the session's digest: with one
    site lost before masking, the one-hot histogram of the others still adds up."""
    method = METHODS["fedcp2_qq_secagg"](0.1, epsilon=1.0, bins={"lo": 0.0, "hi": 4.0, "count": 20}, dropouts=1,
                                         secagg={"graph": "full", **secagg_mode(mode)})
    rows = sites()
    halves = with_identities({s: type(method).site(r, rng_for(s), s) for s, r in rows.items()}, mode)

    def ask(site, phase, body):
        if site == "site-005" and phase == "mask":
            raise RequestError("crashed")
        encoder, request = method.codec_class().for_site(body)
        return encoder.encode(halves[site].answer(phase, request))

    outcome = drive(method, {s: len(r) for s, r in rows.items()}, ask, np.random.default_rng(0))
    assert outcome.status == "ok" and outcome.details["answered"] == 7, outcome.reason


@pytest.mark.parametrize("mode", MODES)
def test_answers_to_different_questions_never_cancel_even_unchecked(monkeypatch, mode):
    """Were a site not to compare digests, its pairwise masks would still not cancel against a
    neighbour's answer to another question: the sum does not unmask, and the one-hot histogram's
    count says so instead of a threshold. In the active mode the digest is in every signature too
    (advertised keys, consistency views): sites that checked no signature either get the same."""
    from protocol.secagg.protocol import share_associated_data
    from protocol.secagg.shamir import SHARE_BYTES, share_from_bytes

    def unchecked(self, sender):
        plain = crypto.decrypt(self.share_keys[sender], self.received[sender],
                               share_associated_data(self.nonce, sender, self.site_id))
        return share_from_bytes(plain[8:8 + SHARE_BYTES]), share_from_bytes(plain[8 + SHARE_BYTES:8 + 2 * SHARE_BYTES])

    monkeypatch.setattr(SecAggClient, "_open", unchecked)
    if mode == "active":
        monkeypatch.setattr(SiteIdentity, "verify", lambda self, peer, message, signature: None)
    method = METHODS["fedcp2_qq_secagg"](0.1, epsilon=1.0, bins={"lo": 0.0, "hi": 4.0, "count": 20},
                                         secagg={"graph": "full", **in_mode(monkeypatch, mode)})
    assert run_session(method, sites(), rng_for).status == "ok"

    def rewrite(step):  # site-003's bins over another range: as many (its vector fits), another question
        requests = dict(step.requests)
        if step.phase == "advertise":
            public = requests["site-003"]["method"]
            requests["site-003"] = {**requests["site-003"], "method": {**public, "bins": {**public["bins"], "hi": 4.5}}}
        return requests, step.minimum

    outcome = run_session(method, sites(), rng_for, rewrite=rewrite)
    assert outcome.status == "aborted" and "the masks did not cancel" in outcome.reason, outcome.reason


# -- the scripted attack --------------------------------------------------------------------------


def test_equivocate_rewrites_one_site_and_keeps_a_secure_sums_vector_in_step():
    shuffled, change = equivocated(bin_request(), 10)
    assert shuffled["bins"]["count"] == 1000 and change == "for 1000 bins where every other site was asked for 100"
    advertise = {"params": {"modulus_bits": 8, "length": 64, "degree": 3, "threshold": 3}, "nonce": 1,
                 "method": {"bins": {**BINS, "count": 64}, "histogram": "flat"}}
    summed, _ = equivocated(advertise, 10)
    assert summed["method"]["bins"]["count"] == summed["params"]["length"] == 640
    tree, _ = equivocated({**advertise, "params": {**advertise["params"], "length": 126},
                           "method": {**advertise["method"], "histogram": "hierarchical"}}, 10)
    assert tree["method"]["bins"]["count"] == 1024 and tree["params"]["length"] == 2046
    assert equivocated({"ell": 3}, 10) == ({"ell": 3}, "")
    rule = {"attack": "equivocate"}
    assert attack_problem(rule, METHODS["fedcp2_qq"](0.1, epsilon=1.0, bins=BINS)) is not None
    for name in ("fedcp2_qq_shuffle", "fedcp2_qq_secagg"):
        assert attack_problem(rule, METHODS[name](0.1, epsilon=1.0, bins=BINS)) is None
