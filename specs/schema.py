"""Scenario files: loading, `--set` overrides, and validation with errors that name the field.

Specs are plain data so that methods, models and data sources can declare their own
parameters without importing this module:

    {"type": "int", "min": 1, "default": 20}
    {"type": "float", "gt": 0, "lt": 1}          (also "ge", "le"; "finite": true refuses nan and inf)
    {"type": "str", "choices": [...]}              {"type": "bool"}
    {"type": "map", "fields": {...}}               {"type": "list", "of": spec, "min_len": 1, "max_len": 2}
    {"type": "float_or", "choices": [...]}         a number, or one of the named strings
    {"type": "int_or", "choices": [...], "min": 1} an integer, or one of the named strings
    {"type": "sizes"}   "equal", a list of positive integers (one per site), or a distribution
                        {distribution: lognormal, median, sigma | uniform, low, high; min, max, seed}
    {"type": "any"}     left to a later check

A field without "default" is required. Unknown fields are errors. Validation goes on past a
problem and reports every one it finds (ScenarioErrors); null is accepted where the default is
null, so a validated scenario validates again to itself.
"""

from __future__ import annotations

import copy
import difflib
import math
from pathlib import Path
from typing import Any, Callable

import yaml

REQUIRED = object()


class ScenarioError(ValueError):
    """A scenario problem: `file`, `field` (dotted path) and what was expected."""

    def __init__(self, field: str, expectation: str, got: Any = REQUIRED, file: str | None = None):
        self.file, self.field, self.expectation, self.got = file, field, expectation, got
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.file}: " if self.file else ""
        got = "" if self.got is REQUIRED else f", got {self.got!r}"
        return f"{where}field '{self.field}': expected {self.expectation}{got}"

    def in_file(self, file: str) -> "ScenarioError":
        return ScenarioError(self.field, self.expectation, self.got, file)

    @property
    def problems(self) -> list["ScenarioError"]:
        """Every problem found (this one alone; ScenarioErrors holds several)."""
        return [self]


class ScenarioErrors(ScenarioError):
    """Several problems found in one pass, one per line in the order of the file; `field`,
    `expectation` and `got` are the first's, so code that reads one problem still works."""

    def __init__(self, problems: list[ScenarioError], file: str | None = None):
        self._problems = [p.in_file(file) if file else p for p in problems]
        first = self._problems[0]
        super().__init__(first.field, first.expectation, first.got, first.file)

    def __str__(self) -> str:
        return "\n".join(ScenarioError.__str__(p) for p in self._problems)

    def in_file(self, file: str) -> "ScenarioErrors":
        return ScenarioErrors(self._problems, file)

    @property
    def problems(self) -> list[ScenarioError]:
        return list(self._problems)


class Problems:
    """Collects ScenarioErrors so that validation goes on past the first and reports them all."""

    def __init__(self) -> None:
        self.found: list[ScenarioError] = []

    def attempt(self, check, *args, failed=None):
        """check(*args), or `failed` after noting its problems."""
        try:
            return check(*args)
        except ScenarioError as exc:
            self.found.extend(exc.problems)
            return failed

    def add(self, problem: ScenarioError) -> None:
        self.found.extend(problem.problems)

    def raise_any(self) -> None:
        if len(self.found) == 1:
            raise self.found[0]
        if self.found:
            raise ScenarioErrors(self.found)


def validate(spec: dict, value: Any, path: str) -> Any:
    """Check `value` against `spec`; return it with defaults filled in."""
    kind = spec["type"]
    check = _CHECKS.get(kind)
    if check is None:
        raise ValueError(f"unknown spec type {kind!r} at {path}")
    return check(spec, value, path)


def _int(spec, value, path):
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(path, _describe(spec), value)
    _bounds(spec, value, path)
    return value


def _float(spec, value, path):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(path, _describe(spec), value)
    if math.isnan(value) or (spec.get("finite") and math.isinf(value)):
        raise ScenarioError(path, _describe(spec), value)
    _bounds(spec, float(value), path)
    return float(value)


def _str(spec, value, path):
    if not isinstance(value, str):
        raise ScenarioError(path, _describe(spec), value)
    choices = spec.get("choices")
    if choices is not None and value not in choices:
        raise ScenarioError(path, _describe(spec), value)
    return value


def _number_or(spec, value, path):
    """float_or / int_or: one of the named strings, or a number checked as "float" / "int"."""
    if isinstance(value, str):
        if value in spec["choices"]:
            return value
        raise ScenarioError(path, _describe(spec), value)
    number = spec["type"].removesuffix("_or")
    return _CHECKS[number]({**spec, "type": number}, value, path)


def _bool(spec, value, path):
    if not isinstance(value, bool):
        raise ScenarioError(path, "true or false", value)
    return value


def _map(spec, value, path):
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ScenarioError(path, "a mapping", value)
    fields = spec["fields"]
    problems = Problems()
    for key in value:
        if key not in fields:
            hint = difflib.get_close_matches(str(key), list(fields), n=1)
            expectation = f"no field '{key}' here (known: {', '.join(fields)})"
            if hint:
                expectation += f"; did you mean '{hint[0]}'?"
            problems.add(ScenarioError(_join(path, key), expectation))
    out = {}
    for key, sub in fields.items():
        if key in value and value[key] is None and "default" in sub and sub["default"] is None:
            out[key] = None  # null where null is the default (a validated scenario validates again)
        elif key in value:
            out[key] = problems.attempt(validate, sub, value[key], _join(path, key))
        elif "default" in sub:
            out[key] = copy.deepcopy(sub["default"])
        elif sub["type"] == "map":  # an absent section takes its fields' defaults
            out[key] = problems.attempt(validate, sub, {}, _join(path, key))
        else:
            problems.add(ScenarioError(_join(path, key), f"{_describe(sub)} (required)"))
    problems.raise_any()
    return out


def _list(spec, value, path):
    if not isinstance(value, list):
        raise ScenarioError(path, "a list", value)
    if len(value) < spec.get("min_len", 0):
        raise ScenarioError(path, f"a list of at least {spec['min_len']} item(s)", value)
    if len(value) > spec.get("max_len", len(value)):
        raise ScenarioError(path, f"a list of at most {spec['max_len']} item(s)", value)
    problems = Problems()
    out = [problems.attempt(validate, spec["of"], item, f"{path}[{i}]") for i, item in enumerate(value)]
    problems.raise_any()
    return out


SIZE_DISTRIBUTIONS = {
    "lognormal": {"median": {"type": "float", "gt": 0}, "sigma": {"type": "float", "ge": 0}},
    "uniform": {"low": {"type": "int", "min": 1}, "high": {"type": "int", "min": 1}},
}
_SIZE_COMMON = {"min": {"type": "int", "min": 1, "default": 1}, "max": {"type": "int", "min": 1, "default": None},
                "seed": {"type": "int", "min": 0, "default": 0}}


def _sizes(spec, value, path):
    if value == "equal" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    if (isinstance(value, list) and value
            and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value)):
        return value
    if isinstance(value, dict):
        kind = validate({"type": "str", "choices": sorted(SIZE_DISTRIBUTIONS)}, value.get("distribution"),
                        _join(path, "distribution"))
        fields = {"distribution": {"type": "str"}, **SIZE_DISTRIBUTIONS[kind], **_SIZE_COMMON}
        out = validate({"type": "map", "fields": fields}, value, path)
        if kind == "uniform" and out["high"] < out["low"]:
            raise ScenarioError(_join(path, "high"), f"at least low = {out['low']}", out["high"])
        return out
    raise ScenarioError(path, "'equal', a positive integer (n for every site), a list of positive integers "
                        "(one n_j per site), or a mapping with 'distribution' (lognormal or uniform)", value)


def _any(spec, value, path):
    return value


_CHECKS = {"int": _int, "int_or": _number_or, "float": _float, "float_or": _number_or, "str": _str, "bool": _bool, "map": _map,
           "list": _list, "sizes": _sizes, "any": _any}


def _bounds(spec, value, path):
    ok = (("min" not in spec or value >= spec["min"]) and ("max" not in spec or value <= spec["max"])
          and ("gt" not in spec or value > spec["gt"]) and ("lt" not in spec or value < spec["lt"])
          and ("ge" not in spec or value >= spec["ge"]) and ("le" not in spec or value <= spec["le"]))
    if not ok:
        raise ScenarioError(path, _describe(spec), value)


def _describe(spec) -> str:
    kind = spec["type"]
    if kind == "str" and spec.get("choices") is not None:
        return "one of " + ", ".join(repr(c) for c in spec["choices"])
    if kind in ("float_or", "int_or"):
        number = "an integer" if kind == "int_or" else "a number"
        limits = [f"{op} {spec[key]}" for key, op in (("min", ">="), ("max", "<=")) if key in spec]
        return " ".join([number, *limits]) + " or " + " or ".join(repr(c) for c in spec["choices"])
    words = {"int": "an integer", "float": "a finite number" if spec.get("finite") else "a number",
             "str": "a string", "bool": "true or false",
             "map": "a mapping", "list": "a list", "sizes": "'equal' or a list of sizes", "any": "a value"}
    text = words[kind]
    limits = [f"{op} {spec[key]}" for key, op in
              (("min", ">="), ("ge", ">="), ("gt", ">"), ("max", "<="), ("le", "<="), ("lt", "<"))
              if key in spec]
    return text + (" " + " and ".join(limits) if limits else "")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


# ---------------------------------------------------------------------------------------------
# Loading and overrides


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError("(file)", f"a readable scenario file ({exc.strerror})", file=str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ScenarioError("(file)", f"valid YAML{where}: {getattr(exc, 'problem', exc)}", file=str(path)) from None
    if not isinstance(data, dict):
        raise ScenarioError("(top level)", "a mapping of scenario fields", data, file=str(path))
    return data


#: accepts(list path, item, field) -> whether `field` can exist in that item of the list (e.g. a
#: method without an `epsilon` parameter cannot take methods.*.epsilon)
Accepts = Callable[[str, Any, str], bool]


def apply_overrides(data: dict, overrides: list[str] | dict, accepts: Accepts | None = None,
                    skipped: list[str] | None = None) -> dict:
    """Apply overrides to a copy of `data`: `dotted.key=value` strings (values parsed as YAML,
    as `--set` gives them) or a mapping {dotted.key: value} (values as they are, as the Python
    API gives them). List items by index, or `*` for every item, e.g. methods.*.epsilon=2: then
    the field is set in every item `accepts` says can have it, and each item left out is noted in
    `skipped` ("methods.*.epsilon: skipped methods[1] (...)"); no item that can is an error."""
    data = copy.deepcopy(data)
    accepts = accepts or (lambda path, item, field: True)
    skipped = [] if skipped is None else skipped
    if isinstance(overrides, dict):
        pairs = [(str(key), copy.deepcopy(value)) for key, value in overrides.items()]
    else:
        pairs = []
        for item in overrides:
            if not isinstance(item, str) or "=" not in item:
                raise ScenarioError(str(item), "an override of the form dotted.key=value")
            key, raw = item.split("=", 1)
            pairs.append((key, yaml.safe_load(raw) if raw.strip() else ""))
    for key, value in pairs:
        _override(data, key.strip().split("."), 0, value, key.strip(), accepts, skipped)
    return data


def _override(node, parts: list[str], depth: int, value, key: str, accepts: Accepts, skipped: list[str]) -> None:
    if depth == len(parts) - 1:
        _assign(node, parts[-1], value, key)
        return
    part = parts[depth]
    if part == "*":
        path = ".".join(parts[:depth])
        if not isinstance(node, list):
            raise ScenarioError(".".join(parts[: depth + 1]), "a list for '*' to range over", node)
        last = depth + 1 == len(parts) - 1  # `*` then the field itself: set it only where it can exist
        taken = [i for i, child in enumerate(node) if not last or accepts(path, child, parts[-1])]
        if node and not taken:
            raise ScenarioError(key, f"a field that at least one item of {path} has")
        for i, child in enumerate(node):
            if i in taken:
                _override(child, parts, depth + 1, value, key, accepts, skipped)
            else:
                name = child.get("name") if isinstance(child, dict) else None
                skipped.append(f"{key}: skipped {path}[{i}]" + (f" ({name} has no field '{parts[-1]}')" if name else ""))
        return
    _override(_child(node, part, ".".join(parts[: depth + 1])), parts, depth + 1, value, key, accepts, skipped)


def _child(node, part, path):
    if isinstance(node, list):
        index = _index(node, part, path)
        return node[index]
    if not isinstance(node, dict):
        raise ScenarioError(path, "a mapping or list to descend into", node)
    return node.setdefault(part, {})


def _assign(node, part, value, path):
    if isinstance(node, list):
        node[_index(node, part, path)] = value
    elif isinstance(node, dict):
        node[part] = value
    else:
        raise ScenarioError(path, "a mapping or list to set a value in", node)


def _index(node, part, path):
    if not part.isdigit() or int(part) >= len(node):
        raise ScenarioError(path, f"a list index below {len(node)}", part)
    return int(part)
