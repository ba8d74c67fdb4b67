"""Quantile estimates (paper 004 section 5): level -> estimate, judged against the sites' mixture.

Per trial the normalized errors (Q-hat_p - Q_p) / sd (column estimate_errors, where the harness
knows the site laws); over trials their bias, sd and MSE per level (tables 4-7);
quantile_errors.png.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import numpy as np

from results.base import Outcome, Truth, over_ok
from results.plotting import colors, pyplot, save


@dataclass(frozen=True)
class Estimates(Outcome):
    estimates: Mapping[str, float] = field(default_factory=dict)  # level (as text) -> estimate

    name = "estimates"
    COLUMNS = ("estimates", "estimate_errors")

    @classmethod
    def of(cls, values: Mapping[float, float], **details) -> "Estimates":
        return cls("ok", "", details, {str(p): float(v) for p, v in values.items()})

    def columns(self, truth: Truth) -> dict:
        if not self.estimates:
            return {}
        errors = estimate_errors(self.estimates, truth.world)
        return {"estimates": json.dumps(dict(self.estimates)),
                "estimate_errors": json.dumps(errors) if errors is not None else None}

    @classmethod
    def aggregate(cls, rows, ok):
        errors = defaultdict(list)
        for row in ok:
            if row.get("estimate_errors") not in (None, "", "nan"):
                for level, value in json.loads(row["estimate_errors"]).items():
                    errors[level].append(value)
        if not errors:
            return {}, {}
        stats = {"estimate_errors": {level: {"bias": float(np.mean(v)),
                                             "sd": float(np.std(v, ddof=1)) if len(v) > 1 else None,
                                             "mse": float(np.mean(np.square(v)))} for level, v in errors.items()}}
        return stats, {"estimate_errors": over_ok(len(ok), len(rows))}

    @classmethod
    def table(cls, summaries, alpha):
        from rich.table import Table

        levels = sorted({lv for s in summaries.values() for lv in s.get("estimate_errors", {})}, key=float)
        table = Table(title="Quantile estimates (MSE x 1e3 of (Q-hat - Q) / sd)")
        for column in ("method", "privacy", "ok/abort", *[f"MSE {lv}" for lv in levels]):
            table.add_column(column, justify="left" if column in ("method", "privacy") else "right", no_wrap=True)
        for method, s in summaries.items():
            mse = [s.get("estimate_errors", {}).get(lv, {}).get("mse") for lv in levels]
            table.add_row(method, s["privacy"], f"{s['ok']}/{s['aborted']}",
                          *["-" if v is None else f"{1e3 * v:.2f}" for v in mse])
        return table

    @classmethod
    def plots(cls, rows, out, alpha, side=None):
        """quantile_errors.png (paper 004 section 5.4, tables 4-6): per quantile level, box plots
        of the normalized errors of each method over trials, and the MSE per level."""
        errors = defaultdict(lambda: defaultdict(list))
        for row in rows:
            if row["status"] == "ok" and row.get("estimate_errors") not in (None, "", "nan"):
                for level, value in json.loads(row["estimate_errors"]).items():
                    errors[row["method"]][level].append(value)
        if not errors:
            return []
        plt, palette, methods = pyplot(), colors(), list(errors)
        levels = sorted({lv for per in errors.values() for lv in per}, key=float)
        width = 0.8 / len(methods)
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 1.3 * len(levels) * len(methods) ** 0.5 + 3), 7.5),
                                          sharex=True)
        for number, method in enumerate(methods):
            positions = [i + (number - (len(methods) - 1) / 2) * width for i in range(len(levels))]
            data = [errors[method].get(lv, []) for lv in levels]
            parts = top.boxplot(data, positions=positions, widths=width * 0.85, patch_artist=True,
                                manage_ticks=False, showfliers=False)
            for box in parts["boxes"]:
                box.set_facecolor(palette[number % len(palette)])
                box.set_alpha(0.6)
            parts["boxes"][0].set_label(method)
            mse = [sum(v * v for v in d) / len(d) if d else float("nan") for d in data]
            bottom.bar(positions, mse, width=width * 0.85, color=palette[number % len(palette)], alpha=0.8,
                       label=method)
        top.axhline(0, color="grey", linewidth=0.8)
        top.set_ylabel("(Q-hat - Q) / sd")
        top.set_title("normalized quantile errors over trials")
        top.legend(fontsize=8)
        bottom.set_yscale("log")
        bottom.set_ylabel("MSE")
        bottom.set_xticks(range(len(levels)), [f"Q_{lv}" for lv in levels])
        return [save(fig, Path(out) / "quantile_errors.png")]


def estimate_errors(estimates: Mapping[str, float], world) -> dict[str, float] | None:
    """Paper 004 section 5.4: (Q-hat_p - Q_p) / sd per level, Q_p the p-quantile of the sites'
    mixture (eq. 13: site j's law weighted by n_j / N), taken from the unshifted test sample with
    each site's shift applied, and sd the test sample's (sqrt(r) for Gamma(r) data). None where
    the site laws are not known to the harness (heterogeneity other than none / location / scale)."""
    from data.heterogeneity import shift_response

    if world.heterogeneity not in ("none", "location", "scale") or world.y_test is None or len(world.y_test) < 2:
        return None
    reference = np.asarray(world.y_test, dtype=float)
    sizes = np.array([len(y) for _, y in world.shards.values()], dtype=float)
    laws = [shift_response(world.heterogeneity, reference, alpha) for alpha in world.shifts]
    values = np.concatenate(laws)
    weights = np.repeat(sizes / sizes.sum() / reference.size, reference.size)
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    sd = float(np.std(reference, ddof=1))
    errors = {}
    for level, estimate in estimates.items():
        truth = values[order][min(int(np.searchsorted(cumulative, float(level) - 1e-12)), values.size - 1)]
        errors[level] = (float(estimate) - float(truth)) / sd
    return errors
