"""Paper 002's ablation switches and aggregators (issue 51): the pure functions against their
formulas, and one local round under each switch keeping the property the switch is for."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from learning.aggregators import anchor_of, moreau_step, proximal_term  # noqa: E402
from learning.nets import build_net  # noqa: E402
from learning.train import SiteData, TrainingConfig, UARLState, uarl_round  # noqa: E402
from learning.uarl import calibration_penalty, symmetric_kd_loss, top_k_sets  # noqa: E402


@pytest.mark.parametrize("form, expected", [("g1", -0.2 + 0.4 + 0.5), ("g2", 0.5), ("g3", 0.5 * 0.16 + 0.5),
                                            ("g4", -0.5 * 0.16 + 0.4 + 0.5)])
def test_calibration_functions_of_section_4_2_4(form, expected):
    assert calibration_penalty(-0.4, 0.5, form) == pytest.approx(expected)
    for delta in (0.0, 0.3, 1.0):  # Delta >= 0: lambda for every function
        assert calibration_penalty(delta, 0.5, form) == 0.5
    with pytest.raises(ValueError):
        calibration_penalty(-0.1, 0.5, "g5")


def test_top_k_sets_are_the_k_largest_logits():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(50, 7))
    for k in (1, 3, 7, 9):
        sets = top_k_sets(z, k)
        assert (sets.sum(axis=1) == min(k, 7)).all()
        for row, chosen in zip(z, sets):  # brute force: every chosen logit >= every left-out one
            if 0 < chosen.sum() < 7:
                assert row[chosen].min() >= row[~chosen].max()


def test_symmetric_distillation_is_kl_from_the_proxy():
    rng = np.random.default_rng(1)
    w, p = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    soft = lambda z: np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)  # noqa: E731
    expected = np.mean(np.sum(soft(p) * (np.log(soft(p)) - np.log(soft(w))), axis=1))
    got = symmetric_kd_loss(torch.tensor(w), torch.tensor(p))
    assert float(got) == pytest.approx(expected, rel=1e-6)


def test_proximal_term_and_moreau_step_follow_their_papers():
    net = torch.nn.Linear(3, 2)
    anchor = [a + 1.0 for a in anchor_of(net)]  # every parameter 1 away
    count = sum(p.numel() for p in net.parameters())
    assert float(proximal_term(net, anchor, 0.2).detach()) == pytest.approx(0.5 * 0.2 * count)
    before = [a.clone() for a in anchor]
    moreau_step(anchor, net, lr=0.1, lam=2.0)  # w <- w - eta lambda (w - theta): 0.2 of the way to theta
    for a, b, p in zip(anchor, before, net.parameters()):
        assert torch.allclose(a, b - 0.2 * (b - p.detach()))


def site():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 5)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int) + 2 * (X[:, 1] > 0)
    return SiteData.split(np.column_stack([X, y]), rng, "cpu")


def one_round(**options):
    data = site()
    private = build_net({"kind": "mlp", "hidden": [16], "channels": [], "image": []}, 5, 4, 1)
    proxy = build_net({"kind": "mlp", "hidden": [4], "channels": [], "image": []}, 5, 4, 2)
    optimizers = (torch.optim.Adam(private.parameters(), 1e-2), torch.optim.Adam(proxy.parameters(), 1e-2))
    anchor = anchor_of(proxy)
    start = anchor_of(proxy)
    stats = uarl_round(private, proxy, optimizers, data, TrainingConfig(1e-2, 16, 5, 1, **options), UARLState(),
                       np.random.default_rng(4), anchor if options.get("aggregation", "fedavg") != "fedavg" else None)
    distance = sum(float(((p.detach() - s) ** 2).sum()) for p, s in zip(proxy.parameters(), start))
    moved = sum(float(((a - s) ** 2).sum()) for a, s in zip(anchor, start))
    return stats, distance, moved


def test_switches_change_what_they_name():
    stats, _, _ = one_round(label_sets="topk", top_k=2)
    assert stats["set_size"] == 2 and stats["private_set_size"] == 2
    assert one_round(consensus="one")[0]["eta"] == 1.0
    assert 0 <= one_round()[0]["eta"] <= 1
    one_round(backward_kd="symmetric")  # runs; the loss itself is checked above


def test_fedprox_holds_the_proxy_near_the_global_and_pfedme_moves_its_anchor():
    _, free, _ = one_round()
    _, held, _ = one_round(aggregation="fedprox", mu=100.0)
    assert held < free / 10
    _, _, moved = one_round(aggregation="pfedme", pfedme_lam=15.0, pfedme_lr=0.01)
    assert moved > 0
    _, _, still = one_round(aggregation="fedprox", mu=1.0)
    assert still == 0  # FedProx's anchor is the global model it was sent: never moved


def synthetic_report(global_=0.5, proxy=0.6, private=0.7):
    """Every experiment of bench/paper002.py with the labels of its scenario and the same three
    accuracies for every method (a 3-round curve with eta rising)."""
    import importlib.util
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("paper002", root / "bench" / "paper002.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    report = {}
    for name, (path, _) in bench.EXPERIMENTS.items():
        methods = yaml.safe_load((root / path).read_text())["methods"]
        curve = {str(r): [global_, proxy, private, 0.3 + 0.1 * r, 3.0, 2.0] for r in (1, 2, 3)}
        report[name] = {"seconds": 1.0, "methods": {m.get("label") or m["name"]: {
            "global": global_, "proxy": proxy, "private": private, "seconds": 1.0, "curve": curve} for m in methods}}
    timing = {"fedtype": 1.1, "symmetric": 1.0, "proxy_ce": 0.5, "train_points": 450}
    return bench, report, timing


def test_paper002_verdicts_follow_the_numbers():
    bench, report, timing = synthetic_report()
    summary = {row[0]: row for row in bench.build_tables(report, timing, True, 10, 1, {"timing": 1.0})[0]["rows"]}
    ordering = "Table 1: private > proxy > global, every aggregation and alpha"
    assert summary[ordering][3] == "reproduced" and summary[ordering][2].startswith("holds in 9 of 9")
    assert summary["Figure 6: eta rises over the rounds"][3] == "reproduced"
    report["aggregators-a0.1"]["methods"]["fedtype_pfedme"]["proxy"] = 0.8  # the proxy above the private model
    summary = {row[0]: row for row in bench.build_tables(report, timing, True, 10, 1, {"timing": 1.0})[0]["rows"]}
    assert summary[ordering][3] == "differs" and summary[ordering][2].startswith("holds in 8 of 9")


def test_a_pfedme_site_sends_its_local_model_and_keeps_the_personalised_proxy():
    """pFedMe (T Dinh et al. 2020, algorithm 1): what travels is w_i, which moved from the global
    model towards the personalised theta_i by eta lambda per step; theta_i stays at the site."""
    from learning.nets import get_weights
    from protocol.codecs.tensors import pack_tensors
    from protocol.phases import Phase
    from tests.learning_sessions import blob_sites, learning_method

    torch.set_num_threads(1)
    method = learning_method("fedtype", aggregation="pfedme", backward_loss="set_mass")
    half = type(method).site(blob_sites()["site-0"], np.random.default_rng(0), "site-0")
    half.answer(Phase("setup"), method.setup_request(0))
    start = method.initial_global(6, np.random.default_rng(1))
    sent = half.answer(Phase("round", 0), {"weights": pack_tensors({k: v.astype("float16") for k, v in start.items()})})
    theta = get_weights(half.proxy)
    gap = lambda a, b: sum(float(np.sum((np.asarray(a[k], float) - np.asarray(b[k], float)) ** 2)) for k in a)  # noqa: E731
    assert gap(sent["tensors"], theta) > 0  # theta_i is not what travels
    assert 0 < gap(sent["tensors"], start) < gap(theta, start)  # w_i moved, less far than theta_i
