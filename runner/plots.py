"""PNG plots of runs and sweeps: each result family draws its own (results.*.plots); this module
draws what every run has, whatever its family (communication cost against swept values)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from results import RESULTS
from results.plotting import DASHES, MARKERS, pyplot, save


def run_plots(rundir, alpha: float) -> list[Path]:
    """Each result family's PNGs of a run directory (runner.outputs.RunDirectory), from its rows
    of results.csv and its own tables."""
    rows = rundir.read_results()
    side = {name: rundir.read_side(name) for name in rundir.side_tables}
    return family_plots(rows, alpha, rundir.path, side)


def family_plots(rows: list[dict], alpha: float, out: Path, side=None) -> list[Path]:
    """Each result family's PNGs of `rows` (results.csv rows, possibly of several runs) into `out`."""
    paths = []
    for name, items in _by_family(rows).items():
        paths += RESULTS.load(name).plots(items, Path(out), alpha, side or {})
    return paths


def sweep_plots(rows: list[dict], results: dict[str, list[dict]], keys: list[str], alpha: float,
                out: Path) -> list[Path]:
    """A sweep's PNGs: cost against each swept value, then each result family's own."""
    paths = cost_plots(rows, keys, out)
    for name, items in _by_family(rows).items():
        runs = {run: [r for r in results.get(run, []) if r.get("result") == name] for run in {r["run"] for r in items}}
        paths += RESULTS.load(name).sweep_plots(runs, items, keys, alpha, Path(out))
    return paths


def _by_family(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row.get("result") or "outcome"].append(row)
    return groups


def cost_plots(rows: list[dict], keys: list[str], out: Path) -> list[Path]:
    """cost_vs_KEY.png: per method, bytes up per site (left) and seconds per trial on the network
    (right: each session from its first message handed to a link to its last arrival) against
    each swept value; a sweep over network profiles shows time and bytes side by side."""
    paths = []
    by_method = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    for key in keys:
        values = [row[key] for row in rows]
        numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
        order = {v: i for i, v in enumerate(dict.fromkeys(values))}  # a categorical grid (profiles) in its order
        fig, (left, right) = pyplot().subplots(1, 2, figsize=(12, 4.5))
        for number, (method, items) in enumerate(by_method.items()):
            style = dict(marker=MARKERS[number % len(MARKERS)], linestyle=DASHES[number % len(DASHES)], alpha=0.8,
                         label=f"{method} ({items[0]['codec']})")
            for axis, measure in ((left, "bytes_up_per_site"), (right, "seconds_per_trial")):
                points = sorted(((r[key] if numeric else order[r[key]]), r[measure]) for r in items
                                if r.get(measure) is not None)
                if points:  # distinct markers and dashes: methods of equal cost would hide each other
                    axis.plot(*zip(*points), **style)
        if not left.get_legend_handles_labels()[0]:  # an in-process sweep sends no bytes
            pyplot().close(fig)
            continue
        for axis, label in ((left, "bytes up per site and trial"), (right, "seconds per trial on the network")):
            axis.set_xlabel(key)
            axis.set_ylabel(label)
            axis.set_yscale("log")
            if not numeric:
                axis.set_xticks(list(order.values()), [str(v) for v in order], rotation=20, ha="right")
        left.set_title(f"communication cost against {key}")
        right.set_title(f"time against {key}")
        left.legend(fontsize=8)
        paths.append(save(fig, out / f"cost_vs_{key.replace('.', '_').replace('*', 'all')}.png"))
    return paths
