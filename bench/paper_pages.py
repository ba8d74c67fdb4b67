"""The papers side by side (issue 51): each paper's results file rendered into its docs page.

A paper's command (`make paper000` ... `make paper004`) writes bench/results/paperNNN.json:

    {"paper": "003", "title": "...", "command": "make paper003", "quick": "make paper003 ARGS=--quick",
     "tables": [{"name": "summary", "columns": [...], "rows": [[...], ...]}, ...]}

Every table is rendered as markdown between `<!-- table:NAME -->` and `<!-- /table:NAME -->` in
docs/papers/NNN.md (`python bench/paper_pages.py write NNN` puts it there), and
tests/test_paper_pages.py keeps each page's tables equal to the committed results file. The table
named `summary` is the page's ledger of the paper, one row per figure, table or claim, with the
columns SUMMARY_COLUMNS: what the paper reports (its number, or its claim where it gives only a
figure), ours, the verdict (one of VERDICTS), why it differs or what stands in for it offline,
the command and the time it took here.

    python bench/paper_pages.py write 003     # render bench/results/paper003.json into docs/papers/003.md
    python bench/paper_pages.py check         # every page against its results file
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PAGES = ROOT / "docs" / "papers"
SUMMARY_COLUMNS = ["item", "the paper", "ours", "verdict", "why, or the stand-in", "command", "time here"]
VERDICTS = ("reproduced", "differs", "impossible offline")


def results_path(paper: str) -> Path:
    return RESULTS / f"paper{paper}.json"


def page_path(paper: str) -> Path:
    return PAGES / f"{paper}.md"


def problems(results: dict) -> list[str]:
    """What is wrong with a results file: a summary with other columns, a verdict not in
    VERDICTS, a `differs` or `impossible offline` row that does not say why, a ragged row."""
    found = []
    names = [table["name"] for table in results.get("tables", [])]
    if "summary" not in names:
        found.append("no table named summary")
    for table in results.get("tables", []):
        width = len(table["columns"])
        for i, row in enumerate(table["rows"]):
            if len(row) != width:
                found.append(f"table {table['name']} row {i}: {len(row)} cells for {width} columns")
        if table["name"] != "summary":
            continue
        if table["columns"] != SUMMARY_COLUMNS:
            found.append(f"summary columns {table['columns']} (expected {SUMMARY_COLUMNS})")
            continue
        for i, row in enumerate(table["rows"]):
            verdict, why = row[3], row[4]
            if verdict not in VERDICTS:
                found.append(f"summary row {i} ({row[0]}): verdict {verdict!r} is not one of {VERDICTS}")
            if verdict != "reproduced" and not str(why).strip():
                found.append(f"summary row {i} ({row[0]}): {verdict} without saying why")
    return found


def cell(value) -> str:
    """A table cell: numbers as written in the results file, pipes escaped, one line."""
    if isinstance(value, float):
        text = f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def render(table: dict) -> str:
    lines = ["| " + " | ".join(cell(c) for c in table["columns"]) + " |",
             "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table["rows"]]
    return "\n".join(lines)


def block(name: str, body: str) -> str:
    return f"<!-- table:{name} -->\n{body}\n<!-- /table:{name} -->"


def blocks_in(page: str) -> dict[str, str]:
    """{name: the text between its markers} of a page."""
    return {m.group(1): m.group(2).strip("\n") for m in
            re.finditer(r"<!-- table:([\w-]+) -->\n(.*?)\n?<!-- /table:\1 -->", page, flags=re.S)}


def write(paper: str) -> Path:
    """Put every table of the paper's results file into its page (a new page gets a header)."""
    results = json.loads(results_path(paper).read_text())
    found = problems(results)
    if found:
        raise SystemExit(f"{results_path(paper)}: " + "; ".join(found))
    path = page_path(paper)
    page = path.read_text() if path.exists() else (
        f"# Paper {paper}: {results.get('title', '')}\n\nRun: `{results.get('command', '')}` "
        f"(quick: `{results.get('quick', '')}`), results in `bench/results/paper{paper}.json`.\n\n")
    present = blocks_in(page)
    for table in results["tables"]:
        new = block(table["name"], render(table))
        if table["name"] in present:
            page = re.sub(rf"<!-- table:{table['name']} -->\n.*?<!-- /table:{table['name']} -->",
                          lambda _: new, page, flags=re.S)
        else:
            page = page.rstrip("\n") + f"\n\n## {table.get('title', table['name'])}\n\n{new}\n"
    path.write_text(page)
    return path


def publish(paper: str, results: dict, out: Path) -> None:
    """A paper command's last step: the results file written to `out` and, when `out` is the
    paper's committed results file, its page rendered; then one line per summary row."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    if out.resolve() == results_path(paper).resolve():
        print(write(paper))
    summary = next(table for table in results["tables"] if table["name"] == "summary")
    for row in summary["rows"]:
        print(f"- {row[0]}: {row[3]} (ours {row[2]})")


def check(paper: str) -> list[str]:
    """Why the paper's page and results file disagree (empty: they agree)."""
    if not results_path(paper).exists():
        return [f"{results_path(paper)} is missing"]
    results = json.loads(results_path(paper).read_text())
    found = problems(results)
    present = blocks_in(page_path(paper).read_text()) if page_path(paper).exists() else {}
    for table in results["tables"]:
        if table["name"] not in present:
            found.append(f"docs/papers/{paper}.md has no table {table['name']}")
        elif present[table["name"]] != render(table):
            found.append(f"docs/papers/{paper}.md table {table['name']} differs from {results_path(paper).name} "
                         f"(python bench/paper_pages.py write {paper})")
    return found


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "write":
        for paper in argv[1:]:
            print(write(paper))
        return 0
    if argv and argv[0] == "check":
        papers = argv[1:] or sorted(p.stem for p in PAGES.glob("*.md") if p.stem.isdigit())
        found = [f"{paper}: {p}" for paper in papers for p in check(paper)]
        print("\n".join(found) or "every page agrees with its results file")
        return 1 if found else 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
