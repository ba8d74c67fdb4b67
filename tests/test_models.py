"""Models and scores (issue 8, point 4): set/score consistency checked by brute force, coverage of
the classification scores by Monte Carlo, and the torch models' training, pickling and device."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from models import MODELS
from models.scores import SCORES, aps_score, aps_set, cumulative_mass, lac_score, lac_set
from models.torch_nets import resolve_device
from stats.conformal import split_conformal_threshold
from tests.oracles import binomial_tolerance

CLASSIFICATION_SCORES = {"lac": {}, "aps": {"penalty": 0.0, "k_reg": 0}, "raps": {"penalty": 0.05, "k_reg": 2}}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def random_probabilities(rng, n, classes):
    return rng.dirichlet(np.full(classes, 0.7), size=n)


@pytest.mark.parametrize("name", sorted(CLASSIFICATION_SCORES))
def test_a_label_is_in_the_set_exactly_when_its_score_is_below_the_threshold(name):
    rng = np.random.default_rng(0)
    score_fn, set_fn = SCORES[name]
    params = CLASSIFICATION_SCORES[name]
    probabilities = random_probabilities(rng, 200, 6)
    for q in (0.0, 0.3, 0.77, 1.0, 1.3):
        members = set_fn(probabilities, q, **params)
        for label in range(6):
            expected = score_fn(np.full(200, label), probabilities, **params) <= q
            np.testing.assert_array_equal(members[:, label], expected)


def test_aps_and_raps_scores_by_brute_force():
    probabilities = np.array([[0.1, 0.5, 0.15, 0.25]])
    # ranks: class 1 (0.5), 3 (0.25), 2 (0.15), 0 (0.1); cumulative mass 0.5, 0.75, 0.9, 1.0
    np.testing.assert_allclose(cumulative_mass(probabilities)[0], [1.0, 0.5, 0.9, 0.75])
    penalty = 0.1  # k_reg = 1: ranks 2, 3, 4 pay 0.1, 0.2, 0.3
    np.testing.assert_allclose(aps_score([0, 1, 2, 3], np.repeat(probabilities, 4, axis=0), penalty, 1),
                               [1.3, 0.5, 1.1, 0.85])
    np.testing.assert_allclose(lac_score([1, 0], np.repeat(probabilities, 2, axis=0)), [0.5, 0.9])
    assert lac_set(probabilities, 0.75).tolist() == [[False, True, False, True]]
    assert aps_set(probabilities, 0.75).tolist() == [[False, True, False, True]]


@pytest.mark.parametrize("name", sorted(CLASSIFICATION_SCORES))
def test_split_conformal_sets_cover_at_the_nominal_level(name):
    """Labels drawn from the model's own probabilities: with n calibration points the coverage
    lies in [1 - alpha, 1 - alpha + 1/(n + 1)] (continuous scores), up to Monte Carlo error."""
    rng = np.random.default_rng(11)
    score_fn, set_fn = SCORES[name]
    params = CLASSIFICATION_SCORES[name]
    alpha, n, repetitions, classes = 0.1, 40, 4000, 5
    covered = 0
    for _ in range(repetitions):
        probabilities = random_probabilities(rng, n + 1, classes)
        labels = np.array([rng.choice(classes, p=p) for p in probabilities])
        threshold = split_conformal_threshold(score_fn(labels[:n], probabilities[:n], **params), alpha)
        covered += bool(set_fn(probabilities[n:], threshold, **params)[0, labels[n]])
    coverage = covered / repetitions
    tolerance = binomial_tolerance(1 - alpha, repetitions)
    assert 1 - alpha - tolerance <= coverage <= 1 - alpha + 1 / (n + 1) + tolerance


def test_resolve_device():
    import torch

    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="sees no CUDA device"):
            resolve_device("cuda")


def small_regression(rng, n=600):
    X = rng.uniform(-2, 2, (n, 3))
    y = X[:, 0] + (0.3 + 0.5 * np.abs(X[:, 1])) * rng.standard_normal(n)
    return X, y


def test_cqr_net_learns_the_conditional_quantiles():
    rng = np.random.default_rng(3)
    X, y = small_regression(rng, 1500)
    params = {**default_params("cqr_net"), "epochs": 80, "hidden": 32, "lr": 3e-3, "batch_size": 128}
    model = MODELS["cqr_net"](device="auto", **params).fit(X, y, 0.1, rng)
    X_test, y_test = small_regression(rng, 2000)
    bounds = model.base_predictions(X_test)
    assert bounds.shape == (2000, 2) and (bounds[:, 0] <= bounds[:, 1]).all()
    inside = np.mean((bounds[:, 0] <= y_test) & (y_test <= bounds[:, 1]))
    assert 0.7 < inside < 0.9  # nominal 0.8 before conformalization
    # wider where the noise is larger: the true width ratio of the two regions is about 2.5, a
    # constant-width model gives 1; 80 epochs reach 2.3 alone, but 1.7 was seen once in the full
    # suite on a loaded machine (thread-dependent float reductions), so the bar is 1.4
    width = bounds[:, 1] - bounds[:, 0]
    assert width[np.abs(X_test[:, 1]) > 1.5].mean() > 1.4 * width[np.abs(X_test[:, 1]) < 0.5].mean()


def default_params(kind):
    from specs.schema import validate

    return validate({"type": "map", "fields": MODELS[kind].PARAMS}, {}, "model.params")


def test_classifier_on_digits_and_its_pickle_in_a_site_process(monkeypatch):
    from sklearn.datasets import load_digits

    digits = load_digits()
    X, y = digits.data / 16.0, digits.target.astype(float)
    rng = np.random.default_rng(4)
    model = MODELS["classifier"](device="auto", **{**default_params("classifier"), "score": "aps",
                                                   "epochs": 40}).fit(X[:1000], y[:1000], 0.1, rng)
    probabilities = model.base_predictions(X[1000:])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert np.mean(probabilities.argmax(axis=1) == y[1000:]) > 0.9
    monkeypatch.setenv("QUORUM_SITE", "1")
    copy = pickle.loads(pickle.dumps(model))  # what a site process does with the model file
    np.testing.assert_allclose(copy.scores(X[1000:], y[1000:]), model.scores(X[1000:], y[1000:]), atol=1e-6)
    assert copy.device in ("cpu", "cuda") and copy.score == "aps"
    threshold = split_conformal_threshold(model.scores(X[1000:1400], y[1000:1400]), 0.1)
    coverage, size = model.evaluate(probabilities[400:], y[1400:], threshold)
    assert coverage > 0.9 - binomial_tolerance(0.9, 397) and 0.5 < size < 3.0


def test_a_torch_classifier_study_over_site_processes(tmp_path):
    """Sites unpickle the torch model, score their own label-skewed shards on their device and
    report it; centralized calibration on their pooled scores covers at about 1 - alpha."""
    import json
    from pathlib import Path

    from runner.outputs import RunDirectory
    from runner.study import run_study
    from quorum import load_scenario

    root = Path(__file__).resolve().parent.parent
    scenario = load_scenario(root / "scenarios" / "digits-label-skew.yaml",
                             ["trials=2", "sites.count=4", "model.params.epochs=25", "model.params.score=raps"]).to_dict()
    summary = run_study(scenario, tmp_path / "run", backend="processes")
    assert summary["site_devices"] == [resolve_device("auto")]
    # where each part ran, over site processes too (runner.devices): 4 sites scored, the harness trained
    assert summary["devices"]["scoring"] == {"device": resolve_device("auto"), "sites": {resolve_device("auto"): 4}}
    assert summary["devices"]["model_training"]["device"] == resolve_device("auto")
    assert summary["devices"]["site_training"]["device"] == "none"
    assert summary["heterogeneity"]["kind"] == "dirichlet"
    assert [s["n"] for s in summary["heterogeneity"]["sites"].values()] == [179] * 4  # 718 // 4
    rows = RunDirectory(tmp_path / "run").read_results()
    assert {r["status"] for r in rows} == {"ok"} and len(rows) == 6
    # label skew breaks exchangeability across sites, not the pooled sample's: centralized holds
    central = summary["methods"]["centralized"]
    assert central["coverage_mean"] > 0.9 - binomial_tolerance(0.9, 2 * 359) and 1 <= central["size_mean"] < 5
    events = [json.loads(line) for line in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert all(e["devices"] == summary["site_devices"] for e in events if e["event"] == "trial_open")


def test_a_class_missing_from_the_training_split_still_gets_a_column():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((300, 4))
    y = (X[:, 0] > 0).astype(float)  # classes 0 and 1 only in training
    model = MODELS["classifier"](device="cpu", **{**default_params("classifier"), "epochs": 5})
    model.n_classes = 3
    model.fit(X, y, 0.1, rng)
    probabilities = model.base_predictions(X[:10])
    assert probabilities.shape == (10, 3)
    assert np.all(model.scores(X[:3], np.array([2, 2, 2])) > 0.5)  # the unseen class is unlikely


def test_a_network_scores_read_only_rows_silently_and_as_it_scores_a_writable_copy():
    """Sites score rows handed to them as read-only views; torch warns on a tensor made from one,
    and that warning reached users' terminals (paper 000's network runs)."""
    import warnings

    rng = np.random.default_rng(3)
    X = rng.standard_normal((40, 4))
    model = MODELS["classifier"](device="cpu", **{**default_params("classifier"), "epochs": 2})
    model.fit(X, (X[:, 0] > 0).astype(float), 0.1, rng)
    expected = model.forward(X.copy())
    X.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(model.forward(X), expected)
