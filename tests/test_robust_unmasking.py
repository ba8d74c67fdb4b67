"""Robust unmasking (issue 48, point 3): Shamir shares off the polynomial are found by Reed-Solomon
decoding (Gao's algorithm, protocol.secagg.shamir.decode_shares), corrected while at most
floor((n - t) / 2) of a secret's n shares are wrong, and their holders named; a secure sum with a
garbage holder still gives the exact sum, and one with too many ends naming whom it can."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from protocol.codecs import CODECS
from protocol.codecs.secagg_ddg import SecAggDDG
from protocol.methods import METHODS
from protocol.methods.base import Send
from protocol.methods.secure_sum import SecureSumCoordinator, SecureSumSite
from protocol.inprocess import drive
from protocol.secagg import protocol as secagg_protocol
from protocol.secagg import shamir, unmasking
from protocol.secagg.graph import HararyArrangement, default_threshold
from protocol.secagg.identity import identities_in_memory
from protocol.secagg.protocol import MODES, SecAggParams
from protocol.secagg.shamir import (PRIME, ShareError, decode_shares, recover_secret, reconstruct_secret,
                                    share_to_bytes, split_secret)
from tests.test_secagg import BITS, LENGTH, make_inputs, plaintext_sum, unmasking_jobs

SMALL = 7  # a field small enough to try every error value


# -- the decoder against brute force ----------------------------------------------------------------

def evaluate(coefficients, x, p):
    return sum(c * pow(x, i, p) for i, c in enumerate(coefficients)) % p


def interpolate(points, p):
    """Coefficients (low to high) of the polynomial of degree below len(points) through them."""
    out = [0] * len(points)
    for i, (xi, yi) in enumerate(points):
        basis, scale = [1], 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                basis = [(a - xj * b) % p for a, b in zip([0] + basis, basis + [0])]
                scale = scale * (xi - xj) % p
        factor = yi * pow(scale, -1, p) % p
        out = [(o + factor * b) % p for o, b in zip(out, basis)]
    return out


def brute_force(received: dict[int, int], t: int, p: int) -> set[tuple[int, ...]]:
    """Every polynomial of degree below t within floor((n - t) / 2) of the received shares: such a
    polynomial agrees with at least n - e >= t of them, so it is the interpolant of some t."""
    n, e = len(received), (len(received) - t) // 2
    found = set()
    for subset in itertools.combinations(sorted(received.items()), t):
        f = tuple(interpolate(list(subset), p))
        if sum(evaluate(f, x, p) != y for x, y in received.items()) <= e:
            found.add(f)
    return found


def decoded(received, t, p):
    try:
        return decode_shares(received, t, p)
    except ShareError:
        return None


@pytest.mark.parametrize("n", range(1, SMALL))
def test_gao_equals_brute_force_on_every_error_pattern_of_a_small_field(n):
    """GF(7), holders 1..n, every threshold t <= n: every set of wrong shares up to the radius
    e = floor((n - t) / 2), with every nonzero error value, decodes to the polynomial dealt and
    names exactly those holders; every set of e + 1 decodes to exactly what brute force finds
    within the radius: nothing when n - t is odd (never a wrong polynomial), and when n - t is
    even either nothing or the one other polynomial the errors landed near, as the theory says."""
    p, rng = SMALL, random.Random(n)
    for t in range(1, n + 1):
        e = (n - t) // 2
        f = [rng.randrange(p) for _ in range(t)]
        clean = {x: evaluate(f, x, p) for x in range(1, n + 1)}
        misdecoded = 0
        for wrong in range(e + 2):
            for positions in itertools.combinations(sorted(clean), wrong):
                for errors in itertools.product(range(1, p), repeat=wrong):
                    received = {**clean, **{x: (clean[x] + d) % p for x, d in zip(positions, errors)}}
                    result = decoded(received, t, p)
                    if wrong <= e:
                        assert result == (f, positions), (n, t, positions, errors)
                        continue
                    truth = brute_force(received, t, p)
                    assert len(truth) <= 1
                    if (n - t) % 2:
                        assert result is None and not truth, (n, t, positions, errors)
                    elif truth:
                        (other,) = truth
                        assert result is not None and tuple(result[0]) == other != tuple(f)
                        assert result[1] == tuple(x for x in sorted(received)
                                                  if evaluate(other, x, p) != received[x])
                        misdecoded += 1
                    else:
                        assert result is None
        if (n - t) % 2 == 0 and 0 < t and e + 1 <= n and n - t >= 2:
            assert misdecoded, (n, t)  # the bound is tight: e + 1 errors can land near another codeword


def test_gao_equals_brute_force_on_random_words():
    """Arbitrary received words over GF(11) (most far from any codeword): the decoder gives the
    polynomial brute force finds within the radius, with the holders off it, or fails when there
    is none."""
    rng, p = random.Random(5), 11
    outcomes = {"decoded": 0, "failed": 0}
    for _ in range(3000):
        n = rng.randint(1, 8)
        t = rng.randint(1, n)
        xs = rng.sample(range(1, p), n)
        received = {x: rng.randrange(p) for x in xs}
        truth = brute_force(received, t, p)
        result = decoded(received, t, p)
        if truth:
            (f,) = truth
            assert result is not None and tuple(result[0]) == f
            assert result[1] == tuple(x for x in sorted(xs) if evaluate(f, x, p) != received[x])
            outcomes["decoded"] += 1
        else:
            assert result is None
            outcomes["failed"] += 1
    assert min(outcomes.values()) > 300, outcomes


@pytest.mark.parametrize("n, t", [(5, 3), (7, 4), (8, 5), (29, 15), (50, 26), (9, 5)])
def test_the_real_field_corrects_to_the_radius_and_detects_one_more(n, t):
    """GF(2^256 + 297), holders spread as in a session: up to e = floor((n - t) / 2) garbage
    shares decode to the secret, naming exactly their holders; e + 1 garbage shares are detected
    (random values land near another polynomial with probability about 2^-256)."""
    rng = random.Random(n * 100 + t)
    e = (n - t) // 2
    for trial in range(6):
        xs = rng.sample(range(1, 10_001), n)
        secret = rng.getrandbits(256)
        shares = split_secret(secret, t, xs, randbelow=rng.randrange)
        for wrong in range(e + 2):
            positions = tuple(sorted(rng.sample(xs, wrong)))
            received = {**shares, **{x: rng.randrange(PRIME) for x in positions}}
            if wrong <= e:
                coefficients, named = decode_shares(received, t)
                assert coefficients[0] == secret and named == positions
                assert recover_secret(received, t) == (secret, positions)
            else:
                with pytest.raises(ShareError, match="cannot tell which"):
                    decode_shares(received, t)


@pytest.mark.parametrize("n, t", [(7, 3), (9, 5), (6, 3), (8, 5)])
def test_e_plus_one_chosen_shares_forge_a_secret_only_when_n_minus_t_is_even(n, t):
    """The theory's limit, with chosen values: holders that send e + 1 shares of a polynomial g
    through t - 1 honest shares (and a secret of their choosing) make g the nearest polynomial
    when n - t is even (distance e against e + 1), and are detected when n - t is odd."""
    rng = random.Random(n + t)
    e = (n - t) // 2
    xs = list(range(1, n + 1))
    shares = split_secret(rng.getrandbits(256), t, xs, randbelow=rng.randrange)
    liars = xs[-(e + 1):]
    forged_points = [(x, shares[x]) for x in xs[:t - 1]] + [(0, 12345)]
    g = interpolate(forged_points, PRIME)
    received = {**shares, **{x: evaluate(g, x, PRIME) for x in liars}}
    if (n - t) % 2 == 0:
        coefficients, named = decode_shares(received, t)
        assert coefficients[0] == 12345 and len(named) == e
    else:
        with pytest.raises(ShareError, match="cannot tell which"):
            decode_shares(received, t)


# -- the fast path, erasures and names ---------------------------------------------------------------

def test_consistent_shares_never_reach_the_decoder(monkeypatch):
    calls = []
    real = shamir.decode_shares
    monkeypatch.setattr(shamir, "decode_shares", lambda *a, **k: calls.append(a) or real(*a, **k))
    rng = random.Random(1)
    xs = rng.sample(range(1, 10_001), 29)
    shares = split_secret(777, 15, xs)
    for _ in range(20):
        assert recover_secret(shares, 15) == (777, ())
        assert reconstruct_secret(shares, 15) == 777
    assert calls == []
    bad = {**shares, xs[3]: 5}
    assert recover_secret(bad, 15) == (777, (xs[3],)) and len(calls) == 1


def test_the_stray_share_named_is_the_wrong_one_wherever_it_lies():
    """reconstruct_secret named the first share beyond the first t that missed the polynomial
    through the first t: a wrong share among those t made it blame an honest holder."""
    shares = split_secret(99, 3, range(1, 6), randbelow=random.Random(4).randrange)
    for x in range(1, 6):
        with pytest.raises(ShareError) as caught:
            reconstruct_secret({**shares, x: (shares[x] + 1) % PRIME}, 3)
        assert str(caught.value) == f"share of holder {x} does not lie on the polynomial of the others"
    with pytest.raises(ShareError, match="cannot tell which"):
        reconstruct_secret({**shares, 1: 0, 2: 0}, 3)


def test_holders_found_wrong_elsewhere_are_left_out():
    """Six shares, t = 3 (one wrong share correctable): two wrong ones decode once a holder found
    wrong in another secret is left out (errors and erasures); a distrusted holder whose share
    here is right is not named; leaving holders out never goes down to t shares, which nothing
    would check."""
    shares = split_secret(4242, 3, range(1, 7), randbelow=random.Random(2).randrange)
    two_wrong = {**shares, 1: 17, 2: 18}
    with pytest.raises(ShareError, match="cannot tell which") as caught:
        recover_secret(two_wrong, 3)
    assert caught.value.left_out == ()
    assert recover_secret(two_wrong, 3, distrusted={1}) == (4242, (1, 2))  # five left, one wrong: decoded
    assert recover_secret(two_wrong, 3, distrusted={1, 2}) == (4242, (1, 2))  # four left, checked
    assert recover_secret({**shares, 1: 17}, 3, distrusted={1, 4}) == (4242, (1,))
    three_wrong = {**shares, 1: 17, 2: 18, 3: 19}
    with pytest.raises(ShareError, match=r"cannot tell which .* \(with the 2 shares of holders found wrong") as caught:
        recover_secret(three_wrong, 3, distrusted={1, 2})  # four left, one of them wrong: detected, not located
    assert caught.value.left_out == (1, 2)
    with pytest.raises(ShareError, match="with the 3 shares of holders found wrong in other secrets left out, 3 "
                                          "remain, and 4 are needed to rebuild it and check the shares") as caught:
        recover_secret(three_wrong, 3, distrusted={1, 2, 3})
    assert caught.value.left_out == (1, 2, 3)


@pytest.mark.usefixtures("fork_server_preloaded")  # tests/conftest.py
def test_unmasking_jobs_correct_one_wrong_share_each_and_name_it():
    """Every job with one share off (7 holders, t = 4): the same bits as with none, on one core
    and on two, and every wrong holder named at its job's position."""
    ring = unmasking.Ring(threshold=4, length=16, bits=20, nonce=77, holders={i: f"h{i}" for i in range(1, 8)})
    jobs, expected = unmasking_jobs(10, ring)
    broken = []
    for position, job in enumerate(jobs):
        shares = dict(job.shares)
        x = 1 + position % 7
        shares[x] = (shares[x] + 3) % PRIME
        broken.append(type(job)(**{**job.__dict__, "shares": shares}))
    for parallel_from in (2, 10**9):
        result = unmasking.unmask(broken, ring, parallel_from)
        assert result.failure is None and np.array_equal(result.total, expected)
        assert result.wrong == {p: (1 + p % 7,) for p in range(10)}


@pytest.mark.usefixtures("fork_server_preloaded")  # tests/conftest.py
def test_a_holder_found_wrong_is_left_out_of_secrets_it_spoils_with_another():
    """Holder 1 wrong in every job, holder 2 too in jobs 5 and 8: two wrong of 7 is more than
    one decoding corrects, but once 1 is found wrong in the other jobs, leaving it out lets 5 and
    8 decode too (on one core and on two: the failed jobs run again here)."""
    ring = unmasking.Ring(threshold=4, length=16, bits=20, nonce=3)
    jobs, expected = unmasking_jobs(10, ring, seed=4)
    broken = []
    for position, job in enumerate(jobs):
        spoiled = (1, 2) if position in (5, 8) else (1,)
        broken.append(type(job)(**{**job.__dict__, "shares": {**job.shares, **{x: 9 for x in spoiled}}}))
    for parallel_from in (2, 10**9):
        result = unmasking.unmask(broken, ring, parallel_from)
        assert result.failure is None and np.array_equal(result.total, expected)
        assert result.wrong == {p: ((1, 2) if p in (5, 8) else (1,)) for p in range(10)}
    # with no other secret to find holder 1 in, the two stay undecodable
    failed = unmasking.unmask([broken[5]], ring, 10**9)
    assert failed.failure.startswith("cannot") and "cannot tell which" in failed.failure
    # holders 1 to 3 wrong in job 7 as well: with 1 and 2 left out, five shares and one wrong is
    # detected but not located; the reason and the holders named are the same on one core or two
    broken[7] = type(jobs[7])(**{**jobs[7].__dict__, "shares": {**jobs[7].shares, 1: 9, 2: 9, 3: 9}})
    results = [unmasking.unmask(broken, ring, parallel_from) for parallel_from in (2, 10**9)]
    for result in results:
        assert list(result.failures) == [7] and result.failure.startswith("cannot rebuild the mask key of dropped "
                                                                          "site site-7")
        assert "left out: the shares of holder 1, holder 2" in result.failure
    assert results[0].failure == results[1].failure and results[0].wrong == results[1].wrong
    assert np.array_equal(results[0].total, results[1].total)


# -- secure sums with garbage holders ---------------------------------------------------------------

class InNameOrder(HararyArrangement):
    """The session's Harary graph with the identity arrangement: Shamir index i at position i - 1,
    and the indices go to the live sites in name order, so the ring is in the order of the site
    names (for the coordinator and for every site, which recomputes it: both call the protocol
    module's harary_by_index)."""

    def index_at(self, position: int) -> int:
        return position + 1

    def neighbours(self, index: int) -> frozenset[int]:
        if self.full:
            return super().neighbours(index)
        return frozenset((index - 1 + d) % self.count + 1 for d in range(-self.half, self.half + 1) if d != 0)


def garbage_sum(inputs, garbage, degree=None, drops=None, seed=0, mode="active"):
    """A secure sum through the codec (tests.test_secagg.secure_sum) where the sites in
    `garbage` answer unmask with a random field element for each share; `drops[phase]` stay
    silent from that phase on. The threshold is the mode's default: a strict majority of the
    k + 1 holders (semi-honest), more than two thirds of them (active)."""
    sites = sorted(inputs)
    k = len(sites) - 1 if degree is None else degree
    params = SecAggParams(BITS, LENGTH, k, default_threshold(k, mode), len(sites), mode)
    codec, rng = SecAggDDG(LENGTH), random.Random(seed)
    coordinator = SecureSumCoordinator(params, sites, np.random.default_rng(seed), {}, lambda aggregate: aggregate)
    identities = identities_in_memory(sites, semi_honest=mode == "semi-honest")
    halves = {s: SecureSumSite(s, lambda public, p, s=s: inputs[s], identity=identities[s]) for s in sites}
    gone, step = set(), coordinator.start()
    while isinstance(step, Send):
        gone |= (drops or {}).get(step.phase, set())
        answers, dropped = {}, {}
        for site, body in step.requests.items():
            if site in gone:
                dropped[site] = "no answer"
                continue
            kind, value = halves[site].answer(step.phase, body)
            if step.phase == "unmask" and site in garbage:
                value = {part: {v: share_to_bytes(rng.randrange(PRIME)) for v in shares} for part, shares in value.items()}
            answers[site] = codec.decode(codec.encode((kind, value)))
        step = coordinator.advance(step.phase, answers, dropped)
    return step, coordinator.server


@pytest.fixture
def ring_in_name_order(monkeypatch):
    monkeypatch.setattr(secagg_protocol, "harary_by_index", InNameOrder)


@pytest.mark.parametrize("mode", MODES)
def test_the_ring_in_name_order_is_the_graph_the_coordinator_and_every_site_use(ring_in_name_order, mode):
    """The fixture's graph is the one the session runs on: site-020's neighbours are the five
    names either side of it, and every site accepted them as its own (the sum went through)."""
    inputs = make_inputs(40, seed=2)
    result, server = garbage_sum(inputs, set(), degree=10, mode=mode)
    assert result.ok, result.reason
    assert np.array_equal(result.total, plaintext_sum(inputs, sorted(inputs)))
    assert server.neighbours["site-020"] == {f"site-{i:03d}" for i in range(15, 26)} - {"site-020"}


@pytest.mark.parametrize("mode", MODES)
def test_a_garbage_holder_in_a_full_graph_is_corrected_and_named(mode):
    """Eight sites, full graph (t = 5 semi-honest, 6 active: one wrong share of eight corrected
    either way): site-003 sends garbage
    for every share it holds; the sum is the plaintext sum of all eight (its own input was masked
    correctly, and stays in), and it is named for each of the eight secrets."""
    inputs = make_inputs(8, seed=1)
    result, _ = garbage_sum(inputs, {"site-003"}, mode=mode)
    assert result.ok, result.reason
    assert result.included == sorted(inputs)
    assert np.array_equal(result.total, plaintext_sum(inputs, sorted(inputs)))
    assert result.wrong_shares == {"site-003": sorted(inputs)}


@pytest.mark.parametrize("mode, degree", [("semi-honest", 10), ("active", 12)])
def test_a_garbage_holder_with_dropouts_in_a_sparse_graph(ring_in_name_order, mode, degree):
    """40 sites, a sparse graph: of degree 10 semi-honest (11 holders, t = 7: two wrong corrected,
    one once the two lost are left out), of degree 12 active (13 holders, t = 9: the same); two
    sites lost before masking (their pairwise masks rebuilt from shares of their keys) and
    site-020 sending garbage for every share, of seeds and of keys: the exact sum of the 38
    survivors, site-020 named for its own secret and those of its neighbours."""
    inputs = make_inputs(40, seed=2)
    lost = {"site-019", "site-023"}
    result, server = garbage_sum(inputs, {"site-020"}, degree=degree, drops={"mask": lost}, mode=mode)
    assert result.ok, result.reason
    survivors = sorted(set(inputs) - lost)
    assert result.included == survivors and np.array_equal(result.total, plaintext_sum(inputs, survivors))
    assert result.wrong_shares == {"site-020": sorted(server.neighbours["site-020"] | {"site-020"})}
    assert set(result.wrong_shares["site-020"]) >= lost  # the dropped sites' mask keys too


def test_too_many_garbage_holders_end_the_sum_naming_those_that_can_be_told(ring_in_name_order):
    """Twelve sites in a ring of degree 4 (5 holders, t = 3, the semi-honest mode's strict
    majority: one wrong share corrected; the active mode's t = 4 corrects none), sites
    004, 005 and 006 side by side sending garbage. 004 is found alone among site-002's holders
    and 006 among site-008's; 005 is never alone, and the secrets of 003 to 007 hold two or three
    of them (after leaving out 004 and 006, too few or uncheckable). The session ends; the reason
    names 004 and 006, says the rest cannot be told apart, and names no honest site."""
    inputs = make_inputs(12, seed=3)
    garbage = {"site-004", "site-005", "site-006"}
    result, _ = garbage_sum(inputs, garbage, degree=4, mode="semi-honest")
    assert not result.ok
    assert result.reason.startswith("cannot remove the self mask of site-003"), result.reason
    assert "cannot tell which" in result.reason
    assert "left out: the shares of site-004;" in result.reason
    assert result.reason.endswith("holders found sending wrong shares: site-004 (1 secret), site-006 (1 secret)")
    named = {s for s in inputs if s in result.reason and s != "site-003"}
    assert named == {"site-004", "site-006"}, result.reason
    assert result.wrong_shares == {"site-004": ["site-002"], "site-006": ["site-008"]}


def test_two_garbage_holders_of_five_cannot_be_told_apart():
    """Five sites, full graph (t = 3, semi-honest): two garbage holders leave three honest shares
    per secret, and any three shares lie on a polynomial of degree 2: no decoder can tell which
    two are wrong, and the abort says so without naming anyone."""
    inputs = make_inputs(5, seed=4)
    result, _ = garbage_sum(inputs, {"site-000", "site-004"}, mode="semi-honest")
    assert not result.ok and "cannot tell which" in result.reason
    assert not any(s in result.reason for s in sorted(inputs)[1:4])
    assert result.wrong_shares == {}


@pytest.mark.parametrize("mode, m", [("semi-honest", 5), ("active", 7)])
def test_a_method_session_with_a_garbage_holder_completes_and_names_it(mode, m):
    """The ddg_quantile method in-process (the driver's decode step, the method's own finish):
    site-0 answers unmask with garbage inside the field (the issue's case had one silent holder
    as well; here the m holders leave one to correct: t = 3 of 5 semi-honest, 5 of 7 active).
    The session is ok, its reason and details name site-0, and the threshold is the one without
    garbage: epsilon this weak leaves the noise no room to move it off the noiseless bin, so a
    wrong sum would show."""
    from protocol.noise import PrivacyNoise

    bins = {"lo": 0.0, "hi": 4.0, "count": 16}
    rng = np.random.default_rng(3)
    sites = [f"site-{j}" for j in range(m)]
    scores = {s: rng.uniform(0, 4, 30) for s in sites}
    outcomes = {}
    secagg = {"graph": "full", **({"mode": mode} if mode != "active" else {})}  # active: the default
    for garbage in (set(), {"site-0"}):
        method = METHODS["ddg_quantile"](0.1, epsilon=5000.0, bins=bins, count="exact", secagg=secagg)
        halves = {s: type(method).site(scores[s], PrivacyNoise(), s) for s in sites}
        # as protocol.inprocess.run_session does, with a policy that takes the semi-honest mode there
        for s, identity in identities_in_memory(sites, semi_honest=mode == "semi-honest").items():
            halves[s].identity = identity
        shares = random.Random(1)

        def ask(site, phase, body):
            encoder, request = CODECS[method.codec].for_site(body)
            kind, value = halves[site].answer(phase, request)
            if phase == "unmask" and site in garbage:
                value = {part: {k: share_to_bytes(shares.randrange(PRIME)) for k in v} for part, v in value.items()}
            return encoder.encode((kind, value))

        outcomes[bool(garbage)] = drive(method, {s: 30 for s in sites}, ask, np.random.default_rng(0))
    clean, spoiled = outcomes[False], outcomes[True]
    assert clean.status == spoiled.status == "ok", spoiled.reason
    assert spoiled.details["bin"] == clean.details["bin"] and spoiled.details["answered"] == m
    assert spoiled.details["wrong_shares"] == {"site-0": sites}
    assert "unmask shares from site-0 were off the other holders' polynomial" in spoiled.reason
    assert "wrong_shares" not in clean.details and "site-0" not in clean.reason


def test_over_site_processes_a_flipped_share_is_corrected_and_named(tmp_path):
    """Seven site processes, full graph (the active mode's t = 5 of seven holders: one wrong share
    corrected; of six, t = 5 would correct none): site-002's unmask answer has one byte of a
    share flipped on its way out (a scripted `corrupt` fault, mode content: the message
    otherwise well formed). The session is ok with the survivors' exact sum (the noiseless
    threshold: epsilon 5000 leaves the noise no room), and results.csv's details and the
    session_end event name site-002."""
    import json

    from runner.outputs import RunDirectory
    from runner.study import run_study
    from scenarios.scenario import validate_scenario
    from tests.test_secagg_runtime import noiseless_threshold, scenario

    spec = scenario([{"action": "corrupt", "mode": "content", "sites": "site-002", "phase": "unmask"}])
    spec = validate_scenario({**spec, "sites": {**spec["sites"], "count": 7}})
    run_study(spec, tmp_path)
    (row,) = RunDirectory(tmp_path).read_results()
    assert row["status"] == "ok" and int(row["answered"]) == 7, row["reason"]
    everyone = [f"site-{i:03d}" for i in range(7)]
    assert float(row["threshold"]) == pytest.approx(noiseless_threshold(spec, everyone), abs=0)
    assert set(json.loads(row["details"])["wrong_shares"]) == {"site-002"}
    (end,) = [e for e in map(json.loads, (tmp_path / "events.jsonl").read_text().splitlines())
              if e["event"] == "session_end"]
    assert end["status"] == "ok" and "unmask shares from site-002 were off" in end["reason"]
