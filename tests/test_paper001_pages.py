"""Issue 51, paper 001: bench/results/paper001.json is rebuilt, row by row, from the committed full
runs of figures 2 and 3, and its numbers are those of the detailed pages (docs/secure-aggregation.md,
docs/private-training.md), which their own tests keep equal to the same files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("paper001", ROOT / "bench" / "paper001.py")
paper001 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paper001)
COMMITTED = json.loads((ROOT / "bench" / "results" / "paper001.json").read_text())


def test_the_results_file_is_rebuilt_from_the_committed_figure_runs():
    this_run = COMMITTED["this_run"]
    rebuilt = paper001.build(this_run["quick"], this_run["seconds"])
    assert json.loads(json.dumps(rebuilt, ensure_ascii=False)) == COMMITTED


def test_figure3_rows_are_the_numbers_of_docs_private_training():
    page = (ROOT / "docs" / "private-training.md").read_text()
    table = next(t for t in COMMITTED["tables"] if t["name"] == "figure3")
    for epsilon, method, p90, mean in table["rows"]:
        assert f"| {epsilon} | {method} | {p90} | {mean} |" in page, (epsilon, method)


def test_figure2_rows_quote_the_docs_numbers_and_every_claim_has_a_verdict():
    page = (ROOT / "docs" / "secure-aggregation.md").read_text()
    summary = next(t for t in COMMITTED["tables"] if t["name"] == "summary")
    left = {row[0]: row for row in summary["rows"] if row[0].startswith("Figure 2 left")}
    # docs: "| left | flat est.: 0.03 at epsilon = 1 | Unif, 512, 64 | 0.042 (0.017) | 0.027 (0.004) |"
    assert left["Figure 2 left: flat histogram, estimated n, at epsilon 1"][2] == "0.027"
    assert "| 0.042 (0.017) | 0.027 (0.004) |" in page
    assert left["Figure 2 left: flat, estimated n, at epsilon 5"][2] == "0.009"
    assert "| 0.015 (0.005) | 0.009 (0.001) |" in page
    verdicts = [row[3] for row in summary["rows"]]
    assert len(summary["rows"]) == 14 and verdicts.count("reproduced") == 9 and verdicts.count("differs") == 5
