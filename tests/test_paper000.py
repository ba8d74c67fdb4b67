"""Paper 000's results file (bench/results/paper000.json, `make paper000`) holds what the stats
functions give: the theory tables are recomputed here and must match the committed numbers."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import paper000  # noqa: E402
from stats import ehm  # noqa: E402
from stats.orderstats import qq_coverage  # noqa: E402

RESULTS = json.loads((ROOT / "bench" / "results" / "paper000.json").read_text())
TABLES = {t["name"]: t for t in RESULTS["tables"]}


def test_figure1_table_is_the_exact_coverage_and_sits_between_the_bounds():
    rows = paper000.figure1()
    assert rows == TABLES["figure1"]["rows"]
    for m, n, ell, k, coverage, central, single in rows:
        assert coverage == pytest.approx(float(qq_coverage(m, n, ell, k)), abs=1e-5)
        assert 0.9 <= coverage <= single  # valid (theorem 3.2) and tighter than one agent alone


def test_figures6_7_table_and_monotone_coverage():
    rows, tables = paper000.figures6_7()
    assert rows == TABLES["figures6-7"]["rows"]
    for (m, n), table in tables.items():
        assert table.shape == (n, m)
        assert np.all(np.diff(table, axis=0) >= -1e-12) and np.all(np.diff(table, axis=1) >= -1e-12)
        # M[1, 1] = P(U <= min of all mn uniforms) = 1/(mn + 1); M[n, m] = mn/(mn + 1)
        assert table[0, 0] == pytest.approx(1 / (m * n + 1), abs=1e-12)
        assert table[-1, -1] == pytest.approx(m * n / (m * n + 1), abs=1e-12)


def test_theorem_c3_example_row_is_stats_ehm():
    example = np.linspace(0.8, 1.0, 10)
    row = TABLES["theorem-c3"]["rows"][0]
    assert row[1:] == [round(ehm.distance(example), 6), round(ehm.upper_bound(example), 6),
                       round(ehm.lower_bound_factor(example), 6)]
    assert row[1] <= row[2]


def test_every_figure_of_appendix_b1_has_a_row_per_model():
    items = [r[0] for r in TABLES["summary"]["rows"]]
    for fig, data, m, n in paper000.REAL:
        for model in RESULTS["settings"]["models"]:
            assert any(i.startswith(f"figure {fig} ({data}") and model in i for i in items), (fig, model)


def test_no_row_claims_the_papers_size_unless_it_ran_at_it():
    """The runs table's `the paper's size` follows from each run's own trials, trees and epochs,
    and every row labelled at the paper's size holds 20 trials' results."""
    runs = TABLES["runs"]["rows"]
    for fig, data, model, trials, trees, epochs, paper, seconds, per_trial in runs:
        full = trials >= 20 and (model != "cqr_forest" or trees >= 1000) and epochs in ("", 200)
        assert paper == ("yes" if full else "no"), (fig, data, model)
    for fig, data, m, n, model, size, trials, method, coverage, length in TABLES["figures8-17"]["rows"]:
        assert ("(the paper's size)" in size) == (trials >= 20 and ("trees" not in size or "1,000 trees" in size)
                                                  and "(quick size)" not in size), (fig, model, size, trials)
        assert any(r[0] == fig and r[2] == model and (r[6] == "yes") == ("(the paper's size)" in size) for r in runs)
    for row in TABLES["summary"]["rows"]:
        if "(the paper's size)" in row[2]:
            assert "quick size" not in row[4], row[0]


def test_each_row_uses_the_wanted_run_when_finished_else_the_largest(tmp_path):
    def make(name, done=True):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.csv").write_text("trial\n")
        if done:
            (tmp_path / name / "done").write_text("1.0")

    wanted = paper000.Size("cqr_forest", 20, 1000)
    assert paper000.best_finished(tmp_path, "cqr_forest", wanted) is None
    make("cqr_forest-t3-trees100")
    make("cqr_forest-t3-trees1000")
    make("cqr_forest-t20-trees1000", done=False)  # stopped at a budget: not a result yet
    make("cqr_net-t20")
    run, size = paper000.best_finished(tmp_path, "cqr_forest", wanted)
    assert run.name == "cqr_forest-t3-trees1000" and not size.paper and "(quick size)" in size.label()
    (tmp_path / "cqr_forest-t20-trees1000" / "done").write_text("9.0")
    run, size = paper000.best_finished(tmp_path, "cqr_forest", wanted)
    assert run.name == "cqr_forest-t20-trees1000" and size.paper
    assert paper000.best_finished(tmp_path, "cqr_net", paper000.Size("cqr_net", 20))[1].paper
    assert not paper000.Size("cqr_net", 20, epochs=20).paper and not paper000.Size("cqr_forest", 20, 100).paper
