"""Issue 47, point 6: untrusted strings stay inert.

A site chooses some of the text Quorum shows (its device at join, the reason of its error, in
plain mode its routing id). Wherever that text is shown, in events.jsonl, the CSV tables,
summary.json, trace.json, timeline.png and the terminal report, it is one bounded line of
printable characters and never markup: a site cannot forge a line, move the cursor, recolour
the terminal, or stop a report or a plot with malformed markup."""

from __future__ import annotations

import csv
import io
import json
import threading

import msgpack
import numpy as np
import pytest
import zmq

from protocol.inert import MAX_SHOWN_CHARS, inert, inert_all, plot_label

#: what a hostile site would like to see printed: a forged line, ANSI escapes (clear the screen,
#: red), rich markup (a forged line in bold red, and markup that does not parse), a bidirectional
#: override, a Unicode line separator, a lone surrogate, mathtext
HOSTILE = ("refused\nsite-009 joined the run\r\x1b[2J\x1b[31m[bold red]ALL SITES OK[/bold red] [/] "
           "\u202eevil\u2028next\ud800 $\\frac{a}{$")
#: as much of it as UTF-8, and so the wire, can carry (no lone surrogate)
SENT = HOSTILE.replace("\ud800", "")


def all_strings(value):
    """Every string inside a JSON-like value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from all_strings(key)
            yield from all_strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from all_strings(item)


def assert_inert(value, limit=MAX_SHOWN_CHARS):
    for text in all_strings(value):
        assert text.isprintable(), repr(text)
        assert len(text) <= limit


# -- the helper ---------------------------------------------------------------------------------


def test_inert_makes_one_bounded_printable_line_and_keeps_what_was_said():
    shown = inert(HOSTILE)
    assert shown.isprintable() and "\n" not in shown and "\x1b" not in shown
    assert shown.startswith("refused\\nsite-009 joined the run\\r\\x1b[2J\\x1b[31m[bold red]")
    assert "\\u202eevil\\u2028next\\ud800" in shown
    assert inert("site-001 ok") == "site-001 ok"  # plain text is left as it is
    assert inert("x" * 5000) == "x" * (MAX_SHOWN_CHARS - 3) + "..."
    assert len(inert("\n" * 5000, 100)) == 100  # bounded after escaping
    assert inert("\n" * 10, None) == "\\n" * 10
    assert inert(3.5) == "3.5" and inert(b"\x00") == "b'\\x00'"
    assert inert(inert(HOSTILE)) == inert(HOSTILE)  # idempotent: applying it twice is harmless


def test_inert_all_reaches_every_string_and_keys_and_leaves_numbers():
    value = {"reason": HOSTILE, HOSTILE: [HOSTILE, 1, 2.5, None, (HOSTILE, True)], "n": 3}
    out = inert_all(value)
    assert_inert(out)
    assert out["n"] == 3 and out[inert(HOSTILE)][1:4] == [1, 2.5, None]


def test_plot_labels_are_never_mathtext():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = plot_label("site-$\\frac{$")
    assert label == "site-\\$\\frac{\\$"
    fig, ax = plt.subplots()
    ax.set_title(label)
    ax.set_yticks([0])
    ax.set_yticklabels([plot_label(HOSTILE)])
    fig.canvas.draw()  # "$\\frac{$" unescaped raises ValueError here (a mathtext parse error)
    plt.close(fig)


# -- the outputs --------------------------------------------------------------------------------


def test_events_jsonl_holds_one_line_per_event_and_nothing_a_terminal_acts_on(tmp_path):
    from coordinator.events import EventLog

    log = EventLog(tmp_path / "events.jsonl")
    log.write("dropout", site="site-001", reason=HOSTILE)
    log.write("rejected", peer=HOSTILE, reason="x" * 10_000, dropped={HOSTILE: HOSTILE}, devices=[HOSTILE])
    log.close()
    raw = (tmp_path / "events.jsonl").read_text()
    assert raw.count("\n") == 2 and raw.isascii()
    events = [json.loads(line) for line in raw.splitlines()]
    assert_inert(events)
    assert events[0]["reason"] == inert(HOSTILE)


def test_csv_tables_and_the_ledger_start_no_line_a_peer_chose(tmp_path):
    from runner.outputs import RunDirectory, csv_cell
    from transport.ledger import Ledger, read_ledger

    assert csv_cell(HOSTILE) == inert(HOSTILE, None)
    run = RunDirectory(tmp_path / "run")
    run.write_attacks([{"trial": 0, "method": "m", "attack": "a", "reasons": HOSTILE, "finding": HOSTILE}])
    assert len(run.attacks.read_text().splitlines()) == 2  # a header and one row, read line by line
    ledger = Ledger(tmp_path / "ledger.csv")
    ledger.record(site=HOSTILE, direction="up", mtype="malformed", nbytes=10)  # a plain-mode routing id
    ledger.flush()
    assert len((tmp_path / "ledger.csv").read_text().splitlines()) == 2
    assert_inert(read_ledger(tmp_path / "ledger.csv"))


def summary_of(devices, attacks=()):
    """A run's summary, as much as the terminal report reads."""
    return {"methods": {}, "alpha": 0.1, "communication": {}, "network": {},
            "heterogeneity": {"sites": {"site-000": {"n": 10}, "site-001": {"n": 10}}, "kind": "none",
                              "spread": None, "proposition_34_tv": None},
            "site_devices": devices, "placement": None,
            "privacy": {"budget": {"epsilon": None, "delta": 1e-6, "scope": "trial", "composition": "basic",
                                   "kanon_releases": 1},
                        "epsilon_composed_max": 0.0, "non_private_max": 0, "kanon_tables_max": 0, "refused": 0,
                        "reused": 0, "noise": "os"},
            "attacks": list(attacks)}


def test_the_terminal_report_shows_a_sites_words_and_never_acts_on_them():
    """rich reads markup in a plain string: a site's device "[bold red]ALL SITES OK[/bold red]"
    printed a forged line in bold red, "[/]" stopped the report with a MarkupError. Now every
    line is rich Text holding the inert words."""
    from rich.console import Console
    from rich.text import Text

    from runner.report import run_report

    attack = {"attack": "fabricated_table", "method": "m", "trial": 0, "answered": 1, "refused": 1,
              "finding": "", "reasons": f"1 x refused: {HOSTILE}"}
    shown = run_report(summary_of(["cpu", HOSTILE], [attack]))
    lines = [item for item in shown if not hasattr(item, "columns")]  # the tables are ours
    assert lines and all(isinstance(line, Text) for line in lines)
    assert all(not line.spans for line in lines)  # no style came from any text
    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor", width=10_000)
    for item in shown:
        console.print(item)
    out = console.file.getvalue()
    assert "[bold red]ALL SITES OK[/bold red] [/]" in out  # shown as it was written
    assert "\x1b[2J" not in out and "\x1b[31m" not in out  # the site's own escapes never reach the terminal
    plain = Console(file=io.StringIO(), width=10_000)
    for item in shown:
        plain.print(item)
    text = plain.file.getvalue()
    assert not any(line.startswith("site-009") for line in text.splitlines())  # no forged line
    assert text.count("site-009 joined the run") == 2  # where it was said, on the sites' and attack's lines


def test_summary_json_holds_the_inert_words(tmp_path):
    from runner.outputs import RunDirectory

    run = RunDirectory(tmp_path / "run")
    written = run.write_summary({"site_devices": ["cpu", HOSTILE], "attacks": [{"reasons": HOSTILE}],
                                 "seconds": 1.5})
    on_disk = json.loads(run.summary.read_text())
    assert on_disk == written and on_disk["seconds"] == 1.5
    assert_inert(on_disk)


def test_trace_json_and_timeline_png_from_an_events_file_a_peer_shaped(tmp_path):
    """Even an events.jsonl written before the event log made strings inert (or edited since):
    what Timeline.of reads is inert, trace.json holds no control character, and timeline.png
    draws a site whose plain-mode name is mathtext."""
    from runner.timeline import draw_timeline
    from runner.trace import Timeline, trace_events

    site = "site-$\\frac{$\n"
    run = tmp_path / "run"
    run.mkdir()
    events = [{"ts": 100.0, "event": "trial_open", "trial": 0, "session": 0, "devices": [HOSTILE]},
              {"ts": 100.5, "event": "dropout", "site": site, "session": 0, "phase": "join", "reason": HOSTILE},
              {"ts": 101.0, "event": "rejected", "peer": HOSTILE, "reason": HOSTILE}]
    (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    timeline = Timeline.of(run)
    trace = trace_events(timeline)
    assert_inert(trace)
    assert any(e.get("args", {}).get("reason") == inert(HOSTILE) for e in trace["traceEvents"])
    assert inert(site) in timeline.tracks
    draw_timeline(timeline, 0, tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0


# -- over real sockets --------------------------------------------------------------------------


class HostileSite(threading.Thread):
    """A site that answers `open` with what it likes: raw bytes, past what `encode` would send."""

    def __init__(self, endpoint, site_id, answer):
        super().__init__(daemon=True)
        self.endpoint, self.site_id, self.answer = endpoint, site_id, answer
        self.stop = threading.Event()

    def run(self):
        from protocol.wire import Envelope, decode, encode, seal

        socket = zmq.Context.instance().socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.ROUTING_ID, self.site_id.encode())
        socket.connect(self.endpoint)
        socket.send(encode(Envelope("hello", 0, self.site_id, 0, {"pid": 1})))
        while not self.stop.is_set():
            if not socket.poll(50):
                continue
            envelope = decode(socket.recv())
            if envelope.type == "open":
                payload = self.answer(envelope)
                mtype = "join" if "device" in payload else "error"
                socket.send(seal(msgpack.packb({"v": 1, "t": mtype, "s": envelope.session, "f": self.site_id,
                                                        "n": 1, "p": payload}, use_bin_type=True)))
        socket.close()


def test_a_sites_device_and_reason_reach_the_run_inert(tmp_path):
    """A device in rich markup is refused by the wire (a rejected message, then a dropout of the
    join); a refusal's reason full of control characters is kept, inert, in the dropout and in
    events.jsonl, one line per event."""
    from coordinator.driver import Coordinator, Deadlines
    from coordinator.events import EventLog
    from tests.support import FakeSite, stop_fakes
    from transport.channel import RouterChannel

    channel = RouterChannel("tcp://127.0.0.1:*")
    coordinator = Coordinator(channel, EventLog(tmp_path / "events.jsonl"), Deadlines(hello=10, join=3, respond=3))
    honest = FakeSite(channel.endpoint, "site-000", np.random.default_rng(0).standard_normal(20))
    hostile = [HostileSite(channel.endpoint, "site-001", lambda env: {"n": 20, "device": "[bold red]cpu[/]"}),
               HostileSite(channel.endpoint, "site-002", lambda env: {"phase": "join", "reason": SENT})]
    for site in [honest, *hostile]:
        site.start()
    try:
        members = coordinator.await_members(["site-000", "site-001", "site-002"])
        sizes, dropped = coordinator.open_trial(0, 0, members)
    finally:
        stop_fakes([honest, *hostile])
        channel.close()
    assert sizes == {"site-000": 20} and coordinator.devices == {"site-000": "cpu"}
    assert dropped["site-002"] == f"refused: {inert(SENT)}"
    assert "no answer within the join deadline" in dropped["site-001"]
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert_inert(events)
    rejected = [e for e in events if e["event"] == "rejected"]
    assert any("join: field 'device' must match" in e["reason"] for e in rejected)
    opened = next(e for e in events if e["event"] == "trial_open")
    assert opened["devices"] == ["cpu"]
