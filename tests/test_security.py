"""CurveZMQ: who may connect, who may speak for whom, and what it costs on the wire."""

import time

import pytest

import zmq

from coordinator.driver import Coordinator, Deadlines
from coordinator.events import EventLog
from protocol.methods import METHODS
from protocol.wire import Envelope, decode, encode
from sites.service import SiteService
from runner.processes import SiteHosts
from tests.support import CountingProxy, trial_zero
from transport.channel import RouterChannel
from transport.ledger import Ledger, handshake_bytes
from transport.security import generate_keys, load_client_keys, load_server_keys, secure_client

SITES = ["site-000", "site-001", "site-002", "site-003"]


def secure_coordinator(tmp_path, events_path=None, ledger=None):
    key_dir = generate_keys(tmp_path / "keys", SITES)
    channel = RouterChannel("tcp://127.0.0.1:*", keys=load_server_keys(key_dir, SITES))
    return key_dir, channel, Coordinator(channel, EventLog(events_path), Deadlines(hello=3, join=10, respond=5), ledger)


def dealer(endpoint, routing_id, keys=None):
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    if routing_id is not None:  # a peer may choose one; under CURVE the coordinator names it by its key
        socket.setsockopt(zmq.ROUTING_ID, routing_id.encode())
    if keys is not None:
        secure_client(socket, keys)
    socket.connect(endpoint)
    return socket


def hello(sender, seq=0):
    return encode(Envelope("hello", 0, sender, seq, {"pid": 1}))


def test_unknown_keys_and_plain_clients_cannot_join(tmp_path):
    key_dir, channel, coordinator = secure_coordinator(tmp_path, tmp_path / "events.jsonl")
    strangers = generate_keys(tmp_path / "stranger", ["site-000"])  # a valid-looking pair, not on the list
    forged = load_client_keys(strangers, "site-000")
    forged = type(forged)(load_client_keys(key_dir, "site-000").server_public, forged.public, forged.secret)
    intruders = [dealer(channel.endpoint, "site-000", forged), dealer(channel.endpoint, "site-001")]
    try:
        refused_before_sending = 0
        for socket in intruders:
            try:
                socket.send(hello(socket.getsockopt(zmq.ROUTING_ID).decode()), flags=zmq.NOBLOCK)
            except zmq.Again:  # the coordinator refused its handshake already (a loaded machine is slow
                refused_before_sending += 1  # to send): no connection is left to queue the hello on
        # nothing got through, whether the hellos were sent or refused at the handshake first
        assert coordinator.await_members(["site-000", "site-001"]) == [], refused_before_sending
        assert '"event": "hello"' not in (tmp_path / "events.jsonl").read_text()
        assert coordinator.ledger.rows == []  # not a byte reached the application
    finally:
        for socket in intruders:
            socket.close(0)
        channel.close()


def test_a_site_cannot_speak_for_another(tmp_path):
    key_dir, channel, coordinator = secure_coordinator(tmp_path, tmp_path / "events.jsonl")
    honest = dealer(channel.endpoint, "site-000", load_client_keys(key_dir, "site-000"))
    impostor = dealer(channel.endpoint, "site-002", load_client_keys(key_dir, "site-001"))  # site-001's key
    try:
        honest.send(hello("site-000"))
        impostor.send(hello("site-002"))
        assert coordinator.await_members(["site-000", "site-002"]) == ["site-000"]
        rejected = [row for row in coordinator.ledger.rows if not row["accepted"]]
        assert [row["site"] for row in rejected] == ["site-001"]  # named by its key
        log = (tmp_path / "events.jsonl").read_text()
        assert "authenticated as 'site-001' (by its key) sent as 'site-002'" in log
    finally:
        honest.close(0)
        impostor.close(0)
        channel.close()


@pytest.mark.parametrize("impostor_first", [True, False], ids=["impostor-first", "impostor-after"])
def test_identity_is_the_key_whoever_connects_first(tmp_path, impostor_first):
    """Issue 36, point 1: a peer holding site-001's key that calls itself site-002 (routing id
    and sender), connecting before or after the real site-002: refused naming both, and every
    message the coordinator sends site-002 reaches the real site-002 and never the impostor."""
    key_dir, channel, coordinator = secure_coordinator(tmp_path, tmp_path / "events.jsonl")

    def real():
        socket = dealer(channel.endpoint, None, load_client_keys(key_dir, "site-002"))
        socket.send(hello("site-002"))
        return socket

    def fake():
        socket = dealer(channel.endpoint, "site-002", load_client_keys(key_dir, "site-001"))
        socket.send(hello("site-002"))
        return socket

    first = fake() if impostor_first else real()
    time.sleep(0.3)
    second = real() if impostor_first else fake()
    honest, impostor = (second, first) if impostor_first else (first, second)
    try:
        assert coordinator.await_members(["site-002"]) == ["site-002"]
        coordinator.deadlines = Deadlines(hello=1, join=1, respond=1)
        assert coordinator.channel.send("site-002", "open", 0, {"trial": 0, "seed": 1}) is not None
        assert honest.poll(3000) and decode(honest.recv()).type == "open"
        assert not impostor.poll(500)  # nothing meant for site-002 reaches the peer with site-001's key
        coordinator.await_members(["site-002", "site-003"])  # reads what else came, until the 1 s deadline
        log = (tmp_path / "events.jsonl").read_text()
        assert "authenticated as 'site-001' (by its key) sent as 'site-002'" in log
    finally:
        honest.close(0)
        impostor.close(0)
        channel.close()


def test_curve_ledger_equals_the_encrypted_bytes_on_the_wire(tmp_path):
    scenario, world = trial_zero(tmp_path / "work")
    ledger = Ledger()
    key_dir, channel, coordinator = secure_coordinator(tmp_path, ledger=ledger)
    proxy = CountingProxy(int(channel.endpoint.rsplit(":", 1)[1]))
    proxy.start()
    procs = SiteHosts(SITES, SiteService(f"tcp://127.0.0.1:{proxy.port}", str(tmp_path / "work"), str(key_dir),
                                         policy={"non_private": "allow"}), tmp_path)
    procs.start()
    try:
        coordinator.deadlines = Deadlines(hello=30, join=30, respond=10)
        assert coordinator.await_members(SITES) == SITES
        sizes, _ = coordinator.open_trial(0, scenario["seed"], SITES)
        for index, method in enumerate([METHODS["fedcp_qq"](0.1), METHODS["centralized"](0.1)]):
            outcome = coordinator.run_method(0, index, method, sizes)
            assert outcome.status == "ok"
        coordinator.shutdown()
        procs.stop()
        time.sleep(0.3)
    finally:
        procs.stop(timeout=0.1)
        channel.close()
    counted, relayed = proxy.compare(ledger)
    assert counted == relayed
    assert handshake_bytes(True, "DEALER", b"site-000", client=True) == 610  # with its presence frame (35)
    assert handshake_bytes(True, "ROUTER", b"", client=False) == 301


def test_keys_and_runs_are_private_and_a_planted_key_directory_is_refused(tmp_path):
    """Issue 36, point 4: secret keys 0600 in a 0700 directory; a run directory and its shards
    closed to other users; a keys directory open to others, or not this user's, is refused with
    what to do."""
    import os
    import stat

    from runner.outputs import RunDirectory
    from tests.support import trial_zero
    from transport.security import KeyDirectoryError, private_key_directory

    keys = generate_keys(tmp_path / "keys", ["site-000"])
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in keys.glob("*.key_secret")} == {0o600}
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o755)
    os.chmod(planted, 0o755)
    with pytest.raises(KeyDirectoryError, match="chmod 700"):
        generate_keys(planted, ["site-000"])
    os.chmod(planted, 0o700)
    (planted / "site-000.key_secret").write_text("x")
    os.chmod(planted / "site-000.key_secret", 0o644)
    with pytest.raises(KeyDirectoryError, match="chmod 600"):
        private_key_directory(planted)
    if os.getuid() == 0:  # root can give a directory away, as another user would have planted it
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 4242, -1)
        with pytest.raises(KeyDirectoryError, match="belongs to uid 4242"):
            generate_keys(foreign, ["site-000"])
    run = RunDirectory(tmp_path / "runs" / "r1")
    assert stat.S_IMODE(run.path.stat().st_mode) == 0o700 and stat.S_IMODE(run.logs.stat().st_mode) == 0o700
    scenario, world = trial_zero(run.work)
    shards = [p for p in run.work.rglob("*") if p.is_file()]
    assert shards and all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in shards)


def test_two_sites_with_one_public_key_are_refused_when_the_allow_list_is_built(tmp_path):
    """Issue 47: an allow-list maps a key to one site id; a key file or a host's key shared by two
    sites once left one name silently, so either site could connect as the other. Now building
    the list fails, naming both sites: from key files, from the keys hosts sent, and when a host
    sends a key another site holds after the start."""
    import shutil

    import zmq
    from transport.security import DuplicateKeyError, SiteAuthenticator

    key_dir = generate_keys(tmp_path / "keys", SITES)
    shutil.copy(key_dir / "site-000.key", key_dir / "site-002.key")  # site-002 holds site-000's public key
    with pytest.raises(DuplicateKeyError, match="sites 'site-000' and 'site-002' have the same public key"):
        load_server_keys(key_dir, SITES)

    publics = {site: load_client_keys(key_dir, site).public for site in SITES}
    publics["site-003"] = publics["site-001"]  # what a host sent
    with pytest.raises(DuplicateKeyError, match="'site-001' and 'site-003'"):
        load_server_keys(key_dir, SITES, publics=publics)

    authenticator = SiteAuthenticator(zmq.Context.instance(), {publics["site-001"]: "site-001"})
    authenticator.allow(publics["site-001"], "site-001")  # the same site again: nothing new
    with pytest.raises(DuplicateKeyError, match="'site-001' and 'site-009'"):
        authenticator.allow(publics["site-001"], "site-009")
    assert set(authenticator.sites.values()) == {"site-001"}


def test_a_site_whose_key_a_peer_refused_never_blocks_its_host(tmp_path):
    """A DEALER whose handshake the peer refused has no connection, and libzmq never redials it:
    a blocking send there hung the whole site host (found on a fresh clone: one site missing
    from the shuffler's registry kept its two host-mates' sealed answers from ever leaving).
    send_raw returns at once, counting what it dropped, and the host's other channels go on."""
    import threading

    from transport.channel import DealerChannel
    from transport.security import ClientKeys

    key_dir, channel, _ = secure_coordinator(tmp_path)
    strangers = generate_keys(tmp_path / "stranger", ["site-000"])
    forged = load_client_keys(strangers, "site-000")
    refused = DealerChannel(channel.endpoint, "site-000",
                            keys=ClientKeys(load_client_keys(key_dir, "site-000").server_public, forged.public,
                                            forged.secret))
    honest = DealerChannel(channel.endpoint, "site-001", keys=load_client_keys(key_dir, "site-001"))
    done = threading.Event()

    def send_until_refused():  # in a thread: a send that blocks fails the test instead of hanging it
        until = time.monotonic() + 10
        while time.monotonic() < until and refused.dropped == 0:  # until the refusal has closed its pipe
            refused.send_raw([hello("site-000")])
            time.sleep(0.05)
        refused.send_raw([hello("site-000", 99)])
        done.set()

    try:
        deadline = time.monotonic() + 12
        threading.Thread(target=send_until_refused, daemon=True).start()
        assert done.wait(12.0), "send_raw blocked on a connection the peer refused"
        assert refused.dropped >= 2
        honest.send_raw([hello("site-001")])
        heard = None
        while time.monotonic() < deadline and heard is None:
            incoming = channel.receive(0.1)
            heard = incoming if incoming is not None and incoming.envelope is not None else None
        assert heard is not None and heard.envelope.sender == "site-001"
    finally:
        refused.close()
        honest.close()
        channel.close()
