"""The run directory and what is written there.

    scenario.yaml   the scenario exactly as run (defaults filled in, overrides applied)
    results.csv     one row per trial and method, appended and fsync'ed as each session ends: the
                    columns every row has, and each result family's own (results.base)
    events.jsonl    joins, dropouts, rejected messages, sessions (coordinator.events)
    ledger.csv      every message at the coordinator's socket with its wire size (transport.ledger)
    NAME.csv        a result family's own tables, appended as each session ends: rounds.csv of
                    federated learning (results.learning: accuracies, weight and wire bytes per round)
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
from collections.abc import Mapping
from pathlib import Path

import yaml

from protocol.inert import inert, inert_all
from results import Outcome, Truth, family_name, result_columns
from transport.security import private_directory

ATTACK_COLUMNS = ["trial", "method", "attack", "asked", "answered", "refused", "reasons", "finding"]


def session_rows(trial: int, label: str, method, outcome: Outcome, world, wire: Mapping, *, sites: int,
                 seconds: float, noise: str, device: str | None = None) -> tuple[dict, dict[str, list[dict]]]:
    """One session's row of results.csv and its rows of its family's own tables, whatever the
    family: the columns every row has, then what the result itself writes (results.base), judged
    against the trial's `world` and the session's bytes, `wire` ((phase, direction) -> bytes:
    Ledger.session_wire). A result of another family than its method declares (`Method.result`)
    is recorded as aborted, with the reason. `device`: where the session's parts ran
    (runner.devices.session_device: 'scoring=cpu; model_training=cpu; site_training=none')."""
    truth = Truth(world, method, wire)
    family = method.result
    if outcome.status != "aborted" and not isinstance(outcome, family):
        outcome = Outcome.aborted(f"{method.name} returned a {type(outcome).__name__} result but declares "
                                  f"result = {family.__name__}", **outcome.details)
    privacy = method.privacy
    row = {"trial": trial, "method": label, "result": family_name(family), "codec": method.codec, "sites": sites,
           "epsilon": privacy["epsilon"], "privacy": privacy["model"], "noise": noise, "seconds": round(seconds, 6),
           "device": device,
           **outcome.common_columns(), **outcome.columns(truth)}
    notes = outcome.caveats(truth)
    if notes:
        row["reason"] = "; ".join(r for r in (row["reason"], *notes) if r)
    side = {name: [{"trial": trial, "method": label, **r} for r in rows]
            for name, rows in outcome.side_rows(truth).items()}
    return row, side


class ResumeError(ValueError):
    """A run directory that cannot be resumed (no scenario, or a different one)."""


class RunDirectory:
    def __init__(self, path: str | Path, families=()) -> None:
        self.path = Path(path)
        private_directory(self.path)  # shards, models, accounts, keys and logs: not for other users
        self.logs = self.path / "logs"
        private_directory(self.logs)
        self.work = self.path / "work"
        self.results = self.path / "results.csv"
        self.events = self.path / "events.jsonl"
        self.ledger = self.path / "ledger.csv"
        self.summary = self.path / "summary.json"
        self.rounds = self.path / "rounds.csv"  # results.learning's table: run.rounds in the API
        self.privacy = self.path / "privacy.csv"
        self.attacks = self.path / "attacks.csv"
        #: the result families of the run's methods: results.csv's columns and the side tables
        self.families = list(dict.fromkeys(families))
        self.side_tables = {name: columns for family in self.families for name, columns in family.SIDE_TABLES.items()}

    def begin(self, scenario: dict, resume: bool) -> tuple[set[tuple[int, str]], set[int]]:
        """Start a run here: write scenario.yaml; or, resuming, check that it is the scenario
        this directory was started with and repair the files a kill may have torn. Returns the
        (trial, method label) pairs already done and the coordinator-kill faults already fired."""
        if not resume:
            self.write_scenario(scenario)
            return set(), set()
        saved = self.read_scenario()
        if saved is None:
            raise ResumeError(f"{self.path} holds no scenario.yaml: nothing to resume")
        if saved != scenario:
            changed = sorted(k for k in set(saved) | set(scenario) if saved.get(k) != scenario.get(k))
            raise ResumeError(f"the scenario differs from the one {self.path} was started with "
                              f"(fields {', '.join(changed)}); resume with the same file and --set")
        self.repair()
        return {(int(r["trial"]), r["method"]) for r in self.read_results()}, self.fired_faults()

    def write_scenario(self, scenario: dict) -> None:
        (self.path / "scenario.yaml").write_text(yaml.safe_dump(scenario, sort_keys=False))

    def read_scenario(self) -> dict | None:
        path = self.path / "scenario.yaml"
        return yaml.safe_load(path.read_text()) if path.exists() else None

    def repair(self) -> None:
        """After a kill: drop a torn last line from the append-only files, keeping every
        complete record (each was flushed before the next began)."""
        sides = [self.path / f"{name}.csv" for name in self.side_tables]
        for path in (self.results, self.events, self.ledger, *sides):
            if not path.exists():
                continue
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):
                path.write_bytes(data[: data.rfind(b"\n") + 1])
        done = {(r["trial"], r["method"]) for r in self.read_results()}
        for name in self.side_tables:  # rows of a session killed before its result row: it runs again
            path = self.path / f"{name}.csv"
            if path.exists():
                kept = [r for r in self.read_side(name) if (r["trial"], r["method"]) in done]
                path.unlink()
                self.append_side(name, kept)

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

    def record_session(self, trial: int, label: str, method, outcome: Outcome, world, wire: Mapping, *,
                       sites: int, seconds: float, noise: str, device: str | None = None) -> dict:
        """One session's rows (session_rows), appended; returns its results.csv row."""
        row, side = session_rows(trial, label, method, outcome, world, wire, sites=sites, seconds=seconds,
                                 noise=noise, device=device)
        self.append_session(row, side)
        return row

    def append_session(self, row: dict, side: dict[str, list[dict]]) -> None:
        """One session's rows: its family's own tables first, then its results.csv row, each
        forced to disk before returning (a row in results.csv means the session is done)."""
        for name, rows in side.items():
            self.append_side(name, rows)
        _append(self.results, self._result_columns(), [row])

    def _result_columns(self) -> list[str]:
        """results.csv's header: the file's own when it exists (a resumed run), else the one of
        the run's result families."""
        if self.results.exists():
            with open(self.results, newline="") as handle:
                header = next(csv.reader(handle), None)
            if header:
                return header
        return result_columns(self.families)

    def append_side(self, name: str, rows: list[dict]) -> None:
        """Append rows to a result family's own table NAME.csv."""
        if rows:
            _append(self.path / f"{name}.csv", list(self.side_tables[name]), rows)

    def read_side(self, name: str) -> list[dict]:
        return _read(self.path / f"{name}.csv")

    def read_rounds(self) -> list[dict]:
        return _read(self.rounds)

    def read_results(self) -> list[dict]:
        return _read(self.results)

    def write_wire(self, rows: list[dict], columns: list[str]) -> None:
        """wire.csv (runner.report.wire_rows): what each site's link carried, per phase."""
        with open(self.path / "wire.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=columns)
            writer.writeheader()
            writer.writerows({key: csv_cell(row.get(key)) for key in columns} for row in rows)

    def write_attacks(self, rows: list[dict]) -> None:
        with open(self.attacks, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=ATTACK_COLUMNS)
            writer.writeheader()
            writer.writerows({key: csv_cell(row.get(key)) for key in ATTACK_COLUMNS} for row in rows)

    def write_summary(self, summary: dict) -> dict:
        """Write summary.json; returns what it holds: `summary` with every string inert
        (protocol.inert), since some of it (site devices, attack reports) a peer chose."""
        summary = inert_all(summary)
        tmp = self.summary.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2, allow_nan=False, default=inert))
        os.replace(tmp, self.summary)
        return summary


def _append(path: Path, columns: list[str], rows: list[dict]) -> None:
    """Append rows to a CSV file (its header first when new) and force them to disk."""
    new = not path.exists()
    with open(path, "a", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows({key: csv_cell(row.get(key)) for key in columns} for row in rows)
        handle.flush()
        os.fsync(handle.fileno())


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def csv_cell(value):
    """One CSV cell, the one formatter of every table Quorum writes: None empty, numpy scalars as
    numbers, floats by repr (full precision), nan, inf and -inf as words, text inert
    (protocol.inert: a reason a site gave starts no new line, even for a tool that reads the
    file line by line; the wire and the driver have bounded it already)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return inert(value, None)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()  # numpy scalars: write the number, not np.float64(...)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    return value
