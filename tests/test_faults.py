"""The fault matrix: every scripted fault kind at each phase, against three method families
(FedCP-QQ's planner, pooled scores, local DP). Every session must end in a correct result or an
explained abort; no process may crash (other than on purpose) or hang.

Where it runs (issue 50 point 5, docs/testing.md "What runs where"): the whole matrix runs in
`make test` in-process, on the virtual clock (the same pump, site and fault code as the
processes, over the in-memory transport): deadlines pass without waiting, so no case depends on
how busy the machine is. Over real site processes (one per site, and site hosts of two agents
each, where the victim shares its process with another site, which must not notice) the default
suite keeps one case per fault that real sockets change: a crash that closes a connection (the
process dies), a corruption decoded by the real channel, a message dropped on its way down to a
host of two; the full processes matrix is marked slow (`make test-all`)."""

import json

import pytest
import yaml

from runner.outputs import RunDirectory
from runner.study import run_study
from scenarios.scenario import validate_scenario
from stats.orderstats import qq_coverage
from stats.planner import COVERAGE_TOLERANCE
from tests.support import TINY

METHODS = [{"name": "fedcp_qq"}, {"name": "centralized"},
           {"name": "fedcp2_qq", "epsilon": 5.0, "bins": {"count": 50, "lo": -3.0, "hi": 3.0}}]
VICTIM = "site-001"

FAULTS = {
    "crash": {"action": "crash", "sites": VICTIM},
    "straggle": {"action": "straggle", "sites": VICTIM},
    "late": {"action": "delay", "sites": VICTIM, "seconds": 6.0},
    "drop_up": {"action": "drop", "sites": VICTIM},
    "duplicate_up": {"action": "duplicate"},
    "reorder_up": {"action": "reorder", "sites": VICTIM, "seconds": 0.3},
    "corrupt_bytes": {"action": "corrupt", "sites": VICTIM, "mode": "bytes"},
    "corrupt_truncate": {"action": "corrupt", "sites": VICTIM, "mode": "truncate"},
    "corrupt_types": {"action": "corrupt", "sites": VICTIM, "mode": "types"},
    "drop_down": {"action": "drop", "sites": VICTIM, "direction": "down"},
    "corrupt_down": {"action": "corrupt", "sites": VICTIM, "direction": "down"},
    "duplicate_down": {"action": "duplicate", "direction": "down"},
    "late_down": {"action": "delay", "sites": VICTIM, "direction": "down", "seconds": 6.0},
    "fraction_straggle": {"action": "straggle", "sites": {"fraction": 0.5, "seed": 3}},
}
# Faults that cost the victim its answer in the phase they hit (duplicates and short holds do not).
LOSES_ANSWER = {"crash", "straggle", "late", "drop_up", "corrupt_bytes", "corrupt_truncate", "corrupt_types",
                "drop_down", "corrupt_down", "late_down"}


def scenario(fault: dict, phase: str, per_process: int = 1) -> dict:
    raw = yaml.safe_load(TINY.read_text())
    raw.update(trials=2, methods=METHODS, faults=[{**fault, "phase": phase, "trials": 0}])
    # over processes an honest site answers in milliseconds; 2.5 s leaves room for the suite's load
    # (three workers on two cores: at 1.5 s a fresh-clone run once saw an honest site miss the
    # respond deadline); in-process the same deadlines pass on the virtual clock, whatever the load
    raw["runtime"] = {"deadlines": {"hello": 30, "join": 4, "respond": 2.5},
                      "placement": {"sites_per_process": per_process}}
    return validate_scenario(raw)


PHASES = ("join", "respond")
#: over real site processes in `make test`: (fault, phase, sites per process), one per fault that
#: the sockets change; the rest of the processes matrix runs with the slow tests
OVER_PROCESSES = {("crash", "respond", 1), ("corrupt_bytes", "respond", 1), ("drop_down", "respond", 2)}


def cases():
    for name in sorted(FAULTS):
        for phase in PHASES:
            yield pytest.param(name, phase, "inprocess", 1, id=f"{name}-{phase}-inprocess")
    for name in sorted(FAULTS):
        for phase in PHASES:
            for per_process, placed in ((1, "process-per-site"), (2, "hosts-of-2")):
                marks = () if (name, phase, per_process) in OVER_PROCESSES else (pytest.mark.slow,)
                yield pytest.param(name, phase, "processes", per_process, id=f"{name}-{phase}-{placed}", marks=marks)


@pytest.fixture
def no_pictures(monkeypatch):
    """The matrix reads results.csv and events.jsonl: the plots and the timeline (most of an
    in-process case's second; tests/test_trace.py draws fault runs' timelines) are not drawn."""
    import runner.study

    monkeypatch.setattr(runner.study, "run_plots", lambda *args, **kwargs: None)
    monkeypatch.setattr(runner.study, "write_timeline", lambda *args, **kwargs: None)


@pytest.mark.parametrize("name, phase, backend, per_process", list(cases()))
def test_every_session_ends_in_a_correct_result_or_an_explained_abort(tmp_path, no_pictures, name, phase, backend,
                                                                      per_process):
    spec = scenario(FAULTS[name], phase, per_process)
    run_study(spec, tmp_path, backend=backend)
    rows = RunDirectory(tmp_path).read_results()
    assert [(int(r["trial"]), r["method"]) for r in rows] == [(t, m["name"]) for t in (0, 1) for m in METHODS]
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["status"] in ("ok", "infinite", "aborted")
        if row["status"] != "ok":
            assert row["reason"], row
        if row["method"] == "fedcp_qq" and row["status"] == "ok":  # the guarantee of the plan actually used
            m, ell, k = int(row["answered"]), int(row["ell"]), int(row["k"])
            assert float(row["guarantee"]) == pytest.approx(qq_coverage(m, 40, ell, k), abs=1e-12)
            assert float(row["guarantee"]) >= 0.9 - COVERAGE_TOLERANCE
    trial0 = [r for r in rows if r["trial"] == "0"]
    if name in LOSES_ANSWER:
        lost = [r for r in trial0 if r["status"] == "ok" and r["answered"] and int(r["answered"]) < int(r["sites"])]
        joined = {int(r["sites"]) for r in trial0}
        assert lost or joined == {3}, "the fault must cost the victim its answer or its join"
        assert any(e["event"] in ("dropout", "rejected") for e in events)
    if name == "fraction_straggle" and phase == "respond":
        assert {int(r["answered"]) for r in trial0 if r["status"] == "ok"} == {2}
    if name.startswith("corrupt") and phase == "respond" and not name.endswith("down"):
        reasons = " ".join(e.get("reason", "") for e in events if e["event"] == "rejected")
        assert "checksum mismatch" in reasons or "undecodable" in reasons or "payload" in reasons
    if name in LOSES_ANSWER and name != "fraction_straggle":  # the victim alone pays, host-mate or not
        assert all(int(r["answered"]) >= int(r["sites"]) - 1 for r in trial0 if r["status"] == "ok" and r["answered"])
    if backend == "inprocess":  # on the virtual clock: the deadlines passed without waiting
        assert next(e for e in events if e["event"] == "coordinator_start")["clock"] == "virtual"
    else:
        codes = next(e for e in events if e["event"] == "sites_stopped")["exit_codes"]
        assert len(codes) == 4 // per_process
        for process, code in codes.items():  # only a crashed one-site process may die; none may hang
            assert code == 0 or (name == "crash" and per_process == 1 and process == VICTIM and code == -9), \
                (process, code)
    if name not in ("crash",):  # sites recover for the next trial
        assert all(int(r["sites"]) == 4 for r in rows if r["trial"] == "1")


def test_a_rule_names_a_method_by_its_label_and_hits_that_entry_alone():
    """Two entries of one method told apart by `label`: a rule for the second fires in its
    sessions only, on the site side (behaviour) and the coordinator's (transform), and a label
    the scenario does not have is a validation error naming the field."""
    from protocol.sessions import join_session, method_session
    from transport.faults import FaultInjector, resolve_rules

    labels = ["fedcp_qq", "fedcp2_qq", "fedcp2_robust4"]
    specs = [{"action": "straggle", "sites": "all", "trials": "all", "phase": "respond", "method": "fedcp2_robust4",
              "direction": "up", "probability": 1.0, "seconds": 1.0, "mode": "bytes"},
             {"action": "drop", "sites": "all", "trials": "all", "phase": None, "method": "fedcp2_robust4",
              "direction": "down", "probability": 1.0, "seconds": 1.0, "mode": "bytes"}]
    rules = resolve_rules(specs, ["site-000"], 0, labels)
    site, coordinator = FaultInjector(rules, "site-000", 0), FaultInjector(rules, "coordinator", 0)
    for trial in (0, 3):
        assert site.behaviour(trial, "respond", method_session(trial, 2)) == ("straggle", 1.0)
        assert site.behaviour(trial, "respond", method_session(trial, 1)) is None  # same name, other label
        assert site.behaviour(trial, "join", join_session(trial)) is None
        assert coordinator.transform(b"x", 0.0, trial, "respond", method_session(trial, 2), "site-000") == []
        assert coordinator.transform(b"x", 0.0, trial, "respond", method_session(trial, 1), "site-000") != []
    raw = yaml.safe_load(TINY.read_text())
    raw.update(methods=METHODS, faults=[{"action": "crash", "method": "fedcp2_robust4"}])
    with pytest.raises(ValueError, match=r"faults\[0\]\.method.*fedcp_qq, centralized, fedcp2_qq"):
        validate_scenario(raw)
