"""DP-SGD models (issue 49 point 3): a scenario's torch model trained with Opacus's DP-SGD, its
(epsilon, delta) the accountant's, validated like every scenario field and reported in
summary.json beside the calibration's privacy (models.dp_sgd)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import quorum
from models.dp_sgd import noise_multiplier, spent_epsilon, train_dp_sgd
from scenarios.scenario import validate_scenario
from specs.schema import ScenarioError

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

DP = {"epsilon": 8.0, "delta": 1e-5, "clip": 1.0, "epochs": 4, "batch_size": 64}


def digits(trials: int = 1, dp_sgd: dict | None = DP, **model_params) -> dict:
    model = {"kind": "classifier", "device": "cpu",
             "params": {"hidden": 32, "layers": 1, "epochs": 5, **model_params}}
    if dp_sgd is not None:
        model["dp_sgd"] = dict(dp_sgd) if isinstance(dp_sgd, dict) else dp_sgd
    return {"name": "dp-sgd-tiny", "seed": 3, "trials": trials, "alpha": 0.1,
            "data": {"source": "sklearn", "name": "digits"},
            "split": {"train": 0.4, "calibration": 0.4, "test": 0.2},
            "sites": {"count": 4, "policy": {"non_private": "allow"}},
            "model": model,
            "methods": [{"name": "centralized"},
                        {"name": "private_cp", "epsilon": 1.0, "bins": {"count": 0, "lo": 0.0, "hi": 1.0}}]}


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def blobs(n: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    X = rng.normal(size=(n, 6)) + 2.0 * np.eye(3, 6)[y]
    return X, y


def small_net(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def cross_entropy(out, target):
    return torch.nn.functional.cross_entropy(out, target.long())


def test_the_reported_epsilon_is_the_accountants_for_the_noise_multiplier_and_steps():
    X, y = blobs()
    spec = {**DP, "epochs": 3, "lr": None, "accountant": "prv", "noise": "os"}
    _, record = train_dp_sgd(small_net(0), X, y, cross_entropy, np.random.default_rng(0), spec, lr=1e-2,
                             weight_decay=0.0, device="cpu")
    steps = 3 * int(round(1 / record["sample_rate"]))
    assert record["steps"] == steps and record["sample_rate"] == pytest.approx(1 / np.ceil(400 / 64))
    # the noise multiplier is the accountant's for the target (not a constant written anywhere): the
    # epsilon Opacus's accountant gives for those steps is the target's, within its search's 0.01 ...
    again = spent_epsilon(record["noise_multiplier"], record["sample_rate"], record["steps"], 1e-5, "prv")
    assert record["epsilon"] == pytest.approx(again, rel=1e-6)
    assert 8.0 - 0.01 <= record["epsilon"] <= 8.0 + 1e-9 and record["delta"] == 1e-5
    # ... and 3% less noise would spend more than the target
    assert spent_epsilon(0.97 * record["noise_multiplier"], record["sample_rate"], record["steps"], 1e-5, "prv") > 8.0
    assert record["noise_multiplier"] == noise_multiplier(8.0, 1e-5, record["sample_rate"], 3, "prv")
    # another accountant gives its own multiplier, still meeting the target by its own count
    rdp = {**spec, "accountant": "rdp"}
    _, other = train_dp_sgd(small_net(0), X, y, cross_entropy, np.random.default_rng(0), rdp, lr=1e-2,
                            weight_decay=0.0, device="cpu")
    assert other["noise_multiplier"] != record["noise_multiplier"]
    assert other["epsilon"] == pytest.approx(spent_epsilon(other["noise_multiplier"], other["sample_rate"],
                                                           other["steps"], 1e-5, "rdp"), rel=1e-6)


def test_without_noise_or_clipping_dp_sgd_trains_as_plain_training_does():
    X, y = blobs(600, seed=1)
    spec = {**DP, "epochs": 15, "clip": 1e6, "lr": None, "accountant": "rdp", "noise": "seeded"}
    private, record = train_dp_sgd(small_net(1), X, y, cross_entropy, np.random.default_rng(1), spec, lr=1e-2,
                                   weight_decay=0.0, device="cpu", sigma=0.0)
    assert record["noise_multiplier"] == 0.0 and record["epsilon"] == float("inf")
    # plain Adam on shuffled batches of the same expected size, same epochs, same initial weights
    plain = small_net(1)
    optimizer = torch.optim.Adam(plain.parameters(), lr=1e-2)
    Xt, yt = torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(y)
    generator = torch.Generator().manual_seed(1)
    for _ in range(15):
        order = torch.randperm(len(X), generator=generator)
        for start in range(0, len(X), 64):
            batch = order[start:start + 64]
            optimizer.zero_grad()
            cross_entropy(plain(Xt[batch]), yt[batch]).backward()
            optimizer.step()
    with torch.no_grad():
        before = float(cross_entropy(small_net(1)(Xt), yt))
        dp_loss, plain_loss = float(cross_entropy(private(Xt), yt)), float(cross_entropy(plain(Xt), yt))
    assert dp_loss < 0.5 * before and plain_loss < 0.5 * before
    assert dp_loss == pytest.approx(plain_loss, abs=0.05)
    assert not any(hasattr(p, "grad_sample") and p.grad_sample is not None for p in private.parameters())


@pytest.mark.parametrize("dp_sgd, field", [
    ({"delta": 1e-5}, "model.dp_sgd.epsilon"),
    ({"epsilon": -1, "delta": 1e-5}, "model.dp_sgd.epsilon"),
    ({"epsilon": 8, "delta": 1.5}, "model.dp_sgd.delta"),
    ({"epsilon": 8, "delta": 1e-5, "clip": 0}, "model.dp_sgd.clip"),
    ({"epsilon": 8, "delta": 1e-5, "batch_size": 0}, "model.dp_sgd.batch_size"),
    ({"epsilon": 8, "delta": 1e-5, "accountant": "moments"}, "model.dp_sgd.accountant"),
    ({"epsilon": 8, "delta": 1e-5, "sigma": 1.1}, "model.dp_sgd.sigma"),  # the multiplier is never written
    ("yes", "model.dp_sgd"),
])
def test_a_bad_dp_sgd_field_is_named(dp_sgd, field):
    with pytest.raises(ScenarioError) as caught:
        validate_scenario(digits(dp_sgd=dp_sgd))
    assert field in [p.field for p in caught.value.problems]


def test_dp_sgd_is_refused_for_a_model_not_trained_by_gradient_descent_and_where_hosts_rebuild_it():
    raw = digits()
    raw["model"] = {"kind": "ridge", "dp_sgd": DP}
    raw["data"] = {"source": "sklearn", "name": "diabetes"}
    with pytest.raises(ScenarioError, match="model.dp_sgd"):
        validate_scenario(raw)
    on_ray = {**digits(), "runtime": {"launcher": {"kind": "ray"}}}
    with pytest.raises(ScenarioError) as caught:
        validate_scenario(on_ray)
    assert caught.value.field == "model.dp_sgd.noise"
    seeded = {**digits(dp_sgd={**DP, "noise": "seeded"}), "runtime": {"launcher": {"kind": "ray"}}}
    assert validate_scenario(seeded)["model"]["dp_sgd"]["noise"] == "seeded"
    # absent or null: plain training, and the scenario as run does not grow a dp_sgd field
    assert "dp_sgd" not in validate_scenario(digits(dp_sgd=None))["model"]
    valid = validate_scenario(digits())
    assert valid["model"]["dp_sgd"] == {**DP, "lr": None, "accountant": "prv", "noise": "os"}
    assert validate_scenario(valid) == valid  # a validated scenario validates again to itself


def test_a_run_in_process_reports_the_models_epsilon_delta_beside_the_calibrations(tmp_path):
    run = quorum.run(digits(), tmp_path / "dp", backend="inprocess")
    summary = json.loads((run.path / "summary.json").read_text())
    model = summary["model"]
    assert model["training"] == "DP-SGD" and model["delta"] == 1e-5 and model["noise"] == "os"
    assert model["epsilon"] == pytest.approx(spent_epsilon(model["noise_multiplier"], model["sample_rate"],
                                                           model["steps"], 1e-5, "prv"), rel=1e-6)
    assert model["epsilon"] <= 8.0 + 1e-6 and model["steps"] == 4 * round(1 / model["sample_rate"])
    assert model["calibration"] == [{"method": "centralized", "epsilon": None, "privacy": "none"},
                                    {"method": "private_cp", "epsilon": 1.0, "privacy": "central"}]
    results = run.results
    assert set(results["method"]) == {"centralized", "private_cp"} and results["coverage"].between(0, 1).all()
    from runner.report import run_report

    lines = [str(r) for r in run_report(summary) if type(r).__name__ == "Text"]
    line = next(text for text in lines if text.startswith("model: DP-SGD"))
    assert "delta 1e-05" in line and "calibration: centralized non-private, private_cp epsilon 1 (central)" in line
    # a model trained without DP-SGD says so too (and prints no model line)
    plain = quorum.run(digits(dp_sgd=None), tmp_path / "plain", backend="inprocess").summary["model"]
    assert plain["training"] == "non-private" and plain["epsilon"] is None


def test_sites_started_by_hand_cannot_rebuild_a_model_trained_with_os_noise(tmp_path):
    with pytest.raises(ValueError, match="model.dp_sgd.noise"):
        quorum.run(digits(), tmp_path / "ext", backend="processes", external_sites=True)


def test_a_resumed_run_that_trained_nothing_still_says_its_model_is_dp_sgd():
    from models.dp_sgd import model_line, model_summary

    spec = validate_scenario(digits())["model"]["dp_sgd"]
    resumed = model_summary("classifier", [], spec)
    assert resumed["training"] == "DP-SGD" and resumed["epsilon"] is None and resumed["target_epsilon"] == 8.0
    assert "not trained in this invocation" in model_line(resumed, "none")
    assert model_summary("classifier", [None, None])["training"] == "non-private"
