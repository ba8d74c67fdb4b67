"""A hypothesis test's result (paper 004): a one-sided p-value and its statistic.

Over trials: the p-value distribution (quartiles) and the rejection rate at REJECT_AT, the type I
error under the null and the power otherwise, with its binomial standard error; pvalues.png.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from results.base import Outcome, fmt, numbers, over_ok
from results.plotting import DASHES, colors, pyplot, save

#: the level at which the tests' rejection rates are reported (paper 004 section 4.6: type I error, power)
REJECT_AT = 0.05


@dataclass(frozen=True)
class HypothesisTest(Outcome):
    p_value: float = math.nan
    statistic: float = math.nan

    name = "test"
    COLUMNS = ("p_value", "statistic")
    HEADLINE = (("p median", "p_value_median", 4), ("reject", "reject_rate", 3))

    @classmethod
    def of(cls, p_value: float, statistic: float, **details) -> "HypothesisTest":
        return cls("ok", "", details, float(p_value), float(statistic))

    def event_fields(self) -> dict:
        return {"p_value": self.p_value}

    def columns(self, truth) -> dict:
        return {"p_value": self.p_value, "statistic": self.statistic}

    @classmethod
    def aggregate(cls, rows, ok):
        p = np.array(numbers(ok, "p_value"))
        if not p.size:
            return {}, {}
        rate = float(np.mean(p < REJECT_AT))
        stats = {"p_value_q25": float(np.quantile(p, 0.25)), "p_value_median": float(np.median(p)),
                 "reject_rate": rate, "reject_rate_se": float(np.sqrt(rate * (1 - rate) / p.size))}
        return stats, {key: over_ok(len(ok), len(rows)) for key in stats}

    @classmethod
    def table(cls, summaries, alpha):
        from rich.table import Table

        table = Table(title=f"Tests (reject at p < {REJECT_AT:g})")
        for column in ("method", "privacy", "ok/abort", "p median", "p q25", "reject", "se"):
            table.add_column(column, justify="left" if column in ("method", "privacy") else "right", no_wrap=True)
        for method, s in summaries.items():
            table.add_row(method, s["privacy"], f"{s['ok']}/{s['aborted']}", fmt(s.get("p_value_median")),
                          fmt(s.get("p_value_q25")), fmt(s.get("reject_rate"), 3), fmt(s.get("reject_rate_se"), 3))
        return table

    @classmethod
    def plots(cls, rows, out, alpha, side=None):
        """pvalues.png (paper 004 figure 1 and S1): per method, the p-values over trials (log
        scale, the level marked) and the empirical CDF against the uniform (under H0 the diagonal)."""
        p = _p_values(rows)
        if not p:
            return []
        plt, methods, level = pyplot(), list(p), REJECT_AT
        fig, (left, right) = plt.subplots(1, 2, figsize=(max(9, 1.4 * len(methods) + 5), 4.5))
        left.boxplot([p[m] for m in methods], showmeans=True)
        left.set_yscale("log")
        left.axhline(level, color="tab:red", linestyle="--", linewidth=1, label=f"p = {level:g}")
        left.set_xticks(range(1, len(methods) + 1), methods, rotation=30, ha="right")
        left.set_title("one-sided p-value per trial")
        left.legend(loc="lower right")
        for number, method in enumerate(methods):
            values = sorted(p[method])
            rejected = sum(v < level for v in values) / len(values)
            right.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post",
                       linestyle=DASHES[number % len(DASHES)], label=f"{method} (reject {rejected:.2f})")
        right.plot([0, 1], [0, 1], color="grey", linewidth=0.8)
        right.set_xlabel("p")
        right.set_ylabel("fraction of trials with p-value <= p")
        right.set_title("p-value distribution (uniform under H0)")
        right.legend(fontsize=8)
        return [save(fig, Path(out) / "pvalues.png")]

    @classmethod
    def sweep_plots(cls, results, rows, keys, alpha, out):
        """pvalues.png of a sweep (paper 004 figure 1): one group per combination of the swept
        values, one box of p-values per method; the rejection rate written above each box."""
        runs = list(dict.fromkeys(row["run"] for row in rows))
        per_run = {run: _p_values(results.get(run, [])) for run in runs}
        methods = list(dict.fromkeys(m for p in per_run.values() for m in p))
        if not methods:
            return []
        plt, palette, level = pyplot(), colors(), REJECT_AT
        labels = {row["run"]: ", ".join(str(row[k]) for k in keys) for row in rows}
        width = 0.8 / len(methods)
        fig, axis = plt.subplots(figsize=(max(8, 0.55 * len(runs) * len(methods) ** 0.5 + 3), 5))
        for number, method in enumerate(methods):
            for i, run in enumerate(runs):
                data = per_run[run].get(method)
                if not data:
                    continue
                x = i + (number - (len(methods) - 1) / 2) * width
                parts = axis.boxplot([data], positions=[x], widths=width * 0.85, patch_artist=True,
                                     manage_ticks=False, showfliers=False)
                parts["boxes"][0].set_facecolor(palette[number % len(palette)])
                parts["boxes"][0].set_alpha(0.6)
                if i == 0:
                    parts["boxes"][0].set_label(method)
                axis.annotate(f"{sum(v < level for v in data) / len(data):.2f}", (x, 1.3), fontsize=6,
                              ha="center", rotation=90)
        axis.set_yscale("log")
        axis.set_ylim(top=3)
        axis.axhline(level, color="tab:red", linestyle="--", linewidth=1)
        axis.set_xticks(range(len(runs)), [labels[r] for r in runs], rotation=30, ha="right")
        axis.set_ylabel("one-sided p-value (rejection rate above)")
        axis.set_title(f"p-values by {', '.join(keys)}")
        axis.legend(fontsize=8, loc="lower left")
        return [save(fig, Path(out) / "pvalues.png")]


def _p_values(rows: list[dict]) -> dict[str, list[float]]:
    p = defaultdict(list)
    for row in rows:
        if row["status"] == "ok" and row.get("p_value") not in (None, "", "nan"):
            p[row["method"]].append(max(float(row["p_value"]), 1e-300))
    return p
