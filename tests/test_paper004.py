"""Paper 004's command (bench/paper004.py, issue 51): the new estimators against brute force, the
paper's table rule beside the hardened one, the exact group sizes, and the committed results."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from stats.fedquantiles import (linear_table_quantile, yj_continuous_quantile, yj_likelihood_continuous,  # noqa: E402
                                yj_site_moments)
from stats.kanon import apply_release, first_release, join_release, k_anonymous_cells, site_counts  # noqa: E402


def test_linear_table_quantile_interpolates_a_uniform_within_each_bin():
    limits, counts = [0.0, 1.0, 2.0, 4.0], [10, 20, 10]  # CDF 0, .25, .75, 1 at the limits
    for p, expected in [(0.125, 0.5), (0.25, 1.0), (0.5, 1.5), (0.875, 3.0), (1.0, 4.0)]:
        assert linear_table_quantile(limits, counts, p) == pytest.approx(expected)
    # brute force: the quantile of many points spread evenly within each bin
    points = np.concatenate([np.linspace(a, b, 1000 * c, endpoint=False) for a, b, c in zip(limits, limits[1:], counts)])
    for p in (0.1, 0.3, 0.6, 0.9):
        assert linear_table_quantile(limits, counts, p) == pytest.approx(np.quantile(points, p), abs=1e-3)
    # an infinite extreme bin has nothing to interpolate over: its finite limit
    assert linear_table_quantile([-np.inf, 1.0, np.inf], [10, 10], 0.1) == 1.0


@pytest.mark.parametrize("shape", [2.0, 4.0, 10.0])
def test_continuous_yj_fit_is_the_maximum_likelihood_lambda(shape):
    rng = np.random.default_rng(int(shape))
    sites = [rng.gamma(shape, 1.0, n) for n in (300, 200, 100)]
    lam, mu, sigma = yj_likelihood_continuous(lambda v: [yj_site_moments(x, [v]) for x in sites])
    pooled = np.concatenate(sites)
    # scipy maximizes the same likelihood over all of R; ours over eq. (9)'s [0, 2] (r = 2 lies below)
    assert lam == pytest.approx(float(np.clip(stats.yeojohnson_normmax(pooled), 0.0, 2.0)), abs=1e-4)
    h = stats.yeojohnson(pooled, lam)
    assert mu == pytest.approx(h.mean()) and sigma == pytest.approx(h.std())
    from stats.fedquantiles import yeo_johnson_inverse
    expected = yeo_johnson_inverse(np.array([mu + sigma * stats.norm.ppf(0.9)]), lam)[0]
    assert yj_continuous_quantile(sites, 0.9) == pytest.approx(expected, rel=1e-6)


def test_paper_cell_rule_is_algorithms_5_6_and_the_default_is_unchanged():
    rng = np.random.default_rng(0)
    big, small = [rng.normal(size=400), rng.normal(size=400)], [rng.normal(size=60), rng.normal(size=55)]
    table = apply_release(None, first_release(big, 10, np.random.default_rng(1)))
    paper = join_release(table.limits, small, 10, np.random.default_rng(2), cells="paper")
    counts = site_counts(paper.limits, [np.sort(g) for g in small])
    assert [list(c) for c in paper.cells] == [k_anonymous_cells(c, 10) for c in counts]
    default = join_release(table.limits, small, 10, np.random.default_rng(2))
    hardened = join_release(table.limits, small, 10, np.random.default_rng(2), cells="hardened")
    assert default == hardened
    with pytest.raises(ValueError):
        join_release(table.limits, small, 10, rng, cells="other")


def test_mwu_trial_has_exactly_the_papers_group_sizes_and_the_combined_test_is_scipys():
    import paper004
    captured = {}
    real = paper004.pooled_test

    def spy(x, y):
        captured["sizes"] = (len(x), len(y))
        captured["p"] = stats.mannwhitneyu(y, x, alternative="greater", method="asymptotic", use_continuity=False).pvalue
        return real(x, y)

    paper004.pooled_test = spy
    try:
        out = paper004.mwu_trial(paper004.TABLE_1[5], 0.05, 0.1, 0.05, np.random.default_rng(3))
    finally:
        paper004.pooled_test = real
    assert captured["sizes"] == (1500, 1500)
    assert out["combined"] == pytest.approx(captured["p"], rel=1e-9)
    assert all(0 < out[m] <= 1 for m in paper004.METHODS)


def test_committed_results_cover_every_setting():
    results = json.loads((ROOT / "bench" / "results" / "paper004.json").read_text())
    tables = {t["name"]: t for t in results["tables"]}
    import paper004
    assert len(tables["fig2"]["rows"]) == 3 * len(paper004.METHOD_GRID)
    assert len(tables["fig3"]["rows"]) == 3 * len(paper004.POWER_GRID)
    assert len(tables["table3"]["rows"]) == 15
    for name in ("table4", "table5", "table6", "table7"):  # 3 centres x 2 shapes x 6 estimators
        assert len(tables[name]["rows"]) == 36
        assert {r[1] for r in tables[name]["rows"]} == {3, 5, 10}
    assert {r[3] for r in tables["summary"]["rows"]} <= {"reproduced", "differs", "impossible offline"}


def test_mixture_quantile_is_bit_for_bit_the_per_component_scipy_root():
    """The vectorized eq. (13) (special.gammainc over the centres) is the root the old per-centre
    stats.gamma.cdf sum found, exactly, and its mixture CDF there is p."""
    from paper004_quantiles import mixture_quantile
    from scipy import optimize

    rng = np.random.default_rng(13)
    for _ in range(20):
        sizes, alphas = [492, 368, 276, 208, 156], rng.normal(0, 0.1, 5)
        p, r = float(rng.choice([0.02, 0.5, 0.98])), float(rng.choice([4.0, 10.0]))
        old = optimize.brentq(lambda q: sum(n / sum(sizes) * stats.gamma.cdf(q / math.exp(a), r)
                                            for n, a in zip(sizes, alphas)) - p, 1e-9, 1e3)
        new = mixture_quantile(p, r, sizes, alphas)
        assert new == old
        cdf = sum(n / sum(sizes) * stats.gamma.cdf(new / math.exp(a), r) for n, a in zip(sizes, alphas))
        assert cdf == pytest.approx(p, abs=1e-9)


@pytest.mark.slow
def test_results_do_not_depend_on_the_number_of_processes(tmp_path):
    import paper004
    tasks = {(c, r): ("quantiles", (c, r, 3, 10, 0.1)) for c in (3, 5) for r in (4.0, 10.0)}
    one, _ = paper004.run_tasks(tasks, 1, None)
    two, _ = paper004.run_tasks(tasks, 2, tmp_path)
    again, _ = paper004.run_tasks(tasks, 2, tmp_path)  # read back from the cache
    text = lambda out: json.dumps([[list(key), out[key]] for key in tasks])
    assert text(one) == text(two) == text(again) and len(list(tmp_path.iterdir())) == len(tasks)


def test_the_summary_states_the_committed_run_size():
    results = json.loads((ROOT / "bench" / "results" / "paper004.json").read_text())
    text = json.dumps(results["tables"][0]["rows"])
    assert f"{results['sims']} data sets a setting" in text and f"{results['qsims']} data sets a setting" in text
    if results["sims"] < 2000 or results["qsims"] < 2000:
        assert "quick run" in text or "reduced run" in text
