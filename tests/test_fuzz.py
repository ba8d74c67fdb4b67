"""Malformed messages at a live coordinator and at a live site process: neither crashes nor
hangs, every message is accounted for, and valid traffic afterwards still works.

`make test` throws 2,000 at each (the same properties, a few seconds each); the 10,000-message
runs (about 25 s each) are marked slow (`make test-all`), as is a site process's run in a host
(docs/testing.md, "What runs where")."""

import itertools
import math
import threading
import time

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator.driver import Coordinator, Deadlines
from coordinator.events import EventLog
from protocol.methods import METHODS
from protocol.wire import PROTOCOL_VERSION, seal
from tests.support import one_live_site, start_fakes, stop_fakes
from transport.channel import RouterChannel

#: malformed messages per run: 2,000 in `make test`, 10,000 with the slow tests
EXAMPLES = [2_000, pytest.param(10_000, marks=pytest.mark.slow)]


def fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


leaves = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.binary(max_size=12))
trees = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=4), inner, max_size=4)),
                     max_leaves=8)


@st.composite
def envelopes(draw, types):
    """Envelope-shaped maps with one field damaged, a field missing or added, or a wild payload."""
    env = {"v": PROTOCOL_VERSION, "t": draw(st.sampled_from(types)), "s": draw(st.integers(0, 5000)),
           "f": draw(st.sampled_from(["site-000", "coordinator", "site-9", "x y"])),
           "n": draw(st.integers(0, 50)), "p": draw(trees)}
    change = draw(st.sampled_from(["value", "drop", "add", "payload", "none"]))
    key = draw(st.sampled_from(list(env)))
    if change == "value":
        env[key] = draw(trees)
    elif change == "drop":
        env.pop(key)
    elif change == "add":
        env[draw(st.text(max_size=3))] = draw(trees)
    return env


def malformed(types):
    packed = st.one_of(trees, envelopes(types)).map(lambda obj: msgpack.packb(obj, use_bin_type=True))
    return st.one_of(st.binary(max_size=200), packed, packed.map(seal),
                     packed.map(seal).map(lambda b: b[: max(1, len(b) // 2)]))


@pytest.mark.parametrize("examples", EXAMPLES)
def test_a_live_coordinator_survives_thousands_of_malformed_messages(tmp_path, examples):
    """2,000 malformed messages in `make test`, 10,000 with the slow tests."""
    channel = RouterChannel("tcp://127.0.0.1:*")
    coordinator = Coordinator(channel, EventLog(None), Deadlines(hello=10, join=10, respond=5))
    rogue = zmq.Context.instance().socket(zmq.DEALER)
    rogue.setsockopt(zmq.ROUTING_ID, b"site-9")  # an id the fuzzed envelopes also use, not a real site's
    rogue.setsockopt(zmq.LINGER, 0)
    rogue.connect(channel.endpoint)
    stop = threading.Event()

    def serve():  # the coordinator's receive loop, as it runs between and within phases
        while not stop.is_set():
            coordinator._receive(time.monotonic() + 0.2)

    worker = threading.Thread(target=serve, daemon=True)
    worker.start()
    sent = []

    @fuzz(examples)
    @given(malformed(["hello", "join", "response", "error", "open", "launch"]))
    def throw(data):
        rogue.send(data)
        sent.append(data)

    throw()
    deadline = time.time() + 60
    while len(coordinator.ledger.rows) < len(sent) and time.time() < deadline:
        time.sleep(0.05)
    stop.set()
    worker.join(5)
    rogue.close(0)
    assert len(sent) >= examples and not worker.is_alive()
    assert len(coordinator.ledger.rows) == len(sent)  # every message received and accounted for
    assert sum(row["accepted"] for row in coordinator.ledger.rows) <= sum(b"hello" in d for d in sent)
    fakes = start_fakes(channel.endpoint, 3, 20)  # valid traffic afterwards
    try:
        members = coordinator.await_members([f.site_id for f in fakes])
        sizes, _ = coordinator.open_trial(0, 0, members)
        outcome = coordinator.run_method(0, 0, METHODS["fedcp_qq"](0.1), sizes)
        assert outcome.status == "ok" and outcome.details["answered"] == 3 and math.isfinite(outcome.threshold)
    finally:
        stop_fakes(fakes)
        channel.close()


# the in-a-host case parses with the same code as the own-process one; it runs in `make test-all`
# (slow) to keep `make test` under its 12 minutes
@pytest.mark.parametrize("examples", EXAMPLES)
@pytest.mark.parametrize("host_mates", [0, pytest.param(1, marks=pytest.mark.slow)], ids=["own-process", "in-a-host"])
def test_a_live_site_process_survives_thousands_of_malformed_messages(tmp_path, host_mates, examples):
    """2,000 malformed messages in `make test`, 10,000 with the slow tests. In a host, the fuzzed
    agent's host-mate is untouched: it answers the valid traffic after."""
    scenario, world, channel, procs = one_live_site(tmp_path, host_mates)
    sites = sorted(world.shards)[: 1 + host_mates]
    stop = threading.Event()
    replies = []
    try:
        coordinator = Coordinator(channel, EventLog(None), Deadlines(hello=30, join=30, respond=10))
        assert sorted(coordinator.await_members(sites)) == sites

        def drain():  # the site answers some of it (errors); keep its outgoing queue moving
            while not stop.is_set():
                incoming = channel.receive(0.1)
                if incoming is not None:
                    replies.append(incoming)

        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        sent, set_aside = [], []

        @fuzz(examples)
        @given(malformed(["open", "request", "close", "shutdown", "hello", "boom"]))
        def throw(data):
            if b"shutdown" in data:  # a well-formed shutdown would legitimately end the site
                set_aside.append(data)
                return
            channel.socket.send_multipart([b"site-000", data])
            sent.append(data)

        throw()
        time.sleep(2.0)
        stop.set()
        drainer.join(5)
        # hypothesis ran its examples; the few that could spell a shutdown were set aside (how many
        # varies a little with how hypothesis spends its budget, e.g. on a loaded machine)
        assert len(sent) + len(set_aside) >= examples * 0.99
        assert len(sent) >= examples * 0.85, (len(sent), len(set_aside))
        process = "site-000" if not host_mates else "host-000"
        assert procs.processes[process].is_alive()
        log = (tmp_path / f"{process}.log").read_text()
        assert log.count("rejected a message") >= len(sent) * 0.9
        assert "site-001" not in "".join(line for line in log.splitlines(keepends=True) if "rejected" in line)
        coordinator.membership.guard.forget("site-000")  # the site's replies to the fuzz advanced its sequence
        # Well-formed fuzz envelopes "from the coordinator" (seq <= 50) are, to the site, genuine
        # and advanced its replay guard: the real coordinator continues after them.
        channel._seq = itertools.count(51)
        for reply in replies:
            if reply.envelope is not None:
                coordinator.membership.guard.check(reply.envelope)
        sizes, _ = coordinator.open_trial(0, scenario["seed"], sites)  # valid traffic afterwards
        assert sizes == {site: len(world.shards[site][1]) for site in sites}
        outcome = coordinator.run_method(0, 0, METHODS["centralized"](0.1), sizes)
        assert outcome.status in ("ok", "infinite") and outcome.details["pooled"] == sum(sizes.values())
        coordinator.shutdown()
    finally:
        stop.set()
        procs.stop()
        channel.close()
    assert procs.exit_codes() == {process: 0}
