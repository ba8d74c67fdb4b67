"""A lying coordinator against private training's sites (issue 49; a red team's findings): every
lie below is one a fresh reviewer made work against the first version, now refused by the sites."""

import copy

import msgpack
import numpy as np
import pytest

from protocol.codecs import CODECS
from protocol.inprocess import drive
from protocol.methods import METHODS
from protocol.methods.base import RequestError
from protocol.noise import SeededNoise
from protocol.phases import Phase
from protocol.secagg.identity import identities_in_memory
from tests.test_delta_fl import label_sites

COMMON = dict(classes=4, rounds=2, clients_per_round=6, held_out=2, epsilon=5.0, secagg={"graph": "full"})


def attacked(method, sites, rewrite_phase, change, seed=9):
    """Run `method` over in-process site halves with the coordinator's requests of `rewrite_phase`
    changed by change(body) (a mechanism, the weights, ...); returns the outcome and every refusal."""
    halves = {s: type(method).site(rows, SeededNoise(np.random.PCG64(j)), s) for j, (s, rows) in enumerate(sites.items())}
    for site, identity in identities_in_memory(halves).items():
        halves[site].identity = identity
    refusals = []

    def ask(site, phase, body):
        encoder, request = CODECS[method.codec].for_site(msgpack.unpackb(msgpack.packb(body, use_bin_type=True),
                                                                         raw=False))
        try:
            return encoder.encode(halves[site].answer(phase, request))
        except RequestError as exc:
            refusals.append((str(phase), str(exc)))
            raise

    def rewrite(step):
        requests = step.requests
        if str(step.phase) == rewrite_phase:
            requests = {site: change(copy.deepcopy(body)) for site, body in requests.items()}
        return requests, step.minimum

    outcome = drive(method, {s: len(r) for s, r in sites.items()}, ask, np.random.default_rng(seed), rewrite=rewrite)
    return outcome, refusals


def with_mechanism(**changes):
    def change(body):
        body["method"]["mechanism"].update(changes)
        return body
    return change


@pytest.fixture(scope="module")
def sites():
    return label_sites(count=8, held=2)


def test_an_update_sum_that_changes_the_rounds_clip_is_refused(sites):
    """The loss sum asks for clip 10^9 (and a huge step) so that the update computed then is released
    unclipped, while the update sum is booked at the honest clip: the sites refuse the update sum."""
    method = METHODS["dp_delta_fl"](0.1, bins=8, loss_bound=2.0, **COMMON)
    outcome, refusals = attacked(method, sites, "loss-advertise-0", with_mechanism(clip=1e9))
    why = [reason for phase, reason in refusals if phase == "update-advertise-0"]
    assert why and all("changes the round's mechanism" in r for r in why)
    assert "noise shortfall" in outcome.rounds[0]["skipped"]


def test_a_sum_whose_vectors_are_not_the_mechanisms_is_refused(sites):
    """dimension 1 would book the sensitivity of one coordinate for a 24-coordinate update."""
    method = METHODS["dp_fedavg"](0.1, **COMMON)
    outcome, refusals = attacked(method, sites, "average-advertise-0", with_mechanism(dimension=1))
    assert refusals and all("asks for vectors of 24 entries where its mechanism's are 1" in r for _, r in refusals)
    assert outcome.rounds[0]["skipped"]


def test_a_sample_the_session_contradicts_is_refused(sites):
    """A claim of 1 of 100,000 (amplification for sites that trust the sampling) while the session asks 6."""
    method = METHODS["dp_fedavg"](0.1, **COMMON)
    _, refusals = attacked(method, sites, "average-advertise-0", with_mechanism(sample=1, population=100_000))
    assert refusals and all("claims a sample of 1 without replacement, the session asks 6" in r for _, r in refusals)


def test_sums_a_method_does_not_have_are_refused_before_anything_is_booked():
    body = {"params": {"length": 24, "sites": 6}, "nonce": 1, "method": {"mechanism": {}}}
    for name, phase in (("delta_fl", "average-advertise"), ("delta_fl", "loss-advertise"),
                        ("dp_fedavg", "loss-advertise"), ("dp_delta_fl", "average-advertise")):
        with pytest.raises(RequestError, match="has no"):
            METHODS[name].spend(Phase(phase, 0), body)
    half = METHODS["delta_fl"].site(label_sites(count=1, held=0)["site-00"], np.random.default_rng(0), "site-00")
    half.answer(Phase("setup"), {"classes": 4})
    with pytest.raises(RequestError, match="no secure sums at all"):
        half.answer(Phase("average-advertise", 0), body)


def test_a_round_is_booked_once_at_its_first_sum(sites):
    """DP-Δ-FL's loss sum books the whole round (both sums' rho: one release, one amplified event);
    the update sum books nothing more and must keep the loss sum's mechanism."""
    method = METHODS["dp_delta_fl"](0.1, bins=8, loss_bound=2.0, **COMMON)
    kept = {}

    def keep(body):
        kept.setdefault("body", copy.deepcopy(body))
        return body

    attacked(method, sites, "loss-advertise-0", keep)
    from protocol.methods.tail_secagg import distributed_round_rhos

    body = kept["body"]
    spend = METHODS["dp_delta_fl"].spend(Phase("loss-advertise", 0), body)
    mechanism = body["method"]["mechanism"]
    # booked per record: one record changed moves the update anywhere in its C-ball (twice the
    # sensitivity of a client added or removed) and the loss bin from one bin to another
    assert spend.kind == "zcdp" and spend.rho == pytest.approx(sum(distributed_round_rhos(mechanism, records=True)))
    assert spend.rho > 3 * sum(distributed_round_rhos(mechanism))
    update = copy.deepcopy(body)
    update["params"]["length"] = body["method"]["mechanism"]["dimension"]
    assert METHODS["dp_delta_fl"].spend(Phase("update-advertise", 0), update) is None


def test_setup_answers_the_same_whatever_the_labels():
    """A setup refused when a label is >= classes would tell the coordinator about the labels for free."""
    rows = label_sites(count=1, held=0)["site-00"]
    answers = []
    for classes in (2, 3, 4, 7):
        half = METHODS["dp_fedavg"].site(rows, np.random.default_rng(0), "site-00")
        answers.append(half.answer(Phase("setup"), {"classes": classes}))
    assert all(a == answers[0] for a in answers)


def test_a_refused_loss_sum_opens_no_round_for_an_update_sum(sites):
    """A loss sum the site refuses (here a nonce that is not a number) books nothing: an update sum
    that follows it would be released unbooked, so it is refused too."""
    method = METHODS["dp_delta_fl"](0.1, bins=8, loss_bound=2.0, **COMMON)

    def bad_nonce(body):
        body["nonce"] = "x"
        return body

    outcome, refusals = attacked(method, sites, "loss-advertise-0", bad_nonce)
    assert {phase for phase, _ in refusals} == {"loss-advertise-0"}  # the honest half then skips the round
    half = METHODS["dp_delta_fl"].site(sites["site-00"], SeededNoise(np.random.PCG64(0)), "site-00")
    half.identity = identities_in_memory(sorted(sites))["site-00"]
    half.answer(Phase("setup"), {"classes": 4})
    kept = {}
    attacked(method, sites, "loss-advertise-0", lambda body: kept.setdefault("loss", copy.deepcopy(body)) and body)
    loss = copy.deepcopy(kept["loss"])
    loss["nonce"] = "x"
    with pytest.raises(RequestError):
        half.answer(Phase("loss-advertise", 0), loss)
    update = copy.deepcopy(kept["loss"])
    update["params"]["length"] = update["method"]["mechanism"]["dimension"]
    update["method"]["tail_bin"] = 0
    with pytest.raises(RequestError, match="without this round's loss sum"):
        half.answer(Phase("update-advertise", 0), update)


def test_rounds_beyond_the_training_and_populations_beyond_the_registry_are_refused(sites):
    method = METHODS["dp_fedavg"](0.1, **COMMON)
    _, refusals = attacked(method, sites, "average-advertise-0", with_mechanism(population=10**6))
    assert refusals and all("the party registry lists 8" in r for _, r in refusals)
    _, refusals = attacked(method, sites, "average-advertise-1", with_mechanism(rounds=1))
    assert refusals and all("beyond the 1 rounds its training states" in r for _, r in refusals)


def test_a_private_round_states_its_noise_and_the_site_books_per_record():
    from protocol.methods.tail_rounds import round_rho

    with pytest.raises(RequestError, match="no mechanism"):
        METHODS["dp_delta_fl"].spend(Phase("round", 0), {"weights": [], "lr": 0.1, "steps": 1, "weight_decay": 0.0})
    mechanism = {"clip": 1.0, "sigma_update": 2.0, "tail": 0.0, "loss_bound": 1.0, "bins": 2, "hierarchical": False,
                 "sigma_histogram": 0.0, "sampling": "poisson", "sample": 10, "population": 100, "rounds": 5}
    spend = METHODS["dp_fedavg"].spend(Phase("round", 0), {"mechanism": mechanism})
    assert spend.rho == pytest.approx(4 * round_rho(mechanism)) and spend.curator


def test_evaluate_answers_once_with_the_error_only():
    rows = label_sites(count=1, held=0)["site-00"]
    half = METHODS["dp_fedavg"].site(rows, np.random.default_rng(0), "site-00")
    half.answer(Phase("setup"), {"classes": 4})
    from protocol.codecs.tensors import pack_tensors

    body = {"weights": pack_tensors({"W": np.zeros((6, 4))})}
    assert set(half.answer(Phase("evaluate"), body)["metrics"]) == {"error"}
    with pytest.raises(RequestError, match="twice"):
        half.answer(Phase("evaluate"), body)


def test_a_poisson_sample_far_from_the_sites_asked_is_refused(sites):
    method = METHODS["dp_fedavg"](0.1, sampling="poisson", dropouts=0, **{**COMMON, "clients_per_round": 3})
    _, refusals = attacked(method, sites, "average-advertise-0", with_mechanism(sample=1, population=8))
    assert not refusals or all("Poisson samples of 1" in r for _, r in refusals)
    body = {"params": {"length": 24, "sites": 12}, "nonce": 1,
            "method": {"mechanism": {"noise": "distributed", "clip": 1.0, "tail": 0.0, "loss_bound": 1.0, "bins": 2,
                                     "hierarchical": False, "scale": 100.0, "sigma2_update": 1e4,
                                     "histogram_scale": 1, "sigma2_histogram": 1.0, "inputs": 5, "dimension": 24,
                                     "modulus_bits": 32, "sampling": "poisson", "sample": 1, "population": 20,
                                     "rounds": 2}}}
    with pytest.raises(RequestError, match="Poisson samples of 1 on average, the session asks 12"):
        METHODS["dp_fedavg"].spend(Phase("average-advertise", 0), body)
    body["method"]["mechanism"]["sample"] = 10
    assert METHODS["dp_fedavg"].spend(Phase("average-advertise", 0), body).rho > 0
    body["method"]["mechanism"]["scale"] = 1e300  # a cost beyond any float: refused, not a crash
    with pytest.raises(RequestError):
        METHODS["dp_fedavg"].spend(Phase("average-advertise", 0), body)
