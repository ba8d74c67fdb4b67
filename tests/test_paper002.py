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
from protocol.methods import RequestError  # noqa: E402


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
    assert summary[ordering][3] == "reproduced" and summary[ordering][2].startswith("holds in 12 of 12")
    assert summary["Figure 6: eta rises over the rounds"][3] == "reproduced"
    report["aggregators-a0.1"]["methods"]["fedtype_pfedme"]["proxy"] = 0.8  # the proxy above the private model
    summary = {row[0]: row for row in bench.build_tables(report, timing, True, 10, 1, {"timing": 1.0})[0]["rows"]}
    assert summary[ordering][3] == "differs" and summary[ordering][2].startswith("holds in 11 of 12")


def test_paper002_aggregation_verdicts_follow_the_numbers():
    """Section 4.2.1's personalised-above-general claim and table 5's columns, each flipped by
    the one number it reads."""
    bench, report, timing = synthetic_report()
    claim = "Table 1 (section 4.2.1): personalised aggregations (pFedMe, pFedBayes) above general ones (FedAvg, FedProx)"
    upper = "Table 5: Homo >= largest+proxy >= FedType, per aggregation"
    verdicts = lambda: {row[0]: row for row in bench.build_tables(  # noqa: E731
        report, timing, True, 10, 1, {"timing": 1.0})[0]["rows"]}
    assert verdicts()[claim][3] == "differs"  # every aggregation equal: not above
    for alpha in ("1.0", "0.5", "0.1"):
        report[f"aggregators-a{alpha}"]["methods"]["fedtype_pfedbayes"]["private"] = 0.75
    assert verdicts()[claim][3] == "reproduced"
    for agg in bench.AGGREGATIONS:
        report["upper-bound"]["methods"][f"homo_{agg}"]["global"] = 0.9
        report["upper-bound"]["methods"][f"big_{agg}"]["private"] = 0.8
    assert verdicts()[upper][2].startswith("4 of 4") and verdicts()[upper][3] == "reproduced"
    for agg in ("fedavg", "fedprox"):  # the homogeneous global model below FedType's private models
        report["upper-bound"]["methods"][f"homo_{agg}"]["global"] = 0.6
    summary = verdicts()
    assert summary[upper][2].startswith("2 of 4") and summary[upper][3] == "differs"


def test_paper002_rows_name_each_experiments_own_trials():
    """A rerun of some experiments at 3 trials: their rows say 3 trials and the command that runs
    them, the others still one."""
    bench, report, timing = synthetic_report()
    report["ablations"]["trials"] = 3
    summary = {row[0]: row for row in bench.build_tables(report, timing, True, 10, 1, {"timing": 1.0})[0]["rows"]}
    g = summary["Figure 3: g1, g3, g4 above g2; g3 best"]
    assert "3 trials" in g[4] and g[5] == "make paper002 ARGS='--quick --trials 3'"
    scale = summary["Table 6: accuracy falls slowly as clients grow; private > proxy > global"]
    assert "1 trial" in scale[4] and scale[5] == "make paper002 ARGS=--quick"


def test_paper002_table7_counts_the_steps_where_the_set_size_follows_the_accuracy():
    """Table 7's rule against the paper's own arrows (FMNIST 4 of 4; CIFAR-10 2, CIFAR-100 4,
    Fed-ISIC19 2), and the verdict read from the convergence run's per-epoch values at round 50."""
    bench, report, timing = synthetic_report()
    assert [bench.same_direction(*bench.PAPER_T7[d]) for d in bench.PAPER_T7] == [(4, 4), (2, 4), (4, 4), (2, 4)]
    assert bench.arrows([1.0, 1.004, 0.5]) == ["-", "-", "down"]  # no change at two decimals: no arrow
    row = lambda: {r[0]: r for r in bench.build_tables(  # noqa: E731
        report, timing, True, 10, 1, {"timing": 1.0})[0]["rows"]}["Table 7: accuracy and |S| per epoch at round 50"]
    assert row()[3] == "differs" and "no per-epoch values" in row()[2]  # a run without epochs.csv
    up = [[e, 0.80 + 0.01 * e, 2.0 + 0.1 * e] for e in range(1, 6)]  # |S| rises with the accuracy: 4 of 4
    entry = report["convergence"]["methods"]["fedtype_fedavg"]
    entry["epochs"] = {"50": up, "49": [[e, 0.8 + 0.01 * e, 3.0 - 0.1 * e] for e in range(1, 6)]}
    assert row()[3] == "differs" and "in 4 of 4 steps" in row()[2]  # round 50 agrees, the run in only 50%
    assert "in 50% of 8 steps" in row()[2] and "round 50 alone passes" in row()[4]
    entry["epochs"]["49"] = [[e, 0.8 - 0.01 * e, 3.0 - 0.1 * e] for e in range(1, 6)]  # both fall: agree
    assert row()[3] == "reproduced" and "in 100% of 8 steps" in row()[2] and "fell in 4 of 8 steps" in row()[2]
    entry["epochs"]["50"] = [[e, 0.80 + 0.01 * e, 2.0 + 0.1 * (e % 2)] for e in range(1, 6)]  # 2 of 4
    assert row()[3] == "differs" and "in 2 of 4 steps" in row()[2]
    assert bench.agreement_share({"1": up}, lag=1) == (1.0, 3)


def site_rounds(name="fedavg", rounds=1, **params):
    """A learning method's site (the plain fedavg by default: table 5's homogeneous baseline) after `rounds` rounds from
    one seeded global model, each round sent back its own answer: (the global weights it started
    from, the last weights it sent, the site half)."""
    from protocol.codecs.tensors import pack_tensors
    from protocol.phases import Phase
    from tests.learning_sessions import blob_sites, learning_method

    torch.set_num_threads(1)
    method = learning_method(name, **params)
    half = type(method).site(blob_sites()["site-0"], np.random.default_rng(0), "site-0")
    half.answer(Phase("setup"), method.setup_request(0))
    start = weights = method.initial_global(6, np.random.default_rng(1))
    for t in range(rounds):
        sent = half.answer(Phase("round", t), {"weights": pack_tensors({k: v.astype("float16")
                                                                        for k, v in weights.items()})})["tensors"]
        weights = {k: v.astype(np.float32) for k, v in sent.items()}
    return start, sent, half


def gap(a, b):
    return sum(float(np.sum((np.asarray(a[k], float) - np.asarray(b[k], float)) ** 2)) for k in a)


def test_a_pfedme_site_sends_its_local_model_and_keeps_the_personalised_proxy():
    """pFedMe (T Dinh et al. 2020, algorithm 1): what travels is w_i, which moved from the global
    model towards the personalised theta_i by eta lambda per step; theta_i stays at the site."""
    from learning.nets import get_weights

    start, sent, half = site_rounds("fedtype", aggregation="pfedme", backward_loss="set_mass")
    theta = get_weights(half.proxy)
    assert gap(sent, theta) > 0  # theta_i is not what travels
    assert 0 < gap(sent, start) < gap(theta, start)  # w_i moved, less far than theta_i


def test_gaussian_kl_is_the_monte_carlo_kl():
    """pFedBayes's KL(q || p) between diagonal Gaussians in closed form against the mean of
    log q(w) - log p(w) over 4000 draws w ~ q, within 4 standard errors of that mean."""
    from learning.aggregators import gaussian_kl

    rng = np.random.default_rng(5)
    mu_q, mu_p = rng.normal(size=6), rng.normal(size=6)
    rho_q, rho_p = rng.normal(size=6) - 1, rng.normal(size=6)
    exact = float(gaussian_kl(*(torch.tensor(a) for a in (mu_q, rho_q, mu_p, rho_p))))
    s_q, s_p = np.log1p(np.exp(rho_q)), np.log1p(np.exp(rho_p))
    w = mu_q + s_q * rng.normal(size=(4000, 6))
    # the log densities up to their common constant, which cancels
    log_density = lambda w, mu, s: (-0.5 * ((w - mu) / s) ** 2 - np.log(s)).sum(axis=1)  # noqa: E731
    draws = log_density(w, mu_q, s_q) - log_density(w, mu_p, s_p)
    assert exact > 0
    assert abs(draws.mean() - exact) < 4 * draws.std() / np.sqrt(len(draws))
    same = torch.tensor(rho_q)
    mu = torch.tensor(mu_q)
    assert float(gaussian_kl(mu, same, mu, same)) == pytest.approx(0, abs=1e-12)


def test_rho_of_inverts_softplus():
    from learning.aggregators import SIGMA0, rho_of

    for sigma in (1e-3, SIGMA0, 0.5, 2.0):
        assert float(torch.nn.functional.softplus(torch.tensor(rho_of(sigma), dtype=torch.float64))) == \
            pytest.approx(sigma, rel=1e-9)


def test_pfedbayes_steps_lower_their_own_objectives():
    """A tiny logistic problem: steps on E_q[CE] + zeta/n KL(q || v) (the personalised step) lower
    that objective, estimated with the same 400 weight draws before and after; the localized
    global step lowers KL(q || v) with q held."""
    from learning.aggregators import SIGMA0, BayesianProxy, anchor_of, rho_of

    torch.manual_seed(0)
    rng = np.random.default_rng(6)
    x = torch.tensor(rng.normal(size=(64, 3)), dtype=torch.float32)
    y = (x[:, 0] + x[:, 1] > 0).long()
    net = torch.nn.Linear(3, 2)
    rho = [torch.full_like(p, rho_of(SIGMA0)) for p in net.parameters()]
    v_mu = [a + 0.3 for a in anchor_of(net)]
    v_rho = [r + 0.5 for r in rho]
    bayes = BayesianProxy(net, rho, v_mu, v_rho, zeta=10.0, n=64, lr=0.05, global_lr=0.05, seed=1)

    def objective():
        with torch.no_grad():
            bayes.generator.manual_seed(99)
            loss = np.mean([float(torch.nn.functional.cross_entropy(bayes.logits(x), y)) for _ in range(400)])
            return loss + float(bayes.personal_penalty())

    before = objective()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
    for _ in range(30):
        optimizer.zero_grad(), bayes.rho_optimizer.zero_grad()
        (torch.nn.functional.cross_entropy(bayes.logits(x), y) + bayes.personal_penalty()).backward()
        optimizer.step(), bayes.rho_optimizer.step()
    assert objective() < before - 0.05
    kl = float(bayes.kl().detach())
    for _ in range(5):
        bayes.global_step()
    assert float(bayes.kl().detach()) < kl


def test_a_pfedbayes_site_sends_its_localized_global_distribution():
    """pFedBayes (Zhang et al. 2022, algorithm 1): what travels is v_i's (mu, rho), one rho per
    weight beside the means, which moved from the global distribution towards q_i; q_i's means
    (the proxy the site keeps) and rhos stay at the site."""
    from learning.aggregators import RHO, split_posterior
    from learning.nets import get_weights

    start, sent, half = site_rounds("fedtype", aggregation="pfedbayes", backward_loss="set_mass")
    assert sorted(sent) == sorted(start)
    names = [name for name, _ in half.proxy.named_parameters()]
    assert sorted(k for k in sent if k.endswith(RHO)) == sorted(name + RHO for name in names)
    mu, rho = split_posterior(sent)
    start_mu, start_rho = split_posterior(start)
    personal_mu, personal_rho = get_weights(half.proxy), dict(zip(rho, (r.numpy() for r in half.rho)))
    assert gap(mu, personal_mu) > 0 and gap(rho, personal_rho) > 0  # q_i is not what travels
    assert 0 < gap(mu, start_mu) and 0 < gap(rho, start_rho)  # v_i moved from the global distribution


def test_fedavg_with_fedprox_changes_the_update_and_a_large_mu_holds_it_at_the_global_model():
    """FedProx (Li et al. 2020, eq. 2) on the plain fedavg method: mu = 0 is FedAvg's update bit
    for bit (the same seeds), a small mu changes it, and mu = 100 keeps the sent model within a
    tenth of FedAvg's distance from the global model it was sent."""
    start, plain, _ = site_rounds()
    _, zero, _ = site_rounds(aggregation="fedprox", mu=0.0)
    _, small, _ = site_rounds(aggregation="fedprox", mu=0.01)
    _, held, _ = site_rounds(aggregation="fedprox", mu=100.0)
    assert gap(zero, plain) == 0
    assert gap(small, plain) > 0
    assert gap(held, start) < gap(plain, start) / 10


def test_fedavg_with_pfedme_sends_w_i_and_keeps_theta_i_from_round_to_round():
    """pFedMe (T Dinh et al. 2020, algorithm 1) on the plain fedavg method: w_i travels, moved
    towards theta_i by less than theta_i moved; theta_i stays at the site."""
    from learning.nets import get_weights

    start, sent, half = site_rounds(aggregation="pfedme")
    theta = get_weights(half.model)
    assert gap(sent, theta) > 0
    assert 0 < gap(sent, start) < gap(theta, start)


def test_fedavg_with_pfedbayes_sends_mean_and_rho_of_v_i_and_keeps_q_i():
    """pFedBayes (Zhang et al. 2022) on the plain fedavg method: a rho per parameter travels beside
    the means, and neither is q_i's (mu_i = the site's model, rho_i kept at the site)."""
    from learning.aggregators import RHO, split_posterior
    from learning.nets import get_weights

    start, sent, half = site_rounds(aggregation="pfedbayes")
    assert sorted(sent) == sorted(start)
    names = [name for name, _ in half.model.named_parameters()]
    assert sorted(k for k in sent if k.endswith(RHO)) == sorted(n + RHO for n in names)
    mu, rho = split_posterior(sent)
    assert gap(mu, get_weights(half.model)) > 0
    assert gap(rho, dict(zip(names, (r.numpy() for r in half.rho)))) > 0
    assert gap(mu, split_posterior(start)[0]) > 0


@pytest.mark.parametrize("hostile", [{"aggregation": "evil"}, {"aggregation": ["pfedbayes"]}, {"zeta": float("nan")},
                                     {"zeta": -5.0}, {"zeta": "x"}, {"pfedbayes_lr": float("inf")},
                                     {"pfedbayes_lr": -1.0}, {"mu": float("nan")}, {"pfedme_lam": 0.0},
                                     {"pfedme_lr": "x"}])
def test_a_site_refuses_hostile_aggregation_options_at_setup_by_name(hostile):
    """A lying coordinator's setup: an aggregation the site does not know, or an option out of
    AGGREGATION_PARAMS' bounds, NaN, infinite or not a number, is refused at setup naming the
    field (before: accepted, then NaN tensors or a TypeError in a round)."""
    from protocol.phases import Phase
    from tests.learning_sessions import blob_sites, learning_method

    for name in ("fedavg", "fedtype"):
        method = learning_method(name, aggregation="pfedbayes")
        half = type(method).site(blob_sites()["site-0"], np.random.default_rng(0), "site-0")
        field = next(iter(hostile))
        with pytest.raises(RequestError, match=f"setup request.{field}"):
            half.answer(Phase("setup"), {**method.setup_request(0), **hostile})
        assert half.config is None  # the site is as it was


def test_a_pfedbayes_site_refuses_a_global_distribution_that_does_not_fit_or_diverges():
    """The global (mu, rho) is the coordinator's: a rho missing or of another shape is refused
    naming the shapes (before: a KeyError, or broadcast into the training), and a rho so large or
    small that the update diverges sends nothing (before: NaN tensors on the wire)."""
    from protocol.codecs.tensors import pack_tensors
    from protocol.phases import Phase
    from tests.learning_sessions import blob_sites, learning_method

    torch.set_num_threads(1)
    method = learning_method("fedavg", aggregation="pfedbayes")
    start = method.initial_global(6, np.random.default_rng(1))

    def round_with(weights):
        half = type(method).site(blob_sites()["site-0"], np.random.default_rng(0), "site-0")
        half.answer(Phase("setup"), method.setup_request(0))
        return half.answer(Phase("round", 0), {"weights": pack_tensors(weights)})

    with pytest.raises(RequestError, match="one rho per parameter"):
        round_with({k: v for k, v in start.items() if k != "0.weight.rho"})
    with pytest.raises(RequestError, match="one rho per parameter"):
        round_with({k: (v[:1] if k.endswith(".rho") else v) for k, v in start.items()})
    for extreme in (1e30, -1e30):
        with pytest.raises(RequestError, match="diverged"):
            round_with({k: (np.full_like(v, extreme) if k.endswith(".rho") else v) for k, v in start.items()})
    assert round_with(start)["tensors"]  # the honest distribution trains


def test_aggregation_penalty_is_the_proximal_term_or_the_kl_or_nothing():
    """learning.train.aggregation_penalty, the one place both local updates take it from."""
    from learning.aggregators import SIGMA0, BayesianProxy, rho_of
    from learning.train import aggregation_penalty

    net = torch.nn.Linear(3, 2)
    anchor = [a + 1.0 for a in anchor_of(net)]
    count = sum(p.numel() for p in net.parameters())
    config = lambda **kw: TrainingConfig(1e-2, 16, 5, 1, **kw)  # noqa: E731
    assert aggregation_penalty(net, config()) is None
    penalty = lambda *args, **kw: float(aggregation_penalty(net, config(**kw), *args).detach())  # noqa: E731
    assert penalty(anchor, aggregation="fedprox", mu=0.2) == pytest.approx(0.1 * count)
    assert penalty(anchor, aggregation="pfedme", pfedme_lam=3.0) == pytest.approx(1.5 * count)
    rho = [torch.full_like(p, rho_of(SIGMA0)) for p in net.parameters()]
    bayes = BayesianProxy(net, rho, anchor, [r + 0.5 for r in rho], zeta=10.0, n=64, lr=0.01, global_lr=0.01, seed=1)
    got = penalty(anchor, bayes, aggregation="pfedbayes")
    assert got == pytest.approx(float(bayes.personal_penalty().detach())) and got > 0
