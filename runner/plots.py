"""PNG plots a person would rather look at than read (matplotlib, headless)."""

from __future__ import annotations

import json
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
        if row.get("coverage") in ("", "nan", None):
            continue  # a test or an estimate (paper 004): no prediction set
        if row["status"] == "ok" or (row["status"] == "infinite" and row.get("per_site")):
            coverage[row["method"]].append(float(row["coverage"]))
            value = float(row["size"])
            if math.isfinite(value):
                size[row["method"]].append(value)
    return coverage, size


def run_plots(rows: list[dict], alpha: float, out: Path, name: str = "coverage_size.png") -> list[Path]:
    """pvalues.png and quantile_errors.png where methods returned tests or estimates (paper 004);
    coverage_size.png: box plots of test coverage and mean set size per method over trials
    (like paper 000 figure 4; rows pooled from several runs give its one point per split and
    data set), with the target 1 - alpha marked."""
    paths = pvalue_plot(rows, out) + quantile_error_plot(rows, out)  # paper 004's statistics
    coverage, size = _per_trial(rows)
    if not coverage:
        return paths
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
    return paths + [path]


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
        if not axis.get_legend_handles_labels()[0]:  # an in-process sweep sends no bytes
            plt.close(fig)
            continue
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


def _p_values(rows: list[dict]) -> dict[str, list[float]]:
    p = defaultdict(list)
    for row in rows:
        if row["status"] == "ok" and row.get("p_value") not in (None, "", "nan"):
            p[row["method"]].append(max(float(row["p_value"]), 1e-300))
    return p


def pvalue_plot(rows: list[dict], out: Path, level: float = 0.05) -> list[Path]:
    """pvalues.png (paper 004 figure 1 and S1): per method, the p-values over trials (log scale,
    the level marked) and the empirical CDF against the uniform (under the null the diagonal)."""
    p = _p_values(rows)
    if not p:
        return []
    methods = list(p)
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(9, 1.4 * len(methods) + 5), 4.5))
    left.boxplot([p[m] for m in methods], showmeans=True)
    left.set_yscale("log")
    left.axhline(level, color="tab:red", linestyle="--", linewidth=1, label=f"p = {level:g}")
    left.set_xticks(range(1, len(methods) + 1), methods, rotation=30, ha="right")
    left.set_title("one-sided p-value per trial")
    left.legend(loc="lower right")
    for number, method in enumerate(methods):
        values = sorted(p[method])
        right.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post",
                   linestyle=DASHES[number % len(DASHES)], label=f"{method} (reject {sum(v < level for v in values) / len(values):.2f})")
    right.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
    right.set_xlabel("p")
    right.set_ylabel("fraction of trials with p-value <= p")
    right.set_title("p-value distribution (uniform under H0)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = out / "pvalues.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def quantile_error_plot(rows: list[dict], out: Path) -> list[Path]:
    """quantile_errors.png (paper 004 section 5.4, tables 4-6): per quantile level, box plots of
    the normalized errors (Q-hat - Q) / sd of each method over trials, and the MSE per level."""
    errors = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["status"] == "ok" and row.get("estimate_errors") not in (None, "", "nan"):
            for level, value in json.loads(row["estimate_errors"]).items():
                errors[row["method"]][level].append(value)
    if not errors:
        return []
    methods = list(errors)
    levels = sorted({lv for per in errors.values() for lv in per}, key=float)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    width = 0.8 / len(methods)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(levels) * len(methods) ** 0.5 + 3), 7.5),
                                      sharex=True)
    for number, method in enumerate(methods):
        positions = [i + (number - (len(methods) - 1) / 2) * width for i in range(len(levels))]
        data = [errors[method].get(lv, []) for lv in levels]
        parts = top.boxplot(data, positions=positions, widths=width * 0.85, patch_artist=True, manage_ticks=False,
                            showfliers=False)
        for box in parts["boxes"]:
            box.set_facecolor(colors[number % len(colors)])
            box.set_alpha(0.6)
        parts["boxes"][0].set_label(method)
        mse = [sum(v * v for v in d) / len(d) if d else float("nan") for d in data]
        bottom.bar(positions, mse, width=width * 0.85, color=colors[number % len(colors)], alpha=0.8, label=method)
    top.axhline(0, color="grey", linewidth=0.8)
    top.set_ylabel("(Q-hat - Q) / sd")
    top.set_title("normalized quantile errors over trials")
    top.legend(fontsize=8)
    bottom.set_yscale("log")
    bottom.set_ylabel("MSE")
    bottom.set_xticks(range(len(levels)), [f"Q_{lv}" for lv in levels])
    fig.tight_layout()
    path = out / "quantile_errors.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def sweep_pvalues(results: dict[str, list[dict]], rows: list[dict], keys: list[str], out: Path,
                  level: float = 0.05) -> list[Path]:
    """pvalues.png of a sweep (paper 004 figure 1): one group per combination of the swept
    values, one box of p-values per method; the rejection rate at `level` written above each box."""
    runs = list(dict.fromkeys(row["run"] for row in rows))
    per_run = {run: _p_values(results.get(run, [])) for run in runs}
    methods = list(dict.fromkeys(m for p in per_run.values() for m in p))
    if not methods:
        return []
    labels = {row["run"]: ", ".join(str(row[k]) for k in keys) for row in rows}
    width = 0.8 / len(methods)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axis = plt.subplots(figsize=(max(8, 0.55 * len(runs) * len(methods) ** 0.5 + 3), 5))
    for number, method in enumerate(methods):
        for i, run in enumerate(runs):
            data = per_run[run].get(method)
            if not data:
                continue
            x = i + (number - (len(methods) - 1) / 2) * width
            parts = axis.boxplot([data], positions=[x], widths=width * 0.85, patch_artist=True, manage_ticks=False,
                                 showfliers=False)
            parts["boxes"][0].set_facecolor(colors[number % len(colors)])
            parts["boxes"][0].set_alpha(0.6)
            if i == 0:
                parts["boxes"][0].set_label(method)
            axis.annotate(f"{sum(v < level for v in data) / len(data):.2f}", (x, 1.3), fontsize=6, ha="center",
                          rotation=90)
    axis.set_yscale("log")
    axis.set_ylim(top=3)
    axis.axhline(level, color="tab:red", linestyle="--", linewidth=1)
    axis.set_xticks(range(len(runs)), [labels[r] for r in runs], rotation=30, ha="right")
    axis.set_ylabel("one-sided p-value (rejection rate above)")
    axis.set_title(f"p-values by {', '.join(keys)}")
    axis.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path = out / "pvalues.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def learning_plot(rounds: list[dict], out: Path, name: str = "learning_curves.png") -> list[Path]:
    """Paper 002: mean per-site test accuracy against rounds (band: +- the sd over sites; dashed:
    FedType's proxies) and the cumulative bytes of weights sent (wire bytes where the run had a
    wire, else the weights' own bytes), with dotted lines for what sending each site's private
    model up and down would have cost. Means over trials."""
    if not rounds:
        return []
    curves: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rounds:
        curves[row["method"]][int(row["round"])].append(row)

    def mean(items, key):
        values = [float(r[key]) for r in items if r.get(key) not in ("", "nan", None)]
        return sum(values) / len(values) if values else math.nan

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, (method, by_round) in enumerate(curves.items()):
        xs = sorted(by_round)
        acc = [mean(by_round[x], "accuracy_mean") for x in xs]
        sd = [mean(by_round[x], "accuracy_sd") for x in xs]
        line, = left.plot(xs, acc, marker=MARKERS[i % len(MARKERS)], markevery=max(1, len(xs) // 10), label=method)
        left.fill_between(xs, [a - s for a, s in zip(acc, sd)], [a + s for a, s in zip(acc, sd)],
                          color=line.get_color(), alpha=0.12)
        proxy = [mean(by_round[x], "proxy_accuracy") for x in xs]
        if any(not math.isnan(p) for p in proxy):
            left.plot(xs, proxy, linestyle="--", color=line.get_color(), label=f"{method} proxy")
        wire = [mean(by_round[x], "wire_bytes_down") + mean(by_round[x], "wire_bytes_up") for x in xs]
        payload = [mean(by_round[x], "weights_bytes_down") + mean(by_round[x], "weights_bytes_up") for x in xs]
        sent = wire if any(w > 0 for w in wire) else payload
        cumulative = [sum(sent[:k + 1]) for k in range(len(sent))]
        if any(c > 0 for c in cumulative):
            right.plot(xs, cumulative, color=line.get_color(), label=f"{method} ({'wire' if sent is wire else 'weights'})")
        private = [mean(by_round[x], "private_weights_bytes") for x in xs]
        if any(c > 0 for c in cumulative) and any(p > 0 for p in private):
            right.plot(xs, [sum(private[:k + 1]) for k in range(len(private))], linestyle=":",
                       color=line.get_color(), label=f"{method}: had private models been sent")
    left.set_xlabel("round")
    left.set_ylabel("test accuracy (mean over sites)")
    left.legend(fontsize=8, loc="lower right")
    left.set_title("accuracy per round")
    right.set_xlabel("round")
    right.set_ylabel("bytes (cumulative)")
    right.set_yscale("log")
    right.legend(fontsize=8, loc="upper left")
    right.set_title("weights sent, cumulative")
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
