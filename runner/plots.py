"""PNG plots a person would rather look at than read (matplotlib, headless)."""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MARKERS = ["o", "s", "^", "v", "D", "x", "P", "*"]
DASHES = ["-", "--", ":", "-."]


def _per_trial(rows: list[dict]):
    """method -> coverages, method -> finite set sizes, over the rows that produced a set."""
    coverage, size = defaultdict(list), defaultdict(list)
    for row in rows:
        if row["status"] == "ok" or (row["status"] == "infinite" and row.get("per_site")):
            coverage[row["method"]].append(float(row["coverage"]))
            value = float(row["size"])
            if math.isfinite(value):
                size[row["method"]].append(value)
    return coverage, size


def run_plots(rows: list[dict], alpha: float, out: Path, name: str = "coverage_size.png") -> list[Path]:
    """coverage_size.png: box plots of test coverage and mean set size per method over trials
    (like paper 000 figure 4; rows pooled from several runs give its one point per split and
    data set), with the target 1 - alpha marked."""
    coverage, size = _per_trial(rows)
    if not coverage:
        return []
    methods = list(coverage)
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(methods) + 4), 4.5))
    left.boxplot([coverage[m] for m in methods], showmeans=True)
    left.axhline(1 - alpha, color="tab:red", linestyle="--", linewidth=1, label=f"1 - alpha = {1 - alpha:g}")
    left.set_title("test coverage per trial")
    left.legend(loc="lower right")
    right.boxplot([size[m] for m in methods], showmeans=True)
    right.set_title("mean set size per trial")
    for axis in (left, right):
        axis.set_xticks(range(1, len(methods) + 1), methods, rotation=30, ha="right")
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def sweep_boxplots(results: dict[str, list[dict]], rows: list[dict], keys: list[str], alpha: float,
                   out: Path) -> list[Path]:
    """coverage_size.png of a sweep: one group of boxes per combination (run), one box per
    method in a fixed colour, coverage above and mean set size below (paper 000 figures 8-17)."""
    runs = list(dict.fromkeys(row["run"] for row in rows))
    per_run = {run: _per_trial(results.get(run, [])) for run in runs}
    methods = list(dict.fromkeys(m for coverage, _ in per_run.values() for m in coverage))
    if not methods:
        return []
    labels = {row["run"]: ", ".join(str(row[k]) for k in keys) for row in rows}
    width = 0.8 / len(methods)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(2, 1, figsize=(max(7, 1.2 * len(runs) * len(methods) ** 0.5 + 3), 7), sharex=True)
    for panel, axis in enumerate(axes):
        for number, method in enumerate(methods):
            data = [per_run[run][panel].get(method, []) for run in runs]
            positions = [i + (number - (len(methods) - 1) / 2) * width for i in range(len(runs))]
            kept = [(p, d) for p, d in zip(positions, data) if d]
            if not kept:
                continue
            parts = axis.boxplot([d for _, d in kept], positions=[p for p, _ in kept], widths=width * 0.85,
                                 showmeans=True, patch_artist=True, manage_ticks=False)
            for box in parts["boxes"]:
                box.set_facecolor(colors[number % len(colors)])
                box.set_alpha(0.6)
            parts["boxes"][0].set_label(method)
        axis.set_xticks(range(len(runs)), [labels[r] for r in runs], rotation=20, ha="right")
    axes[0].axhline(1 - alpha, color="tab:red", linestyle="--", linewidth=1)
    axes[0].set_ylabel("test coverage per trial")
    axes[1].set_ylabel("mean set size per trial")
    axes[0].set_title(f"coverage (target {1 - alpha:g}) and set size by {', '.join(keys)}")
    axes[0].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = out / "coverage_size.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def sweep_plots(rows: list[dict], keys: list[str], out: Path) -> list[Path]:
    """cost_vs_KEY.png (bytes up per site against each numeric swept value, a line per method)
    and utility_vs_cost.png (mean set size against bytes up per site, coverage annotated)."""
    paths = []
    by_method = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    for key in keys:
        values = [row[key] for row in rows]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            continue
        fig, axis = plt.subplots(figsize=(7, 4.5))
        for number, (method, items) in enumerate(by_method.items()):
            points = sorted((r[key], r["bytes_up_per_site"]) for r in items if r["bytes_up_per_site"] is not None)
            if points:  # distinct markers and dashes: methods of equal cost would hide each other
                axis.plot(*zip(*points), marker=MARKERS[number % len(MARKERS)],
                          linestyle=DASHES[number % len(DASHES)], alpha=0.8,
                          label=f"{method} ({items[0]['codec']})")
        axis.set_xlabel(key)
        axis.set_ylabel("bytes up per site and trial")
        axis.set_yscale("log")
        axis.set_title(f"communication cost against {key}")
        axis.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"cost_vs_{key.replace('.', '_').replace('*', 'all')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    fig, axis = plt.subplots(figsize=(7, 4.5))
    for number, (method, items) in enumerate(by_method.items()):
        points = [(r["bytes_up_per_site"], r["size_mean"], r["coverage_mean"]) for r in items
                  if r["bytes_up_per_site"] is not None and r["size_mean"] is not None]
        if not points:
            continue
        xs, ys, cs = zip(*points)
        axis.scatter(xs, ys, label=method, marker=MARKERS[number % len(MARKERS)], alpha=0.8)
        for x, y, c in points:
            axis.annotate(f"{c:.3f}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    axis.set_xscale("log")
    axis.set_xlabel("bytes up per site and trial")
    axis.set_ylabel("mean set size (labels: mean coverage)")
    axis.set_title("utility against communication cost")
    if axis.get_legend_handles_labels()[0]:  # in-process runs send no bytes: nothing to plot
        axis.legend(fontsize=8)
    fig.tight_layout()
    path = out / "utility_vs_cost.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths
