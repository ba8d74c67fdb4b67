"""The phase table: what a phase admits, from whom, how often; and replay protection."""

from protocol.phases import PhaseCollector, SequenceGuard
from protocol.wire import Envelope


def msg(mtype="response", session=5, sender="a", seq=0, phase="respond"):
    payload = {"response": {"phase": phase, "body": 1.0}, "join": {"n": 3, "device": "cpu"}, "error": {"phase": phase, "reason": "no"},
               "hello": {"pid": 1}}[mtype]
    return Envelope(mtype, session, sender, seq, payload)


def test_accepts_one_answer_per_expected_site():
    c = PhaseCollector(5, "respond", frozenset({"a", "b"}))
    assert c.offer(msg(sender="a")) is None
    assert not c.complete and c.missing() == ["b"]
    assert c.offer(msg(sender="b", mtype="error")) is None
    assert c.complete and c.refusals == {"b": "no"} and list(c.answers) == ["a"]


def test_refusals_name_the_problem():
    c = PhaseCollector(5, "respond", frozenset({"a"}))
    assert "session 5 is open" in c.offer(msg(session=4))
    assert "not allowed in phase 'respond'" in c.offer(msg(mtype="join"))
    assert "not a member" in c.offer(msg(sender="z"))
    assert "while phase 'respond' is open" in c.offer(msg(phase="unmask"))
    assert "while phase 'respond' is open" in c.offer(msg(mtype="error", phase="join"))
    assert c.offer(msg()) is None
    assert "second answer" in c.offer(msg())


def test_join_phase_expects_join():
    c = PhaseCollector(0, "join", frozenset({"a"}))
    assert "expects 'join'" in c.offer(msg(session=0))
    assert c.offer(msg(mtype="join", session=0)) is None


def test_sequence_guard_rejects_replays():
    g = SequenceGuard()
    assert g.check(msg(seq=0)) is None
    assert g.check(msg(seq=2)) is None
    assert "replayed" in g.check(msg(seq=2))
    assert "replayed" in g.check(msg(seq=1))
    g.forget("a")
    assert g.check(msg(seq=0)) is None
