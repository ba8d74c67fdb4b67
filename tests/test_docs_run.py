"""The docs run: every command and code block in README.md and docs/ that is meant to run is run here.

A fenced block is meant to run when it is Python (```python) or a block of commands (each line
`python run.py ...`, `.venv/bin/python run.py ...`, `make ...`, `ray ...`, optionally after `$ `).
The line before a fence may say otherwise, or say what a block shows:

    <!-- docs: not run (REASON) -->          an excerpt, a synopsis, or a command for several hosts
    <!-- docs: slow (REASON) -->             run, but only with the slow tests (`make test-all`)
    <!-- docs: output of `COMMAND` -->       the block is what COMMAND prints

Commands run from a scratch directory that sees the checkout's scenarios/, examples/ and run.py,
at small settings (one trial for `run` and `sweep`); a `$ COMMAND` block's own output
lines, `name=value` words in a command's trailing comment, and a Python line's trailing
`# prints: TEXT` must be what it prints. An output
block's shape (table columns, method rows, the lines' leading words) is checked here at small
settings; its values, at the stated settings, by the slow test at the end (`make test-all`):
rows of methods without privacy noise exactly, rows with OS noise by their status counts. `...`
in a shown line stands for anything.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- docs: (.+?) -->$")
COMMAND = re.compile(r"^(\$ )?((\.venv/bin/)?python )?(run\.py|make|ray) ")
BOX = "┏┃┡│└━╇┩┓┳┗"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    lang: str
    lines: tuple[str, ...]
    mark: str  # the docs marker before it, or ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def commands(self) -> bool:
        """A block of commands: every line a command, a `$ command` with its output, or a comment."""
        lines = [line for line in self.lines if line.strip()]
        if not lines or self.lang not in ("", "bash", "sh", "console"):
            return False
        if lines[0].startswith("$ "):
            return bool(COMMAND.match(lines[0]))
        previous = ""
        for line in lines:
            if not (COMMAND.match(line) or line.lstrip().startswith("#") or previous.rstrip().endswith("\\")):
                return False
            previous = line
        return True

    @property
    def runnable(self) -> bool:
        return not self.mark.startswith("not run") and not self.mark.startswith("output of") and (
            self.lang == "python" or self.commands)

    @property
    def param(self):
        marks = [pytest.mark.slow] if self.mark.startswith("slow") else []
        return pytest.param(self, id=self.id, marks=marks)


def read_blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if fence:
            indent, j = len(fence.group(1)), i + 1
            while not lines[j].strip().startswith("```"):
                j += 1
            before = lines[i - 1].strip() if i else ""
            mark = MARK.match(before)
            body = tuple(line[indent:] for line in lines[i + 1:j])
            blocks.append(Block(page, i + 1, fence.group(2), body, mark.group(1) if mark else ""))
            i = j
        i += 1
    return blocks


BLOCKS = [block for page in PAGES for block in read_blocks(page)]
RUNNABLE = [block for block in BLOCKS if block.runnable]
OUTPUTS = [block for block in BLOCKS if block.mark.startswith("output of")]


def scratch(path: Path) -> Path:
    """A scratch directory where the docs' relative paths (scenarios/..., run.py) resolve and
    what the commands write (runs/...) stays."""
    for name in ("scenarios", "examples", "tests", "run.py"):
        (path / name).symlink_to(ROOT / name)
    return path


@pytest.fixture()
def workdir(tmp_path) -> Path:
    return scratch(tmp_path)


@functools.lru_cache(maxsize=None)
def printed(argv: tuple[str, ...]) -> str:
    """What a command prints, run once per session (several pages show the same run's output)."""
    return run_command(list(argv), scratch(Path(tempfile.mkdtemp(prefix="docs-output-"))))


def small(argv: list[str]) -> list[str]:
    """A `run.py run|sweep` command at small settings: one trial."""
    if len(argv) < 3 or argv[1] != "run.py" or argv[2] not in ("run", "sweep"):
        return argv
    if "--trials" in argv:
        at = argv.index("--trials") + 1
        return argv[:at] + ["1"] + argv[at + 1:]
    return argv + ["--trials", "1"]


def command_argv(line: str) -> list[str]:
    """A docs command line as argv for this interpreter (`python`/`.venv/bin/python` -> sys.executable)."""
    argv = shlex.split(line.removeprefix("$ "), comments=True)
    if argv[0] in ("python", ".venv/bin/python"):
        argv[0] = sys.executable
    return argv


def run_command(argv: list[str], cwd: Path) -> str:
    result = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    shown = " ".join(argv)
    assert result.returncode == 0, f"{shown} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def squash(text: str) -> str:
    return " ".join(text.split())


def shows(expected: str, output: str) -> bool:
    """Whether `output` shows `expected`, `...` standing for anything, whitespace not counted."""
    at, flat = 0, squash(output)
    for fragment in (squash(part) for part in expected.split("...")):
        if fragment:
            found = flat.find(fragment, at)
            if found < 0:
                return False
            at = found + len(fragment)
    return True


def check_comment(line: str, output: str) -> None:
    """A command's trailing comment: each `name=value` word (value may end in `...`) is printed."""
    if "#" not in line:
        return
    for word in line.split("#", 1)[1].split():
        if "=" in word:
            assert shows(word, output), f"{line.strip()}: the output lacks {word}:\n{output[-2000:]}"


def run_block(block: Block, cwd: Path) -> None:
    if block.lang == "python":
        script = cwd / "snippet.py"
        script.write_text("\n".join(block.lines) + "\n")
        output = run_command([sys.executable, str(script)], cwd)
        shown = [line.split("# prints:", 1)[1] for line in block.lines if "# prints:" in line]
        assert shows(" ... ".join(shown), output), f"{block.id}: the prints show {shown}, it printed:\n{output}"
        return
    lines = list(block.lines)
    if lines[0].startswith("$ "):  # `$ command` then its output, possibly several
        while lines:
            command, lines = lines[0], lines[1:]
            while command.endswith("\\"):
                command, lines = command[:-1] + lines[0].strip(), lines[1:]
            expected = []
            while lines and not lines[0].startswith("$ "):
                expected.append(lines.pop(0))
            output = run_command(small(command_argv(command)), cwd)
            check_comment(command, output)
            assert shows("\n".join(expected), output), f"{block.id}: {command} printed\n{output[-3000:]}"
        return
    for line in lines:
        if COMMAND.match(line):
            output = run_command(small(command_argv(line)), cwd)
            check_comment(line, output)


@pytest.mark.parametrize("block", [block.param for block in RUNNABLE])
def test_every_runnable_block_runs_as_shown(block, workdir):
    run_block(block, workdir)


def test_every_block_that_looks_runnable_runs_or_says_why_not():
    for block in BLOCKS:
        if block.mark.startswith(("not run", "slow")):
            assert re.match(r"(not run|slow) \(.{10,}\)$", block.mark), f"{block.id}: say why"
            assert block.lang == "python" or block.commands, f"{block.id}: marked {block.mark} but is not runnable"
        elif block.mark:
            assert re.match(r"output of `[^`]+`$", block.mark), f"{block.id}: unknown docs marker {block.mark!r}"
    assert len(RUNNABLE) >= 10 and len(OUTPUTS) >= 3


def output_command(block: Block) -> list[str]:
    return command_argv(re.match(r"output of `([^`]+)`", block.mark).group(1))


def shape(lines) -> tuple[list[str], list[str], list[str]]:
    """What an output block shows whatever its numbers: table headers, rows' first cells, and the
    leading words of other lines (up to the first word with a digit)."""
    headers, labels, leads = [], [], []
    for line in lines:
        if line.startswith("┃"):
            headers.append(squash(line))
        elif line.startswith("│"):
            labels.append(line.split("│")[1].strip())
        elif line.strip() and line[0] not in BOX:
            words = []
            for word in line.split():
                if re.search(r"\d", word):
                    break
                words.append(word)
            if words:
                leads.append(" ".join(words))
    return headers, labels, leads


@pytest.mark.parametrize("block", OUTPUTS, ids=lambda b: b.id)
def test_an_output_block_has_the_shape_of_what_its_command_prints(block):
    output = printed(tuple(small(output_command(block))))
    headers, labels, leads = shape(block.lines)
    out_headers, out_labels, _ = shape(output.splitlines())
    assert headers or leads, f"{block.id}: an output block with nothing to check"
    assert set(headers) <= set(out_headers), f"{block.id}: table headers {headers} vs {out_headers}"
    assert set(labels) <= set(out_labels), f"{block.id}: rows {sorted(set(labels) - set(out_labels))} not printed"
    for lead in leads:
        assert lead in output, f"{block.id}: nothing printed starts like {lead!r}:\n{output[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("block", OUTPUTS, ids=lambda b: b.id)
def test_an_output_block_shows_the_values_its_command_prints(block):
    """At the stated settings: rows of methods without privacy noise to the digit, rows with OS
    noise (their privacy column is not "-") by method, codec, privacy and status counts."""
    output = printed(tuple(output_command(block)))
    for line in block.lines:
        if line.startswith("│"):
            cells = [c.strip() for c in line.split("│")[1:-1]]
            expected = line if cells[2] == "-" else "│ " + " │ ".join(cells[:4]) + " │"
            assert shows(expected, output), f"{block.id}: not printed: {line}"
        elif line.strip() and line[0] not in BOX:
            assert shows(line, output), f"{block.id}: not printed: {line}"
