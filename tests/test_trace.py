"""trace.json and timeline.png (issue 24, point 4): a scripted fault run over site processes,
checked against what was scripted and against events.jsonl and ledger.csv line by line."""

from __future__ import annotations

import csv
import json

import pytest

import quorum
from runner.trace import COORDINATOR, SHUFFLER, Instant, Span, Timeline
from runner.timeline import draw_timeline
from tests.support import TINY

# pytest-xdist (make test runs on several workers): one traced run serves the module
pytestmark = pytest.mark.xdist_group("test_trace")

FAULTS = [
    {"action": "crash", "sites": "site-001", "trials": 1, "phase": "respond", "method": "robust"},
    {"action": "straggle", "sites": "site-002", "trials": 0, "phase": "respond", "method": "fedcp_qq"},
    {"action": "drop", "sites": "site-003", "trials": 0, "phase": "respond", "method": "centralized",
     "direction": "down"},
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    scenario = quorum.load_scenario(TINY, {
        "trials": 2, "faults": FAULTS, "runtime.deadlines": {"hello": 30, "join": 10, "respond": 1.5},
        "methods": [{"name": "fedcp_qq"}, {"name": "centralized"},
                    {"name": "fedcp_qq", "label": "robust", "dropouts": 1}]})
    return quorum.run(scenario, tmp_path_factory.mktemp("traced") / "run")


def by_phase(trace: dict, ph: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def test_the_trace_is_trace_event_format_with_a_track_per_party(run):
    trace = json.loads((run.path / "trace.json").read_text())
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["run"] == "tiny"
    assert {e["ph"] for e in trace["traceEvents"]} == {"M", "X", "i", "C"}
    names = {e["args"]["name"]: e["tid"] for e in by_phase(trace, "M") if e["name"] == "thread_name"}
    assert set(names) == {COORDINATOR, SHUFFLER, "site-000", "site-001", "site-002", "site-003"}
    for event in trace["traceEvents"]:
        assert event["pid"] == 1 and isinstance(event["name"], str)
        if event["ph"] in ("X", "i", "C"):
            assert event["ts"] >= 0
        if event["ph"] == "X":
            assert event["dur"] >= 0 and "cat" in event
        if event["ph"] == "i":
            assert event["s"] == "t" and event["tid"] in names.values()
    for tid in names.values():  # slices on one track nest or follow each other: Perfetto draws them
        spans = sorted(((e["ts"], e["ts"] + e["dur"]) for e in by_phase(trace, "X") if e["tid"] == tid),
                       key=lambda span: (span[0], -span[1]))
        open_ = []
        for start, end in spans:
            while open_ and open_[-1] <= start + 0.2:
                open_.pop()
            assert not open_ or end <= open_[-1] + 0.2, (tid, start, end, open_)
            open_.append(end)


def test_every_event_of_events_jsonl_appears_on_its_track(run):
    trace = run.trace
    lines = [json.loads(line) for line in (run.path / "events.jsonl").read_text().splitlines()]
    instants = {e["args"]["event_index"]: e for e in by_phase(trace, "i") if "event_index" in e["args"]}
    assert sorted(instants) == list(range(len(lines)))
    tracks = {e["tid"]: e["args"]["name"] for e in by_phase(trace, "M") if e["name"] == "thread_name"}
    origin = trace["otherData"]["origin_unix_s"]
    for index, line in enumerate(lines):
        instant = instants[index]
        assert instant["args"]["event"] == line["event"]
        assert instant["ts"] == pytest.approx((line["ts"] - origin) * 1e6, abs=1.0)
        if line.get("site", "").startswith("site-"):
            assert tracks[instant["tid"]] == line["site"]
        assert {k: v for k, v in line.items() if k not in ("ts", "event")}.items() <= instant["args"].items()


def test_a_span_per_phase_per_site_from_request_to_answer(run):
    trace = run.trace
    tracks = {e["tid"]: e["args"]["name"] for e in by_phase(trace, "M") if e["name"] == "thread_name"}
    origin = trace["otherData"]["origin_unix_s"]
    spans = {(tracks[e["tid"]], e["name"], round(e["ts"])): e for e in by_phase(trace, "X")}
    rows = list(csv.DictReader(open(run.path / "ledger.csv")))
    requests = [r for r in rows if r["direction"] == "down" and r["type"] in ("open", "request")]
    assert len(requests) == 2 * 4 * 4 - 1  # two trials, four sites, a join and three methods; one dropped
    for r in requests:
        span = spans[(r["site"], r["phase"], round((float(r["ts"]) - origin) * 1e6))]
        assert span["cat"] == (r["method"] or "join") and span["args"]["bytes_down"] == int(r["bytes"])
        answer = [a for a in rows if a["direction"] == "up" and (a["session"], a["phase"], a["site"]) ==
                  (r["session"], r["phase"], r["site"]) and a["type"] in ("join", "response", "error")]
        if answer:
            end = (float(answer[0]["ts"]) - origin) * 1e6
            assert span["ts"] + span["dur"] == pytest.approx(end, abs=1.0)
            assert span["args"]["bytes_up"] == int(answer[0]["bytes"])
    up = sum(int(r["bytes"]) for r in rows if r["direction"] == "up")
    down = sum(int(r["bytes"]) for r in rows if r["direction"] == "down")
    counters = by_phase(trace, "C")
    assert counters[-1]["args"] == {"up": up, "down": down}
    assert all(a["args"]["up"] <= b["args"]["up"] and a["args"]["down"] <= b["args"]["down"]
               for a, b in zip(counters, counters[1:]))


def test_what_was_scripted_is_where_it_was_scripted(run):
    trace = run.trace
    tracks = {e["tid"]: e["args"]["name"] for e in by_phase(trace, "M") if e["name"] == "thread_name"}
    marks = [(tracks[e["tid"]], e["name"], e["args"]) for e in by_phase(trace, "i")]
    crash = [a for t, name, a in marks if t == "site-001" and name == "scripted crash"]
    assert [(a["trial"], a["phase"], a["method"], a["rule"]) for a in crash] == [(1, "respond", "robust", 0)]
    straggle = [a for t, name, a in marks if t == "site-002" and name == "scripted straggle"]
    assert [(a["trial"], a["method"]) for a in straggle] == [(0, "fedcp_qq")]
    dropped = [a for t, name, a in marks if t == "site-003" and name == "fault: drop"]
    assert len(dropped) == 1 and dropped[0]["trial"] == 0  # applied by the coordinator: an events.jsonl line
    deadline = [a for t, name, a in marks if t == COORDINATOR and name.startswith("deadline passed")]
    assert {s for a in deadline for s in a["missing"]} >= {"site-002"}
    assert any(t == "site-002" and name == "dropout: deadline" for t, name, _ in marks)
    assert any(t == "site-001" and name.startswith("dropout") and a.get("session") == 1003 for t, name, a in marks)
    robust = [json.loads(line) for line in (run.path / "events.jsonl").read_text().splitlines()]
    assert not any(e["event"] == "dropout" and e.get("site") == "site-001" and e.get("session") in (1000, 1001, 1002)
                   for e in robust)  # the crash waited for its method: the label named it


def test_timeline_png_shows_the_troubled_trial_and_redraws_any(run, tmp_path):
    assert (run.path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Timeline.of(run.path).troubled_trial() == 0  # trial 0 has the straggler and the dropped request
    png = run.timeline(trial=1, out=tmp_path / "t1.png")
    assert png.stat().st_size > 10_000
    with pytest.raises(ValueError, match="trial 7 is not in this run"):
        run.timeline(trial=7, out=tmp_path / "t7.png")


@pytest.mark.parametrize("sites", [10, 1000])
def test_the_timeline_draws_ten_and_a_thousand_sites(tmp_path, sites):
    """A synthetic run of three phases per site with a dropout every 97th site: the figure keeps
    its size, labels a bounded number of rows, and renders."""
    import matplotlib.image

    names = [f"site-{i:04d}" for i in range(sites)]
    spans = [Span(COORDINATOR, "trial 0", 0.0, 3.0, "trial", {"trial": 0}),
             Span(COORDINATOR, "session 1: m", 1.0, 3.0, "session", {"trial": 0, "method": "m"})]
    instants = []
    for i, site in enumerate(names):
        spans.append(Span(site, "join", 0.0, 0.5 + i / sites, "join", {"trial": 0}))
        spans.append(Span(site, "respond", 1.0, 1.2 + (i % 7) / 10, "m", {"trial": 0}))
        if i % 97 == 3:
            instants.append(Instant(site, "dropout: deadline", 2.5, "dropout", {"event": "dropout"}))
    timeline = Timeline("synthetic", [COORDINATOR, SHUFFLER, *names], spans, instants, [], [], [])
    png = draw_timeline(timeline, 0, tmp_path / "t.png")
    height, width = matplotlib.image.imread(png).shape[:2]
    assert width == 1320 and height <= 1100
