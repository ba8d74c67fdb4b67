"""The run directory and what is written there.

    scenario.yaml   the scenario exactly as run (defaults filled in, overrides applied)
    results.csv     one row per trial and method, appended and fsync'ed as each session ends
    events.jsonl    joins, dropouts, rejected messages, sessions (coordinator.events)
    ledger.csv      every message at the coordinator's socket with its wire size (transport.ledger)
    rounds.csv      federated learning only: one row per trial, method and round (accuracies,
                    conformal set sizes, weight bytes, wire bytes), appended as each session ends
    privacy.csv     what each site spent of its own privacy budget, per method and in total, read
                    from the sites' accounts (runner.privacy), written at the end
    attacks.csv     a scenario's attacks only (coordinator.adversary): per trial and attack, the sites
                    asked, answered and refused, the top reasons and what the attack found
    summary.json    per-method aggregates, written at the end (and rebuilt from results.csv)
    logs/           one log file per site process
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import yaml

from transport.security import private_directory

RESULT_COLUMNS = ["trial", "method", "codec", "status", "coverage", "size", "threshold", "guarantee",
                  "ell", "k", "sites", "answered", "epsilon", "privacy", "noise", "epsilon_obtained", "epsilon_local", "quantile_error",
                  "clipped", "p_value", "statistic", "estimates", "estimate_errors", "accuracy", "accuracy_sd",
                  "global_accuracy", "proxy_accuracy", "set_coverage", "seconds", "reason", "details"]
ATTACK_COLUMNS = ["trial", "method", "attack", "asked", "answered", "refused", "reasons", "finding"]
ROUND_COLUMNS = ["trial", "method", "round", "sampled", "answered", "accuracy_mean", "accuracy_sd", "accuracy_min",
                 "accuracy_max", "global_accuracy", "private_accuracy", "proxy_accuracy", "set_size",
                 "private_set_size", "eta", "weights_bytes_down", "weights_bytes_up", "private_weights_bytes",
                 "wire_bytes_down", "wire_bytes_up", "dropped"]


class RunDirectory:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        private_directory(self.path)  # shards, models, accounts, keys and logs: not for other users
        self.logs = self.path / "logs"
        private_directory(self.logs)
        self.work = self.path / "work"
        self.results = self.path / "results.csv"
        self.events = self.path / "events.jsonl"
        self.ledger = self.path / "ledger.csv"
        self.summary = self.path / "summary.json"
        self.rounds = self.path / "rounds.csv"
        self.privacy = self.path / "privacy.csv"
        self.attacks = self.path / "attacks.csv"

    def write_scenario(self, scenario: dict) -> None:
        (self.path / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))

    def read_scenario(self) -> dict | None:
        path = self.path / "scenario.yaml"
        return yaml.safe_load(path.read_text()) if path.exists() else None

    def repair(self) -> None:
        """After a kill: drop a torn last line from the append-only files, keeping every
        complete record (each was flushed before the next began)."""
        for path in (self.results, self.events, self.ledger, self.rounds):
            if not path.exists():
                continue
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                path.write_bytes(data[: data.rfind(b"\n") + 1])
        if self.rounds.exists():  # rounds of a session killed before its result row: it runs again
            done = {(r["trial"], r["method"]) for r in self.read_results()}
            kept = [r for r in self.read_rounds() if (r["trial"], r["method"]) in done]
            self.rounds.unlink()
            if kept:
                self.append_rounds(kept)

    def fired_faults(self) -> set[int]:
        """Indices of coordinator-kill faults already carried out (they must not fire again)."""
        fired = set()
        if self.events.exists():
            for line in self.events.read_text().splitlines():
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if event.get("event") == "fault" and event.get("action") == "kill_coordinator":
                    fired.add(event["rule"])
        return fired

    def append_result(self, row: dict) -> None:
        """Append one row and force it to disk before returning."""
        new = not self.results.exists()
        with open(self.results, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=RESULT_COLUMNS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow({key: csv_cell(row.get(key)) for key in RESULT_COLUMNS})
            handle.flush()
            os.fsync(handle.fileno())

    def append_rounds(self, rows: list[dict]) -> None:
        """Append a learning session's per-round rows, forced to disk like results.csv."""
        new = not self.rounds.exists()
        with open(self.rounds, "a", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=ROUND_COLUMNS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerows({key: csv_cell(row.get(key)) for key in ROUND_COLUMNS} for row in rows)
            handle.flush()
            os.fsync(handle.fileno())

    def read_rounds(self) -> list[dict]:
        if not self.rounds.exists():
            return []
        with open(self.rounds, newline="") as handle:
            return list(csv.DictReader(handle))

    def read_results(self) -> list[dict]:
        if not self.results.exists():
            return []
        with open(self.results, newline="") as handle:
            return list(csv.DictReader(handle))

    def write_attacks(self, rows: list[dict]) -> None:
        with open(self.attacks, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=ATTACK_COLUMNS)
            writer.writeheader()
            writer.writerows({key: csv_cell(row.get(key)) for key in ATTACK_COLUMNS} for row in rows)

    def write_summary(self, summary: dict) -> None:
        tmp = self.summary.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2, allow_nan=False, default=str))
        os.replace(tmp, self.summary)


def csv_cell(value):
    """One CSV cell, the one formatter of every table Quorum writes: None empty, numpy scalars as
    numbers, floats by repr (full precision), nan, inf and -inf as words."""
    if value is None:
        return ""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars: write the number, not np.float64(...)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    return value
