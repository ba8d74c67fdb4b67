"""Accounting over rounds (issue 49, point 2): zCDP per round of private federated training, the
rounds composed in zCDP and converted once, amplification by subsampling through dp_accounting
(protocol.rounds_privacy), and a site's account that books zCDP spends beside (epsilon, delta) ones
(protocol.accounting, protocol.policy)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy.special import comb

import dp_accounting
from dp_accounting.pld import common, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from protocol.accounting import Budget, BudgetExceeded, SiteAccount, Spend, pld_composition, record_ids
from protocol.policy import SitePolicy
from sites.storage import append_account, read_account
from stats import ddg
from protocol import rounds_privacy as rp

# paper 001 appendix B.3: 1,000 rounds, 100 of n = 2,500 clients a round, delta = 1/n
ROUNDS, SAMPLE, POPULATION, DELTA = 1000, 100, 2500, 1 / 2500


def dp_accounting_epsilon(event, delta, relation=None, orders=None):
    """dp_accounting's own RdpAccountant, independently of protocol.rounds_privacy."""
    kwargs = {} if relation is None else {"neighboring_relation": relation}
    accountant = rdp.RdpAccountant(orders=orders, **kwargs)
    accountant.compose(event)
    return accountant.get_epsilon(delta)


# -- one round: claim 13 corrected ---------------------------------------------------------------


def test_claim_13_corrected_the_gaussian_term_is_c2_over_2_sigma2_not_the_printed_inverse():
    clip, sigma = 1.1, 40.0
    assert rp.gaussian_sum_rho(clip, sigma) == clip**2 / (2 * sigma**2)
    printed = sigma**2 / (2 * clip**2)  # claim 13 as printed: more noise would cost more privacy
    assert printed > 1e6 * rp.gaussian_sum_rho(clip, sigma)
    assert rp.gaussian_sum_rho(clip, 2 * sigma) == pytest.approx(rp.gaussian_sum_rho(clip, sigma) / 4)
    # algorithm 4 line 12 puts sigma_w on the average of m(t) updates: the same as m(t) sigma_w on the sum
    assert rp.gaussian_average_rho(clip, 0.5, 40) == pytest.approx(rp.gaussian_sum_rho(clip, 40 * 0.5))
    eps_q = ddg.histogram_concentrated_epsilon(1, 100, 18.0, 32, True)
    assert rp.ddg_rho(eps_q) == pytest.approx(eps_q**2 / 2)
    assert rp.quantile_round_rho(1, 100, 18.0, 32, True) == pytest.approx(eps_q**2 / 2)
    assert rp.round_rho(0.25, 1.0) == 1.25  # zCDP adds


# -- over rounds: against dp_accounting and by hand ------------------------------------------------


@pytest.mark.parametrize("rho,rounds,delta", [(0.5, 1, 1e-5), (1e-3, 1000, 1 / 2500), (0.02, 30, 1e-6)])
def test_no_sampling_is_the_plain_zcdp_conversion_by_both_routes(rho, rounds, delta):
    ours = rp.rounds_epsilon(rho, rounds, delta)
    assert ours == pytest.approx(ddg.zcdp_to_approx_dp(rounds * rho, delta), rel=2e-4)
    # dp_accounting's ZCDpEvent composed `rounds` times, on its default orders (coarser: never below ours)
    theirs = dp_accounting_epsilon(dp_accounting.SelfComposedDpEvent(dp_accounting.ZCDpEvent(rho), rounds), delta)
    assert ours <= theirs + 1e-12 and theirs == pytest.approx(ours, rel=0.02)
    # by hand: min over a > 1 of a R + log((a - 1) / a) - (log delta + log a) / (a - 1), R = rounds rho
    a = 1 + np.geomspace(1e-3, 1e5, 400_000)
    total = rounds * rho
    hand = float(np.min(a * total + np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)))
    assert ours == pytest.approx(hand, rel=1e-4)


def test_the_gaussian_bound_is_dp_accountings_own_sampled_gaussian():
    rho = 2e-3
    sigma = 1 / math.sqrt(2 * rho)
    poisson = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(SAMPLE / POPULATION, dp_accounting.GaussianDpEvent(sigma)), ROUNDS)
    assert rp.rounds_epsilon(rho, ROUNDS, DELTA, "poisson", SAMPLE, POPULATION, bound="gaussian") == \
        pytest.approx(dp_accounting_epsilon(poisson, DELTA), rel=1e-12)
    # without replacement: replace-one neighbours, sensitivity 2C, so noise multiplier sigma / 2
    wor = dp_accounting.SelfComposedDpEvent(dp_accounting.SampledWithoutReplacementDpEvent(
        POPULATION, SAMPLE, dp_accounting.GaussianDpEvent(sigma / 2)), ROUNDS)
    assert rp.rounds_epsilon(rho, ROUNDS, DELTA, "without_replacement", SAMPLE, POPULATION, bound="gaussian") == \
        pytest.approx(dp_accounting_epsilon(wor, DELTA, dp_accounting.NeighboringRelation.REPLACE_ONE), rel=1e-12)
    # dp_accounting 0.6.0 has the with-replacement event but no accountant for it
    accountant = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    assert not accountant.supports(dp_accounting.SampledWithReplacementDpEvent(
        POPULATION, SAMPLE, dp_accounting.GaussianDpEvent(sigma)))


@pytest.mark.parametrize("rho", [1e-4, 1e-3, 3e-2])
def test_the_generic_poisson_curve_is_dp_accountings_first_direction_or_the_second_by_hand(rho):
    """Integer orders: the larger of dp_accounting's sampled-Gaussian moment (D(R || P)) and the
    Taylor bound of D(P || R); at order 2 both by hand."""
    q = SAMPLE / POPULATION
    orders, curve = rp.round_curve(rho, "poisson", SAMPLE, POPULATION)
    integer = [i for i, a in enumerate(orders) if float(a).is_integer()]
    accountant = rdp.RdpAccountant(orders=[float(orders[i]) for i in integer])
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1 / math.sqrt(2 * rho))))
    gaussian = accountant.rdp
    a = orders[integer]
    second = np.log1p(comb(a, 2) * q**2 * (1 - q) ** -(a + 1) * math.expm1(2 * rho)) / (a - 1)
    expected = np.minimum(np.maximum(gaussian, second), a * rho)
    np.testing.assert_allclose(curve[integer], expected, rtol=1e-9)
    order2 = list(orders).index(2)
    assert curve[order2] == pytest.approx(max(math.log1p(q**2 * math.expm1(2 * rho)),
                                              math.log1p(q**2 * (1 - q) ** -3 * math.expm1(2 * rho))), rel=1e-9)
    assert np.all(curve[: order2] == curve[order2])  # orders below 2 take order 2's value


def test_without_and_with_replacement_by_hand_at_order_2():
    rho, q = 1e-3, SAMPLE / POPULATION
    orders, wor = rp.round_curve(rho, "without_replacement", SAMPLE, POPULATION)
    i = list(orders).index(2)
    r = 4 * rho  # a replaced client: 4 rho-zCDP
    theorem9 = math.log(1 + q**2 * min(4 * math.expm1(2 * r), 2 * math.exp(2 * r)))
    convexity = math.log(1 - q + q * math.exp(2 * r))
    assert wor[i] == pytest.approx(min(theorem9, convexity), rel=1e-9)
    most, tail = rp.copies_bound(SAMPLE, POPULATION, ROUNDS, DELTA)
    assert tail <= DELTA / 10 and most < SAMPLE
    _, wr = rp.round_curve(rho, "with_replacement", SAMPLE, POPULATION, most)
    k = np.arange(most + 1)
    w = comb(SAMPLE, k) * (1 / POPULATION) ** k * (1 - 1 / POPULATION) ** (SAMPLE - k)
    assert wr[i] == pytest.approx(math.log(np.sum(w * np.exp(2 * 4 * k**2 * rho)) / np.sum(w)), rel=1e-9)


@pytest.mark.parametrize("rho", [1e-5, 1e-4, 1e-3, 1e-2])
def test_subsampling_amplifies_and_the_sampling_kinds_are_ordered(rho):
    eps = {s: rp.rounds_epsilon(rho, ROUNDS, DELTA, s, SAMPLE, POPULATION) for s in rp.SAMPLINGS}
    replaced = rp.rounds_epsilon(4 * rho, ROUNDS, DELTA)  # no sampling, a client replaced
    # Poisson (a client added or removed) below no sampling; the fixed-size kinds (a client
    # replaced) below no sampling of replaced clients, with replacement (duplicates) the weakest
    assert eps["poisson"] < eps["none"]
    assert eps["poisson"] < eps["without_replacement"] <= eps["with_replacement"] < replaced
    # the generic bounds never claim more than dp_accounting's sampled Gaussian
    assert eps["poisson"] >= rp.rounds_epsilon(rho, ROUNDS, DELTA, "poisson", SAMPLE, POPULATION, bound="gaussian")
    assert eps["without_replacement"] >= rp.rounds_epsilon(rho, ROUNDS, DELTA, "without_replacement", SAMPLE,
                                                           POPULATION, bound="gaussian") - 1e-9
    assert rp.rounds_epsilon(rho, ROUNDS, DELTA, "poisson", POPULATION, POPULATION) == pytest.approx(eps["none"],
                                                                                                      rel=0.01)


def test_sampling_never_costs_more_than_the_rounds_themselves_even_at_large_rho():
    for rho in (1.0, 10.0):
        plain = rp.rounds_epsilon(rho, 10, 1e-5)
        assert rp.rounds_epsilon(rho, 10, 1e-5, "poisson", 10, 100) <= plain
        assert rp.rounds_epsilon(rho, 10, 1e-5, "without_replacement", 10, 100) <= rp.rounds_epsilon(4 * rho, 10, 1e-5)


@pytest.mark.parametrize("sampling", ["poisson", "without_replacement", "none"])
@pytest.mark.parametrize("ratio", [0.0, 0.25])
@pytest.mark.parametrize("target", [3.0, 10.0])
def test_sigma_for_epsilon_round_trips(sampling, ratio, target):
    started = time.perf_counter()
    plan = rp.sigma_for_epsilon(target, DELTA, ROUNDS, 1.1, SAMPLE, POPULATION, sampling, quantile_ratio=ratio)
    assert time.perf_counter() - started < 5.0  # about 0.3 s here, cold
    assert plan["rho_update"] == pytest.approx(rp.gaussian_sum_rho(1.1, plan["sigma"]))
    assert plan["rho_quantile"] == pytest.approx(ratio * plan["rho_update"])
    assert plan["rho_round"] == pytest.approx(rp.round_rho(plan["rho_quantile"], plan["rho_update"]))
    again = rp.rounds_epsilon(plan["rho_round"], ROUNDS, DELTA, sampling, SAMPLE, POPULATION)
    assert again == plan["epsilon"] and target - 1e-3 <= again <= target


def test_without_amplification_the_update_noise_is_12_to_20_times_larger():
    """The issue's sanity figure, at the paper's setting (Poisson sampling at 100 / 2,500)."""
    for target in (3.0, 5.0, 10.0, 15.0, 20.0):
        amplified = rp.sigma_for_epsilon(target, DELTA, ROUNDS, 1.0, SAMPLE, POPULATION, "poisson")["sigma"]
        plain = rp.sigma_for_epsilon(target, DELTA, ROUNDS, 1.0, SAMPLE, POPULATION, "none")["sigma"]
        assert 12 <= plain / amplified <= 21, target


def test_1000_ddg_rounds_as_epsilon_delta_events_cost_about_62_where_zcdp_gives_7():
    """1,000 DDG quantile rounds (algorithm 2: hierarchical, b = 32, c = 1, 100 noise-adding
    clients a round, sigma^2 = 18 each), delta = 1/2500, no amplification: composed in zCDP and
    converted once, epsilon 7.1; each round booked as an (epsilon_i, delta_i) event (delta_i =
    delta / (10 T), the rest left to the composition) and composed by the optimal (pld) rule, 58
    (53 to 66 as delta_i goes from delta / (2T) to delta / (100T))."""
    rho = rp.quantile_round_rho(1, 100, 18.0, 32, True)
    zcdp = rp.rounds_epsilon(rho, ROUNDS, DELTA)
    assert 6.8 < zcdp < 7.4
    per_event = {}
    for share in (2, 10, 100):
        each = ddg.zcdp_to_approx_dp(rho, DELTA / (share * ROUNDS))
        per_event[share] = pld_composition([(each, DELTA / (share * ROUNDS))] * ROUNDS, DELTA)
    assert 50 < per_event[2] < per_event[10] < per_event[100] < 70
    assert per_event[10] > 7.5 * zcdp


# -- a site's account -------------------------------------------------------------------------------


def fresh_account(epsilon=3.0, delta=1e-6, composition="pld"):
    account = SiteAccount(Budget(epsilon=epsilon, delta=delta, composition=composition))
    data = account.hold(record_ids(np.arange(20.0)))
    return account, data


def test_a_site_books_rounds_of_rho_in_zcdp_and_refuses_the_one_past_its_budget():
    rho, delta = 0.01, 1e-6
    account, data = fresh_account(3.0, delta)
    allowed = max(k for k in range(1, 200)
                  if dp_accounting_epsilon(dp_accounting.ZCDpEvent(k * rho), delta,
                                           orders=list(rp.ZCDP_ORDERS)) <= 3.0)
    booked = 0
    with pytest.raises(BudgetExceeded, match=r"epsilon [\d.]+ at delta 1e-06 per record, over its budget 3"):
        while True:
            account.admit(0, data, Spend("zcdp", rho=rho))
            account.record(0, booked, "dp_fedavg", data, Spend("zcdp", rho=rho))
            booked += 1
    assert booked == allowed
    assert account.composed(account.dp_groups(0, data)[0]) == pytest.approx(rp.zcdp_epsilon(booked * rho, delta))
    # the same rounds as (epsilon, delta) events, each converted alone, would be refused far earlier
    each = ddg.zcdp_to_approx_dp(rho, delta / (2 * booked))
    assert pld_composition([(each, delta / (2 * booked))] * booked, delta) > 1.5 * 3.0


@pytest.mark.parametrize("composition", ["pld", "basic"])
def test_zcdp_and_epsilon_delta_events_compose_with_one_conversion(composition):
    delta, rho = 1e-6, 0.02
    account, data = fresh_account(10.0, delta, composition)
    account.record(0, 0, "fedcp2_qq", data, Spend("dp", 1.0, 0.0, "local"))
    for session in range(1, 6):
        account.record(0, session, "dp_fedavg", data, Spend("zcdp", rho=rho))
    events = account.dp_groups(0, data)[0]
    total = account.composed(events)
    expected = math.inf
    for share in (0.25, 0.5, 0.75):
        eps_z = rp.zcdp_epsilon(5 * rho, share * delta)
        if composition == "basic":
            expected = min(expected, 1.0 + eps_z)
        else:  # dp_accounting's PLDs of the two (epsilon, delta) events, composed
            a = privacy_loss_distribution.from_privacy_parameters(common.DifferentialPrivacyParameters(1.0, 0.0))
            b = privacy_loss_distribution.from_privacy_parameters(
                common.DifferentialPrivacyParameters(eps_z, share * delta))
            expected = min(expected, a.compose(b).get_epsilon_for_delta(delta), 1.0 + eps_z)
    assert total == pytest.approx(expected, rel=1e-9)
    # one conversion of the zCDP rounds beats converting each and composing them as (epsilon, delta)
    each = ddg.zcdp_to_approx_dp(rho, delta / 10)
    assert total < (pld_composition([(1.0, 0.0)] + [(each, delta / 10)] * 5, delta) if composition == "pld"
                    else 1.0 + 5 * each)
    with pytest.raises(BudgetExceeded, match="over its budget 10"):
        account.admit(0, data, Spend("dp", 9.0, 0.0, "local"))


def test_a_site_books_unamplified_unless_its_policy_trusts_the_sampling():
    rho, delta = 0.05, 1e-6
    training = Spend("zcdp", rho=rho, sampling="poisson", sample=SAMPLE, population=POPULATION, rounds=50,
                     key=b"training-1")
    amplified = rp.rounds_epsilon(rho, 50, delta, "poisson", SAMPLE, POPULATION)
    for trust in (False, True):
        policy = SitePolicy(trust_sampling=trust)
        account, data = fresh_account(30.0, delta)
        booked = policy.booked(training)
        assert booked.amplified is trust
        for session in range(3):  # three rounds of one training
            account.admit(0, data, booked)
            account.record(0, session, "dp_fedavg", data, booked)
        spent = account.composed(account.dp_groups(0, data)[0])
        if trust:  # the whole training, once, at its amplified cost, however many rounds it answers
            assert spent == pytest.approx(amplified, rel=1e-9)
        else:
            assert spent == pytest.approx(rp.site_account_epsilon(rho, 3, delta), rel=1e-9)
    # trusted, a training answered more often than the rounds it states is refused
    policy = SitePolicy(trust_sampling=True)
    account, data = fresh_account(30.0, delta)
    short = policy.booked(Spend("zcdp", rho=rho, sampling="poisson", sample=SAMPLE, population=POPULATION, rounds=2,
                                key=b"t"))
    for session in range(2):
        account.admit(0, data, short)
        account.record(0, session, "dp_fedavg", data, short)
    with pytest.raises(BudgetExceeded, match="answered 2 round"):
        account.admit(0, data, short)
    # a method's own `trusted` is not the site's: the policy decides
    assert not SitePolicy().booked(Spend("zcdp", rho=rho, sampling="poisson", sample=1, population=2,
                                         key=b"t", trusted=True)).amplified


def test_a_zcdp_release_is_capped_by_its_one_round_epsilon_at_the_budgets_delta():
    policy = SitePolicy(max_epsilon=1.0)
    small, large = Spend("zcdp", rho=0.005), Spend("zcdp", rho=0.05)
    assert policy.refusal("dp_fedavg", small, delta=1e-6) is None  # one round: epsilon 0.43 at 1e-6
    reason = policy.refusal("dp_fedavg", large, delta=1e-6)
    assert reason.startswith("site policy: one round at rho 0.05") and "epsilon 1.472 at delta 1e-06" in reason
    assert policy.refusal("dp_fedavg", large, delta=0.05) is None  # epsilon 0.36 at delta 0.05
    assert policy.refusal("dp_fedavg", large) == reason  # the default budget's delta
    curator = Spend("zcdp", rho=0.005, curator=True, model="clipped updates to a trusted curator")
    assert "curator: refuse" in SitePolicy().refusal("dp_delta_fl", curator)
    assert SitePolicy(curator="allow").refusal("dp_delta_fl", curator) is None


def test_an_account_with_zcdp_spends_round_trips_through_its_file(tmp_path):
    delta = 1e-6
    account, data = fresh_account(3.0, delta)
    policy = SitePolicy(trust_sampling=True)
    account.record(0, 0, "fedcp2_qq", data, Spend("dp", 0.5, 0.0, "local"))
    for session in range(1, 4):
        account.record(0, session, "dp_fedavg", data, Spend("zcdp", rho=0.01))
    training = policy.booked(Spend("zcdp", rho=0.02, sampling="without_replacement", sample=SAMPLE,
                                   population=POPULATION, rounds=100, key=b"run-7"))
    account.record(0, 4, "dp_delta_fl", data, training)
    account.refusal(0, 5, "dp_fedavg", "privacy budget: no")
    append_account(tmp_path, "site-0", account.take_unsaved())
    again = SiteAccount(account.budget, read_account(tmp_path, "site-0"))
    assert again.records == account.records
    assert again.composed(again.dp_groups(0, data)[0]) == account.composed(account.dp_groups(0, data)[0])
    assert again.histories() == account.histories()
    for spend in (Spend("zcdp", rho=0.5), Spend("dp", 2.9, 0.0, "local"), training):
        outcomes = []
        for which in (account, again):
            try:
                which.admit(0, data, spend)
                outcomes.append("admitted")
            except BudgetExceeded as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
