"""FedType's per-epoch values (paper 002 appendix I, table 7; epochs.csv): what a site measures per
local epoch against what its round reports, the training left as it was, and the coordinator's
check of the epoch values as a site's untrusted word."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from learning.nets import accuracy, build_net, get_weights  # noqa: E402
from learning.train import SiteData, TrainingConfig, UARLState, uarl_round  # noqa: E402
from protocol.methods.learning_rounds import epoch_metrics, epoch_rows, split_epoch_metrics  # noqa: E402
from tests.learning_sessions import blob_sites, learning_method, run_learning  # noqa: E402


def site_round(epochs=None, local_epochs=5, passes=1):
    rng = np.random.default_rng(3)
    X = rng.normal(size=(230, 5)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int) + 2 * (X[:, 1] > 0)
    data = SiteData.split(np.column_stack([X, y]), rng, "cpu")
    private = build_net({"kind": "mlp", "hidden": [16], "channels": [], "image": []}, 5, 4, 1)
    proxy = build_net({"kind": "mlp", "hidden": [4], "channels": [], "image": []}, 5, 4, 2)
    optimizers = (torch.optim.Adam(private.parameters(), 1e-2), torch.optim.Adam(proxy.parameters(), 1e-2))
    stats = uarl_round(private, proxy, optimizers, data, TrainingConfig(1e-2, 16, local_epochs, passes), UARLState(),
                       np.random.default_rng(4), epochs=epochs)
    return stats, data, private, proxy


def test_epoch_values_add_up_to_the_round_and_change_no_update():
    epochs = []
    stats, data, private, proxy = site_round(epochs)
    assert [e["epoch"] for e in epochs] == [1, 2, 3, 4, 5]
    # the last epoch's accuracy is the round's proxy_accuracy (the proxy on the test split at the end)
    assert epochs[-1]["proxy_accuracy"] == accuracy(proxy, data.X_test, data.y_test)
    assert all(0 <= e["proxy_accuracy"] <= 1 for e in epochs)
    # the round's set_size is the mean over all points trained on: the epochs' means weighted by their parts
    parts = [len(p) for p in np.array_split(np.arange(len(data.y_train)), 5)]
    assert len(set(parts)) == 2  # unequal parts: a plain mean over epochs would not do
    weighted = sum(n * e["set_size"] for n, e in zip(parts, epochs)) / sum(parts)
    assert weighted == pytest.approx(stats["set_size"], rel=1e-12)
    # measuring draws nothing and trains nothing: the same networks without the list
    plain, _, private0, proxy0 = site_round(None)
    assert plain == stats
    for a, b in ((get_weights(proxy, "float32"), get_weights(proxy0, "float32")),
                 (get_weights(private, "float32"), get_weights(private0, "float32"))):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_with_several_passes_the_last_pass_is_reported():
    epochs = []
    site_round(epochs, local_epochs=3, passes=2)
    assert [e["epoch"] for e in epochs] == [1, 2, 3]


def test_epoch_metrics_flatten_and_the_coordinator_takes_them_back():
    sent = epoch_metrics([{"epoch": 1, "proxy_accuracy": 0.5, "set_size": 2.5},
                          {"epoch": 2, "proxy_accuracy": 0.75, "set_size": float("nan")}])
    assert sent == {"epoch1_proxy_accuracy": 0.5, "epoch1_set_size": 2.5, "epoch2_proxy_accuracy": 0.75}
    rest, epochs, refused = split_epoch_metrics({"train": 9, "eta": 0.4, **sent}, local_epochs=2, classes=4)
    assert rest == {"train": 9, "eta": 0.4} and refused == ""
    assert epochs == {1: {"proxy_accuracy": 0.5, "set_size": 2.5}, 2: {"proxy_accuracy": 0.75}}


@pytest.mark.parametrize("key, value, words", [
    ("epoch6_set_size", 2.0, "epoch6_set_size: epoch outside 1..5"),
    ("epoch0_proxy_accuracy", 0.5, "epoch0_proxy_accuracy: epoch outside 1..5"),
    ("epoch" + "9" * 5000 + "_set_size", 1.0, "epoch outside 1..5"),
    ("epoch2_private_accuracy", 0.5, "epoch2_private_accuracy: unknown per-epoch quantity"),
    ("epoch2_proxy_accuracy", 1.5, "epoch2_proxy_accuracy: 1.5 is not a finite number in [0, 1]"),
    ("epoch2_set_size", 11.0, "epoch2_set_size: 11.0 is not a finite number in [0, 10]"),
    ("epoch2_set_size", -0.1, "is not a finite number in [0, 10]"),
    ("epoch3_set_size", math.inf, "epoch3_set_size: inf is not a finite number"),
    ("epoch3_set_size", math.nan, "epoch3_set_size: nan is not a finite number"),
    ("epoch3_set_size", "2", "epoch3_set_size: '2' is not a finite number"),
    ("epoch3_set_size", True, "epoch3_set_size: True is not a finite number"),
])
def test_hostile_epoch_values_are_refused_by_name_and_the_rest_kept(key, value, words):
    good = {f"epoch{e}_proxy_accuracy": 0.5 for e in range(1, 6)}
    rest, epochs, refused = split_epoch_metrics({"train": 9, "proxy_accuracy": 0.7, **good, key: value},
                                                local_epochs=5, classes=10)
    assert words in refused and len(refused) < 200
    assert epochs == {}  # one bad value: none of that site's epoch values count
    assert rest == {"train": 9, "proxy_accuracy": 0.7}


def test_epoch_rows_are_site_means_and_name_the_refused():
    record = {"round": 4, "epochs": {"a": {1: {"proxy_accuracy": 0.5, "set_size": 2.0}, 2: {"proxy_accuracy": 0.7}},
                                     "b": {1: {"proxy_accuracy": 0.9, "set_size": 3.0}}},
              "epochs_refused": {"c": "epoch9_set_size: epoch outside 1..2 (local_epochs)"}}
    rows = epoch_rows(record)
    assert [(r["epoch"], r["sites"]) for r in rows] == [(1, 2), (2, 1)]
    assert rows[0]["proxy_accuracy"] == pytest.approx(0.7) and rows[0]["set_size"] == pytest.approx(2.5)
    assert rows[1]["proxy_accuracy"] == pytest.approx(0.7) and math.isnan(rows[1]["set_size"])
    assert all(r["refused"] == "c: epoch9_set_size: epoch outside 1..2 (local_epochs)" for r in rows)
    assert epoch_rows({"round": 1, "sites": {}}) == []


@pytest.mark.slow
def test_a_session_s_epoch_rows_match_its_rounds_and_a_lying_site_is_named(monkeypatch):
    """Through the tensors codec: per round, epochs 1..local_epochs from every site, the last one's
    accuracy the round's proxy_accuracy; a site that adds an out-of-range epoch value loses its epoch
    values for the round (named), not its update."""
    from protocol.methods.fedtype import FedTypeSite

    method = learning_method("fedtype", rounds=2, local_epochs=3)
    outcome, _ = run_learning(method, blob_sites())
    assert outcome.status == "ok"
    for record in outcome.rounds:
        rows = [r for r in outcome.epochs if r["round"] == record["round"]]
        assert [r["epoch"] for r in rows] == [1, 2, 3] and all(r["sites"] == 3 for r in rows)
        assert rows[-1]["proxy_accuracy"] == pytest.approx(record["proxy_accuracy"], abs=1e-12)
        assert min(r["set_size"] for r in rows) - 1e-9 <= record["set_size"] <= max(r["set_size"] for r in rows) + 1e-9
        assert rows[-1]["refused"] == ""

    honest = FedTypeSite.train_round

    def lying(self, weights):
        tensors, metrics = honest(self, weights)
        return tensors, {**metrics, "epoch7_set_size": 1.0}

    monkeypatch.setattr(FedTypeSite, "train_round", lying)
    lied, _ = run_learning(learning_method("fedtype", rounds=2, local_epochs=3), blob_sites())
    assert lied.status == "ok" and all(r["answered"] == 3 for r in lied.rounds)  # every update still counted
    assert lied.epochs and all(r["epoch"] == "" and r["sites"] == 0 for r in lied.epochs)
    assert "site-0: epoch7_set_size: epoch outside 1..3 (local_epochs)" in lied.epochs[0]["refused"]
