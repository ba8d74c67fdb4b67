"""A federated learning run (paper 002): final test accuracies, and a record per round.

The sites hold the test data: each reports its accuracies and the run's are their means (the
spread over sites beside). Per round (rounds.csv, its own table): what the answering sites
reported and the bytes of weights down and up, with the wire bytes the ledger saw in that round's
phase; learning_curves.png.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from results.base import Outcome, Truth, fmt, mean_of, numbers, over_ok
from results.plotting import MARKERS, pyplot, save

ROUND_COLUMNS = ("round", "sampled", "answered", "accuracy_mean", "accuracy_sd", "accuracy_min",
                 "accuracy_max", "global_accuracy", "private_accuracy", "proxy_accuracy", "set_size",
                 "private_set_size", "eta", "weights_bytes_down", "weights_bytes_up", "private_weights_bytes",
                 "wire_bytes_down", "wire_bytes_up", "dropped")
#: epochs.csv (paper 002 appendix I, table 7): per round and local epoch, the site means of what the
#: answering sites reported for that epoch (protocol.methods.learning_rounds.EPOCH_QUANTITIES)
EPOCH_COLUMNS = ("round", "epoch", "sites", "proxy_accuracy", "set_size", "refused")
ACCURACIES = ("accuracy", "global_accuracy", "proxy_accuracy", "set_coverage")


@dataclass(frozen=True)
class LearningRun(Outcome):
    accuracy: float = math.nan  # the method's own accuracy (its `primary` site metric), mean over sites
    accuracy_sd: float = math.nan  # its spread over sites
    global_accuracy: float = math.nan
    proxy_accuracy: float = math.nan
    set_coverage: float = math.nan
    rounds: tuple[dict, ...] = field(default_factory=tuple)  # one record per round (ROUND_COLUMNS, and its phase)
    epochs: tuple[dict, ...] = field(default_factory=tuple)  # one row per round and local epoch (EPOCH_COLUMNS)

    name = "learning"
    COLUMNS = ("accuracy", "accuracy_sd", "global_accuracy", "proxy_accuracy", "set_coverage")
    SIDE_TABLES = {"rounds": ("trial", "method", *ROUND_COLUMNS), "epochs": ("trial", "method", *EPOCH_COLUMNS)}
    HEADLINE = (("accuracy", "accuracy_mean", 4), ("sd over sites", "accuracy_site_sd_mean", 4))

    def event_fields(self) -> dict:
        return {"accuracy": self.accuracy}

    def columns(self, truth: Truth) -> dict:
        return {key: getattr(self, key) for key in self.COLUMNS}

    def side_rows(self, truth: Truth) -> dict[str, list[dict]]:
        """rounds.csv: each round's record and the wire bytes of its phase (0 in-process: no wire);
        epochs.csv: per round and local epoch what the sites reported (FedType's; none for others)."""
        return {"rounds": [{**{k: v for k, v in record.items() if k != "phase"},
                            "wire_bytes_down": truth.wire.get((record["phase"], "down"), 0),
                            "wire_bytes_up": truth.wire.get((record["phase"], "up"), 0)} for record in self.rounds],
                "epochs": [dict(row) for row in self.epochs]}

    @classmethod
    def aggregate(cls, rows, ok):
        """The final accuracies' mean over trials (each a mean over the sites' test splits), and
        the spread over sites averaged over trials."""
        if not numbers(ok, "accuracy"):
            return {}, {}
        stats = {f"{key}_mean": mean_of(ok, key) for key in ACCURACIES}
        stats["accuracy_trial_sd"] = float(np.std(numbers(ok, "accuracy")))
        stats["accuracy_site_sd_mean"] = mean_of(ok, "accuracy_sd")
        return stats, {key: over_ok(len(ok), len(rows)) for key in stats}

    @classmethod
    def table(cls, summaries, alpha):
        from rich.table import Table

        table = Table(title="Federated learning: final test accuracy per site (mean over sites, then trials)")
        for column in ("method", "ok/abort", "accuracy", "sd over sites", "global", "proxy", "set coverage"):
            table.add_column(column, justify="left" if column == "method" else "right", no_wrap=True)
        for method, s in summaries.items():
            table.add_row(method, f"{s['ok']}/{s['aborted']}", fmt(s.get("accuracy_mean")),
                          fmt(s.get("accuracy_site_sd_mean")), fmt(s.get("global_accuracy_mean")),
                          fmt(s.get("proxy_accuracy_mean")), fmt(s.get("set_coverage_mean")))
        return table

    @classmethod
    def plots(cls, rows, out, alpha, side=None, name: str = "learning_curves.png"):
        """Mean per-site test accuracy against rounds (band: +- the sd over sites; dashed:
        FedType's proxies) and the cumulative bytes of weights sent (wire bytes where the run had
        a wire, else the weights' own bytes), dotted: what sending each site's private model up
        and down would have cost. Means over trials."""
        rounds = (side or {}).get("rounds") or []
        if not rounds:
            return []
        curves: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
        for row in rounds:
            curves[row["method"]][int(row["round"])].append(row)

        def mean(items, key):
            values = [float(r[key]) for r in items if r.get(key) not in ("", "nan", None)]
            return sum(values) / len(values) if values else math.nan

        plt = pyplot()
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
                right.plot(xs, cumulative, color=line.get_color(),
                           label=f"{method} ({'wire' if sent is wire else 'weights'})")
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
        return [save(fig, Path(out) / name)]
