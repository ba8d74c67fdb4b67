"""Scenarios from Python: load a file or build one from a dict, override fields, validate.

    scenario = quorum.load_scenario("scenarios/quickstart.yaml", {"trials": 2, "sites.count": 10})
    scenario = quorum.Scenario.from_dict({"name": "mine", "data": {...}, ...})
    smaller = scenario.override({"methods.*.epsilon": 2.0})

A Scenario is immutable: `override` returns a new one. It keeps the mapping as written (before
defaults, which sweeps override) and the validated one (defaults filled in, what runs). Any
problem raises ScenarioError naming every field at fault (`.problems` lists them). An override
with `*` (`methods.*.epsilon`) sets the field in the methods that have one; `scenario.skipped`
lists the others (and a UserWarning says so).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import yaml

from scenarios.scenario import override_scenario, validate_scenario
from specs.schema import ScenarioError, read_yaml


class Scenario:
    def __init__(self, written: dict, source: str | None = None, skipped: list[str] | None = None) -> None:
        self._written = copy.deepcopy(written)
        self.source = source  # the file it came from, if any
        #: what `*` overrides left out, e.g. "methods.*.epsilon: skipped methods[1] (centralized has no field 'epsilon')"
        self.skipped = list(skipped or [])
        try:
            self._spec = validate_scenario(self._written)
        except ScenarioError as exc:
            raise (exc.in_file(source) if source else exc) from None

    @classmethod
    def load(cls, path: str | Path, overrides: dict | list[str] | None = None) -> "Scenario":
        """A scenario file, with overrides ({dotted.key: value}, or `key=value` strings as
        `--set` takes them) applied before validation."""
        written, skipped = read_yaml(path), []
        try:
            written = override_scenario(written, overrides or [], skipped)
        except ScenarioError as exc:
            raise exc.in_file(str(path)) from None
        return cls(written, str(path), _warned(skipped))

    @classmethod
    def from_dict(cls, data: dict, overrides: dict | list[str] | None = None) -> "Scenario":
        """A scenario from a mapping shaped like a scenario file (e.g. a run's scenario.yaml)."""
        if not isinstance(data, dict):
            raise ScenarioError("(top level)", "a mapping of scenario fields", data)
        skipped = []
        written = override_scenario(data, overrides or [], skipped)
        return cls(written, skipped=_warned(skipped))

    def override(self, overrides: dict | list[str]) -> "Scenario":
        """A new scenario with these fields changed, e.g. {"sites.count": 10, "methods.0.epsilon": 2}."""
        skipped = []
        written = override_scenario(self._written, overrides, skipped)
        return Scenario(written, self.source, _warned(skipped))

    def to_dict(self) -> dict:
        """The validated scenario (defaults filled in): what a run directory's scenario.yaml holds."""
        return copy.deepcopy(self._spec)

    def spec(self):
        """The run, typed (scenarios.spec.RunSpec): the world spec, the built methods, the
        runtime, the site policy and budget, as each part of a run takes them."""
        from scenarios.spec import RunSpec

        return RunSpec.of(self._spec)

    def written(self) -> dict:
        """The scenario as written, overrides applied, before defaults."""
        return copy.deepcopy(self._written)

    def __getitem__(self, key: str):
        return copy.deepcopy(self._spec[key])

    @property
    def name(self) -> str:
        return self._spec["name"]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(yaml.safe_dump(self._spec, sort_keys=False))
        return path

    def __repr__(self) -> str:
        s = self._spec
        methods = ", ".join(m["label"] for m in s["methods"])
        return f"Scenario({s['name']!r}: {s['sites']['count']} sites, {s['trials']} trials, methods {methods})"


def load_scenario(path: str | Path, overrides: dict | list[str] | None = None) -> Scenario:
    """Scenario.load: a scenario file with overrides applied, validated."""
    return Scenario.load(path, overrides)


def as_scenario(scenario: "Scenario | dict | str | Path") -> Scenario:
    """What run, sweep and validate take: a Scenario, a mapping, or a path to a YAML file."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        return Scenario.from_dict(scenario)
    return Scenario.load(scenario)


def _warned(skipped: list[str]) -> list[str]:
    for note in skipped:
        warnings.warn(note, UserWarning, stacklevel=3)
    return skipped
