"""Paper 002 (FedType) and its baselines: the tensor codec, the pure functions of section 3.2
against brute force, FedAvg's server step, learning sessions in-process, the bytes on the wire
(no private weight ever leaves a site), and a run over site processes with a crashed site."""

import itertools
import math

import msgpack
import numpy as np
import pytest

from protocol.phases import Phase
import torch

from learning.nets import build_net, get_weights, parameter_count
from learning.uarl import (backward_kd_loss, calibration_penalty, consensus_weight, fit_conformal,
                           fit_temperature, forward_kd_loss, raps_scores, softmax)
from protocol.codecs import CODECS, PayloadError
from protocol.codecs.tensors import Tensors, pack_tensors
from protocol.methods.learning_rounds import sample_sites, weighted_average
from runner.outputs import RunDirectory
from runner.study import run_study
from quorum import load_scenario
from specs.schema import ScenarioError
from transport.ledger import read_ledger
from tests.learning_sessions import (SCENARIO, SMALL, assert_no_private_weight_on_the_wire, blob_sites,
                                     learning_method, run_learning)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py



# -- the tensor codec ----------------------------------------------------------------------------


def test_tensors_round_trip_bit_exact_in_every_precision_and_count_their_bits():
    rng = np.random.default_rng(0)
    sent = {"a.weight": rng.normal(size=(3, 4)).astype(np.float16), "a.bias": rng.normal(size=4).astype(np.float32),
            "w": rng.normal(size=(2, 3))}  # float64: paper 001's linear model, the same bits on both paths
    body = Tensors().encode({"tensors": sent, "metrics": {"train": 7, "accuracy": 0.5}})
    back = Tensors().decode(msgpack.unpackb(msgpack.packb(body, use_bin_type=True), raw=False))
    for name, array in sent.items():
        assert back["tensors"][name].dtype == array.dtype and back["tensors"][name].tobytes() == array.tobytes()
    assert back["metrics"] == {"train": 7, "accuracy": 0.5}
    assert Tensors().information_bits(back) == 16 * 12 + 32 * 4 + 64 * 6 + 64 * 2
    with pytest.raises(ValueError, match="float16, float32 or float64"):
        pack_tensors({"x": np.zeros(2, dtype=np.int64)})  # integers are not a wire precision


@pytest.mark.parametrize("bad, words", [
    ({"tensors": [], "metrics": {}, "extra": 1}, "'tensors' and 'metrics'"),
    ({"tensors": [["w", "i8", [1], b"\0" * 8]], "metrics": {}}, "dtype"),
    ({"tensors": [["w", "f4", [2], b"\0" * 4]], "metrics": {}}, "needs 8 bytes"),
    ({"tensors": [["w", "f4", [1], np.float32(np.nan).tobytes()]], "metrics": {}}, "NaN"),
    ({"tensors": [["w", "f4", [1], b"\0" * 4], ["w", "f4", [1], b"\0" * 4]], "metrics": {}}, "twice"),
    ({"tensors": [], "metrics": {"accuracy": "high"}}, "must be a number"),
    ({"tensors": [["w", "f4", [-1], b""]], "metrics": {}}, "shape"),
])
def test_tensors_decoder_refuses_malformed_bodies_naming_what_is_wrong(bad, words):
    with pytest.raises(PayloadError, match=words):
        CODECS["tensors"]().decode(bad)


# -- section 3.2 against brute force -------------------------------------------------------------


def test_calibration_function_of_eq7():
    assert calibration_penalty(0.1, 0.5) == 0.5 and calibration_penalty(0.0, 0.5) == 0.5
    assert calibration_penalty(-0.2, 0.5) == pytest.approx(0.5 * -0.2 + 0.2 + 0.5)  # 0.6: a drop, bigger penalty
    assert calibration_penalty(-1.0, 0.5) == pytest.approx(1.0)


def test_raps_scores_match_their_definition_label_by_label():
    rng = np.random.default_rng(1)
    probabilities = rng.dirichlet(np.ones(6), size=20)
    u = rng.uniform(size=20)
    scores = raps_scores(probabilities, u, penalty=0.3, k_reg=2)
    for j, y in itertools.product(range(20), range(6)):
        pi = probabilities[j]
        rho = sum(pi[v] for v in range(6) if pi[v] > pi[y])
        rank = sum(1 for v in range(6) if pi[v] >= pi[y])
        assert scores[j, y] == pytest.approx(pi[y] * u[j] + rho + 0.3 * max(rank - 2, 0))


def test_consensus_weight_of_eq8_on_every_pair_of_small_sets():
    labels = 4
    subsets = [np.array([(m >> k) & 1 for k in range(labels)], dtype=bool) for m in range(2 ** labels)]
    S = np.array([s for s, _ in itertools.product(subsets, subsets)])
    L = np.array([t for _, t in itertools.product(subsets, subsets)])
    eta = consensus_weight(S, L)
    for i in range(len(S)):
        inter, union, size_s, size_l = (S[i] & L[i]).sum(), (S[i] | L[i]).sum(), S[i].sum(), L[i].sum()
        expected = (inter / union if union else 0.0) if size_s >= size_l else (inter / size_s if size_s else 0.0)
        assert eta[i] == pytest.approx(expected)


def test_conformal_sets_cover_at_least_one_minus_theta_over_repetitions():
    """Eq. (4) by Monte Carlo: labels drawn from softmax(z) and a model with the right logits;
    tau from 100 calibration points, coverage on 200 fresh ones; mean over 200 repetitions within
    4 binomial standard errors of >= 0.9 (the temperature is fitted on the same points, as in
    the paper, so the bound is approximate; with the given g the sets still cover)."""
    rng = np.random.default_rng(2)
    covered = []
    for _ in range(200):
        z = rng.normal(0, 2.0, size=(300, 5))
        y = np.array([rng.choice(5, p=p) for p in softmax(z)])
        model = fit_conformal(z[:100], y[:100], theta=0.1, penalty=calibration_penalty(-0.3, 0.5), k_reg=1, rng=rng)
        sets = model.sets(z[100:], rng.uniform(size=200))
        covered.append(np.mean(sets[np.arange(200), y[100:]]))
    se = math.sqrt(0.9 * 0.1 / (200 * 200))
    assert np.mean(covered) >= 0.9 - 4 * se
    assert np.mean(covered) <= 0.96  # and the sets are not trivially everything


def test_temperature_scaling_lowers_the_validation_nll():
    rng = np.random.default_rng(3)
    z = rng.normal(0, 3.0, size=(400, 4))
    y = np.array([rng.choice(4, p=p) for p in softmax(z / 2.5)])  # over-confident logits: T > 1 fits better
    nll = lambda t: -np.mean(np.log(softmax(z, t)[np.arange(400), y]))  # noqa: E731
    fitted = fit_temperature(z, y)
    assert fitted > 1.3 and nll(fitted) < nll(1.3) < nll(1.0)


def test_distillation_losses_match_eq1_and_eq3_and_pull_the_right_way():
    torch.manual_seed(0)
    w, p = torch.randn(5, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    S = np.array([[1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1]], dtype=bool)
    eta = np.array([1.0, 0.5, 1.0, 0.25, 0.0])
    log_w = torch.log_softmax(w, 1).detach().numpy()
    expected = -np.mean([eta[j] * sum(log_w[j, k] for k in range(4) if S[j, k]) for j in range(5)])
    loss = backward_kd_loss(w, S, eta)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert (w.grad[0, :2] < 0).all() and (w.grad[0, 2:] > 0).all()  # descent raises S's logits, lowers the rest
    assert torch.all(w.grad[4] == 0)  # eta = 0: no pull
    mass = backward_kd_loss(w.detach(), S, eta, "set_mass")
    probabilities = np.exp(log_w)
    expected = -np.mean([eta[j] * (np.log(probabilities[j][S[j]].sum()) if S[j].any() else 0.0) for j in range(5)])
    assert float(mass) == pytest.approx(expected, rel=1e-6)
    teacher, student = torch.softmax(w.detach(), 1).numpy(), torch.softmax(p.detach(), 1).numpy()
    kl = np.mean(np.sum(teacher * np.log(teacher / student), axis=1))
    fkd = forward_kd_loss(w, p)
    assert float(fkd.detach()) == pytest.approx(kl, rel=1e-5)
    w.grad = None
    fkd.backward()
    assert w.grad is None or torch.all(w.grad == 0)  # the private model is the teacher: eq. (1) trains the proxy


# -- the server step and sampling ----------------------------------------------------------------


def test_weighted_average_is_fedavg_and_sampling_takes_the_fraction():
    a, b = {"w": np.array([1.0, 2.0], np.float32)}, {"w": np.array([3.0, 6.0], np.float16)}
    assert weighted_average([a, b], [1, 3])["w"].tolist() == [2.5, 5.0]
    sites = [f"s{j}" for j in range(10)]
    chosen = sample_sites(sites, 0.3, np.random.default_rng(4))
    assert len(chosen) == 3 and set(chosen) <= set(sites)
    assert chosen == sample_sites(sites, 0.3, np.random.default_rng(4))
    assert sample_sites(sites, 0.01, np.random.default_rng(4)) and sample_sites(sites, 1.0, np.random.default_rng(4)) == sites


# -- sessions in-process --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["local_only", "fedavg", "fedtype", "fml", "fedproto", "fedtype_personal"])
def test_learning_sessions_learn_and_keep_one_record_per_round(name):
    outcome, halves = run_learning(learning_method(name), blob_sites())
    assert outcome.status == "ok", outcome.reason
    rounds = outcome.rounds
    assert [r["round"] for r in rounds] == [1, 2, 3, 4] and all(r["answered"] == 3 for r in rounds)
    assert outcome.accuracy > 0.6  # 4 separated classes; chance is 0.25
    if name in ("local_only", "fedavg", "fedtype"):
        assert rounds[-1]["accuracy_mean"] >= rounds[0]["accuracy_mean"] - 0.05
    else:  # paper 002's baselines and FedType-P (tests/test_fedtype_baselines.py) share a global model
        assert outcome.global_accuracy > 0.5
    if name == "fedtype":
        assert all(1 <= r["set_size"] <= 4 and 0 <= r["eta"] <= 1 for r in rounds)
        assert 0.5 < outcome.set_coverage <= 1
    if name == "fedtype_personal":
        assert all(0 <= h.personalised_accuracy()[1] <= 1 for h in halves.values())


def test_fedtype_weight_bytes_are_the_proxy_and_far_below_the_private_models():
    method = learning_method("fedtype")
    outcome, halves = run_learning(method, blob_sites())
    proxy = sum(v.size for v in get_weights(halves["site-0"].proxy).values())
    private = sum(parameter_count(h.private) for h in halves.values())
    for record in outcome.rounds:
        assert record["weights_bytes_up"] == record["weights_bytes_down"] == 3 * proxy * 2  # float16
        assert record["private_weights_bytes"] == 2 * private * 2
    assert 10 * outcome.rounds[0]["weights_bytes_up"] < outcome.rounds[0]["private_weights_bytes"]


def test_no_private_weight_ever_appears_on_the_wire_while_the_proxy_does():
    """Every message of a FedType session, as msgpack bytes: no 8-byte run of any private
    tensor (float16 or float32, as it stands after training) occurs in any of them; the final
    proxy's bytes do occur (so the search can find weights when they are there)."""
    messages = []
    method = learning_method("fedtype", precision="float32", rounds=2)
    _, halves = run_learning(method, blob_sites(), capture=messages)
    wire = b"".join(data for _, data in messages)
    assert_no_private_weight_on_the_wire(halves, wire)
    proxy = get_weights(halves["site-0"].proxy, "float32")["0.weight"].tobytes()  # the final global proxy
    assert proxy[:64] in b"".join(data for direction, data in messages if direction == "down")


def test_a_site_that_gets_no_setup_or_a_bad_architecture_refuses_with_the_reason():
    from protocol.methods.base import RequestError

    method = learning_method("fedtype")
    half = type(method).site(blob_sites()["site-0"], np.random.default_rng(0), "site-0")
    with pytest.raises(RequestError, match="before setup"):
        half.answer(Phase("round", 0), {})
    request = method.setup_request(0)
    with pytest.raises(RequestError, match="image"):
        half.answer(Phase("setup"), {**request, "private": {"kind": "cnn", "channels": [4], "image": [3, 3],
                                                           "hidden": []}})
    with pytest.raises(RequestError, match="labels must be integers"):
        half.answer(Phase("setup"), {**request, "classes": 2})


@pytest.mark.parametrize("theta", [0.05, 0.1, 0.2, 0.3, 0.5])
def test_smallest_calibration_is_the_least_split_with_a_finite_threshold(theta):
    from stats.conformal import split_conformal_threshold
    from stats.conformal import smallest_calibration

    finite = [n for n in range(1, 60) if math.isfinite(split_conformal_threshold(np.arange(n, dtype=float), theta))]
    assert smallest_calibration(theta) == finite[0] and finite == list(range(finite[0], 60))


def test_fedtype_refuses_sites_too_small_for_informative_sets_and_the_session_says_why():
    """40 rows split 7:2:1 leave 4 conformal points: with theta = 0.1 tau would be +inf and every
    set all labels, so eq. (3) would carry nothing; the site refuses setup, is excluded by name,
    and the session goes on with the others (or aborts, explained, when none is left)."""
    sites = blob_sites()
    sites["site-small"] = sites["site-2"][:40]
    outcome, _ = run_learning(learning_method("fedtype", rounds=1), sites)
    assert outcome.status == "ok", outcome.reason
    assert "needs at least 9" in outcome.details["excluded"]["site-small"]
    outcome, _ = run_learning(learning_method("fedtype", rounds=1), {"site-small": sites["site-small"]})
    assert outcome.status == "aborted" and "needs at least 9" in outcome.reason


def test_cnn_private_models_train_on_image_shaped_features():
    net = build_net({"kind": "cnn", "channels": [4, 8], "image": [8, 8], "hidden": [16]}, 64, 10, seed=0)
    assert net(torch.zeros(5, 64)).shape == (5, 10)
    with pytest.raises(ValueError, match="image"):
        build_net({"kind": "cnn", "channels": [4], "image": [8, 7], "hidden": []}, 64, 10, seed=0)


# -- scenarios and runs --------------------------------------------------------------------------


def test_scenarios_refuse_learning_methods_on_scores_and_conformal_methods_on_examples():
    with pytest.raises(ScenarioError, match="methods\\[0\\].name"):
        load_scenario(SCENARIO, ["methods.0={name: fedcp_qq}"]).to_dict()
    with pytest.raises(ScenarioError, match="methods\\[0\\].name"):
        load_scenario("scenarios/quickstart.yaml", ["methods.0={name: fedtype, classes: 2}"]).to_dict()
    with pytest.raises(ScenarioError, match="precision"):
        load_scenario(SCENARIO, ["methods.2.precision=float8"]).to_dict()


def test_run_over_site_processes_meters_rounds_and_survives_a_crashed_site(tmp_path):
    # the crashed site is a dropout at once (its connection closes), so the deadline only bounds the
    # honest sites' first setup: each imports torch and trains, 21-22 s under the suite's load once
    spec = load_scenario(SCENARIO, SMALL + [
        "runtime.deadlines.respond=90", "faults=[{action: crash, sites: site-003, phase: round-1, method: fedtype}]"]).to_dict()
    spec["methods"] = spec["methods"][:4]  # paper 002's own four (tests/test_fedtype_baselines.py runs the rest)
    summary = run_study(spec, tmp_path)
    run = RunDirectory(tmp_path)
    results = {r["method"]: r for r in run.read_results()}
    assert all(r["status"] == "ok" for r in results.values())
    assert float(results["local_only"]["accuracy"]) > 0.3 and float(results["fedtype"]["accuracy"]) > 0.3
    assert results["fedtype"]["answered"] == "3"  # site-003 crashed in round 1 and is left out
    rounds = [r for r in run.read_rounds() if r["method"] == "fedtype"]
    assert [r["answered"] for r in rounds] == ["4", "3", "3"] and "site-003: connection lost" in rounds[1]["dropped"]
    ledger = read_ledger(tmp_path / "ledger.csv")
    halves = {}  # the private models' sizes, from the setup the sites reported
    for row in ledger:
        if row["method"] == "fedtype" and row["phase"].startswith("round-") and row["direction"] == "up" \
                and row["type"] == "response":
            halves.setdefault(row["phase"], []).append(int(row["bytes"]))
    proxy_bytes = (20 * 32 + 32 + 32 * 10 + 10) * 2
    smallest_private = (20 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 2
    for phase, sizes in halves.items():  # each answer holds the proxy, nowhere near a private model
        assert all(proxy_bytes < n < proxy_bytes + 1024 < smallest_private for n in sizes), (phase, sizes)
    assert all(int(r["wire_bytes_up"]) > int(r["weights_bytes_up"]) > 0 for r in rounds)
    # each round's wire bytes are its phase's in ledger.csv to the byte (summed as the ledger flushed);
    # round r is phase round-(r-1)
    for r in rounds:
        up = sum(int(row["bytes"]) for row in ledger if row["method"] == "fedtype" and row["trial"] == r["trial"]
                 and row["phase"] == f"round-{int(r['round']) - 1}" and row["direction"] == "up")
        assert int(r["wire_bytes_up"]) == up > 0, r
    assert summary["methods"]["fedtype"]["accuracy_mean"] is not None
    assert (tmp_path / "learning_curves.png").stat().st_size > 10_000
