"""A run as a timeline: who was asked what when, who answered, who dropped out and why.

`Timeline.of(run directory)` reads events.jsonl, ledger.csv (each message with its time) and
scenario.yaml, and gives the tracks (the coordinator, the shuffler, one per site), spans and
instants that both outputs draw:

  trace.json     the Trace Event Format (the JSON that Perfetto, ui.perfetto.dev, and
                 chrome://tracing open): one process for the run, a thread (track) for the
                 coordinator, the shuffler and each site; on a site's track a span per phase from
                 the request leaving the coordinator to the site's answer arriving (or its
                 dropout), named by the phase, its category the method's label, its arguments the
                 bytes each way and how it ended; under a scenario's network, inside it, a span per
                 message on the site's link ("down request", "up response", category "link") from
                 when it was handed to the link to its arrival; on the coordinator's track a span per trial, per
                 session and per phase; instants for every line of events.jsonl on the track it
                 concerns (dropouts, refusals, rejected messages, lost connections, scripted faults
                 the coordinator applied, joins, sessions), each carrying the line's fields and its
                 index in events.jsonl; an instant where a phase deadline passed with sites
                 missing; an instant where a scripted site-side fault (faults: in the scenario)
                 meets a request to that site; and a counter of the bytes up and down so far.
                 The process is named with where the run computed (scored on, model trained on,
                 sites trained on: runner.devices), and `otherData.devices` is summary.json's
                 `devices`.
  timeline.png   runner.timeline: one trial, sites on one axis and time on the other.

Times in trace.json are microseconds from the run's first record; `otherData.origin_unix_s`
gives that instant. What `Timeline.of` reads is made inert first (protocol.inert: a reason or a
plain-mode routing id a peer chose, even in an events.jsonl written before the event log did so),
so that neither output shows a peer's control characters or unbounded text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from protocol.inert import MAX_NAME_CHARS, inert, inert_all
from protocol.sessions import method_index
from runner.outputs import RunDirectory
from transport.faults import MESSAGE_ACTIONS, SITE_ACTIONS, resolve_rules
from transport.ledger import read_ledger
from world.trial import site_ids

COORDINATOR, SHUFFLER = "coordinator", "shuffler"
REQUESTS = {"open", "request"}  # what opens a phase at a site
ANSWERS = {"join", "response", "error", "sealed"}  # what closes it (sealed: through the shuffler)


@dataclass
class Span:
    track: str
    name: str
    start: float  # Unix seconds
    end: float
    category: str
    args: dict = field(default_factory=dict)


@dataclass
class Instant:
    track: str
    name: str
    ts: float
    category: str
    args: dict = field(default_factory=dict)


@dataclass
class Timeline:
    name: str
    tracks: list[str]
    spans: list[Span]
    instants: list[Instant]
    bytes_up: list[tuple[float, int]]  # (time, bytes received so far)
    bytes_down: list[tuple[float, int]]
    events: list[dict]
    shown: str = ""  # when a large run's site tracks were sampled: which (sampled_sites)
    #: where the run computed (summary.json's `devices`, runner.devices): {} before its summary is written
    devices: dict = field(default_factory=dict)

    @classmethod
    def of(cls, path: str | Path, max_sites: int | None = None) -> "Timeline":
        """The timeline of run directory `path`; with more than `max_sites` sites (default
        MAX_SITE_TRACKS), the site tracks are a sample (sampled_sites); the coordinator's
        spans and the byte counters still come from every message."""
        run = RunDirectory(path)
        scenario = run.read_scenario() or {}
        events = _read_events(run.events)
        rows = [_typed(r) for r in read_ledger(run.ledger) if r.get("ts")]
        count = scenario.get("sites", {}).get("count", 0)
        seen = {r["site"] for r in rows} | {e.get("site") for e in events}
        sites = sorted(set(site_ids(count)) | (seen - {None, COORDINATOR, SHUFFLER}))
        kept, shown = sampled_sites(sites, events, MAX_SITE_TRACKS if max_sites is None else max_sites)
        tracks = [COORDINATOR, SHUFFLER] + kept
        drawn, hidden = set(kept) | {SHUFFLER}, set(sites) - set(kept)
        site_rows = rows if not hidden else [r for r in rows if r["site"] in drawn]
        site_events = events if not hidden else [e for e in events if event_track(e) not in hidden]
        spans = site_spans(site_rows, site_events) + coordinator_spans(rows, events) + link_spans(site_rows)
        instants = (event_instants(site_events) + deadline_instants(events)
                    + scripted_fault_instants(site_rows, scenario))
        up, down = byte_counters(rows)
        return cls(scenario.get("name", Path(path).name), tracks, spans, instants, up, down, events, shown,
                   _read_devices(run.summary))

    def trials(self) -> list[int]:
        return sorted({s.args["trial"] for s in self.spans if isinstance(s.args.get("trial"), int)})

    def trial_window(self, trial: int) -> tuple[float, float] | None:
        window = [s for s in self.spans if s.track == COORDINATOR and s.category == "trial"
                  and s.args.get("trial") == trial]
        return (window[0].start, window[0].end) if window else None

    def troubled_trial(self) -> int:
        """The first trial with a dropout, refusal or fault (else the first trial): the one
        timeline.png shows unless told otherwise."""
        for trial in self.trials():
            start, end = self.trial_window(trial)
            if any(start <= i.ts <= end and i.category in ("dropout", "fault", "rejected") for i in self.instants):
                return trial
        return (self.trials() or [0])[0]


#: site tracks drawn at most (issue 40: 10,000 tracks made an unreadable timeline.png in 8 s and a
#: trace.json in 7 s); past this a sample is drawn, every troubled site in it
MAX_SITE_TRACKS = 500
TROUBLE = {"dropout", "fault", "rejected", "connection_lost", "lost", "refused"}


def sampled_sites(sites: list[str], events: list[dict], limit: int) -> tuple[list[str], str]:
    """At most `limit` of `sites` to draw, and a note saying so ("" when all are kept): every
    site some event of trouble names (dropouts, faults, rejected messages, lost connections),
    in order, then sites evenly spaced through the rest."""
    if len(sites) <= limit:
        return sites, ""
    known = set(sites)
    troubled = list(dict.fromkeys(e["site"] for e in events if e.get("event") in TROUBLE
                                  and isinstance(e.get("site"), str) and e["site"] in known))[:limit]
    rest = [s for s in sites if s not in set(troubled)]
    room = min(limit - len(troubled), len(rest))
    spaced = [rest[round(i * (len(rest) - 1) / max(room - 1, 1))] for i in range(room)] if room > 0 else []
    chosen = set(troubled) | set(spaced)
    kept = [s for s in sites if s in chosen]
    return kept, (f"{len(kept)} of {len(sites)} sites shown: all {len(troubled)} with a dropout, fault or rejected "
                  f"message, the rest evenly spaced")


def _read_devices(path: Path) -> dict:
    """summary.json's `devices` (inert: the scoring devices are the sites' words), or {}."""
    try:
        devices = json.loads(path.read_text()).get("devices")
    except (OSError, ValueError, AttributeError):
        return {}
    return inert_all(devices, MAX_NAME_CHARS * 4) if isinstance(devices, dict) else {}


def _read_events(path: Path) -> list[dict]:
    events = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                events.append(inert_all(json.loads(line)))
            except json.JSONDecodeError:  # a torn last line of a killed run
                continue
    return events


def _typed(row: dict) -> dict:
    number = (lambda v: int(v) if v not in ("", None) else None)
    ts = float(row["ts"])
    return {**row, "site": inert(row["site"], MAX_NAME_CHARS),  # a plain-mode peer's routing id, in an older ledger
            "trial": number(row["trial"]), "session": number(row["session"]), "bytes": int(row["bytes"]),
            "accepted": row["accepted"] == "1", "ts": ts, "sent": float(row.get("sent") or ts),
            "arrived": float(row.get("arrived") or ts)}


def link_spans(rows: list[dict]) -> list[Span]:
    """A span per message on an emulated link (a scenario's network), on its site's track, from
    when it was handed to the link to when the link delivered it: "down request", "up response"..."""
    return [Span(row["site"], f"{row['direction']} {row['type']}", row["sent"], row["arrived"], "link",
                 {"trial": row["trial"], "bytes": row["bytes"], "link": row.get("link", ""), "phase": row["phase"],
                  "seconds": round(row["arrived"] - row["sent"], 6)})
            for row in rows if row["arrived"] > row["sent"] and row["site"] != SHUFFLER]


def site_spans(rows: list[dict], events: list[dict]) -> list[Span]:
    """A span per request a site was sent, from the request to its answer, its dropout, or the
    end of the phase (whichever the records hold)."""
    answers: dict[tuple, list[dict]] = {}
    for row in rows:
        if row["direction"] == "up" and row["type"] in ANSWERS:
            answers.setdefault((row["session"], row["phase"], row["site"]), []).append(row)
    dropouts = {(e.get("session"), e.get("phase"), e.get("site")): e for e in events if e["event"] == "dropout"}
    phase_end: dict[tuple, float] = {}
    for row in rows:
        key = (row["session"], row["phase"])
        phase_end[key] = max(phase_end.get(key, row["ts"]), row["ts"])
    spans = []
    for row in rows:
        if row["direction"] != "down" or row["type"] not in REQUESTS or row["site"] == SHUFFLER:
            continue
        key = (row["session"], row["phase"], row["site"])
        answer = next((a for a in answers.get(key, []) if a["ts"] >= row["ts"]), None)
        dropout = dropouts.get(key)
        args = {"trial": row["trial"], "session": row["session"], "method": row["method"] or "join",
                "bytes_down": row["bytes"]}
        if answer is not None:
            end = answer["ts"]
            args.update(bytes_up=answer["bytes"], ended=_ending(answer))
        elif dropout is not None:
            end = dropout["ts"]
            args.update(ended="dropped", reason=dropout.get("reason", ""))
        else:
            end = phase_end[key[:2]]
            args.update(ended="no answer recorded")
        if dropout is not None and "reason" not in args:
            args["dropout"] = dropout.get("reason", "")
        spans.append(Span(row["site"], row["phase"], row["ts"], max(end, row["ts"]), row["method"] or "join", args))
    return spans


def _ending(answer: dict) -> str:
    if not answer["accepted"]:
        return "rejected"
    return {"error": "refused", "sealed": "answered through the shuffler"}.get(answer["type"], "answered")


def coordinator_spans(rows: list[dict], events: list[dict]) -> list[Span]:
    """Trials, sessions and phases on the coordinator's track, each inside the one before."""
    sessions = {}
    for e in events:
        if e["event"] in ("session_start", "session_end"):
            sessions.setdefault(e["session"], {})[e["event"]] = e
    session_spans = {}
    for number, pair in sessions.items():
        start, end = pair.get("session_start"), pair.get("session_end")
        if start is None:
            continue
        label = start.get("label", start["method"])
        args = {"trial": start["trial"], "session": number, "method": label}
        if end is not None:
            args.update(status=end["status"], rounds=end["rounds"], reason=end.get("reason", ""))
        stop = end["ts"] if end is not None else max([r["ts"] for r in rows if r["session"] == number] or [start["ts"]])
        session_spans[number] = Span(COORDINATOR, f"session {number}: {label}", start["ts"], stop,
                                     "session", args)
    phases: dict[tuple, list[float]] = {}
    labels = {}
    for row in rows:
        if row["session"] is None or row["phase"] in ("", "hello", "connect", "shutdown"):
            continue
        phases.setdefault((row["session"], row["phase"]), []).append(row["ts"])
        labels[(row["session"], row["phase"])] = (row["trial"], row["method"] or "join")
    for e in events:
        key = (e.get("session"), e.get("phase"))
        if e["event"] == "dropout" and key in phases:
            phases[key].append(e["ts"])
    spans = []
    for (session, phase), times in phases.items():
        start, end = min(times), max(times)
        outer = session_spans.get(session)
        if outer is not None:  # kept inside its session, so that the slices nest
            start, end = max(start, outer.start), min(end, outer.end)
        trial, method = labels[(session, phase)]
        spans.append(Span(COORDINATOR, phase, start, max(start, end), "phase",
                          {"trial": trial, "session": session, "method": method}))
    trials: dict[int, list[float]] = {}
    for span in spans + list(session_spans.values()):
        trials.setdefault(span.args["trial"], []).extend([span.start, span.end])
    for e in events:
        if e["event"] == "trial_open":
            trials.setdefault(e["trial"], []).append(e["ts"])
    trial_spans = [Span(COORDINATOR, f"trial {t}", min(v), max(v), "trial", {"trial": t})
                   for t, v in sorted(trials.items()) if t is not None]
    return trial_spans + list(session_spans.values()) + spans


def event_track(event: dict) -> str:
    """The track an events.jsonl record belongs on."""
    who = event.get("site") or event.get("peer")
    if event["event"].startswith("shuffler_") or who == SHUFFLER:
        return SHUFFLER
    return who if isinstance(who, str) and who.startswith("site-") else COORDINATOR


def event_instants(events: list[dict]) -> list[Instant]:
    """Every line of events.jsonl, on its track, with its fields and its index in the file."""
    out = []
    for index, e in enumerate(events):
        kind = e["event"]
        name, category = kind, kind
        if kind == "dropout":
            name = f"dropout: {_why(e.get('reason', ''))}"
        elif kind == "rejected":
            name = "rejected message"
        elif kind == "fault":
            name, category = f"fault: {e.get('action')}", "fault"
        elif kind == "connection_lost":
            category = "dropout"
        args = {key: value for key, value in e.items() if key not in ("ts", "event")}
        out.append(Instant(event_track(e), name, e["ts"], category, {"event": kind, "event_index": index, **args}))
    return out


def _why(reason: str) -> str:
    for marker, short in (("deadline", "deadline"), ("refused", "refused"), ("connection lost", "connection lost"),
                          ("not connected", "not connected"), ("undecodable", "undecodable"),
                          ("shuffler", "shuffler")):
        if marker in reason:
            return short
    return reason.split(":")[0][:40] or "no reason"


def deadline_instants(events: list[dict]) -> list[Instant]:
    """Where a phase's deadline passed with sites still missing: on the coordinator's track."""
    passed: dict[tuple, Instant] = {}
    for e in events:
        if e["event"] == "dropout" and "deadline" in e.get("reason", ""):
            key = (e.get("session"), e.get("phase"))
            if key not in passed:
                passed[key] = Instant(COORDINATOR, f"deadline passed: {e.get('phase')}", e["ts"], "deadline",
                                      {"session": e.get("session"), "phase": e.get("phase"), "missing": [],
                                       "reason": e.get("reason", "")})
            passed[key].args["missing"].append(e.get("site"))
    return list(passed.values())


def scripted_fault_instants(rows: list[dict], scenario: dict) -> list[Instant]:
    """The scenario's site-side faults (a site's behaviour, or its own messages hit) where they
    meet a request sent to that site: the site applies them when it handles that request (with
    `probability` below 1, it may not)."""
    if not scenario.get("faults"):
        return []
    labels = [m["label"] for m in scenario["methods"]]
    rules = [r for r in resolve_rules(scenario["faults"], site_ids(scenario["sites"]["count"]), scenario["seed"], labels)
             if r.direction == "up" and (r.action in SITE_ACTIONS or r.action in MESSAGE_ACTIONS)]
    out = []
    for row in rows:
        if row["direction"] != "down" or row["type"] not in REQUESTS:
            continue
        for rule in rules:
            if rule.applies(row["trial"], row["phase"], row["session"], row["site"]):
                chance = "" if rule.probability >= 1 else f" (p={rule.probability:g})"
                out.append(Instant(row["site"], f"scripted {rule.action}{chance}", row["ts"], "fault", {
                    "rule": rule.index, "action": rule.action, "trial": row["trial"], "phase": row["phase"],
                    "method": labels[method_index(row["session"])] if method_index(row["session"]) is not None
                    else "join", "probability": rule.probability, "where": "site side, scripted in faults"}))
    return out


def byte_counters(rows: list[dict]) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
    """Bytes received and sent by the coordinator's socket so far, one point per millisecond
    in which any moved."""
    series = {"up": [], "down": []}
    total = {"up": 0, "down": 0}
    for row in sorted(rows, key=lambda r: r["ts"]):
        direction = row["direction"]
        total[direction] += row["bytes"]
        points = series[direction]
        tick = round(row["ts"], 3)
        if points and points[-1][0] == tick:
            points[-1] = (tick, total[direction])
        else:
            points.append((tick, total[direction]))
    return series["up"], series["down"]


# -- the Trace Event Format ---------------------------------------------------------------------


def trace_events(timeline: Timeline) -> dict:
    """The JSON object trace.json holds (Trace Event Format, JSON object form)."""
    times = ([s.start for s in timeline.spans] + [i.ts for i in timeline.instants]
             + [t for t, _ in timeline.bytes_up + timeline.bytes_down])
    origin = min(times, default=0.0)
    us = (lambda t: round((t - origin) * 1e6, 1))
    tid = {track: number for number, track in enumerate(timeline.tracks, start=1)}
    where = ""
    if timeline.devices:  # the process is named with where the run computed
        from runner.devices import devices_words

        where = f" ({devices_words(timeline.devices)})"
    out = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": f"Quorum run {timeline.name}{where}"}}]
    for track, number in tid.items():
        out.append({"ph": "M", "pid": 1, "tid": number, "name": "thread_name", "args": {"name": track}})
        out.append({"ph": "M", "pid": 1, "tid": number, "name": "thread_sort_index", "args": {"sort_index": number}})
    order = {"trial": 0, "session": 1, "phase": 2}  # outer before inner at equal start times
    for span in sorted(timeline.spans, key=lambda s: (tid[s.track], s.start, order.get(s.category, 3), -s.end)):
        out.append({"ph": "X", "pid": 1, "tid": tid[span.track], "name": span.name, "cat": span.category,
                    "ts": us(span.start), "dur": round((span.end - span.start) * 1e6, 1), "args": span.args})
    for instant in sorted(timeline.instants, key=lambda i: i.ts):
        out.append({"ph": "i", "s": "t", "pid": 1, "tid": tid.get(instant.track, tid[COORDINATOR]),
                    "name": instant.name, "cat": instant.category, "ts": us(instant.ts), "args": instant.args})
    ups, downs = dict(timeline.bytes_up), dict(timeline.bytes_down)
    up = down = 0
    for t in sorted(set(ups) | set(downs)):
        up, down = ups.get(t, up), downs.get(t, down)
        out.append({"ph": "C", "pid": 1, "name": "bytes at the coordinator's socket", "ts": us(t),
                    "args": {"up": up, "down": down}})
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"run": timeline.name, "origin_unix_s": origin, "events": len(timeline.events),
                          "source": "events.jsonl, ledger.csv, scenario.yaml",
                          **({"devices": timeline.devices} if timeline.devices else {}),
                          **({"sites_shown": timeline.shown} if timeline.shown else {})}}


def write_trace(timeline: Timeline, target: str | Path) -> Path:
    """Write trace.json (the Trace Event Format) for `timeline` to `target`."""
    target = Path(target)
    target.write_text(json.dumps(trace_events(timeline), allow_nan=False, default=str))
    return target
