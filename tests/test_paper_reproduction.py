"""Paper 000's real-data result on one data set, end to end over site processes (slow: run with
`make test-all`): FedCP-QQ covers at 1 - alpha with sets within a few percent of centralized
calibration, and FedCP-Avg's are wider (paper 000 section 5.2, figures 4 and 16)."""

from pathlib import Path

import pytest

from runner.study import run_study
from quorum import load_scenario
from tests.test_data import needs_datasets

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@needs_datasets
def test_concrete_m40_n10_matches_the_paper(tmp_path):
    scenario = load_scenario(ROOT / "scenarios" / "paper000" / "fig16-concrete-m40-n10.yaml").to_dict()
    summary = run_study(scenario, tmp_path / "run")
    qq, avg, central = (summary["methods"][m] for m in ("fedcp_qq", "fedcp_avg", "centralized"))
    trials = scenario["trials"]
    assert qq["ok"] == avg["ok"] == central["ok"] == trials
    standard_error = qq["coverage_std"] / trials ** 0.5
    assert qq["coverage_mean"] >= 0.9 - 3 * standard_error
    assert abs(qq["size_mean"] / central["size_mean"] - 1) < 0.06
    assert avg["size_mean"] > qq["size_mean"] and avg["coverage_mean"] > qq["coverage_mean"]
