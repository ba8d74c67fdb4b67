"""Paper 001 figure 2 (bench/paper001_fig2.py, issue 49 point 5): the bench's errors against an
independent brute-force computation at small scale, its mechanism path against the real protocol,
its readings of the accounting, and the docs' tables against the committed results JSON."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import paper001_fig2 as fig2  # noqa: E402
import protocol.methods.ddg_quantile as ddg_method  # noqa: E402
from protocol.inprocess import run_session  # noqa: E402
from stats.ddg import scaling_for_epsilon  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "paper001_fig2.json"
DOCS = ROOT / "docs" / "secure-aggregation.md"


# -- the errors, brute force ------------------------------------------------------------------


def brute_force_errors(values, b, c, bits, noises, estimator):
    """Eq. (3) at p = 0.1..0.9 from scratch: per-site one-hot histograms (a hierarchical one built
    node by node from its definition), c x + noise mod M summed mod M, read in (-M/2, M/2], / c;
    the CDF by the estimator's rule (the dyadic sums found by a top-down walk of the tree); the
    first j minimising |F_hat_j - p|; the true F_j = #{v < l_j} / n (F_b = 1)."""
    n, m = len(values), 1 << bits
    width = fig2.B / b
    levels = int(round(math.log2(b)))
    hierarchical = estimator.startswith("hierarchical")

    def bin_of(v):
        return min(int(v // width), b - 1)

    def nodes():  # (level r, node o 0-based) in the order of algorithm 2's vector
        return [(r, o) for r in range(levels) for o in range(b >> r)]

    total = [0] * (2 * b - 2 if hierarchical else b)
    for site, v in enumerate(values):
        if hierarchical:
            x = [1 if o * (1 << r) <= bin_of(v) < (o + 1) * (1 << r) else 0 for r, o in nodes()]
        else:
            x = [1 if j == bin_of(v) else 0 for j in range(b)]
        for k in range(len(total)):
            total[k] = (total[k] + (c * x[k] + int(noises[site][k])) % m) % m
    h = [(t - m if t > m // 2 else t) / c for t in total]
    if hierarchical:
        node = dict(zip(nodes(), h))
        cdf = []
        for j in range(1, b + 1):  # [1, j] from the biggest aligned nodes, top level down
            covered, f = 0, 0.0
            for r in reversed(range(levels)):
                size = 1 << r
                while covered % size == 0 and covered + size <= j:
                    f += node[(r, covered // size)]
                    covered += size
            assert covered == j
            cdf.append(f / n)
    else:
        running, prefix = 0.0, []
        for value in h:
            running += value
            prefix.append(running)
        denominator = prefix[-1] if estimator == "flat, estimated n" else n
        cdf = [f / denominator for f in prefix]
    true = [sum(1 for v in values if v < (j + 1) * width) / n for j in range(b - 1)] + [1.0]
    errors = []
    for p in fig2.LEVELS:
        best = 0
        for j in range(b):
            if abs(cdf[j] - p) < abs(cdf[best] - p):
                best = j
        errors.append(abs(true[best] - p))
    return errors


class RecordedNoise:
    """Stands in for the discrete Gaussian: seeded integers, recorded call by call."""

    def __init__(self, seed, spread):
        self.rng, self.spread, self.calls = np.random.default_rng(seed), spread, []

    def __call__(self, sigma2, size):
        draw = self.rng.integers(-self.spread, self.spread + 1, size).astype(np.int64)
        self.calls.append(draw)
        return draw


@pytest.mark.parametrize("estimator", list(fig2.ESTIMATORS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bench_errors_match_a_brute_force_computation(monkeypatch, estimator, seed):
    n, b, eps = 24, 8, 2.0
    values = fig2.panel_values("chi2" if seed % 2 else "uniform", n, b, seed)
    method, sizes, params, public = fig2.plan(eps, n, b, estimator)
    noise = RecordedNoise(seed, spread=3 * public["c"])  # enough to move the estimate off the truth
    monkeypatch.setattr(ddg_method, "discrete_gaussian", noise)
    outcome = method.finish(fig2.mechanism_sum(values, sizes, params, public), sizes, params, public)
    ours = fig2.level_errors(values, outcome.details["quantile_indices"], b)
    assert len(noise.calls) == n  # one noisy histogram per site
    expected = brute_force_errors(values, b, public["c"], params.modulus_bits, noise.calls, estimator)
    assert ours.tolist() == pytest.approx(expected, abs=1e-12)
    floor = fig2.noiseless_errors(values, b)
    assert (ours >= floor - 1e-12).all()  # no estimate beats the best bin edge


def test_the_summaries_are_the_worst_the_mean_and_the_median_over_levels():
    errors = np.array([[0.1, 0.2, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.3], [0.0] * 4 + [0.2] + [0.0] * 4])
    out = fig2.summary(errors)
    assert out["worst_mean"] == pytest.approx(0.25) and out["worst_std"] == pytest.approx(0.05)
    assert out["mean_p_mean"] == pytest.approx((0.65 / 9 + 0.2 / 9) / 2)
    assert out["median_mean"] == pytest.approx(0.125)
    # the other order: each level's mean over the runs (here one group, of both), then the worst level
    assert out["worst_of_means_mean"] == pytest.approx(0.15) and out["worst_of_means_std"] == pytest.approx(0.15)
    rng = np.random.default_rng(0)
    errors = rng.uniform(0, 0.1, (100, 9))
    out = fig2.summary(errors)
    assert out["worst_of_means_groups"] == 10
    groups = [errors[i:i + 10].mean(axis=0).max() for i in range(0, 100, 10)]
    assert out["worst_of_means_mean"] == pytest.approx(np.mean(groups))
    assert out["worst_of_means_mean"] < out["worst_mean"]  # a max of means never exceeds a mean of maxes


def test_the_mechanism_path_releases_what_the_protocol_releases(monkeypatch):
    """The bench's default path (site code, ring sum, coordinator's finish) and the real protocol
    in-process give the same estimate for the same noise (a fixed pattern, whatever the order)."""
    monkeypatch.setattr(ddg_method, "discrete_gaussian",
                        lambda sigma2, size: (np.arange(size) * 7 % 11 - 5).astype(np.int64))
    n, b = 12, 8
    values = fig2.panel_values("uniform", n, b, 3)
    for estimator in fig2.ESTIMATORS:
        method, sizes, params, public = fig2.plan(1.0, n, b, estimator)
        direct = method.finish(fig2.mechanism_sum(values, sizes, params, public), sizes, params, public)
        real = run_session(method, {s: values[i:i + 1] for i, s in enumerate(sizes)},
                           lambda s: np.random.default_rng(0))
        assert real.status == direct.status == "ok"
        assert real.details["quantile_indices"] == direct.details["quantile_indices"]


@pytest.mark.parametrize("hierarchical,accounting", [(False, "exact"), (True, "exact"), (True, "paper")])
def test_the_readings_of_the_accounting(hierarchical, accounting):
    # `tight` is Quorum's own planning
    for eps in (1.0, 5.0):
        c, s2 = fig2.scaling_for_zcdp(fig2.zcdp_target(eps, "tight"), 512, 64, hierarchical, accounting)
        c0, s20 = scaling_for_epsilon(eps, 1e-5, 512, 2.0, 64, hierarchical, accounting)
        assert c == c0 and s2 == pytest.approx(s20, rel=1e-6)
    # `simple`: epsilon = rho + 2 sqrt(rho log(1/delta)) with rho = eps_z^2 / 2
    rho = fig2.zcdp_target(1.0, "simple") ** 2 / 2
    assert rho + 2 * math.sqrt(rho * math.log(1e5)) == pytest.approx(1.0)
    assert fig2.zcdp_target(1.0, "simple") < fig2.zcdp_target(1.0, "tight")  # more noise, not less
    assert fig2.zcdp_target(3.0, "zcdp") == 3.0


# -- the docs against the committed results ---------------------------------------------------


def figure2_section() -> str:
    """docs/secure-aggregation.md's figure 2 part, between its two comment markers."""
    text = DOCS.read_text()
    return text[text.index("<!-- paper 001 figure 2"):text.index("<!-- /paper 001 figure 2 -->")]


def cell(point):
    """mean over runs of the worst error (sd) / worst level of the 10-run means"""
    return f"{point['worst_mean']:.3f} ({point['worst_std']:.3f}) / {point['worst_of_means_mean']:.3f}"


def test_the_docs_figure_2_table_is_the_committed_json():
    report = json.loads(RESULTS.read_text())
    points = {(r["distribution"], r["n"], r["b"], r["epsilon"], r["estimator"]): r for r in report["points"]}
    floors = {(r["distribution"], r["n"], r["b"]): r for r in report["floor"]}
    dists = {"Unif": "uniform", "chi^2(4)": "chi2"}
    labels = list(fig2.ESTIMATORS)
    rows = re.findall(r"^\| (Unif|chi\^2\(4\)) \| (\d+), (\d+) \| ([\d.]+) \| (.*) \|$", figure2_section(), re.M)
    seen = set()
    for dist, n, b, eps, rest in rows:
        key = (dists[dist], int(n), int(b))
        cells = [c.strip() for c in rest.split("|")]
        for label, text in zip(labels, cells[:4]):
            point = points[(*key, float(eps), label)]
            assert text.strip("*") == cell(point), (key, eps, label)
        floor = floors[key]
        assert cells[4] == f"{floor['worst_mean']:.3f} / {floor['worst_of_means_mean']:.3f}", (key, "floor")
        seen.add((*key, float(eps)))
    assert seen == {k[:4] for k in points}, "every point the bench computed is in the table"
    assert len(seen) == 40


def test_the_docs_hypothesis_table_is_the_committed_json():
    report = json.loads(RESULTS.read_text())
    hyp = {(r["distribution"], r["n"], r["b"], r["epsilon"], r["conversion"], r["estimator"]): r
           for r in report["hypotheses"] if r["estimator"]}
    points = {(r["distribution"], r["n"], r["b"], r["epsilon"], "tight", r["estimator"]): r for r in report["points"]}
    dists = {"Unif": "uniform", "chi^2(4)": "chi2"}
    metric = {"worst": "worst", "worst of 10-run means": "worst_of_means", "mean over p": "mean_p", "median": "median"}
    rows = re.findall(r"^\| (Unif|chi\^2\(4\)), (\d+), (\d+) \| (tight|simple|zcdp) \| "
                      r"(worst|worst of 10-run means|mean over p|median) \| (.*) \|$",
                      figure2_section(), re.M)
    assert len(rows) == 6 * 3 * 4  # six panels, three readings of the accounting, four metrics
    for dist, n, b, conversion, name, rest in rows:
        cells = [c.strip().strip("*") for c in rest.split("|")]
        # flat at 1, flat at 5, theorem 2 at 1, flat at 10, theorem 2 at 10
        wanted = [(1.0, "flat, estimated n"), (5.0, "flat, estimated n"), (1.0, "hierarchical, theorem 2 as printed"),
                  (10.0, "flat, estimated n"), (10.0, "hierarchical, theorem 2 as printed")]
        for text, (eps, label) in zip(cells, wanted):
            key = (dists[dist], int(n), int(b), eps, conversion, label)
            row = (points if conversion == "tight" else hyp).get(key)
            if row is None:
                assert text.startswith("wraps"), key
                continue
            assert text == f"{row[metric[name] + '_mean']:.3f}", key


def test_the_docs_noise_scale_table_is_the_committed_json():
    report = json.loads(RESULTS.read_text())
    scaled = {(r["distribution"], r["n"], r["b"], r["epsilon"], r["noise_scale"], r["estimator"]): r
              for r in report["noise_scale"]}
    points = {(r["distribution"], r["n"], r["b"], r["epsilon"], 1.0, r["estimator"]): r for r in report["points"]}
    section = figure2_section()
    header = re.search(r"^\| panel \| noise sd x k \| (.*) \|$", section, re.M)
    ks = [float(k.strip()[4:]) for k in header.group(1).split("|")]
    assert ks[-1] == 1.0 and sorted(ks) == ks
    dists = {"Unif": "uniform", "chi^2(4)": "chi2"}
    names = {"flat est.": "flat, estimated n", "thm 2": "hierarchical, theorem 2 as printed"}
    rows = re.findall(r"^\| (Unif|chi\^2\(4\)), (\d+), (\d+) \| (flat est\.|thm 2) at ([\d.]+) \| (.*) \|$", section, re.M)
    assert len(rows) >= 6
    for dist, n, b, name, eps, rest in rows:
        for k, text in zip(ks, rest.split("|")):
            key = (dists[dist], int(n), int(b), float(eps), k, names[name])
            assert text.strip().strip("*") == f"{(scaled.get(key) or points[key])['worst_mean']:.3f}", key


def test_the_docs_table_of_the_quoted_points_is_the_committed_json():
    report = json.loads(RESULTS.read_text())
    points = {(r["distribution"], r["n"], r["b"], r["epsilon"], r["estimator"]): r for r in report["points"]}
    dists = {"Unif": "uniform", "chi^2(4)": "chi2"}
    names = {"flat est.": "flat, estimated n", "thm 2": "hierarchical, theorem 2 as printed"}
    rows = re.findall(r"^\| (left|right) \| (flat est\.|thm 2): (.*?) \| (Unif|chi\^2\(4\)), (\d+), (\d+) \| (.*) \| (.*) \|$",
                      figure2_section(), re.M)
    quotes = {(q["plot"], q["estimator"], q["text"]): q for q in report["paper"]}
    assert len(rows) == sum(len(report["paper_panels"][q["plot"]]) for q in report["paper"])
    for plot, name, text, dist, n, b, worst, of_means in rows:
        quote = quotes[(plot, names[name], text)]
        assert [dist_ := dists[dist], int(n), int(b)] in report["paper_panels"][plot]
        point = points[(dist_, int(n), int(b), quote["epsilon"], quote["estimator"])]
        assert worst.strip("*") == f"{point['worst_mean']:.3f} ({point['worst_std']:.3f})"
        assert of_means.strip("*") == f"{point['worst_of_means_mean']:.3f} ({point['worst_of_means_spread']:.3f})"
