"""Issue 25: FedType's own baselines (FML, FedProto) and our variant (FedType-P): their pure
functions against brute force, sessions in-process, what each sends (never a private weight),
and a run over site processes with a crashed site."""


import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from learning.mutual import mutual_losses
from learning.nets import get_weights
from learning.personal import MIXTURE_GRID, label_prior, mixture_accuracy, mixture_weight, shift_by_prior
from learning.prototypes import (global_prototypes, local_prototypes, nearest_prototype_accuracy, prototype_loss,
                                 with_embedding)
from runner.outputs import RunDirectory
from runner.study import run_study
from quorum import load_scenario
from tests.learning_sessions import (SCENARIO, SMALL, assert_no_private_weight_on_the_wire, blob_sites,
                                     learning_method, run_learning)
from transport.ledger import read_ledger


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

BASELINES = ("fml", "fedproto", "fedtype_personal")


# -- FML: the two losses of mutual learning ------------------------------------------------------


def test_mutual_losses_are_fml_local_and_meme_objectives_each_training_only_its_student():
    torch.manual_seed(1)
    private, meme = torch.randn(6, 4, requires_grad=True), torch.randn(6, 4, requires_grad=True)
    y = torch.tensor([0, 1, 2, 3, 1, 0])
    alpha, beta = 0.3, 0.8
    pw, pm = torch.softmax(private, 1).detach().numpy(), torch.softmax(meme, 1).detach().numpy()
    rows = np.arange(6)
    ce = lambda p: -np.mean(np.log(p[rows, y.numpy()]))  # noqa: E731
    kl = lambda p, q: np.mean(np.sum(p * np.log(p / q), axis=1))  # noqa: E731  D_KL(p || q)
    local, shared = mutual_losses(private, meme, y, alpha, beta)
    assert float(local.detach()) == pytest.approx(alpha * ce(pw) + (1 - alpha) * kl(pm, pw), rel=1e-5)
    assert float(shared.detach()) == pytest.approx(beta * ce(pm) + (1 - beta) * kl(pw, pm), rel=1e-5)
    local.backward()
    assert meme.grad is None or torch.all(meme.grad == 0)  # the meme is L_local's fixed teacher
    assert private.grad.abs().sum() > 0
    private.grad = None
    shared.backward()
    assert private.grad is None or torch.all(private.grad == 0)  # and the private model is L_meme's
    at_one, _ = mutual_losses(private, meme, y, 1.0, 1.0)  # alpha = 1: plain cross-entropy
    assert float(at_one.detach()) == pytest.approx(ce(pw), rel=1e-5)


# -- FedProto: prototypes, their aggregate, the regulariser, eq. (4) ------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_global_prototypes_are_the_pooled_class_means_of_every_site(sites, seed):
    """Eq. (3) per site then eq. (6) at the server equals each class's mean embedding over the
    union of the sites' data (what a prototype of the pooled data would be); a class nobody
    holds stays zero with count 0."""
    rng = np.random.default_rng(seed)
    classes, width = 5, 3
    data = [(rng.normal(size=(n, width)), rng.integers(0, classes - 1, size=n))  # class 4 never occurs
            for n in rng.integers(1, 30, size=sites)]
    each = [local_prototypes(h, y, classes) for h, y in data]
    for (h, y), (prototypes, counts) in zip(data, each):
        for j in range(classes):
            assert counts[j] == np.sum(y == j)
            expected = h[y == j].mean(axis=0) if counts[j] else np.zeros(width)
            np.testing.assert_allclose(prototypes[j], expected, atol=1e-12)
    merged, counts = global_prototypes([p for p, _ in each], [c for _, c in each])
    pooled_h, pooled_y = np.vstack([h for h, _ in data]), np.concatenate([y for _, y in data])
    for j in range(classes):
        assert counts[j] == np.sum(pooled_y == j)
        expected = pooled_h[pooled_y == j].mean(axis=0) if counts[j] else np.zeros(width)
        np.testing.assert_allclose(merged[j], expected, atol=1e-9)
    assert counts[classes - 1] == 0


def test_prototype_loss_is_the_mean_squared_distance_to_known_class_prototypes():
    h = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, -1.0], [5.0, 5.0]], requires_grad=True)
    y = torch.tensor([0, 1, 0, 2])
    prototypes = torch.tensor([[1.0, 1.0], [2.0, 0.0], [9.0, 9.0]])
    known = torch.tensor([True, True, False])  # class 2 has no global prototype yet: point 3 adds nothing
    loss = prototype_loss(h, y, prototypes, known)
    expected = np.mean([(1 - 1) ** 2, (2 - 1) ** 2, (0 - 2) ** 2, 0 ** 2, (3 - 1) ** 2, (-1 - 1) ** 2])
    assert float(loss.detach()) == pytest.approx(expected)
    loss.backward()
    assert torch.all(h.grad[3] == 0)
    assert float(prototype_loss(h, y, prototypes, torch.zeros(3, dtype=torch.bool)).detach()) == 0.0


def test_nearest_prototype_rule_of_eq4_against_brute_force():
    net = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Linear(2, 3))  # f(x) = x
    X = torch.tensor([[0.0, 0.0], [2.0, 2.1], [4.0, 0.0], [0.9, 1.0]])
    y = torch.tensor([0, 1, 2, 1])
    prototypes = torch.tensor([[0.0, 0.0], [2.0, 2.0], [4.0, 0.5]])
    known = torch.tensor([True, True, True])
    brute = np.mean([int(np.argmin([np.linalg.norm(x - c) for c in prototypes.numpy()]) == t)
                     for x, t in zip(X.numpy(), y.numpy())])
    assert nearest_prototype_accuracy(net, X, y, prototypes, known) == pytest.approx(brute)  # point 3 is nearer class 0
    assert nearest_prototype_accuracy(net, X, y, prototypes, torch.tensor([True, False, True])) == pytest.approx(0.5)
    assert with_embedding({"kind": "mlp", "hidden": [32], "channels": [], "image": []}, 16)["hidden"] == [32, 16]


# -- FedType-P: the personalised head -------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(0, 2**32 - 1))
def test_mixture_weight_is_the_grid_point_of_highest_validation_likelihood(n, seed):
    rng = np.random.default_rng(seed)
    private, proxy = rng.dirichlet(np.ones(4), size=n), rng.dirichlet(np.ones(4), size=n)
    labels = rng.integers(0, 4, size=n)
    chosen = mixture_weight(private, proxy, labels)
    likelihood = {w: np.mean(np.log(w * private[np.arange(n), labels] + (1 - w) * proxy[np.arange(n), labels]))
                  for w in MIXTURE_GRID}
    assert chosen in MIXTURE_GRID and likelihood[chosen] >= max(likelihood.values()) - 1e-9
    best = max(likelihood.values())
    assert chosen == max(w for w in MIXTURE_GRID if likelihood[w] >= best - 1e-12)  # ties: the private side
    accuracy = mixture_accuracy(private, proxy, labels, chosen)
    assert accuracy == pytest.approx(np.mean((chosen * private + (1 - chosen) * proxy).argmax(1) == labels))


def test_a_useless_proxy_leaves_the_private_model_alone_and_a_better_one_takes_weight():
    labels = np.array([0, 1, 2, 0])
    right = np.eye(3)[labels] * 0.8 + 0.2 / 3
    uniform = np.full((4, 3), 1 / 3)
    assert mixture_weight(right, uniform, labels) == 1.0
    assert mixture_weight(uniform, right, labels) == 0.0
    assert mixture_weight(right, uniform, np.array([], dtype=int)) == 1.0


def test_label_prior_is_laplaces_rule_of_succession():
    assert label_prior(np.array([0, 0, 0, 2]), 4) == pytest.approx([4 / 8, 1 / 8, 2 / 8, 1 / 8])
    assert label_prior(np.array([], dtype=int), 2) == pytest.approx([0.5, 0.5])


def test_the_prior_shift_changes_the_output_and_nothing_that_travels():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 4))
    X = torch.randn(6, 3)
    before, weights = net(X).detach(), get_weights(net)
    prior = label_prior(np.array([0, 0, 1, 3, 3, 3]), 4)
    handle = shift_by_prior(net, prior)
    assert torch.allclose(net(X).detach(), before + torch.log(torch.as_tensor(prior, dtype=torch.float32)))
    shifted = get_weights(net)
    assert shifted.keys() == weights.keys() and all(np.array_equal(shifted[k], weights[k]) for k in weights)
    handle.remove()
    assert torch.allclose(net(X).detach(), before)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_logit_adjusted_cross_entropy_learns_the_same_scores_at_sites_with_different_label_priors(seed):
    """The claim behind `label_shift` (learning.personal.shift_by_prior): two sites that share
    p(x | y) but not p(y), each minimising the expected cross-entropy of softmax(z(x) + log p_i(y)),
    end with z_1(x) - z_2(x) constant over the classes (so averaging z is consistent), and
    z_i(x) + log p_i(y) is site i's Bayes posterior."""
    rng = np.random.default_rng(seed)
    classes, points = 3, 4
    likelihood = rng.dirichlet(np.ones(points), size=classes).T  # p(x | y), x in 0..3: (points, classes)
    priors = rng.dirichlet(np.ones(classes), size=2)
    posteriors = [likelihood * prior / (likelihood * prior).sum(1, keepdims=True) for prior in priors]  # p_i(y | x)
    scores = []
    for prior, posterior in zip(priors, posteriors):
        marginal = (likelihood * prior).sum(1)  # p_i(x)
        z = torch.zeros(points, classes, dtype=torch.float64, requires_grad=True)
        log_prior = torch.as_tensor(np.log(prior))
        optimizer = torch.optim.LBFGS([z], max_iter=2000, tolerance_grad=1e-12, tolerance_change=1e-14,
                                      line_search_fn="strong_wolfe")

        def expected_loss():
            optimizer.zero_grad()
            loss = -(torch.as_tensor(marginal[:, None] * posterior)
                     * torch.log_softmax(z + log_prior, dim=1)).sum()
            loss.backward()
            return loss

        optimizer.step(expected_loss)
        assert torch.softmax(z + log_prior, dim=1).detach().numpy() == pytest.approx(posterior, abs=1e-5)
        scores.append(z.detach())
    # either site's scores serve the other: shifted by site 2's prior, site 1's scores give site 2's
    # posterior, and so does their average (what the server's FedAvg of the z-networks aims at)
    log_prior = torch.as_tensor(np.log(priors[1]))
    for z in (scores[0], (scores[0] + scores[1]) / 2):
        assert torch.softmax(z + log_prior, dim=1).numpy() == pytest.approx(posteriors[1], abs=1e-4)


# -- the wire (that each session learns: tests/test_fedtype.py) -------------------------------


def test_fedproto_sends_prototypes_and_counts_and_the_server_averages_them_per_class():
    method = learning_method("fedproto", embedding=8)
    outcome, halves = run_learning(method, blob_sites())
    for record in outcome.rounds:  # (4 classes x 8) float16 prototypes + 4 float32 counts, 3 sites
        assert record["weights_bytes_up"] == 3 * (4 * 8 * 2 + 4 * 4)
    sites = list(halves.values())
    sent = [local_prototypes(h.private[:-1](h.data.X_train).detach().numpy(), h.data.y_train.numpy(), 4) for h in sites]
    expected, counts = global_prototypes([p.astype(np.float16) for p, _ in sent], [c for _, c in sent])
    assert counts.tolist() == np.bincount(np.concatenate([h.data.y_train.numpy() for h in sites]), minlength=4).tolist()
    coordinator = method.aggregate([{"prototypes": p.astype(np.float16), "counts": c.astype(np.float32)} for p, c in sent],
                                   [1, 1, 1])
    np.testing.assert_allclose(coordinator["prototypes"], expected, rtol=1e-6)


@pytest.mark.parametrize("name", BASELINES)
def test_no_private_weight_of_fml_fedproto_or_fedtype_p_ever_appears_on_the_wire(name):
    """Every message of a session as msgpack bytes: no 8-byte run of any private tensor (float16 or
    float32) occurs in any; what the method does send (meme / proxy weights, prototypes) does."""
    messages = []
    _, halves = run_learning(learning_method(name, precision="float32", rounds=2), blob_sites(), capture=messages)
    wire = b"".join(data for _, data in messages)
    assert_no_private_weight_on_the_wire(halves, wire)
    site = halves["site-0"]
    shared = site.meme if name == "fml" else site.proxy if name == "fedtype_personal" else None
    if shared is not None:  # the final global model went down in the evaluation request
        assert get_weights(shared, "float32")["0.weight"].tobytes()[:64] in wire
    else:
        prototypes, _ = local_prototypes(site.private[:-1](site.data.X_train).detach().numpy(),
                                         site.data.y_train.numpy(), 4)
        assert prototypes.astype(np.float32)[site.data.y_train[0]].tobytes()[:16] in wire


def test_every_method_of_a_trial_splits_a_site_into_the_same_points_whatever_its_session():
    """The paired comparison (bench/fedtype_baselines.py) pairs test points: a site's 7:2:1 split
    depends on its rows only, not on the session's Generator (which the method's place in the
    scenario sets); different rows split differently."""
    sites = blob_sites()
    splits = []
    for session, name in enumerate(("local_only", "fedtype_personal", "fml"), start=1):
        _, halves = run_learning(learning_method(name, rounds=1), sites, session=session)
        splits.append({s: [t.numpy() for t in (h.data.X_train, h.data.X_test, h.data.X_val)] for s, h in halves.items()})
    for split in splits[1:]:
        assert all(np.array_equal(a, b) for s in sites for a, b in zip(splits[0][s], split[s]))
    _, halves = run_learning(learning_method("local_only", rounds=1), {s: r[::-1] for s, r in sites.items()})
    assert not np.array_equal(np.sort(halves["site-0"].data.X_test.numpy(), 0), np.sort(splits[0]["site-0"][1], 0))


def test_fedtype_p_with_label_shift_sends_the_unshifted_proxy_and_heads_with_the_final_global_one():
    """`label_shift` + `head_proxy: global`: the hook shifts the proxy's output at the site only (the
    weights on the wire are the network's own), no private weight travels, and each site's reported
    accuracy is the equal mixture of its private model and the final global proxy plus its log prior."""
    messages = []
    method = learning_method("fedtype_personal", precision="float32", rounds=2, label_shift=True, head_proxy="global")
    outcome, halves = run_learning(method, blob_sites(), capture=messages)
    assert outcome.status == "ok", outcome.reason
    wire = b"".join(data for _, data in messages)
    assert_no_private_weight_on_the_wire(halves, wire)
    accuracies = []
    for site in halves.values():
        assert get_weights(site.proxy, "float32")["0.weight"].tobytes()[:64] in wire  # the final global proxy
        X, y = site.data.X_test, site.data.y_test.numpy()
        raw = X
        for layer in site.proxy:  # the layers one by one: the network without the site's hook
            raw = layer(raw)
        log_prior = torch.log(torch.as_tensor(label_prior(site.data.y_train.numpy(), 4), dtype=torch.float32))
        assert torch.allclose(site.proxy(X), raw + log_prior, atol=1e-6)
        private, proxy = torch.softmax(site.private(X), 1).detach().numpy(), torch.softmax(raw + log_prior, 1).detach().numpy()
        accuracies.append(mixture_accuracy(private, proxy, y, 0.5))
        assert site.personalised_accuracy()[0] == pytest.approx(accuracies[-1])
    assert outcome.accuracy == pytest.approx(np.mean(accuracies), abs=1e-9)


def test_baselines_over_site_processes_survive_a_crashed_site_and_send_no_private_model(tmp_path):
    spec = load_scenario(SCENARIO, SMALL + [
        "runtime.deadlines.respond=20", "faults=[{action: crash, sites: site-002, phase: round-1, method: fml}]",
        "methods=[" + ", ".join(f"{{name: {m}, classes: 10, rounds: 3, private_models: [{{kind: mlp, hidden: [64]}}],"
                                f" {'meme' if m == 'fml' else 'proxy'}: {{kind: mlp, hidden: [32]}}}}"
                                if m != "fedproto" else
                                f"{{name: {m}, classes: 10, rounds: 3, private_models: [{{kind: mlp, hidden: [64]}}]}}"
                                for m in BASELINES) + "]"]).to_dict()
    run_study(spec, tmp_path)
    results = {r["method"]: r for r in RunDirectory(tmp_path).read_results()}
    assert all(r["status"] == "ok" for r in results.values()), results
    assert [results[m]["answered"] for m in BASELINES] == ["3"] * 3  # a crashed site stays gone for the trial
    private_bytes = (20 * 64 + 64 + 64 * 10 + 10) * 4  # the smallest private model, float32
    for row in read_ledger(tmp_path / "ledger.csv"):
        if row["phase"].startswith("round-") and row["direction"] == "up" and row["type"] == "response":
            assert int(row["bytes"]) < private_bytes, row
