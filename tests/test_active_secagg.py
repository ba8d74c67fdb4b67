"""SecAgg+ against a coordinator that lies (issue 48 point 1): signed keys, the public graph and
the consistency round, each attacked in-process by a coordinator that rewrites what it sends
(protocol.secagg.protocol, active mode). The same attacks over real site processes are in
tests/test_attacks.py."""

from __future__ import annotations

import numpy as np
import pytest

from protocol.codecs.secagg_ddg import SecAggDDG
from protocol.methods.base import RequestError, Send
from protocol.methods.secure_sum import SecureSumCoordinator, SecureSumSite
from protocol.secagg import primitives as crypto
from protocol.secagg.graph import default_degree, default_threshold
from protocol.secagg.identity import identities_in_memory, new_signing_key, signing_public
from protocol.secagg.protocol import FORGED, INCONSISTENT, SecAggClient, SecAggParams, SecAggRefusal, add_mod

BITS, LENGTH = 20, 16


def inputs_for(m, seed=0):
    rng = np.random.default_rng(seed)
    return {f"site-{i:02d}": rng.integers(0, 1 << BITS, LENGTH, dtype=np.uint64) for i in range(m)}


def run(inputs, *, degree=None, mode="active", rewrite=None, identities=None, drops=None, seed=0):
    """One secure sum through the codec; rewrite(phase, requests) -> requests is the lying
    coordinator (it changes what is sent, never the sites)."""
    sites = sorted(inputs)
    k = len(sites) - 1 if degree is None else degree
    params = SecAggParams(BITS, LENGTH, k, default_threshold(k, mode), len(sites), mode)
    identities = identities or identities_in_memory(sites, semi_honest=mode == "semi-honest")
    coordinator = SecureSumCoordinator(params, sites, np.random.default_rng(seed), {}, lambda aggregate: aggregate)
    halves = {s: SecureSumSite(s, lambda public, p, s=s: inputs[s], identity=identities[s]) for s in sites}
    codec, refusals, step = SecAggDDG(LENGTH), {}, coordinator.start()
    while isinstance(step, Send):
        requests = rewrite(step.phase, step.requests) if rewrite else step.requests
        answers, dropped = {}, {}
        for site, body in requests.items():
            if site in (drops or {}).get(step.phase, ()):
                dropped[site] = "no answer"
                continue
            try:
                answers[site] = codec.decode(codec.encode(halves[site].answer(step.phase, body)))
            except RequestError as exc:
                dropped[site] = refusals[site] = f"refused: {exc}"
        step = coordinator.advance(step.phase, answers, dropped)
    return step, refusals


def plain_sum(inputs, sites):
    total = np.zeros(LENGTH, dtype=np.uint64)
    for s in sites:
        total = add_mod(total, inputs[s], BITS)
    return total


@pytest.mark.parametrize("degree", [None, 6], ids=["full", "sparse"])
@pytest.mark.parametrize("mode", ["active", "semi-honest"])
def test_an_honest_sum_is_bit_exact_in_both_modes_with_dropouts_in_every_phase(degree, mode):
    """...but under a sparse graph a survivor lost in the active mode's consistency round ends the
    session, explained: no holder releases a share of its self mask without its own signature
    (red team round 4); under a full graph t signatures on the one survivor set suffice."""
    inputs = inputs_for(12)
    for phase in ("share", "mask", "consistency", "unmask"):
        result, refusals = run(inputs, degree=degree, mode=mode, drops={phase: {"site-05"}})
        if mode == "active" and phase == "consistency" and degree is not None:
            assert not result.ok and not refusals and result.reason.startswith(
                "1 site(s) named surviving did not sign the survivor set (lost in the consistency round, or refusing to "
                "sign: fewer than t survivors around them), e.g. site-05")
            continue
        assert result.ok and not refusals, result.reason
        lost = {"site-05"} if phase in ("share", "mask") else set()
        assert result.included == sorted(set(inputs) - lost)
        assert np.array_equal(result.total, plain_sum(inputs, result.included))


def substitute_keys(target):
    """Key substitution: the target is sent keys of the coordinator's making for every peer."""
    def rewrite(phase, requests):
        if phase != "share":
            return requests
        body = dict(requests[target])
        body["peers"] = {v: {**info, "c": crypto.public_bytes(crypto.new_private_key()),
                             "s": crypto.public_bytes(crypto.new_private_key())} for v, info in body["peers"].items()}
        return {**requests, target: body}
    return rewrite


@pytest.mark.parametrize("degree", [None, 6], ids=["full", "sparse"])
def test_substituted_keys_are_refused_and_the_session_aborts_naming_the_forgery(degree):
    result, refusals = run(inputs_for(10), degree=degree, rewrite=substitute_keys("site-03"))
    assert not result.ok and result.total is None
    assert set(refusals) == {"site-03"} and FORGED in refusals["site-03"]
    assert "caught lying" in result.reason and "site-03" in result.reason and "were not signed by" in result.reason


def test_in_the_semi_honest_mode_substituted_keys_are_taken_and_the_coordinator_opens_the_shares():
    """What the active mode closes: the target encrypts its shares to keys the coordinator holds."""
    inputs, target, made = inputs_for(10), "site-03", {}

    def rewrite(phase, requests):
        if phase != "share":
            return requests
        body = dict(requests[target])
        peers = {}
        for v, info in body["peers"].items():
            made[v] = crypto.new_private_key()
            peers[v] = {**info, "c": crypto.public_bytes(made[v])}
        return {**requests, target: {**body, "peers": peers}}

    sites = sorted(inputs)
    params = SecAggParams(BITS, LENGTH, 9, default_threshold(9), 10, "semi-honest")
    client = SecAggClient(target, 77, lambda p: inputs[target])
    keys = client.answer("advertise", {"params": params.as_body()})
    others = {v: SecAggClient(v, 77, lambda p, v=v: inputs[v]) for v in sites if v != target}
    advertised = {v: c.answer("advertise", {"params": params.as_body()}) for v, c in others.items()}
    peers = {v: {"index": i + 2, **advertised[v]} for i, v in enumerate(sorted(others))}
    body = rewrite("share", {target: {"index": 1, "threshold": params.threshold, "peers": peers}})[target]
    ciphertexts = client.answer("share", body)
    opened = 0
    for v, ct in ciphertexts.items():
        key = crypto.agree(made[v], keys["c"], b"share", 77)
        opened += bool(crypto.decrypt(key, ct, f"secagg|77|{target}|{v}".encode()))
    assert opened == 9 >= params.threshold  # t shares of its self mask and mask key: its input is readable


def equivocate_survivors(target, phase_name):
    """Half the sites are told `target` dropped, the other half that it survived."""
    def rewrite(phase, requests):
        if phase != phase_name:
            return requests
        out = {}
        for i, (site, body) in enumerate(sorted(requests.items())):
            if i % 2 and site != target and target in body["survivors"]:
                body = {**body, "survivors": [s for s in body["survivors"] if s != target],
                        "dropped": sorted(body["dropped"] + [target])}
            out[site] = body
        return out
    return rewrite


@pytest.mark.parametrize("degree", [None, 6], ids=["full", "sparse"])
def test_survivor_sets_that_differ_between_sites_end_the_session_before_any_share_is_released(degree):
    released = []

    def rewrite(phase, requests):
        if phase == "unmask":
            released.append(phase)
        return equivocate_survivors("site-04", "consistency")(phase, requests)

    result, refusals = run(inputs_for(12), degree=degree, rewrite=rewrite)
    assert not result.ok and result.total is None
    assert refusals and all(INCONSISTENT in why for why in refusals.values())
    assert "caught lying" in result.reason and "survivor sets that disagree" in result.reason
    # every site that refused did so in the unmask phase, before answering it: no share left it
    assert released == ["unmask"]


def test_a_survivor_list_shorter_than_the_claim_is_refused_at_the_consistency_round():
    """Under a full graph the consistency round's survivor set is the session's: a claim of more
    inputs than it holds is refused before anything is signed."""
    from protocol.accounting import Spend

    inputs = inputs_for(8)
    sites = sorted(inputs)
    identities = identities_in_memory(sites)
    params = SecAggParams(BITS, LENGTH, 7, default_threshold(7, "active"), 8)
    coordinator = SecureSumCoordinator(params, sites, np.random.default_rng(0), {}, lambda a: a)
    halves = {s: SecureSumSite(s, lambda public, p, s=s: inputs[s], identity=identities[s],
                               check=lambda public: Spend("dp", 1.0, 1e-6, contributors=8)) for s in sites}
    step = coordinator.start()
    for _ in range(3):  # advertise, share, mask
        answers = {s: SecAggDDG(LENGTH).decode(SecAggDDG(LENGTH).encode(halves[s].answer(step.phase, b)))
                   for s, b in step.requests.items()}
        step = coordinator.advance(step.phase, answers, {})
    assert step.phase == "consistency"
    body = dict(step.requests["site-00"])
    body["survivors"] = body["survivors"][:6]
    body["dropped"] = sorted(set(sites) - set(body["survivors"]))
    with pytest.raises(RequestError, match=r"only 6 survivors named, fewer than the inputs the sum's noise was claimed for and booked \(8\)"):
        halves["site-00"].answer("consistency", body)


def test_a_view_altered_on_the_way_or_a_signature_from_another_session_does_not_verify():
    def alter_view(phase, requests):
        if phase != "unmask":
            return requests
        site = sorted(requests)[0]
        body = requests[site]
        other = next(v for v in sorted(body["views"]) if v != site)
        view = bytearray(body["views"][other])
        view[-1:] = b"A" if view[-1:] != b"A" else b"S"
        return {**requests, site: {**body, "views": {**body["views"], other: bytes(view)}}}

    result, refusals = run(inputs_for(12), degree=6, rewrite=alter_view)
    assert not result.ok and len(refusals) == 1 and INCONSISTENT in next(iter(refusals.values()))

    kept = {}

    def replay_signature(phase, requests):  # a signature the peer made in an earlier session
        if phase == "share" and "old" in kept:
            target = sorted(requests)[0]
            body = requests[target]
            victim = sorted(body["peers"])[0]
            return {**requests, target: {**body, "peers": {**body["peers"], victim: {**body["peers"][victim],
                                                                                     "sig": kept["old"]}}}}
        if phase == "share":
            body = requests[sorted(requests)[0]]
            kept["old"] = body["peers"][sorted(body["peers"])[0]]["sig"]
        return requests

    identities = identities_in_memory(sorted(inputs_for(10)))
    first, _ = run(inputs_for(10), rewrite=replay_signature, identities=identities, seed=1)
    assert first.ok
    second, refusals = run(inputs_for(10), rewrite=replay_signature, identities=identities, seed=2)
    assert not second.ok and FORGED in next(iter(refusals.values()))


def test_a_peer_the_registry_does_not_list_and_a_graph_of_the_coordinators_choosing_are_refused():
    inputs = inputs_for(10)
    sites = sorted(inputs)
    identities = identities_in_memory(sites)
    stranger = new_signing_key()
    # the registry of site-00 lacks site-01 (a key the coordinator registered nowhere)
    registry = {name: key for name, key in identities["site-00"].peers().items() if name != "site-01"}
    narrow = {**identities, "site-00": type(identities["site-00"])("site-00", identities["site-00"].key,
                                                                    lambda: registry)}
    result, refusals = run(inputs, identities=narrow)
    assert not result.ok and "site-01 has no signing key in the party registry" in refusals["site-00"]
    assert signing_public(stranger) not in registry.values()

    def swap_peers(phase, requests):  # one peer of site-02 swapped for a far site, its keys genuine
        if phase != "share":
            return requests
        body = requests["site-02"]
        far = next(s for s in sorted(requests) if s not in body["peers"] and s != "site-02")
        genuine = next(b["peers"][far] for b in requests.values() if far in b["peers"])  # signed by far itself
        near = sorted(body["peers"])[0]
        peers = {**{v: info for v, info in body["peers"].items() if v != near}, far: genuine}
        return {**requests, "site-02": {**body, "peers": peers}}

    result, refusals = run(inputs_for(16), degree=6, rewrite=swap_peers)
    assert not result.ok and "not my neighbours in the session's graph" in refusals["site-02"]
    assert "a graph other than the session's public one" in result.reason


def test_a_site_takes_part_in_the_semi_honest_protocol_only_where_its_policy_says_so():
    inputs = inputs_for(6)
    strict = identities_in_memory(sorted(inputs))  # the default policy: active only
    result, refusals = run(inputs, mode="semi-honest", identities=strict)
    assert not result.ok and all("semi-honest mode are not served" in why for why in refusals.values())
    result, refusals = run(inputs, mode="semi-honest")  # identities whose policy takes it
    assert result.ok and not refusals


def test_the_client_refuses_active_parameters_without_an_identity():
    client = SecAggClient("a", 1, lambda p: np.zeros(4, dtype=np.uint64))
    with pytest.raises(SecAggRefusal, match="no signing key"):
        client.answer("advertise", {"params": SecAggParams(8, 4, 2, 3, 3).as_body()})


# -- red team round 4 ---------------------------------------------------------------------------

def test_a_session_nonce_is_answered_once_even_across_a_restart(tmp_path):
    """Signatures name the nonce; a coordinator reusing one could replay a site's signature of an
    earlier session into a later one. Each site answers a nonce once, kept beside its account."""
    inputs = inputs_for(6)
    sites = sorted(inputs)
    identities = {s: i.with_policy(False, ledger=tmp_path / f"{s}.nonces") for s, i in identities_in_memory(sites).items()}

    def same_nonce(phase, requests):
        return {s: {**b, "nonce": 4242} for s, b in requests.items()} if phase == "advertise" else requests

    first, refusals = run(inputs, rewrite=same_nonce, identities=identities)
    assert not refusals
    restarted = {s: type(i)(s, i.key, i.registered, ledger=i.ledger) for s, i in identities.items()}
    second, refusals = run(inputs, rewrite=same_nonce, identities=restarted, seed=5)
    assert not second.ok and set(refusals) == set(sites)
    assert all("a session nonce answered before: 4242" in why for why in refusals.values())
    assert "caught lying" in second.reason


def test_a_survivor_whose_signature_is_withheld_gets_no_share_released():
    """A share of v's self mask leaves a holder only with v's own signature on an agreeing view."""
    def drop_one_signature(phase, requests):
        if phase != "unmask":
            return requests
        body = requests["site-00"]
        victim = next(v for v in sorted(body["signatures"]) if v != "site-00")
        return {**requests, "site-00": {**body, "signatures": {v: sig for v, sig in body["signatures"].items()
                                                               if v != victim}}}

    result, refusals = run(inputs_for(9), degree=6, rewrite=drop_one_signature)
    assert not result.ok and set(refusals) == {"site-00"}
    assert "named surviving, did not sign the survivor set" in refusals["site-00"]


def test_the_active_mode_refuses_a_threshold_of_two_thirds_or_less():
    with pytest.raises(ValueError, match="the active mode needs 7 or more"):
        SecAggParams(BITS, LENGTH, 8, 5, 9)  # a strict majority of 9, as the semi-honest mode takes
    assert SecAggParams(BITS, LENGTH, 8, 5, 9, "semi-honest").threshold == 5
    client = SecAggClient("a", 1, lambda p: np.zeros(4, dtype=np.uint64), identity=identities_in_memory(["a"])["a"])
    with pytest.raises(SecAggRefusal, match="two thirds"):
        client.answer("advertise", {"params": {**SecAggParams(8, 4, 8, 7, 9).as_body(), "threshold": 5}})


def test_a_share_request_naming_fewer_live_sites_than_the_claim_is_refused():
    """Pieces: a coordinator that tells a group of sites that only they advertised (live = 7 of
    16) could unmask the group's sum alone, where each booked the noise of 16 inputs."""
    from protocol.accounting import Spend

    inputs = inputs_for(16)
    sites = sorted(inputs)
    identities = identities_in_memory(sites)
    params = SecAggParams(BITS, LENGTH, 8, 7, 16)
    half = SecureSumSite("site-00", lambda public, p: inputs["site-00"], identity=identities["site-00"],
                         check=lambda public: Spend("dp", 1.0, 1e-6, contributors=16))
    half.answer("advertise", {"params": params.as_body(), "nonce": 9, "method": {}})
    with pytest.raises(RequestError, match=r"says 7 sites advertised, fewer than the inputs the sum's noise was "
                                           r"claimed for \(16\)"):
        half.answer("share", {"index": 1, "threshold": 7, "live": 7, "peers": {}})


def test_a_billion_sites_are_refused_and_a_million_cost_a_site_only_its_neighbourhood():
    with pytest.raises(ValueError, match="sites must be a count up to 1000000"):
        SecAggParams(BITS, LENGTH, 28, 20, 10**9)
    from protocol.secagg.graph import graph_seed, harary_by_index

    arrangement = harary_by_index(10**6, 28, graph_seed(1, b"q"))
    assert not hasattr(arrangement, "order")  # no permutation of every site is built
    near = arrangement.neighbours(123_457)
    assert len(near) == 28 and all(123_457 in arrangement.neighbours(v) for v in near)
    assert sorted(arrangement.index_at(p) for p in range(1000)) != list(range(1, 1001))


# -- red team round 5 ---------------------------------------------------------------------------

def test_a_nonce_outside_the_honest_range_is_refused_and_a_ledger_keeps_every_nonce(tmp_path):
    identity = identities_in_memory(["a", "b", "c"])["a"].with_policy(False, ledger=tmp_path / "a.nonces")
    params = SecAggParams(8, 4, 2, 3, 3).as_body()
    for nonce in (-4242, 1 << 62):
        client = SecAggClient("a", nonce, lambda p: np.zeros(4, dtype=np.uint64), identity=identity)
        with pytest.raises(SecAggRefusal, match=r"a malformed secure-aggregation request: session nonce"):
            client.answer("advertise", {"params": params})
    assert identity.first_use(17) and not identity.first_use(17)
    restarted = type(identity)("a", identity.key, identity.registered, ledger=identity.ledger)
    assert not restarted.first_use(17) and restarted.first_use(18)


@pytest.mark.parametrize("field, value", [("c", 1 << 31), ("s", "x" * 32), ("sig", b"\0" * 65), ("c", -1),
                                          ("c", 2.5)])
def test_a_peer_key_of_the_wrong_type_or_size_is_refused_before_anything_is_built(field, value):
    """A 9-byte integer where a key belongs made a site hash gigabytes (red team round 5)."""
    def poison(phase, requests):
        if phase != "share":
            return requests
        body = requests["site-00"]
        victim = sorted(body["peers"])[0]
        peers = {**body["peers"], victim: {**body["peers"][victim], field: value}}
        return {**requests, "site-00": {**body, "peers": peers}}

    result, refusals = run(inputs_for(7), rewrite=poison)
    assert set(refusals) == {"site-00"} and "a malformed secure-aggregation request: peer entry" in refusals["site-00"]
    assert not result.ok and "requests no honest coordinator sends" in result.reason


def test_malformed_signature_maps_are_refusals_not_crashes():
    def mixed_keys(phase, requests):
        if phase != "unmask":
            return requests
        body = requests["site-00"]
        return {**requests, "site-00": {**body, "signatures": {**body["signatures"], 1: b"x" * 64}}}

    result, refusals = run(inputs_for(7), rewrite=mixed_keys)
    assert set(refusals) == {"site-00"} and not result.ok and "caught lying" in result.reason


def test_an_odd_degree_of_a_sparse_graph_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="degree 5 is odd"):
        SecAggParams(BITS, LENGTH, 5, 5, 12)
    assert SecAggParams(BITS, LENGTH, 11, 9, 12).full  # the full graph may be odd
