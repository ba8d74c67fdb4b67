"""SecAgg's phases are written once (protocol.secagg.protocol.PHASE_TABLE, issue 50 point 6): each
row says what its phase is (its role), and the halves ask the table for a role instead of
comparing a phase to its name. The AST scan below keeps it so."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from protocol.methods.secure_sum import SECURE_SUM_PHASES, sum_parts, sum_phase
from protocol.methods.tail_secagg import ROUND_OPENERS, asks_question
from protocol.secagg.protocol import (MASKED_INPUT, MODE_PHASES, NEXT_PHASE, PHASE_TABLE, QUESTION, SHARES, SURVIVORS,
                                      UNMASKING, names_survivors, phase_of, role_of)

ROOT = Path(__file__).resolve().parents[1]
HALVES = sorted([*(ROOT / "protocol" / "methods").glob("*.py"), *(ROOT / "protocol" / "secagg").glob("*.py")])
NAMES = frozenset(row.name for row in PHASE_TABLE)


def test_each_phase_has_one_role_and_each_role_one_phase():
    assert [row.role for row in PHASE_TABLE] == [QUESTION, SHARES, MASKED_INPUT, SURVIVORS, UNMASKING]
    for row in PHASE_TABLE:
        assert role_of(row.name) == row.role and phase_of(row.role) == row.name
    assert role_of("round") is None and role_of(None) is None and role_of(["advertise"]) is None


def test_the_table_reads_as_the_protocol_did():
    """The names on the wire and each mode's order are those the protocol always had."""
    assert MODE_PHASES == {"active": ("advertise", "share", "mask", "consistency", "unmask"),
                           "semi-honest": ("advertise", "share", "mask", "unmask")}
    assert NEXT_PHASE["semi-honest"]["mask"] == "unmask" and NEXT_PHASE["active"]["mask"] == "consistency"
    assert {name: step.then for name, step in SECURE_SUM_PHASES.steps.items()} == {
        "advertise": ("share",), "share": ("mask",), "mask": ("consistency", "unmask"),
        "consistency": ("unmask",), "unmask": ()}
    assert ROUND_OPENERS == ("round", "loss-advertise", "average-advertise")


def test_the_requests_that_name_the_survivors():
    """Consistency's (active) and unmask's (semi-honest: no consistency round comes first)."""
    assert [row.name for row in PHASE_TABLE if names_survivors(row.name)] == ["consistency", "unmask"]
    assert not names_survivors("round") and not names_survivors(None)


@pytest.mark.parametrize("prefix", ["", "loss", "update", "average"])
def test_a_sums_phase_names_come_apart_as_they_were_made(prefix):
    for row in PHASE_TABLE:
        name = sum_phase(prefix, row.name)
        assert sum_parts(name) == (prefix, row.name)
        assert asks_question(name) == (row.role == QUESTION)
    assert not asks_question("setup") and not asks_question("round") and not asks_question("evaluate")


def literal_phase_names(node: ast.AST) -> list[str]:
    """The SecAgg phase names a comparison operand spells out: a string ("mask", or a prefixed one
    such as "loss-advertise") or a tuple, list or set of them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [name for element in node.elts for name in literal_phase_names(element)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value.rpartition("-")[2] in NAMES:
            return [node.value]
    return []


def name_comparisons(source: str) -> list[tuple[int, str]]:
    """Where Python source compares something to a SecAgg phase's name, tests a suffix or prefix
    against one, or dispatches on one (a dict literal keyed by names): (line, name) each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = [name for operand in (node.left, *node.comparators) for name in literal_phase_names(operand)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("endswith", "startswith", "removesuffix", "removeprefix")):
            names = [name for arg in node.args for name in literal_phase_names(arg)]
        elif isinstance(node, ast.Dict):
            names = [name for key in node.keys if key is not None for name in literal_phase_names(key)]
        else:
            continue
        found += [(node.lineno, name) for name in names]
    return found


def test_no_half_compares_a_phase_to_a_secagg_phase_name():
    """A half asks the table what a phase is (role_of, names_survivors, phase_of), never its name."""
    assert HALVES, "no halves found"
    found = [f"{path.relative_to(ROOT)}:{line}: {name!r}" for path in HALVES
             for line, name in name_comparisons(path.read_text())]
    assert not found, "compare to the table's roles instead:\n" + "\n".join(found)


def test_the_scan_finds_what_it_forbids():
    source = ('def f(phase, name, step):\n'
              '    a = phase == "mask"\n'
              '    b = phase in ("consistency", "unmask")\n'
              '    c = name.endswith("-advertise")\n'
              '    d = {"share": 1}\n'
              '    e = step != "loss-advertise"\n'
              '    return phase == "range" or name == "masked" or half.answer("mask", {})\n')
    assert sorted(name_comparisons(source)) == [(2, "mask"), (3, "consistency"), (3, "unmask"), (4, "-advertise"),
                                                (5, "share"), (6, "loss-advertise")]
