"""Result families (issue 38, point 2): a plugin brings a kind of result of its own, and the harness
writes it (results.csv columns, a table of its own, summary.json, the terminal table) with no
change to Quorum; every shipped method's rows carry its family; a result of the wrong family is
recorded as aborted with the reason; the engine follows each method's phase table."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from protocol.engine import Requests, Session
from protocol.methods import METHODS
from protocol.phases import Phase, PhaseStep, PhaseTable
from quorum.plugin import CoordinatorHalf, Method, Outcome, Send, SiteHalf, Threshold
from results import RESULTS, check_result, family_name, result_columns
from results.base import HEAD_COLUMNS, TAIL_COLUMNS

ROOT = Path(__file__).resolve().parent.parent

#: a plugin package written against docs/plugins.md: a federated mean with a confidence interval,
#: a result family from scratch (not a Threshold) with a table of its own beside results.csv
PACKAGE = {
    "fedmean/__init__.py": "",
    "fedmean/result.py": '''
        import math
        from dataclasses import dataclass, field

        import numpy as np

        from quorum.plugin import Outcome, fmt, mean_of, over_ok


        @dataclass(frozen=True)
        class Interval(Outcome):
            mean: float = math.nan
            half_width: float = math.nan
            parts: tuple = field(default_factory=tuple)  # (site, n) of each answer

            name = "interval"
            COLUMNS = ("mean", "half_width", "covers")
            SIDE_TABLES = {"contributions": ("trial", "method", "site", "n")}

            def columns(self, truth):
                if self.status != "ok":
                    return {}
                pooled = np.concatenate(list(truth.world.site_scores.values()))
                return {"mean": self.mean, "half_width": self.half_width,
                        "covers": int(abs(self.mean - pooled.mean()) <= self.half_width)}

            def side_rows(self, truth):
                return {"contributions": [{"site": site, "n": n} for site, n in self.parts]}

            @classmethod
            def aggregate(cls, rows, ok):
                stats = {"covers_rate": mean_of(ok, "covers"), "half_width_mean": mean_of(ok, "half_width")}
                return stats, {key: over_ok(len(ok), len(rows)) for key in stats}

            @classmethod
            def table(cls, summaries, alpha):
                from rich.table import Table

                table = Table(title="Federated means and their intervals")
                for column in ("method", "ok", "covers", "half width"):
                    table.add_column(column)
                for label, s in summaries.items():
                    table.add_row(label, str(s["ok"]), fmt(s["covers_rate"], 3), fmt(s["half_width_mean"]))
                return table
    ''',
    "fedmean/method.py": '''
        import math

        import numpy as np

        from quorum.plugin import OneShotMethod, Outcome, Planned, SiteHalf, Spend
        from quorum.protocol.codecs.summary import Summary
        from fedmean.result import Interval


        class FedMean(OneShotMethod):
            name = "fed_mean"
            codec = "summary"
            result = Interval
            PARAMS = {"z": {"type": "float", "gt": 0, "default": 1.96}}

            def make_codec(self):
                return Summary({"n": "int", "total": "float", "squares": "float"})

            def plan(self, sizes):
                return Planned({site: {} for site in sizes})

            def combine(self, sizes, planned, answers, dropped, rng):
                n = sum(a["n"] for a in answers.values())
                if n < 2:
                    return Outcome.aborted(f"{n} values in all")
                mean = sum(a["total"] for a in answers.values()) / n
                variance = (sum(a["squares"] for a in answers.values()) - n * mean * mean) / (n - 1)
                return Interval("ok", "", {"answered": len(answers)}, mean,
                                self.params["z"] * math.sqrt(variance / n),
                                tuple(sorted((site, a["n"]) for site, a in answers.items())))

            @classmethod
            def site(cls, rows, rng, site_id):
                return Moments(rows)

            @classmethod
            def spend(cls, phase, body):
                return Spend("none", model="sums in the clear")


        class Moments(SiteHalf):
            def __init__(self, rows):
                self.rows = np.asarray(rows, dtype=float)

            def answer(self, phase, body):
                return {"n": int(self.rows.size), "total": float(self.rows.sum()),
                        "squares": float(np.square(self.rows).sum())}
    ''',
    "scenario.yaml": '''
        name: fedmean
        trials: 3
        seed: 4
        sites: {count: 5, policy: {non_private: allow}}
        data: {source: synthetic, generator: romano2019, n: 1000}
        model: {kind: ridge}
        methods:
          - {name: "fedmean.method:FedMean", label: mean}
          - {name: fedcp_qq}
        faults:
          - {action: crash, sites: site-002, trials: 1, phase: respond, method: mean}
    ''',
}


@pytest.fixture()
def plugin(tmp_path):
    for name, text in PACKAGE.items():
        path = tmp_path / "plugin" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
    return tmp_path / "plugin"


def test_a_plugin_brings_a_result_family_of_its_own_over_site_processes(plugin, tmp_path, monkeypatch):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{plugin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, str(ROOT / "run.py"), "run", str(plugin / "scenario.yaml"), "--out",
                           str(out)], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Federated means and their intervals" in done.stdout and "Per-method results" in done.stdout
    rows = list(csv.DictReader(open(out / "results.csv")))
    header = list(rows[0])
    assert header[:5] == list(HEAD_COLUMNS) and header[-len(TAIL_COLUMNS):] == list(TAIL_COLUMNS)
    assert {"mean", "half_width", "covers", "coverage", "size"} <= set(header)
    means = [r for r in rows if r["method"] == "mean"]
    assert [r["result"] for r in means] == ["fedmean.result:Interval"] * 3
    assert [r["status"] for r in means] == ["ok"] * 3 and [r["answered"] for r in means] == ["5", "4", "4"]  # crashed for good
    assert all(r["coverage"] == "" for r in means) and all(r["mean"] != "" for r in means)
    # the interval is judged against the truth the simulation knows: the pooled scores
    assert {r["covers"] for r in means} <= {"0", "1"}
    contributions = list(csv.DictReader(open(out / "contributions.csv")))
    assert [(r["trial"], r["method"]) for r in contributions].count(("1", "mean")) == 4
    assert "site-002" not in {r["site"] for r in contributions if r["trial"] == "1"}
    summary = json.loads((out / "summary.json").read_text())
    stats = summary["methods"]["mean"]
    assert stats["result"] == "fedmean.result:Interval" and stats["ok"] == 3
    assert stats["covers_rate"] == pytest.approx(np.mean([float(r["covers"]) for r in means]))
    assert stats["averaged_over"]["covers_rate"] == "all 3 trials (every one ok)"
    assert summary["methods"]["fedcp_qq"]["result"] == "conformal"
    # a run directory summarizes again from its rows alone (the family is named in each row)
    from runner.report import summarize

    monkeypatch.syspath_prepend(str(plugin))
    assert summarize(rows)["mean"]["covers_rate"] == stats["covers_rate"]


def test_every_shipped_method_declares_a_family_its_rows_carry():
    for name in METHODS:
        family = METHODS[name].result
        assert check_result(family) is None, name
        assert RESULTS.load(family_name(family)) is family


def test_a_family_that_takes_a_common_column_is_refused():
    class Clash(Outcome):
        name = "clash"
        COLUMNS = ("mean", "reason")

    assert "every row's own" in check_result(Clash)
    assert result_columns([Threshold])[:5] == list(HEAD_COLUMNS)


def test_a_result_of_another_family_than_declared_is_recorded_as_aborted():
    from runner.outputs import session_rows

    method = METHODS["fedcp_qq"](0.1)
    row, side = session_rows(0, "x", method, Outcome("ok", "", {"answered": 3}), None, {}, sites=3, seconds=0.1,
                             noise="os")
    assert row["status"] == "aborted" and "declares result = Threshold" in row["reason"] and side == {}


class _Steps(CoordinatorHalf):
    def __init__(self, phases):
        self.phases = list(phases)

    def start(self):
        return Send(self.phases.pop(0), {"site-0": {}})

    def advance(self, phase, answers, dropped):
        return Send(self.phases.pop(0), {"site-0": {}}) if self.phases else Threshold.ok(1.0)


class _Rounds(Method):
    name = "rounds_test"
    codec = "raw_quantile"
    phases = PhaseTable(PhaseStep("setup", then=("round",)), PhaseStep("round", then=("round", "done"), numbered=True),
                        PhaseStep("done"), rounds=5)
    asked: list = []

    def coordinator(self, sizes, rng):
        return _Steps(self.asked)

    @classmethod
    def site(cls, rows, rng, site_id):
        return SiteHalf()


@pytest.mark.parametrize("asked, problem", [
    (["setup", Phase("round", 0), Phase("round", 1), "done"], None),
    ([Phase("round", 0)], "a session opens with setup"),
    (["setup", Phase("round", 1)], "after setup comes round-0, not round-1"),
    (["setup", Phase("round", 0), "setup"], "round-0 is followed by round-N (N < 5), done, not setup"),
    (["setup", "round-0", Phase("round", 5)], "'round-5', which rounds_test does not have"),
    (["setup", "nosuch"], "'nosuch', which rounds_test does not have"),
])
def test_the_engine_follows_the_method_phase_table(asked, problem):
    method = _Rounds(0.1)
    method.asked = list(asked)
    session = Session(method, {"site-0": 5}, np.random.default_rng(0))
    step, seen = session.start(), []
    while isinstance(step, Requests):
        seen.append((step.phase.name, step.phase.round))  # the table's Phase: round numbers are data
        step = session.advance(session.decode({"site-0": 1.0}), {})
    if problem is None:
        assert step.status == "ok" and seen == [("setup", None), ("round", 0), ("round", 1), ("done", None)]
    else:
        assert step.status == "aborted" and problem in step.reason, step.reason


def test_a_numbered_phase_is_data_and_its_wire_name_parses_back():
    table = METHODS["fedtype"].phase_table()
    phase = table.parse("round-17")
    assert (phase.name, phase.round, phase) == ("round", 17, "round-17")
    assert table.parse("round-017") is None and table.parse("round-1000") is None and "setup" in table
    assert table.describe() == "setup, round-N (N < 1000), evaluate"
