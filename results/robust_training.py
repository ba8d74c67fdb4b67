"""Distributionally robust federated training (paper 001 section 5: Δ-FL, DP-Δ-FL, FedAvg,
DP-FedAvg): figure 3's numbers per trial and over trials.

The held-out test clients report their misclassification errors; the run's are their mean and
90th percentile (figure 3's two panels). A private run gives both privacy figures (issue 49): the
central guarantee over all rounds assuming the coordinator sampled as it says (`epsilon_central`),
and the unamplified account of the site that took part most often (`epsilon_site_max`): what a
site that cannot check the sampling books. rounds.csv: each round's sampled and answering sites,
the tail's first loss bin and size, a round skipped (a sum that could not be unmasked) and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from results.base import fmt, mean_of, numbers, over_ok
from results.learning import LearningRun

ROUND_COLUMNS = ("round", "pool", "sampled", "answered", "tail", "tail_bin", "skipped", "dropped",
                 "wire_bytes_down", "wire_bytes_up")
ERRORS = ("mean_error", "p90_error", "validation_mean_error", "validation_p90_error")
PRIVACY = ("epsilon_central", "epsilon_site_max", "delta")


@dataclass(frozen=True)
class RobustTraining(LearningRun):
    name = "robust_training"
    COLUMNS = (*ERRORS, *PRIVACY)
    SIDE_TABLES = {"rounds": ("trial", "method", *ROUND_COLUMNS)}
    HEADLINE = (("p90 error", "p90_error_mean", 4), ("mean error", "mean_error_mean", 4))

    def event_fields(self) -> dict:
        return {"p90_error": self.details.get("p90_error")}

    def columns(self, truth) -> dict:
        return {key: self.details.get(key, math.nan) for key in self.COLUMNS}

    def side_rows(self, truth) -> dict[str, list[dict]]:
        by_round: dict[tuple[int, str], int] = {}
        for (phase, way), count in truth.wire.items():  # every phase of a round: round-t, loss-mask-t, ...
            number = str(phase).rpartition("-")[2]
            if number.isdigit():
                by_round[int(number), way] = by_round.get((int(number), way), 0) + count
        rows = []
        for record in self.rounds:
            row = {key: record.get(key, "") for key in ROUND_COLUMNS[:-2]}
            row["wire_bytes_down"] = by_round.get((record["round"] - 1, "down"), 0)
            row["wire_bytes_up"] = by_round.get((record["round"] - 1, "up"), 0)
            rows.append(row)
        return {"rounds": rows}

    @classmethod
    def aggregate(cls, rows, ok):
        if not numbers(ok, "p90_error"):
            return {}, {}
        stats = {f"{key}_mean": mean_of(ok, key) for key in (*ERRORS, *PRIVACY[:2])}
        stats["p90_error_sd"] = float(np.std(numbers(ok, "p90_error")))
        stats["mean_error_sd"] = float(np.std(numbers(ok, "mean_error")))
        return stats, {key: over_ok(len(ok), len(rows)) for key in stats}

    @classmethod
    def table(cls, summaries, alpha):
        from rich.table import Table

        table = Table(title="Robust federated training: test clients' errors (paper 001 figure 3), mean over trials")
        for column in ("method", "ok/abort", "p90 error", "mean error", "epsilon (central, sampled)",
                       "epsilon (a site's own)"):
            table.add_column(column, justify="left" if column == "method" else "right", no_wrap=True)
        for method, s in summaries.items():
            table.add_row(method, f"{s['ok']}/{s['aborted']}", fmt(s.get("p90_error_mean")),
                          fmt(s.get("mean_error_mean")), fmt(s.get("epsilon_central_mean"), 3),
                          fmt(s.get("epsilon_site_max_mean"), 3))
        return table

    @classmethod
    def plots(cls, rows, out, alpha, side=None, name: str = "robust_training.png"):
        return []
