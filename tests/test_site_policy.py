"""Issue 35: privacy that holds against the coordinator, at the site.

Noise that protects a release comes from the OS CSPRNG, so a coordinator that replays the site's
Generator from the scenario seed predicts nothing (with the policy's explicit `noise: seeded`,
it predicts everything, and the outputs say so); the site's policy, not the study, decides what
it serves; a session belongs to its first method; a K-anonymous join cannot be turned into a
locator by a fabricated table.
"""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from protocol.codecs import CODECS
from protocol.methods import RequestError
from protocol.methods.kanon_table import KAnonTableSite, table_request
from protocol.noise import NOT_PRIVATE, PrivacyNoise
from protocol.policy import SitePolicy
from runner.outputs import RunDirectory
from runner.study import run_study
from scenarios.scenario import load_site_policy, validate_scenario
from quorum import load_scenario
from sites.local import SiteLocal
from specs.schema import ScenarioError
from stats.dp import Bins, exponential_mechanism_log_probabilities
from stats.kanon import check_release, first_release, join_release
from stats.randomness import site_rng
from tests.support import TINY

BINS = {"lo": 0.0, "hi": 4.0, "count": 40}


def bin_probabilities(scores, bins: Bins, level: float, epsilon: float) -> np.ndarray:
    """The exponential mechanism's output distribution (stats.dp.private_quantile_bin)."""
    histogram = np.bincount(bins.index_of(scores), minlength=bins.count)
    return np.exp(exponential_mechanism_log_probabilities(histogram, level, epsilon))


UNLIMITED = {"epsilon": "unlimited"}  # statistical tests of one mechanism ask it hundreds of times


def site(tmp_path, policy=None, budget=None, scores=None, name="site-000", trial=0, seed=7):
    local = SiteLocal(name, tmp_path, budget=budget, policy=policy)
    local.hold(trial, seed, np.linspace(0.05, 3.95, 60) if scores is None else scores)
    return local


def exp_mech(local, session=0, epsilon=1.0, level=0.5):
    body = CODECS["exp_mech_bins"]().wrap_request({"level": level, "epsilon": epsilon, "bins": BINS})
    return CODECS["exp_mech_bins"](count=BINS["count"]).decode(local.answer(session, "fedcp2_qq", "respond", body))


# -- noise nobody can replay -----------------------------------------------------------------------


def test_privacy_noise_is_uniform_and_not_seedable():
    """53-bit uniforms from os.urandom: Kolmogorov-Smirnov against U(0, 1) (false alarm 1e-6), and
    two fresh sources never agree."""
    draws = PrivacyNoise().random(20_000)
    assert stats.kstest(draws, "uniform").pvalue > 1e-6
    assert 0 <= draws.min() and draws.max() < 1
    assert not np.array_equal(PrivacyNoise().random(8), PrivacyNoise().random(8))
    assert 2.0 <= PrivacyNoise().uniform(2.0, 3.0) < 3.0


def test_a_coordinator_that_replays_the_seed_predicts_the_release_only_when_the_policy_says_seeded(tmp_path):
    """The attack of issue 35: the coordinator knows (seed, trial, session, site id), recomputes the
    site's uniform draw u = site_rng(...).random() and inverts the exponential mechanism's CDF at u.
    Under `noise: seeded` that predicts every release; from the OS CSPRNG the prediction is right
    only as often as two independent draws of the mechanism agree (sum of p_i^2), within 5 binomial
    standard deviations over 300 sessions."""
    scores = np.linspace(0.05, 3.95, 60)
    probabilities = bin_probabilities(scores, Bins(**BINS), 0.5, 1.0)
    cdf = np.cumsum(probabilities)

    def replayed(session):
        u = site_rng(7, 0, session, "site-000").random()
        return int(min(np.searchsorted(cdf, u, side="right"), BINS["count"] - 1))

    for noise, expect_all in (("seeded", True), ("os", False)):
        local = site(tmp_path / noise, policy={"noise": noise}, scores=scores, budget=UNLIMITED)
        hits = sum(exp_mech(local, session=s) == replayed(s) for s in range(300))
        if expect_all:
            assert hits == 300
        else:
            p = float(np.sum(probabilities ** 2))
            assert abs(hits - 300 * p) <= 5 * np.sqrt(300 * p * (1 - p)) + 1


def test_os_noise_releases_follow_the_mechanism():
    """The exponential mechanism with OS noise still releases bin i with probability p_i (chi-square,
    false alarm 1e-6): the defence changes who can predict the draw, not its distribution."""
    from stats.dp import private_quantile_bin

    scores = np.linspace(0.05, 3.95, 60)
    noise = PrivacyNoise()
    answers = np.array([private_quantile_bin(scores, Bins(**BINS), 0.5, 1.0, noise) for _ in range(3000)])
    probabilities = bin_probabilities(scores, Bins(**BINS), 0.5, 1.0)
    expected = probabilities * answers.size
    observed = np.bincount(answers, minlength=BINS["count"])
    keep = expected > 5
    chi2 = (((observed - expected) ** 2) / expected)[keep].sum() + ((observed[~keep].sum() - expected[~keep].sum()) ** 2
                                                                     / max(expected[~keep].sum(), 1e-9))
    assert stats.chi2.sf(chi2, keep.sum()) > 1e-6


def test_the_same_scenario_twice_gives_different_private_and_identical_non_private_releases(tmp_path):
    """Run TINY twice in-process: fedcp2_qq's thresholds (exponential-mechanism bins from the OS
    CSPRNG) differ between the runs, FedCP-QQ's and the centralized thresholds are identical; with
    `noise: seeded` every column repeats, and results.csv, privacy.csv, summary.json and the
    terminal line say the releases are not private."""
    def thresholds(out, policy):
        raw = load_scenario(TINY, ["trials=2"]).to_dict()
        raw["sites"]["policy"] = policy
        spec = validate_scenario(raw)
        summary = run_study(spec, out, backend="inprocess")
        rows = RunDirectory(out).read_results()
        return {(r["trial"], r["method"]): r["threshold"] for r in rows}, rows, summary

    allow = {"non_private": "allow", "max_epsilon": 5}  # TINY's fedcp2_qq asks epsilon 5 (its budget is 8)
    first, _, _ = thresholds(tmp_path / "a", allow)
    second, _, _ = thresholds(tmp_path / "b", allow)
    private = [key for key in first if key[1] in ("fedcp2_qq", "private_cp_local", "private_cp")]
    public = [key for key in first if key[1] in ("fedcp_qq", "centralized", "fedcp_avg")]
    assert all(first[key] == second[key] for key in public)
    assert any(first[key] != second[key] for key in private)  # P(all equal by chance) < 1e-6 here

    seeded = {**allow, "noise": "seeded"}
    third, rows, summary = thresholds(tmp_path / "c", seeded)
    fourth, _, _ = thresholds(tmp_path / "d", seeded)
    assert third == fourth
    assert all(r["noise"] == NOT_PRIVATE for r in rows)
    privacy = list(csv.DictReader(open(tmp_path / "c" / "privacy.csv")))
    assert privacy and all(r["noise"] == NOT_PRIVATE for r in privacy if r["releases"] != "0")
    written = json.loads((tmp_path / "c" / "summary.json").read_text())["privacy"]
    assert written["noise"] == "seeded" and written["warning"] == NOT_PRIVATE
    from runner.privacy import privacy_line

    assert privacy_line(summary["privacy"]).startswith("WARNING: " + NOT_PRIVATE)
    assert summary["privacy"]["noise"] == "seeded"
    _, os_rows, os_summary = thresholds(tmp_path / "e", allow)
    assert all(r["noise"] == "os" for r in os_rows) and "warning" not in os_summary["privacy"]


def test_a_trusted_curators_release_does_not_replay_from_the_seed():
    """private_cp's curator (the coordinator) releases an exponential-mechanism bin of the pooled
    scores: 40 sessions with the same seeded coordinator Generator give several thresholds (the
    noise is the OS CSPRNG's; P(all equal) < 1e-9 here), and the explicit seeded mode repeats one."""
    from protocol.inprocess import run_session
    from protocol.methods import METHODS
    from protocol.noise import SeededNoise, coordinator_rng

    rng = np.random.default_rng(4)
    scores = {f"site-{j}": rng.exponential(1.0, 30) for j in range(4)}
    method = METHODS["private_cp"](0.1, epsilon=0.5, bins={"lo": 0.0, "hi": 6.0, "count": 40})

    def threshold(seeded):
        return run_session(method, scores, lambda name: coordinator_rng(np.random.default_rng(9), seeded)).threshold

    assert len({threshold(False) for _ in range(40)}) > 1
    assert len({threshold(True) for _ in range(40)}) == 1
    assert isinstance(coordinator_rng(np.random.default_rng(9), True), SeededNoise)


# -- a policy that belongs to the site -------------------------------------------------------------


def test_a_site_refuses_raw_scores_by_default_whatever_it_refused_before(tmp_path):
    """A site whose budget refused fedcp2_qq is then asked for centralized (every raw score) and
    private_cp: refused by its policy, named in its account; with non_private: allow it answers."""
    local = site(tmp_path, budget={"epsilon": 0.5})
    with pytest.raises(RequestError, match="privacy budget"):
        exp_mech(local, session=0, epsilon=1.0)
    raw = CODECS["raw_scores"]().wrap_request({})
    for session, method in ((1, "centralized"), (2, "private_cp")):
        with pytest.raises(RequestError, match="site policy: .* no formal privacy"):
            local.answer(session, method, "respond", raw)
    reasons = [r["reason"] for r in local.account.records if r["kind"] == "refused"]
    assert len(reasons) == 3 and all("site policy" in r for r in reasons[1:])
    allowing = site(tmp_path / "allow", policy={"non_private": "allow"})
    assert len(CODECS["raw_scores"]().decode(allowing.answer(1, "centralized", "respond", raw))) == 60


@pytest.mark.parametrize("policy,request_kind,match", [
    ({"methods": ["fedcp_qq"]}, "exp_mech", "answers only fedcp_qq"),
    ({"max_epsilon": 2.0}, "exp_mech_eps5", "above this site's largest"),
    ({"min_k": 20}, "table_k10", "below the smallest K"),
    ({"min_contributors": 50}, "shuffle_10", "planned for 10 input"),
])
def test_each_policy_limit_refuses_and_names_itself(tmp_path, policy, request_kind, match):
    local = site(tmp_path, policy=policy, scores=np.column_stack([np.linspace(0, 1, 60), np.arange(60) % 2])
                 if request_kind.startswith("table") else None)
    if request_kind == "exp_mech":
        call = lambda: exp_mech(local)
    elif request_kind == "exp_mech_eps5":
        call = lambda: exp_mech(local, epsilon=5.0)
    elif request_kind == "table_k10":
        body = {**table_request(10, "buffer", []), "limits": []}
        call = lambda: local.answer(0, "mwu_table", "table-0", CODECS["summary"]().wrap_request(body))
    else:
        body = {"level": 0.5, "epsilon": 3.0, "bins": BINS, "central": {"epsilon": 3.0, "delta": 1e-6, "messages": 10}}
        from protocol.codecs.exp_mech_bins import ExpMechBins
        from protocol.codecs.shuffle import Shuffle

        wrapped = Shuffle(ExpMechBins(BINS["count"])).wrap_request(body)
        call = lambda: local.answer(0, "fedcp2_qq_shuffle", "respond", wrapped)
    with pytest.raises(RequestError, match=match):
        call()
    assert local.account.records[-1]["kind"] == "refused" and "site policy" in local.account.records[-1]["reason"]


def test_a_session_never_changes_its_method(tmp_path):
    """A second method asked in the same session is refused (it was answered by the first
    method's half and booked as free), even after the session was closed."""
    local = site(tmp_path, policy={"non_private": "allow"})
    exp_mech(local, session=3)
    with pytest.raises(RequestError, match="belongs to fedcp2_qq"):
        local.answer(3, "centralized", "respond", CODECS["raw_scores"]().wrap_request({}))
    local.close_session(3)
    with pytest.raises(RequestError, match="belongs to fedcp2_qq"):
        local.answer(3, "fedcp_qq", "respond", CODECS["raw_quantile"]().wrap_request({"ell": 3}))
    assert local.answer(4, "fedcp_qq", "respond", CODECS["raw_quantile"]().wrap_request({"ell": 3}))


def test_a_scenario_asking_what_the_policy_refuses_fails_validation():
    raw = load_scenario(TINY).to_dict()
    raw["sites"]["policy"] = {"non_private": "refuse", "max_epsilon": 0.5}
    with pytest.raises(ScenarioError) as caught:
        validate_scenario(raw)
    fields = {p.field for p in caught.value.problems}
    labels = [m["label"] for m in raw["methods"]]
    for name in ("fedcp_qq", "centralized", "fedcp2_qq"):  # raw, raw, epsilon 1 > 0.5
        assert f"methods[{labels.index(name)}]" in fields
    assert "site policy" in str(caught.value)


def test_a_site_operators_policy_file_is_validated_with_file_and_field(tmp_path):
    good = tmp_path / "policy.yaml"
    good.write_text("min_k: 11\nnon_private: allow\nbudget: {epsilon: 4}\n")
    policy, budget = load_site_policy(good)
    assert SitePolicy.from_spec(policy).min_k == 11 and budget["epsilon"] == 4
    bad = tmp_path / "bad.yaml"
    bad.write_text("min_k: 1\nnoise: replay\n")
    with pytest.raises(ScenarioError) as caught:
        load_site_policy(bad)
    assert "bad.yaml" in str(caught.value) and {p.field for p in caught.value.problems} >= {"min_k", "noise"}


# -- K-anonymous requests that cannot pin a point --------------------------------------------------


def fabricated(values, width):
    """A coordinator's table: narrow bins of `width` over the data's range (the attack)."""
    lo, hi = float(np.min(values)) - 1.0, float(np.max(values)) + 1.0
    return list(np.arange(lo, hi + width, width))


def test_a_fabricated_table_of_narrow_bins_locates_no_value():
    """The attack: 40,000 bins of width 1e-4 over the site's range. The release has no empty cell,
    every cell holds at least K values, and the limit that closes a cell is drawn uniformly from
    the table's limits in the gap after the cell's last value, so over 400 releases the closing
    limit of the first cell is spread over that gap (chi-square against uniform, false alarm 1e-6)
    instead of sitting at the first limit past the K-th value (the paper's rule)."""
    rng = np.random.default_rng(3)
    values = np.sort(np.round(rng.uniform(0, 3, 40), 3))
    limits = fabricated(values, 1e-4)
    k = 5
    closing = []
    for _ in range(400):
        release = join_release(limits, [values], k, PrivacyNoise())
        check_release(release, [values], k, public_limits=limits, joined=True)
        cells = release.cells[0]
        assert all(count >= k for _, _, count in cells)
        closing.append(release.limits[cells[0][1] + 1])
    v_k, v_next = values[k - 1], values[k]
    inside = [c for c in limits if v_k <= c < v_next]
    assert all(v_k <= c < v_next for c in closing)
    if len(inside) >= 10:
        counts = np.histogram(closing, bins=5, range=(min(inside), max(inside) + 1e-12))[0]
        assert stats.chisquare(counts).pvalue > 1e-6


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=3, max_size=60),
       st.lists(st.floats(-120, 120, allow_nan=False), min_size=2, max_size=400, unique=True),
       st.integers(2, 8), st.sampled_from(["buffer", "infinite", "bounds"]))
def test_any_table_gives_a_release_with_no_empty_cell_and_no_cell_under_k(values, table, k, extremes):
    """Whatever table a coordinator sends (any limits, any widths), the joining site's release
    passes the invariant: cells of at least K values, no empty cell unless the group is empty, no
    limit of its own equal to a value; declared bounds equal to values are released."""
    values = np.array(values)
    bounds = (float(values.min()), float(values.max())) if extremes == "bounds" and values.min() < values.max() else None
    if extremes == "bounds" and bounds is None:
        return
    table = sorted(table)
    site_half = KAnonTableSite([values], PrivacyNoise())
    body = {**table_request(k, extremes, list(bounds or [])), "limits": table}
    try:
        site_half.answer("table-0", body)
    except RequestError as exc:
        assert "fewer than K" in str(exc) or "nothing can be released" in str(exc) or values.size < k, str(exc)
        return
    release = join_release(table, [values], k, PrivacyNoise(), extremes, bounds)
    check_release(release, [values], k, public_limits=[*table, *(bounds or ())], joined=True)


def test_declared_bounds_equal_to_data_values_are_released():
    """Issue 20's leftover: bounds are public limits, so values equal to them are no reason to refuse."""
    values = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.0])
    half = KAnonTableSite([values], PrivacyNoise())
    first = half.answer("table-0", {**table_request(3, "bounds", [0.0, 5.0]), "limits": []})
    assert first["limits"][0] == 0.0 and first["limits"][-1] == 5.0
    joined = half.answer("table-1", {**table_request(3, "bounds", [0.0, 5.0]), "limits": [0.0, 2.5, 5.0]})
    assert list(joined["limits"][[0, -1]]) == [0.0, 5.0]
    assert first_release([values], 3, PrivacyNoise(), "bounds", (0.0, 5.0)).limits[0] == 0.0


# -- claims checked where the protocol lets them be -----------------------------------------------


class FakeSecAggClient:  # the SecAgg client after `share`: its parameters and peers
    def __init__(self, peers, sites):
        from protocol.secagg.graph import default_threshold
        from protocol.secagg.protocol import SecAggParams

        self.peers = {f"site-{i}": {} for i in range(peers)}
        self.params = SecAggParams(8, 4, peers, default_threshold(peers, "active"), sites)

    def answer(self, phase, body):
        return {"b": {}, "s": {}}


#: the phase whose request names the survivors: consistency in the active mode (the site signs
#: the set, and the unmask request carries signatures only), unmask in the semi-honest one
SURVIVOR_PHASES = ["consistency", "unmask"]


@pytest.mark.parametrize("phase", SURVIVOR_PHASES)
def test_a_secure_sum_site_refuses_to_unmask_fewer_survivors_than_it_booked(phase):
    """The coordinator claims (and the site books) a sum over 5 noisy inputs, then names only 3
    survivors in the request that names them: under a full graph (the parameters say 5 sites,
    degree 4) the site sees every survivor and refuses; under a sparse graph (100 sites) the
    global count is beyond its sight and is not refused here (its policy decides: the next test)."""
    from protocol.accounting import Spend
    from protocol.methods.secure_sum import SecureSumSite
    from protocol.secagg.protocol import ANSWER_KIND, SHORT_OF_CLAIM

    half = SecureSumSite("site-x", lambda public, params: None)
    half.claimed, half.client = 5, FakeSecAggClient(4, 5)
    with pytest.raises(RequestError, match=rf"only 3 survivors named, {re.escape(SHORT_OF_CLAIM)} .*\(5\)"):
        half.answer(phase, {"survivors": ["a", "b", "c"], "dropped": []})
    assert half.answer(phase, {"survivors": list("abcde"), "dropped": []})[0] == ANSWER_KIND[phase]
    sparse = SecureSumSite("site-y", lambda public, params: None)
    sparse.claimed, sparse.client = 50, FakeSecAggClient(4, 100)
    assert sparse.answer(phase, {"survivors": list("abc"), "dropped": []})[0] == ANSWER_KIND[phase]
    checked = SecureSumSite("site-z", lambda public, params: None, check=lambda public: Spend("dp", 1.0, 1e-6,
                                                                                             contributors=7))
    with pytest.raises(RequestError, match="secure-aggregation parameters"):
        checked.answer("advertise", {"params": {}, "nonce": 1, "method": {}})
    assert checked.claimed == 7  # booked from the method's own check, before any key is made


def test_a_sealed_answer_claims_what_the_site_booked_and_the_key_it_sealed_to(tmp_path):
    """SiteLocal.sealing_claim: the messages the site's spend was planned for, the digest of
    the request's seal_to key and the request digest of the question it answers, which the
    shuffler compares across the batch."""
    from protocol.codecs.exp_mech_bins import ExpMechBins
    from protocol.methods import METHODS
    from protocol.codecs.shuffle import Shuffle
    from protocol.shuffle import sealing_claim

    coordinator = Shuffle(ExpMechBins(BINS["count"]))
    body = coordinator.wrap_request({"level": 0.5, "epsilon": 3.0, "bins": BINS,
                                     "central": {"epsilon": 3.0, "delta": 1e-6, "messages": 12}})
    claim = SiteLocal.sealing_claim("fedcp2_qq_shuffle", "respond", body)
    question = METHODS["fedcp2_qq_shuffle"].sealed_digest("respond", body)
    assert claim == sealing_claim(12, coordinator.public_key, question) and len(question) == 32


@pytest.mark.parametrize("phase", SURVIVOR_PHASES)
def test_a_claim_beyond_the_sites_sight_is_trusted_or_refused_as_its_policy_says(tmp_path, phase):
    """A secure sum over a sparse graph (100 sites, degree 4) claimed for 50 inputs where the site
    sees 5 survivors (itself and 4 neighbours): the global count is the coordinator's word.
    `unseen_claims: trust` (default) answers; `refuse` refuses before unmasking, naming the claim."""
    from protocol.methods.secure_sum import SecureSumSite

    for policy, refused in (("trust", False), ("refuse", True)):
        local = site(tmp_path / policy, policy={"unseen_claims": policy})
        half = SecureSumSite("site-000", lambda public, params: None)
        half.claimed, half.client = 50, FakeSecAggClient(4, 100)
        local._owners[7], local._halves[7] = "ddg_quantile", ("ddg_quantile", half)
        body = {"survivors": [f"s{i}" for i in range(5)], "dropped": []}
        if refused:
            with pytest.raises(RequestError, match="claimed for 50 inputs, more than the 5 survivors this site can see"):
                local.answer(7, "ddg_quantile", phase, body)
            assert "unseen_claims: refuse" in local.account.records[-1]["reason"]
        else:
            assert local.answer(7, "ddg_quantile", phase, body) is not None


@pytest.mark.parametrize("mode", ["active", "semi-honest"])
def test_a_secure_sum_whose_parameters_do_not_say_how_many_sites_were_asked_is_refused(mode):
    """Red team round 3, issue 48: `sites: 0` ("not said") switched off the check of a claim
    against the sites asked and made a full graph look sparse; every honest session says m."""
    from protocol.accounting import Spend
    from protocol.methods.secure_sum import SecureSumSite
    from protocol.secagg.graph import default_threshold
    from protocol.secagg.identity import identities_in_memory
    from protocol.secagg.protocol import SecAggParams

    identity = identities_in_memory(["site-000"], semi_honest=mode == "semi-honest")["site-000"]
    # 9 peers of 10 sites is the full graph; said as 0 sites, an odd degree would be refused as a
    # sparse graph's before the count is looked at: 8 there
    for nonce, (sites, degree, refused) in enumerate(((0, 8, "do not say how many sites"),
                                                      (10, 9, "more than the 10 sites the session asked"))):
        half = SecureSumSite("site-000", lambda public, params: None,
                             check=lambda public: Spend("dp", 1.0, 1e-6, contributors=1000),
                             identity=identity)
        params = SecAggParams(16, 4, degree, default_threshold(degree, mode), sites, mode).as_body()
        with pytest.raises(RequestError, match=refused):
            half.answer("advertise", {"params": params, "nonce": nonce, "method": {}})
