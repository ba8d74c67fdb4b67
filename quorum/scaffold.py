"""`run.py new method NAME`: a plugin package to start from, with a test that passes (as `flwr new`).

The package holds a working method (the largest of the sites' own split-conformal quantiles: a
conservative threshold, valid for a test point from any one site), its codec (one float), a
scenario that names it by import path, a README, and tests: the threshold against brute force,
the codec's refusals, and one in-process run of the scenario. Everything it imports comes from
`quorum.plugin` (docs/plugins.md).
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")

PYPROJECT = '''[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "quorum-{dash}"
version = "0.1.0"
description = "A Quorum plugin: the {name} method"
requires-python = ">=3.11"
dependencies = []  # Quorum itself: install this into Quorum's environment

# Installed (pip install -e .), scenarios name the method `{name}`; without installing, by import
# path `{package}.method:{cls}` with this folder on PYTHONPATH (scenario.yaml does that).
[project.entry-points."quorum.methods"]
{name} = "{package}.method:{cls}"

[project.entry-points."quorum.codecs"]
{name}_value = "{package}.codec:{cls}Value"

[tool.setuptools]
packages = ["{package}"]
'''

INIT = '''"""A Quorum plugin: the {name} method (method.py) and its codec (codec.py)."""
'''

CODEC = '''"""The `{name}_value` codec: what a site may send is one float (a score, or +inf)."""

from __future__ import annotations

import math

from quorum.plugin import Codec, PayloadError


class {cls}Value(Codec):
    name = "{name}_value"

    def encode(self, value: float) -> float:
        return float(value)

    def decode(self, body) -> float:
        # msgpack gives back a float for what encode sent; anything else is damage or a lie
        if not isinstance(body, float) or math.isnan(body) or body == -math.inf:
            raise PayloadError(f"{{self.name}}: expected a float or +inf, got {{body!r}}")
        return body

    def information_bits(self, value: float) -> int:
        return 64
'''

METHOD = '''"""{cls}: the largest of the sites' own split-conformal quantiles.

Site j holds n_j calibration scores and answers its own split-conformal threshold, the
k_j-th smallest of its scores with k_j = ceil((n_j + 1)(1 - alpha)) (+inf when k_j > n_j).
Each is a valid threshold for a test point exchangeable with site j's scores, so the largest
of them is valid for a test point from any one site (conservative: it covers at least as
much as every site's own). Replace `local_threshold` and `combine` with your method.
"""

from __future__ import annotations

import math

import numpy as np

from quorum.plugin import OneShotMethod, Outcome, Planned, SiteHalf, Spend, Threshold, checked


def local_threshold(scores: np.ndarray, alpha: float) -> float:
    """The k-th smallest score, k = ceil((n + 1)(1 - alpha)); +inf when k > n (split CP)."""
    n = len(scores)
    k = math.ceil((n + 1) * (1 - alpha))
    return float(np.sort(scores)[k - 1]) if k <= n else math.inf


class {cls}(OneShotMethod):
    name = "{name}"
    codec = "{package}.codec:{cls}Value"   # or "{name}_value" once the package is installed
    PARAMS = {{
        "at_least": {{"type": "int", "min": 1, "default": 1}},  # answers needed for a result
    }}

    def plan(self, sizes):
        return Planned({{site: {{"alpha": self.alpha}} for site in sizes}})

    def combine(self, sizes, planned, answers, dropped, rng):
        if len(answers) < self.params["at_least"]:
            return Outcome.aborted(f"{{len(answers)}} answers, fewer than at_least = {{self.params['at_least']}}")
        largest = max(answers.values())
        return Threshold.ok(largest, answered=len(answers), largest_site_threshold=largest,
                            smallest_site_threshold=min(answers.values()))

    @classmethod
    def site(cls, rows, rng, site_id):
        return LocalThreshold(rows)

    @classmethod
    def spend(cls, phase, body):
        return Spend("none", model="a site's quantile in the clear")  # sites must allow non-private releases


class LocalThreshold(SiteHalf):
    REQUEST = {{"type": "map", "fields": {{"alpha": {{"type": "float", "gt": 0, "lt": 1}}}}}}  # as PARAMS

    def __init__(self, scores):
        self.scores = np.asarray(scores, dtype=float)

    def answer(self, phase, body):
        alpha = checked(self.REQUEST, body, f"{{phase}} request")["alpha"]  # RequestError names the field
        return local_threshold(self.scores, alpha)
'''

SCENARIO = '''# The {name} method against centralized split CP, over 8 site processes.
#   PYTHONPATH={folder} python run.py run {folder}/scenario.yaml
name: {name}-demo
seed: 7
trials: 3
alpha: 0.1
data: {{source: synthetic, generator: romano2019, n: 3000}}
model: {{kind: ridge}}
sites:
  count: 8
  policy: {{non_private: allow}}   # both methods release values in the clear
methods:
  - {{name: "{package}.method:{cls}"}}
  - {{name: centralized}}
'''

TEST = '''"""{cls}: the threshold against brute force, the codec's refusals, one in-process run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import quorum
from quorum.plugin import PayloadError, run_session
from {package}.codec import {cls}Value
from {package}.method import {cls}

SCENARIO = Path(__file__).resolve().parent.parent / "scenario.yaml"


@pytest.mark.parametrize("seed", range(10))
def test_the_threshold_is_the_largest_site_quantile_by_brute_force(seed):
    rng = np.random.default_rng(seed)
    sites = {{f"site-{{j}}": rng.exponential(size=int(rng.integers(5, 60))) for j in range(6)}}
    outcome = run_session({cls}(0.1), sites, lambda name: np.random.default_rng(0))
    expected = []
    for scores in sites.values():
        k = math.ceil((len(scores) + 1) * 0.9)
        expected.append(sorted(scores)[k - 1] if k <= len(scores) else math.inf)
    assert outcome.threshold == max(expected)
    assert outcome.details["answered"] == 6


def test_parameters_take_their_defaults_when_built_directly():
    assert {cls}(0.1).params == {{"at_least": 1}}


@pytest.mark.parametrize("body", ["1.0", None, float("nan"), -math.inf, True])
def test_the_codec_refuses_anything_but_a_float(body):
    with pytest.raises(PayloadError):
        {cls}Value().decode(body)


def test_the_scenario_runs_in_process(tmp_path):
    run = quorum.run(quorum.load_scenario(SCENARIO, {{"trials": 2}}), tmp_path / "run", backend="inprocess")
    ours = run.results[run.results.method == "{name}"]
    assert list(ours.status) == ["ok", "ok"]
    assert (ours.coverage > 0.5).all()
'''

README = '''# quorum-{dash}

A Quorum plugin: the `{name}` method ({package}/method.py) and its codec ({package}/codec.py).

    PYTHONPATH={folder} python -m pytest {folder}/tests           # its tests
    PYTHONPATH={folder} python run.py run {folder}/scenario.yaml  # over site processes
    pip install -e {folder}                                         # then scenarios say `name: {name}`

See docs/plugins.md in Quorum for the interface (everything comes from `quorum.plugin`).
'''


class ScaffoldError(ValueError):
    """A plugin name or folder that cannot be used; the message says why."""


def new_method(name: str, parent: str | Path = ".") -> Path:
    """Write the plugin package for method `name` under `parent`/quorum-NAME; returns the folder."""
    if not NAME.match(name) or keyword.iskeyword(name):
        raise ScaffoldError(f"method name {name!r}: lower case letters, digits and _ (a letter first, at most 40)")
    folder = Path(parent) / f"quorum-{name.replace('_', '-')}"
    if folder.exists():
        raise ScaffoldError(f"{folder} already exists; choose another name or --dir")
    package = f"quorum_{name}"
    cls = "".join(part.capitalize() for part in name.split("_"))
    fields = {"name": name, "dash": name.replace("_", "-"), "package": package, "cls": cls, "folder": folder}
    files = {"pyproject.toml": PYPROJECT, "README.md": README, "scenario.yaml": SCENARIO,
             f"{package}/__init__.py": INIT, f"{package}/codec.py": CODEC, f"{package}/method.py": METHOD,
             f"tests/test_{name}.py": TEST}
    for relative, template in files.items():
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(template.format(**fields))
    return folder
