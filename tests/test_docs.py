"""The README and docs/ stay true: links resolve, the two commands are the ones CI runs, every
page is reachable from the README, and the README stays an overview (issue 24, point 5)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves_to_a_file_and_heading(page):
    for target in re.findall(r"\]\(([^)]+)\)", page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path) if path else page
        assert linked.exists(), f"{page.name}: {target}"
        if anchor:
            headings = [slug(line.lstrip("#")) for line in linked.read_text().splitlines() if line.startswith("#")]
            assert anchor in headings, f"{page.name}: {target}"


def test_the_readme_is_an_overview_that_reaches_every_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 300
    for page in (ROOT / "docs").glob("*.md"):
        assert f"docs/{page.name}" in readme, page.name
    for section in ("## Two commands", "## A five-minute tour", "## Architecture", "## Documentation"):
        assert section in readme


def test_ci_runs_the_test_command_the_readme_gives():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: .*\n\t.*pytest", makefile, re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_test_a_page_names_exists(page):
    """The trust table is a test table (issue 47): a test named beside a promise is a real test.
    `test_x.py::test_name` names a test of tests/test_x.py; a following `::test_other` (with no
    file) names another test of the same file; a bare `test_x.py` names a file."""
    text = page.read_text()
    for match in re.finditer(r"`(test_\w+\.py)(?:::(\w+))?`((?:, `::\w+`)*)", text):
        file, tests = match.group(1), [match.group(2), *re.findall(r"`::(\w+)`", match.group(3))]
        source = ROOT / "tests" / file
        assert source.exists(), f"{page.name}: tests/{file}"
        for name in filter(None, tests):
            assert re.search(rf"^def {name}\(", source.read_text(), re.MULTILINE), f"{page.name}: {file}::{name}"
