"""What a session returns: an Outcome, of a result family that owns how it is written.

A method's coordinator half ends a session with an `Outcome`. Its family, the Outcome's class,
owns everything the harness writes about it, so that the harness writes any family without
knowing which it is:

    COLUMNS         its own results.csv columns; `columns(truth)` gives their values once the
                    harness knows the trial's truth (the test set, every site's data)
    caveats(truth)  notes appended to the row's reason (e.g. clipped scores)
    SIDE_TABLES     tables of its own beside results.csv (learning's rounds.csv), `side_rows(truth)`
    aggregate       its aggregates over one method's trials in summary.json, each with what it
                    is taken over (`averaged_over`)
    table           its terminal table; `HEADLINE`: its utility columns in a sweep's table
    plots           its PNGs of a run; `sweep_plots` those of a sweep

Families Quorum ships: results.conformal.Threshold (a prediction set), results.hypothesis.
HypothesisTest (a p-value), results.estimates.Estimates (quantile estimates), results.learning.
LearningRun (a federated learning run). A plugin brings its own by subclassing Outcome (or one of
these) and naming it in its method's `result` (docs/plugins.md, "A result family of your own").
A plain `Outcome` is the result of no family: an aborted session (`Outcome.aborted`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Mapping

import numpy as np

#: Outcome statuses: a result; the whole line (a threshold family: no finite threshold carries the
#: guarantee); no result at all, with the reason; or a result released with weaker privacy than
#: the scenario asked for (fewer private inputs than planned), only where the method's
#: `on_shortfall: report` allows it, the reason naming the gap.
STATUSES = ("ok", "infinite", "aborted", "shortfall")

#: results.csv columns every row has, before and after its families' own
HEAD_COLUMNS = ("trial", "method", "result", "codec", "status")
TAIL_COLUMNS = ("sites", "answered", "epsilon", "privacy", "noise", "epsilon_obtained", "epsilon_local",
                "device", "seconds", "reason", "details")  # device: where it ran (runner.devices)
DETAIL_LIMIT = 1000  # characters of JSON per value in the details column; a longer value is noted, not written


@dataclass(frozen=True)
class Truth:
    """What the harness knows of one session that its coordinator does not, to judge the result."""

    world: Any  # world.trial.TrialWorld: the trial's test set, every site's data, the model
    method: Any  # the Method as it ran (its bins, its score range)
    #: (phase, "up" | "down") -> bytes of this session at the coordinator's socket (empty in-process)
    wire: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Outcome:
    status: str
    reason: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    #: the family's name in results.csv's `result` column and summary.json (results.RESULTS)
    name: ClassVar[str] = "outcome"
    #: the family's own results.csv columns
    COLUMNS: ClassVar[tuple[str, ...]] = ()
    #: details read into columns (the rest go to the `details` column as JSON)
    READS: ClassVar[frozenset[str]] = frozenset({"answered", "epsilon_obtained", "epsilon_local"})
    #: tables of the family's own beside results.csv: file stem -> columns (each row has trial, method)
    SIDE_TABLES: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: the family's utility in a sweep's terminal table: (column title, summary key, digits)
    HEADLINE: ClassVar[tuple[tuple[str, str, int], ...]] = ()

    @classmethod
    def aborted(cls, reason: str, **details) -> "Outcome":
        """No result, with the reason (any family's session may end so)."""
        return Outcome("aborted", reason, details)

    def short_of_privacy(self, reason: str) -> "Outcome":
        """This result, marked as released with weaker privacy than asked (status "shortfall")."""
        return replace(self, status="shortfall", reason="; ".join(r for r in (reason, self.reason) if r))

    def with_details(self, **details) -> "Outcome":
        """This result with more details (a new Outcome: results are immutable)."""
        return replace(self, details={**self.details, **details})

    # -- one row ---------------------------------------------------------------------------

    def event_fields(self) -> dict:
        """What the session_end event shows of the result, besides its status and reason."""
        return {}

    def columns(self, truth: Truth) -> dict:
        """Values of the family's COLUMNS for this trial (called for every status)."""
        return {}

    def caveats(self, truth: Truth) -> list[str]:
        """Notes on the result that its reason must carry (e.g. scores clipped by a bin range)."""
        return []

    def side_rows(self, truth: Truth) -> dict[str, list[dict]]:
        """Rows of the family's SIDE_TABLES for this session (without trial and method)."""
        return {}

    def common_columns(self) -> dict:
        """The row's columns every family has that the result itself gives."""
        return {"status": self.status, "reason": self.reason, "answered": self.details.get("answered"),
                "epsilon_obtained": self.details.get("epsilon_obtained"),
                "epsilon_local": self.details.get("epsilon_local"),
                "details": extra_details(self.details, type(self).READS)}

    # -- over trials -----------------------------------------------------------------------

    @classmethod
    def summarize(cls, rows: list[dict]) -> dict:
        """summary.json's entry for one method: what every family reports (statuses, privacy),
        then the family's own aggregates, and `averaged_over`: what each aggregate is taken over."""
        first = rows[0]
        stats = {
            "result": first.get("result", cls.name), "codec": first["codec"],
            "privacy": first.get("privacy", "none"),
            "epsilon": float(first["epsilon"]) if first.get("epsilon") not in (None, "") else None,
            "trials": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
            "infinite": sum(r["status"] == "infinite" for r in rows),
            "aborted": sum(r["status"] == "aborted" for r in rows),
        }
        own, notes = cls.aggregate(rows, [r for r in rows if r["status"] == "ok"])
        stats.update(own)
        stats["epsilon_obtained_max"] = max_of(rows, "epsilon_obtained")
        notes["epsilon_obtained_max"] = f"the largest over the trials of all {len(rows)} that report one"
        stats["averaged_over"] = {key: notes[key] for key in stats if key in notes}
        return stats

    @classmethod
    def aggregate(cls, rows: list[dict], ok: list[dict]) -> tuple[dict, dict[str, str]]:
        """The family's aggregates over one method's rows (`ok`: those with status ok) and, for
        each, what it is taken over, in words with its count."""
        return {}, {}

    @classmethod
    def table(cls, summaries: dict[str, dict], alpha: float):
        """The terminal table of the methods of this family ({label: summary}), or None."""
        return None

    @classmethod
    def plots(cls, rows: list[dict], out: Path, alpha: float, side: Mapping[str, list[dict]]) -> list[Path]:
        """PNGs of a run's rows of this family (and its side tables' rows) into directory `out`."""
        return []

    @classmethod
    def sweep_plots(cls, results: dict[str, list[dict]], rows: list[dict], keys: list[str], alpha: float,
                    out: Path) -> list[Path]:
        """PNGs of a sweep: `results` maps each run directory to its results rows of this family,
        `rows` are sweep.csv's rows of this family's methods, `keys` the swept fields."""
        return []


def over_ok(ok: int, trials: int, why: str = "") -> str:
    """The words for an aggregate over the ok trials of `trials`."""
    if ok == trials:
        return f"all {trials} trials (every one ok)"
    return f"the {ok} trials with status ok{why}; the {trials - ok} other trials are left out"


def numbers(rows: list[dict], key: str) -> list[float]:
    """The numeric values of column `key` over `rows` (empty cells and nan left out)."""
    return [float(r[key]) for r in rows if r.get(key) not in (None, "", "nan")]


def mean_of(rows: list[dict], key: str) -> float | None:
    values = numbers(rows, key)
    return float(np.mean(values)) if values else None


def max_of(rows: list[dict], key: str) -> float | None:
    values = numbers(rows, key)
    return float(np.max(values)) if values else None


def fmt(value, digits: int = 4) -> str:
    """A number as the terminal tables show it ("-" for none)."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return "-"
    return f"{value:.{digits}f}"


def extra_details(details: Mapping[str, Any], reads: frozenset[str]) -> str | None:
    """A result's details that no column reads (e.g. a plugin's `width=...`), as the JSON object of
    results.csv's `details` column: numbers, strings, lists and maps as JSON (numpy values
    converted), a value over DETAIL_LIMIT characters replaced by a note of its size. None when
    there are none."""
    extra = {}
    for key in sorted(set(details) - reads):
        text = json.dumps(details[key], default=_plain, allow_nan=True)
        extra[key] = json.loads(text) if len(text) <= DETAIL_LIMIT else f"(omitted: {len(text)} characters of JSON)"
    return json.dumps(extra) if extra else None


def _plain(value):
    """json.dumps fallback: numpy scalars and arrays as Python numbers and lists, sets sorted,
    anything else as its repr."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=str)
    return repr(value)
