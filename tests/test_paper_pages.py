"""Issue 51: each paper's docs page shows the numbers its command wrote, table by table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("paper_pages", ROOT / "bench" / "paper_pages.py")
paper_pages = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paper_pages)

PAGES = sorted(p.stem for p in (ROOT / "docs" / "papers").glob("*.md") if p.stem.isdigit())


@pytest.mark.parametrize("paper", PAGES)
def test_every_table_of_a_papers_page_is_its_committed_results_file(paper):
    assert paper_pages.check(paper) == []


def test_a_summary_row_that_differs_must_say_why_and_a_verdict_is_one_of_three():
    results = {"tables": [{"name": "summary", "columns": paper_pages.SUMMARY_COLUMNS,
                           "rows": [["fig 1", "0.9", "0.8", "differs", "", "make x", "1 s"],
                                    ["fig 2", "0.9", "0.9", "close enough", "", "make x", "1 s"]]}]}
    found = paper_pages.problems(results)
    assert any("differs without saying why" in p for p in found)
    assert any("'close enough' is not one of" in p for p in found)
    table = {"name": "t", "columns": ["a", "b"], "rows": [[1.23456, "x|y"]]}
    assert paper_pages.render(table) == "| a | b |\n|---|---|\n| 1.235 | x\\|y |"
    page = paper_pages.block("t", paper_pages.render(table))
    assert paper_pages.blocks_in("intro\n" + page + "\nmore")["t"] == paper_pages.render(table)
