"""Δ-FL, DP-Δ-FL, FedAvg and DP-FedAvg (paper 001 section 5, appendix B): the math against brute
force, the private methods collapsing to the plain ones, and sessions over the engine."""

import math

import msgpack
import numpy as np
import pytest

from learning.tail_fl import (client_gradients, client_losses, clip_updates, local_updates, loss_bins,
                              noisy_loss_cdf, plain_round_step, private_round_step, superquantile,
                              tail_quantile_exact, tail_start_bin, with_intercept)
from protocol.codecs import CODECS
from protocol.inprocess import drive
from protocol.methods import METHODS
from protocol.methods.tail_rounds import round_rho, server_step, site_step


def clients(count=12, n=30, d=5, k=4, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(count, n, d))
    y = rng.integers(0, k, size=(count, n))
    return with_intercept(X), y


def test_gradient_matches_finite_differences():
    X1, y = clients(count=2)
    W = np.random.default_rng(1).normal(size=(X1.shape[-1], 4)) * 0.3
    grad = client_gradients(W, X1, y)
    h = 1e-6
    for (a, b) in [(0, 0), (3, 2), (5, 1)]:
        E = np.zeros_like(W)
        E[a, b] = h
        numeric = (client_losses(W + E, X1, y) - client_losses(W - E, X1, y)) / (2 * h)
        assert np.allclose(grad[:, a, b], numeric, atol=1e-7)


def test_local_updates_are_the_gradient_steps_of_algorithm_3():
    X1, y = clients(count=3)
    W = np.zeros((X1.shape[-1], 4))
    one = local_updates(W, X1, y, lr=0.1, steps=1)
    assert np.allclose(one, -0.1 * client_gradients(W, X1, y))
    two = local_updates(W, X1, y, lr=0.1, steps=2, weight_decay=0.5)
    for i in range(3):  # by hand: w1 = (1 - g l) w0 - g grad(w0), w2 likewise
        w = W.copy()
        for _ in range(2):
            w = (1 - 0.1 * 0.5) * w - 0.1 * client_gradients(w, X1[i:i + 1], y[i:i + 1])[0]
        assert np.allclose(two[i], w - W)


def brute_superquantile(values, p):
    """Rockafellar and Uryasev: S_p = min over eta of eta + E[max(0, Z - eta)] / (1 - p), the minimum
    attained at a data point."""
    values = np.asarray(values, dtype=float)
    return min(eta + np.maximum(0.0, values - eta).mean() / (1 - p) for eta in values)


@pytest.mark.parametrize("p", [0.0, 0.5, 0.75, 0.9, 0.33])
@pytest.mark.parametrize("seed", range(5))
def test_superquantile_against_brute_force(p, seed):
    values = np.random.default_rng(seed).exponential(size=int(7 + 5 * seed))
    assert superquantile(values, p) == pytest.approx(brute_superquantile(values, p), rel=1e-12)


@pytest.mark.parametrize("p", [0.5, 0.75, 0.9])
def test_tail_aggregation_against_brute_force(p):
    rng = np.random.default_rng(3)
    losses = rng.exponential(size=20)
    updates = rng.normal(size=(20, 3, 2))
    step, info = plain_round_step(losses, updates, p)
    q = sorted(losses)[math.ceil(p * 20) - 1]
    chosen = [i for i in range(20) if losses[i] >= q]
    assert info["tail"] == len(chosen) == 20 - math.ceil(p * 20) + 1
    assert np.allclose(step, np.mean([updates[i] for i in chosen], axis=0))
    # with one gradient step and every client sampled, the tail mean of the losses at the tail's
    # own threshold is the superquantile at the level that tail has (appendix B.1)
    level = 1 - len(chosen) / 20
    assert np.mean(losses[chosen]) == pytest.approx(superquantile(losses, level))


def test_fedavg_is_delta_fl_at_p_zero():
    rng = np.random.default_rng(4)
    updates = rng.normal(size=(9, 2, 2))
    step, info = plain_round_step(rng.exponential(size=9), updates, 0.0)
    assert info["tail"] == 9 and np.allclose(step, updates.mean(axis=0))


def test_clipping_is_algorithm_4_line_10():
    updates = np.array([[[3.0, 4.0]], [[0.3, 0.4]]])
    clipped = clip_updates(updates, 1.0)
    assert np.allclose(clipped[0], [[0.6, 0.8]]) and np.allclose(clipped[1], updates[1])
    assert clip_updates(updates, math.inf) is updates


def test_private_step_collapses_to_the_plain_one():
    """Noise 0 and C to infinity: DP-Δ-FL's step is Δ-FL's when the loss bins separate the clients
    the exact quantile separates (fine bins), and DP-FedAvg's is FedAvg's exactly."""
    rng = np.random.default_rng(5)
    losses = np.sort(rng.uniform(0.05, 0.95, size=16))
    updates = rng.normal(size=(16, 3, 2))
    bins = loss_bins(losses, 1.0, 4096)
    assert len(set(bins)) == 16
    for p in (0.5, 0.75):
        private, info = private_round_step(bins, clip_updates(updates, math.inf), p, 4096, False,
                                           np.zeros(4096), np.zeros((3, 2)))
        plain, plain_info = plain_round_step(losses, updates, p)
        assert info["tail"] == plain_info["tail"] and np.allclose(private, plain)
    hierarchical, _ = private_round_step(bins, updates, 0.75, 4096, True, np.zeros(2 * 4096 - 2), np.zeros((3, 2)))
    assert np.allclose(hierarchical, plain_round_step(losses, updates, 0.75)[0])
    dp_fedavg, _ = private_round_step(bins, updates, 0.0, 4096, False, None, np.zeros((3, 2)))
    assert np.array_equal(dp_fedavg, plain_round_step(losses, updates, 0.0)[0])


def test_noisy_cdf_flat_and_hierarchical_agree_without_noise():
    bins = np.array([0, 1, 1, 3, 5, 7, 7, 7])
    flat = noisy_loss_cdf(bins, 8, False, np.zeros(8))
    tree = noisy_loss_cdf(bins, 8, True, np.zeros(14))
    assert np.allclose(flat, tree) and flat[-1] == 1.0
    assert tail_start_bin(flat, 0.0) == 0
    # eq. (1): j* = argmin |F_j - p| = 4 (1-based; F = 1/8, 3/8, 3/8, 4/8, 4/8, 5/8, 5/8, 1), the
    # quantile's bin, 3 (0-based), is the tail's first
    assert tail_start_bin(flat, 0.5) == 3


def test_round_rho_is_claim_13_corrected():
    mechanism = {"clip": 1.3, "sigma_update": 2.0, "tail": 0.75, "loss_bound": 1.0, "bins": 32,
                 "hierarchical": False, "sigma_histogram": 4.0}
    assert round_rho(mechanism) == pytest.approx(1.3**2 / (2 * 4.0) + 1 / (2 * 16.0))
    assert round_rho({**mechanism, "hierarchical": True}) == pytest.approx(1.3**2 / 8 + 5 / 32)
    assert round_rho({**mechanism, "tail": 0.0}) == pytest.approx(1.3**2 / 8)  # DP-FedAvg: no histogram


def run_session(method, sites, seed=9):
    halves = {s: type(method).site(rows, None, s) for s, rows in sites.items()}

    def ask(site, phase, body):
        encoder, request = CODECS[method.codec].for_site(msgpack.unpackb(msgpack.packb(body, use_bin_type=True),
                                                                         raw=False))
        return encoder.encode(halves[site].answer(phase, request))

    return drive(method, {s: len(r) for s, r in sites.items()}, ask, np.random.default_rng(seed))


def label_sites(count=10, held=3, n=40, seed=2):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(4, 5))
    out = {}
    for j in range(count):
        y = rng.integers(0, 4, n)
        out[f"site-{j:02d}"] = np.column_stack([centres[y] + rng.normal(size=(n, 5)), y])
    return out


def test_delta_fl_session_matches_the_math_round_by_round():
    """The live halves over the engine give what the pure functions give, round by round."""
    sites = label_sites()
    method = METHODS["delta_fl"](0.1, classes=4, rounds=6, clients_per_round=4, held_out=3, tail=0.5)
    outcome = run_session(method, sites)
    assert outcome.status == "ok", outcome.reason
    rng = np.random.default_rng(9)
    names = sorted(sites)
    training, held = names[:-3], names[-3:]
    W = np.zeros((6, 4))
    data = {s: (with_intercept(r[None, :, :-1]), r[None, :, -1].astype(int)) for s, r in sites.items()}
    for _ in range(6):
        chosen = sorted(rng.choice(training, size=4, replace=False).tolist())
        X1 = np.concatenate([data[s][0] for s in chosen])
        y = np.concatenate([data[s][1] for s in chosen])
        numbers, updates = site_step(W, X1, y, 0.1, 1, 0.0, None)
        step, _ = server_step(None, 0.5, numbers, updates, rng)
        W = W + step
    errors = [float((np.argmax(data[s][0][0] @ W, axis=1) != data[s][1][0]).mean()) for s in held]
    assert outcome.details["mean_error"] == pytest.approx(np.mean(errors), abs=1e-12)
    assert outcome.details["p90_error"] == pytest.approx(np.percentile(errors, 90), abs=1e-12)
    # from w = 0 every loss is log 4 (all in the tail); then the 2nd smallest of 4 and above: 3
    assert [r["tail"] for r in outcome.rounds] == [4] + [3] * 5


def test_a_site_refuses_a_malformed_round():
    sites = label_sites(count=4, held=0)
    half = METHODS["delta_fl"].site(sites["site-00"], None, "site-00")
    from protocol.phases import Phase
    from protocol.methods.base import RequestError

    with pytest.raises(RequestError, match="before setup"):
        half.answer(Phase("round", 0), {})
    half.answer(Phase("setup"), {"classes": 4})
    with pytest.raises(RequestError, match="weights"):
        half.answer(Phase("round", 0), {"weights": [], "lr": 0.1, "steps": 1, "weight_decay": 0.0})


def run_with_identities(method, sites, seed=9, ask_hook=None, seeded=True):
    from protocol.noise import SeededNoise
    from protocol.secagg.identity import identities_in_memory

    halves = {s: type(method).site(rows, SeededNoise(np.random.PCG64(j)) if seeded else None, s)
              for j, (s, rows) in enumerate(sites.items())}
    for site, identity in identities_in_memory(halves).items():
        halves[site].identity = identity

    def ask(site, phase, body):
        if ask_hook is not None:
            ask_hook(site, phase)
        encoder, request = CODECS[method.codec].for_site(msgpack.unpackb(msgpack.packb(body, use_bin_type=True),
                                                                         raw=False))
        return encoder.encode(halves[site].answer(phase, request))

    return drive(method, {s: len(r) for s, r in sites.items()}, ask, np.random.default_rng(seed))


def test_the_distributed_plan_meets_the_rounds_budget():
    from protocol.methods.tail_secagg import distributed_round_rhos, plan_distributed

    plan = plan_distributed(0.002, 0.0005, clip=1.1, tail=0.75, loss_bound=1.5, bins=32, hierarchical=True,
                            dimension=210, sample=100, population=2500, rounds=1000, dropouts=10, granularity=1024)
    rho_loss, rho_update = distributed_round_rhos(plan)
    assert rho_update == pytest.approx(0.002, rel=1e-6) and rho_update <= 0.002
    assert rho_loss == pytest.approx(0.0005, rel=1e-6) and rho_loss <= 0.0005
    assert plan["inputs"] == 90 and plan["sigma2_histogram"] >= 1.0
    # the ring holds every site's largest entry and the noise's 12 sd without wrapping
    assert 2 ** (plan["modulus_bits"] - 1) > 100 * (1024 + 1) + 12 * math.sqrt(100 * plan["sigma2_update"])


def test_distributed_dp_fedavg_collapses_to_fedavg_as_noise_vanishes():
    """epsilon large and C large: the distributed sum's noise and rounding (1 / scale) vanish, so the
    trained model is FedAvg's: the same test errors."""
    sites = label_sites()
    common = dict(classes=4, rounds=4, clients_per_round=7, held_out=3)  # every training site, every round
    plain = run_session(METHODS["delta_fl"](0.1, tail=0.0, **common), sites)
    from protocol.methods.tail_secagg import plan_distributed

    method = METHODS["dp_fedavg"](0.1, epsilon=1.0, secagg={"graph": "full"}, **common)
    # rho per round 10^14 (epsilon beyond any budget): lemma 9's noise on updates scaled so that C = 10 (above
    # every update's norm here) is 2^40 units has sd about 3e-7 of an update unit, the rounding 1e-11
    method.mechanism = lambda population, features: plan_distributed(
        1e14, 0.0, clip=10.0, tail=0.0, loss_bound=1.0, bins=2, hierarchical=False, dimension=(features + 1) * 4,
        sample=7, population=population, rounds=4, dropouts=0, granularity=2.0**40)
    private = run_with_identities(method, sites)
    assert private.status == "ok", private.reason
    assert private.details["noise"] == "distributed" and private.details["sigma2_update"] >= 0.25
    assert private.details["mean_error"] == pytest.approx(plain.details["mean_error"], abs=1e-12)
    assert private.details["p90_error"] == pytest.approx(plain.details["p90_error"], abs=1e-12)


def test_a_round_whose_site_dropped_is_skipped_with_the_shortfall_named():
    from protocol.methods.base import RequestError

    sites = label_sites(count=8, held=2)  # 6 training sites, all sampled each round
    method = METHODS["dp_delta_fl"](0.1, classes=4, rounds=3, clients_per_round=6, held_out=2, epsilon=5.0,
                                    secagg={"graph": "full"}, bins=8, loss_bound=2.0)

    def drop(site, phase):
        if str(phase) == "update-mask-1" and site == "site-03":
            raise RequestError("crashed")

    outcome = run_with_identities(method, sites, ask_hook=drop)
    assert outcome.status == "ok", outcome.reason
    first, second, third = outcome.rounds
    assert first.get("skipped") is None
    assert "noise shortfall: 5 masked inputs where the noise was planned for 6" in second["skipped"]
    # the lost site is not sampled again: 5 left, fewer than the 6 inputs the noise was planned for
    assert third["pool"] == third["sampled"] == 5 and "noise shortfall" in third["skipped"]
    # planned for one dropout a round (noise for 5 inputs), the same loss costs nothing
    tolerant = METHODS["dp_delta_fl"](0.1, classes=4, rounds=3, clients_per_round=6, held_out=2, epsilon=5.0,
                                      secagg={"graph": "full"}, bins=8, loss_bound=2.0, dropouts=1)
    outcome = run_with_identities(tolerant, sites, ask_hook=drop)
    assert outcome.status == "ok" and not any(r.get("skipped") for r in outcome.rounds), outcome.rounds
    assert outcome.rounds[1]["answered"] == 5 and outcome.rounds[2]["sampled"] == 5
