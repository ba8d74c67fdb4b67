"""A prediction set's threshold: the result of a conformal method (papers 000, 001, 003).

`Threshold.ok(q_hat)`: the set {y : s(x, y) <= q_hat}, with the guarantee the method claims;
`Threshold.infinite(reason)`: the whole line (no finite threshold carries the guarantee). The
harness judges it on the trial's test set: coverage and mean set size (columns), their spread
over trials (summary.json), box plots (coverage_size.png).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from results.base import Outcome, Truth, fmt, mean_of, numbers
from results.plotting import MARKERS, colors, pyplot, save


@dataclass(frozen=True)
class Threshold(Outcome):
    threshold: float = math.nan  # q-hat: the set is {y : s(x, y) <= threshold}
    per_site: dict[str, float] | None = None  # local calibration: each site's own threshold

    name = "conformal"
    COLUMNS = ("coverage", "size", "threshold", "guarantee", "coverage_upper_bound", "p_max", "ell", "k",
               "quantile_error", "clipped")
    READS = Outcome.READS | {"guarantee", "ell", "k", "quantile_indices", "included", "top_bin", "theorem3"}
    HEADLINE = (("coverage", "coverage_mean", 4), ("size", "size_mean", 4))

    @classmethod
    def ok(cls, threshold: float, **details) -> "Threshold":
        """A threshold: status ok when finite, else infinite (a local quantile was +inf)."""
        if math.isfinite(threshold):
            return cls("ok", "", details, float(threshold))
        return cls("infinite", "a local quantile was +inf (fewer scores than the order asked)", details,
                   float(threshold))

    @classmethod
    def infinite(cls, reason: str, **details) -> "Threshold":
        """The whole line: no finite threshold carries the guarantee, with the reason."""
        return cls("infinite", reason, details, math.inf)

    def event_fields(self) -> dict:
        return {"threshold": self.threshold}

    def columns(self, truth: Truth) -> dict:
        coverage, size = self.evaluate(truth.world)
        clipped = _clipped(truth)
        upper, p_max = self.coverage_upper_bound(truth)
        return {"coverage": coverage, "size": size, "threshold": self.threshold,
                "guarantee": self.details.get("guarantee"), "coverage_upper_bound": upper, "p_max": p_max,
                "ell": self.details.get("ell"),
                "k": self.details.get("k"), "quantile_error": self.worst_quantile_error(truth), "clipped": clipped}

    def caveats(self, truth: Truth) -> list[str]:
        clipped, bounds = _clipped(truth), truth.method.score_range
        if clipped and self.details.get("top_bin"):
            return [f"the top bin was chosen while {clipped:.1%} of calibration scores exceed its edge "
                    f"{bounds[1]:g}: the guarantee then holds for min(score, {bounds[1]:g})"]
        return []

    def evaluate(self, world) -> tuple[float, float]:
        """Test-set coverage and mean set size; with per-site thresholds (local calibration), the
        average over sites of each site's own prediction set. nan for no result."""
        if self.status == "aborted" or getattr(world, "y_test", None) is None:
            return math.nan, math.nan
        results = []
        for threshold in (list(self.per_site.values()) if self.per_site else [self.threshold]):
            if math.isinf(threshold):
                results.append((1.0, math.inf))
            else:
                results.append(world.model.evaluate(world.test_base, world.y_test, threshold))
        return float(np.mean([c for c, _ in results])), float(np.mean([s for _, s in results]))

    def coverage_upper_bound(self, truth: Truth) -> tuple[float | None, float | None]:
        """Paper 003 theorem 3 (stats.private_coverage.coverage_upper_bound) for the private sets of
        `private_cp` / `private_cp_local` (details `theorem3`: each set's n, alpha, epsilon, bins,
        gamma and sites), with p_max^m estimated by the heaviest bin's share of the set's calibration
        scores on its bins (the simulation knows them; the coordinator does not). Per-site sets: the
        mean of the sites' bounds, as coverage is the mean of their coverages; p_max: the largest.
        (None, None) for methods that report no theorem 3 inputs."""
        grids = self.details.get("theorem3")
        if not grids or self.status == "aborted":
            return None, None
        from stats.dp import Bins
        from stats.private_coverage import coverage_upper_bound, heaviest_bin_share

        scores, bounds, shares = truth.world.site_scores, [], []
        for grid in grids:
            bins = Bins(**grid["bins"])
            values = np.concatenate([np.asarray(scores[s], dtype=float) for s in grid["sites"]])
            share = heaviest_bin_share(np.bincount(bins.index_of(values), minlength=bins.count))
            bounds.append(coverage_upper_bound(grid["n"], grid["alpha"], grid["epsilon"], bins.count,
                                               grid["gamma"], share))
            shares.append(share)
        return float(np.mean(bounds)), float(max(shares))

    def worst_quantile_error(self, truth: Truth) -> float | None:
        """Paper 001 eq. (3), worst over the reported levels: |F(j*_p) - p| with F the true CDF of
        the included sites' scores on the method's bins (the simulation knows it; the coordinator
        does not)."""
        indices = self.details.get("quantile_indices")
        if not indices:
            return None
        from stats.ddg import flat_histogram

        scores = truth.world.site_scores
        values = np.concatenate([scores[s] for s in (self.details.get("included") or list(scores))])
        cdf = np.cumsum(flat_histogram(values, truth.method.bins.edges)) / values.size
        return float(max(abs(cdf[j - 1] - float(p)) for p, j in indices.items()))

    # -- over trials -------------------------------------------------------------------------

    @classmethod
    def aggregate(cls, rows, ok):
        coverage = np.array(numbers(ok, "coverage"))
        size = np.array([float(r["size"]) for r in ok if r["coverage"] not in ("", "nan")])
        guarantee = numbers(rows, "guarantee")
        left_out = len(rows) - len(ok)
        over = (f"the {len(ok)} trials with status ok (finite threshold); the {left_out} infinite, aborted or "
                f"shortfall trials are left out (an infinite set covers every point at infinite size)"
                if left_out else f"all {len(rows)} trials (every one ok)")
        stats = {"coverage_mean": _stat(np.mean, coverage), "coverage_std": _stat(np.std, coverage),
                 "coverage_min": _stat(np.min, coverage), "size_mean": _stat(np.mean, size),
                 "size_median": _stat(np.median, size),
                 "guarantee_mean": float(np.mean(guarantee)) if guarantee else None,
                 "coverage_upper_bound_mean": mean_of(rows, "coverage_upper_bound"),
                 "quantile_error_mean": mean_of(rows, "quantile_error")}
        notes = {key: over for key in stats if key.startswith(("coverage_", "size_"))}
        notes["guarantee_mean"] = f"the trials of all {len(rows)} that report a guarantee (ok and infinite)"
        notes["coverage_upper_bound_mean"] = (f"the trials of all {len(rows)} that report paper 003's theorem 3 "
                                              f"bound (private_cp, private_cp_local)")
        notes["quantile_error_mean"] = f"the trials of all {len(rows)} that report a quantile error"
        return stats, notes

    @classmethod
    def table(cls, summaries, alpha):
        from rich.table import Table

        table = Table(title=f"Per-method results (target coverage {1 - alpha:g}; coverage and size over the ok trials)")
        # paper 003's theorem 3 upper bound: a column only when a method of the run reports one
        bounded = any(s.get("coverage_upper_bound_mean") is not None for s in summaries.values())
        columns = ("method", "codec", "privacy", "ok/inf/abort", "coverage", "sd", "min", "guarantee",
                   *(("upper bound",) if bounded else ()), "size", "size median")
        for column in columns:
            table.add_column(column, justify="left" if column in ("method", "codec", "privacy") else "right",
                             no_wrap=True)
        for method, s in summaries.items():
            privacy = ("-" if s["privacy"] == "none" else s["privacy"] if s["epsilon"] is None
                       else f"eps={s['epsilon']:g} {s['privacy']}")
            table.add_row(method, s["codec"], privacy, f"{s['ok']}/{s['infinite']}/{s['aborted']}",
                          fmt(s["coverage_mean"]), fmt(s["coverage_std"]), fmt(s["coverage_min"]),
                          fmt(s["guarantee_mean"]), *((fmt(s.get("coverage_upper_bound_mean")),) if bounded else ()),
                          fmt(s["size_mean"]), fmt(s["size_median"]))
        return table

    @classmethod
    def plots(cls, rows, out, alpha, side=None, name: str = "coverage_size.png"):
        """coverage_size.png: box plots of test coverage and mean set size per method over trials
        (like paper 000 figure 4; rows pooled from several runs give its one point per split and
        data set), with the target 1 - alpha marked."""
        coverage, size = _per_trial(rows)
        if not coverage:
            return []
        plt = pyplot()
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
        return [save(fig, Path(out) / name)]

    @classmethod
    def sweep_plots(cls, results, rows, keys, alpha, out):
        return _sweep_boxplots(results, rows, keys, alpha, Path(out)) + _utility_vs_cost(rows, Path(out))


def _clipped(truth: Truth) -> float | None:
    """The share of calibration scores above the method's public score range (binned methods)."""
    bounds = truth.method.score_range
    if not bounds or getattr(truth.world, "calibration_scores", None) is None:
        return None
    return float(np.mean(truth.world.calibration_scores > bounds[1]))


def _stat(fn, values):
    return float(fn(values)) if values.size else None


def _per_trial(rows: list[dict]):
    """method -> coverages, method -> finite set sizes, over the ok rows that produced a set."""
    coverage, size = defaultdict(list), defaultdict(list)
    for row in rows:
        if row["status"] != "ok" or row.get("coverage") in ("", "nan", None):
            continue
        coverage[row["method"]].append(float(row["coverage"]))
        value = float(row["size"])
        if math.isfinite(value):
            size[row["method"]].append(value)
    return coverage, size


def _sweep_boxplots(results, rows, keys, alpha, out: Path) -> list[Path]:
    """coverage_size.png of a sweep: one group of boxes per combination (run), one box per
    method in a fixed colour, coverage above and mean set size below (paper 000 figures 8-17)."""
    runs = list(dict.fromkeys(row["run"] for row in rows))
    per_run = {run: _per_trial(results.get(run, [])) for run in runs}
    methods = list(dict.fromkeys(m for coverage, _ in per_run.values() for m in coverage))
    if not methods:
        return []
    plt, palette = pyplot(), colors()
    labels = {row["run"]: ", ".join(str(row[k]) for k in keys) for row in rows}
    width = 0.8 / len(methods)
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
                box.set_facecolor(palette[number % len(palette)])
                box.set_alpha(0.6)
            parts["boxes"][0].set_label(method)
        axis.set_xticks(range(len(runs)), [labels[r] for r in runs], rotation=20, ha="right")
    axes[0].axhline(1 - alpha, color="tab:red", linestyle="--", linewidth=1)
    axes[0].set_ylabel("test coverage per trial")
    axes[1].set_ylabel("mean set size per trial")
    axes[0].set_title(f"coverage (target {1 - alpha:g}) and set size by {', '.join(keys)}")
    axes[0].legend(fontsize=8, loc="lower right")
    return [save(fig, out / "coverage_size.png")]


def _utility_vs_cost(rows, out: Path) -> list[Path]:
    """utility_vs_cost.png: mean set size against bytes up per site, coverage annotated."""
    by_method = defaultdict(list)
    for row in rows:
        by_method[row["method"]].append(row)
    plt = pyplot()
    fig, axis = plt.subplots(figsize=(7, 4.5))
    for number, (method, items) in enumerate(by_method.items()):
        points = [(r["bytes_up_per_site"], r["size_mean"], r["coverage_mean"]) for r in items
                  if r.get("bytes_up_per_site") is not None and r.get("size_mean") is not None]
        if not points:
            continue
        xs, ys, _ = zip(*points)
        axis.scatter(xs, ys, label=method, marker=MARKERS[number % len(MARKERS)], alpha=0.8)
        for x, y, c in points:
            axis.annotate(f"{c:.3f}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if not axis.get_legend_handles_labels()[0]:  # in-process runs send no bytes: nothing to plot
        plt.close(fig)
        return []
    axis.set_xscale("log")
    axis.set_xlabel("bytes up per site and trial")
    axis.set_ylabel("mean set size (labels: mean coverage)")
    axis.set_title("utility against communication cost")
    axis.legend(fontsize=8)
    return [save(fig, out / "utility_vs_cost.png")]
