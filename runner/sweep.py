"""Sweeps: run a scenario over the product of grid values and write one combined table.

    python run.py sweep SCENARIO --grid sites.count=10,50,100 --grid methods.1.epsilon=1,10
    python run.py sweep SCENARIO --grid 'model=[{kind: ridge}, {kind: cqr_forest}]'

A grid is comma-separated values, or a YAML list in brackets when values are mappings (a
whole model, say); a mapping is named in tables and directories by its `kind` or `name`.
Each combination runs into DIR/<key=value,...>/ (a full run directory); DIR/sweep.csv has one
row per combination and method with the swept values, utility, privacy and communication cost;
DIR/cost_vs_KEY.png and DIR/utility_vs_cost.png plot them, and DIR/coverage_size.png shows the
per-trial coverage and set size as box plots, one group per combination, one box per method
(paper 000 figures 8-17 when the grid runs over models); where methods are tests (paper 004),
DIR/pvalues.png shows their p-values per combination with the rejection rates at 0.05.
"""

from __future__ import annotations

import csv
import itertools
import json
from pathlib import Path

import yaml

from runner.outputs import RunDirectory, csv_cell
from runner.plots import sweep_plots
from runner.study import run_study
from scenarios.scenario import override_scenario, validate_scenario
from specs.schema import ScenarioError

#: sweep.csv's columns after the swept values: every method's, then its result family's aggregates
#: (the numbers of its summary.json entry), then the cost and the run directory
SWEEP_HEAD = ["method", "result", "codec", "privacy", "epsilon", "trials", "ok", "infinite", "aborted",
              "epsilon_obtained_max"]
SWEEP_TAIL = ["bytes_up_per_site", "bytes_down_per_site", "bytes_per_trial", "messages_per_trial",
              "rounds_per_trial", "info_bits_per_trial", "overhead_up", "seconds_per_trial", "run"]


def parse_grid(items: list[str]) -> list[tuple[str, list]]:
    """["a.b=1,2", "c=x,y"] -> [("a.b", [1, 2]), ("c", ["x", "y"])], values parsed as YAML."""
    grid = []
    for item in items:
        if "=" not in item:
            raise ScenarioError(item, "a grid of the form dotted.key=v1,v2,...")
        key, raw = item.split("=", 1)
        if raw.strip().startswith("["):
            try:
                values = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise ScenarioError(key, f"a YAML list of grid values ({exc})", raw) from None
        else:
            values = [yaml.safe_load(v) for v in raw.split(",") if v.strip()]
        if not values:
            raise ScenarioError(key, "at least one value in the grid", raw)
        grid.append((key.strip(), values))
    return grid


def grid_label(value) -> str:
    """How a grid value is named in sweep.csv, plots and directory names."""
    if isinstance(value, dict):
        named = value.get("kind", value.get("name"))
        return str(named) if named is not None else json.dumps(value, separators=(",", ":"))
    if isinstance(value, list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def run_sweep(scenario: dict, grid: list[tuple[str, list]], out: Path, *, backend="processes",
              progress=None) -> list[dict]:
    """Run `scenario` (a scenario mapping as written, before defaults are filled in, so that a
    swept model kind does not meet another kind's parameters) once per combination of the
    grid's values, each combination validated before any runs; returns the rows of sweep.csv."""
    out = Path(out)
    keys = [key for key, _ in grid]
    combos = list(itertools.product(*[values for _, values in grid]))
    specs = []  # validate every combination before running any
    for combo in combos:
        specs.append((combo, validate_scenario(override_scenario(scenario, dict(zip(keys, combo))))))
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for number, (combo, spec) in enumerate(specs, start=1):
        labels = [grid_label(v) if isinstance(v, (dict, list)) else v for v in combo]
        name = ",".join(f"{k}={v}" for k, v in zip(keys, labels)).replace("/", "_")
        if progress is not None:
            progress(number, len(specs), name)
        summary = run_study(spec, out / name, backend=backend)
        for method, stats in summary["methods"].items():
            cost = summary["communication"].get(method, {})
            row = dict(zip(keys, labels))
            row.update({"method": method, **{key: value for key, value in stats.items()
                                             if isinstance(value, (int, float, str)) or value is None}})
            row.update({
                "bytes_up_per_site": cost.get("bytes_up_per_site_mean"),
                "bytes_down_per_site": cost.get("bytes_down_per_site_mean"),
                "bytes_per_trial": cost.get("bytes_per_trial"), "messages_per_trial": cost.get("messages_per_trial"),
                "rounds_per_trial": cost.get("rounds_per_trial"), "info_bits_per_trial": cost.get("info_bits_per_trial"),
                "overhead_up": cost.get("overhead_up"), "seconds_per_trial": cost.get("seconds_per_trial"),
                "run": str(out / name),
            })
            rows.append(row)
        _write(out / "sweep.csv", keys, rows)  # rewritten after every combination: nothing lost
    results = {run: RunDirectory(Path(run)).read_results() for run in {r["run"] for r in rows}}
    sweep_plots(rows, results, keys, specs[0][1]["alpha"], out)
    return rows


def _write(path: Path, keys: list[str], rows: list[dict]) -> None:
    own = [key for row in rows for key in row if key not in (*keys, *SWEEP_HEAD, *SWEEP_TAIL)]
    columns = keys + SWEEP_HEAD + list(dict.fromkeys(own)) + SWEEP_TAIL
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows({key: csv_cell(row.get(key)) for key in columns} for row in rows)
    tmp.replace(path)
