"""The bisection's own result family: a threshold with the bracket it was found in.

A `Bracket` is a `Threshold` (Quorum judges its coverage and set size on the test set as for
every prediction set) with two columns of its own in results.csv, `bracket_lo` and `rounds`, and
`width` = threshold - bracket_lo; summary.json gets their means over the ok trials, and the
terminal a table of its own. Quorum writes it without knowing it: the method names it in its
`result`, and results.csv's `result` column names it back (`bracket` once the package is
installed, its import path otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quorum.plugin import Threshold, fmt, mean_of, over_ok


@dataclass(frozen=True)
class Bracket(Threshold):
    lo: float = math.nan  # the bracket's lower end: the threshold lies in (lo, threshold]

    name = "bracket"
    COLUMNS = (*Threshold.COLUMNS, "bracket_lo", "width", "rounds")
    READS = Threshold.READS | {"rounds"}  # details that become columns (the rest: the details column)
    HEADLINE = (*Threshold.HEADLINE, ("width", "width_mean", 4))

    def columns(self, truth) -> dict:
        width = self.threshold - self.lo if math.isfinite(self.threshold) and math.isfinite(self.lo) else None
        return {**super().columns(truth), "bracket_lo": self.lo, "width": width, "rounds": self.details.get("rounds")}

    @classmethod
    def aggregate(cls, rows, ok):
        stats, notes = super().aggregate(rows, ok)
        stats.update(width_mean=mean_of(ok, "width"), rounds_mean=mean_of(ok, "rounds"))
        notes.update(width_mean=over_ok(len(ok), len(rows)), rounds_mean=over_ok(len(ok), len(rows)))
        return stats, notes

    @classmethod
    def table(cls, summaries, alpha):
        from rich.table import Table

        table = Table(title=f"Bisection brackets (target coverage {1 - alpha:g}; means over the ok trials)")
        for column in ("method", "ok/inf/abort", "coverage", "size", "width", "rounds"):
            table.add_column(column, justify="left" if column == "method" else "right", no_wrap=True)
        for method, s in summaries.items():
            table.add_row(method, f"{s['ok']}/{s['infinite']}/{s['aborted']}", fmt(s["coverage_mean"]),
                          fmt(s["size_mean"]), fmt(s["width_mean"], 6), fmt(s["rounds_mean"], 1))
        return table
