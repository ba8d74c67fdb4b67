"""The communication ledger against the bytes the sockets actually carried."""

import time

import numpy as np
import pytest

from coordinator.driver import Coordinator, Deadlines
from coordinator.events import EventLog
from protocol.codecs import CODECS
from protocol.methods import METHODS
from protocol.wire import Envelope, encode
from sites.service import SiteService
from runner.processes import SiteHosts
from runner.report import communication
from tests.support import CountingProxy, trial_zero
from transport.channel import RouterChannel
from transport.ledger import Ledger, message_wire_bytes, null_handshake_bytes


@pytest.mark.parametrize("per_process", [1, 4], ids=["process-per-site", "one-host"])
def test_ledger_equals_the_bytes_relayed_by_a_tcp_proxy(tmp_path, per_process):
    """Byte for byte, per connection; in a host every site still has its own connection."""
    scenario, world = trial_zero(tmp_path)
    channel = RouterChannel("tcp://127.0.0.1:*")
    proxy = CountingProxy(int(channel.endpoint.rsplit(":", 1)[1]))
    proxy.start()
    sites = sorted(world.shards)
    procs = SiteHosts(sites, SiteService(f"tcp://127.0.0.1:{proxy.port}", str(tmp_path), policy={"non_private": "allow"}),
                      tmp_path, sites_per_process=per_process)
    ledger = Ledger(tmp_path / "ledger.csv")
    procs.start()
    try:
        coordinator = Coordinator(channel, EventLog(None), Deadlines(hello=30, join=30, respond=10), ledger)
        assert coordinator.await_members(sites) == sites
        sizes, _ = coordinator.open_trial(0, scenario["seed"], sites)
        for index, method in enumerate([METHODS["fedcp_qq"](0.1), METHODS["centralized"](0.1),
                                        METHODS["fedcp2_qq"](0.1, epsilon=2.0, bins={"count": 300, "lo": -3.0, "hi": 3.0})]):
            coordinator.run_method(0, index, method.for_trial(world.public), sizes)
        coordinator.shutdown()
        procs.stop()
        time.sleep(0.3)  # let the relay finish its last writes
    finally:
        procs.stop(timeout=0.1)
        channel.close()
    counted, relayed = proxy.compare(ledger)
    assert counted == relayed
    assert len(relayed) == len(sites) and len(procs.processes) == len(sites) // per_process
    assert (tmp_path / "ledger.csv").read_text().count("\n") == len(ledger.rows) + 1


def test_known_sizes_of_the_simple_codecs():
    def response(body, session=7, seq=2):
        return message_wire_bytes([len(encode(Envelope("response", session, "site-049", seq,
                                                      {"phase": "respond", "body": body})))])

    base = response(b"") - 2 - 2  # the envelope around an empty body: minus frame header and bin8 header
    assert base == 58  # including the 4-byte CRC trailer
    # msgpack body sizes: float64 = 1 + 8; fixint = 1; uint16 = 1 + 2; bin16 = 1 + 2 + data.
    # ZMTP frame header: 2 bytes up to 255 bytes, 9 beyond.
    assert response(CODECS["raw_quantile"]().encode(0.123)) == base + 9 + 2 == 69
    assert response(CODECS["exp_mech_bins"](100).encode(57)) == base + 1 + 2 == 61
    assert response(CODECS["exp_mech_bins"](1000).encode(999)) == base + 3 + 2
    assert response(CODECS["raw_scores"]().encode(np.zeros(40))) == base + 3 + 320 + 9
    assert response(CODECS["raw_scores"]().encode(np.zeros(1000))) == base + 3 + 8000 + 9


def test_handshake_sizes_follow_zmtp():
    assert null_handshake_bytes("DEALER", b"site-000") == 115
    assert null_handshake_bytes("ROUTER", b"") == 107


def test_information_bits():
    assert CODECS["raw_quantile"]().information_bits(1.0) == 64
    assert CODECS["raw_scores"]().information_bits(np.zeros(10)) == 640
    assert CODECS["exp_mech_bins"](100).information_bits(3) == 7
    assert CODECS["exp_mech_bins"](1024).information_bits(3) == 10


def test_communication_report_arithmetic():
    rows = []
    for trial in (0, 1):
        for site, up in (("a", 60), ("b", 70)):
            rows.append(dict(trial=trial, session=trial * 1000 + 1, method="qq", codec="raw_quantile",
                             phase="respond", site=site, direction="down", type="request", bytes=80,
                             info_bits=0, accepted=1))
            rows.append(dict(trial=trial, session=trial * 1000 + 1, method="qq", codec="raw_quantile",
                             phase="respond", site=site, direction="up", type="response", bytes=up,
                             info_bits=64, accepted=1))
    cost = communication(rows)["qq"]
    assert cost["bytes_up_per_site_mean"] == 65 and cost["bytes_up_per_site_max"] == 70
    assert cost["bytes_down_per_site_mean"] == 80
    assert cost["bytes_per_trial"] == 290 and cost["messages_per_trial"] == 4 and cost["rounds_per_trial"] == 1
    assert cost["info_bits_per_trial"] == 128
    assert cost["overhead_up"] == pytest.approx(8 * 260 / 256)


def test_a_ledger_written_before_ts_existed_keeps_its_columns_when_resumed(tmp_path):
    """A run started by an older Quorum and resumed by this one: rows append under the old
    header (no `ts`), so ledger.csv stays one readable table."""
    import csv as csvmodule

    from transport.ledger import LEDGER_COLUMNS, Ledger, read_ledger

    old = LEDGER_COLUMNS[:LEDGER_COLUMNS.index("ts")]  # a ledger from before times were kept
    path = tmp_path / "ledger.csv"
    path.write_text(",".join(old) + "\n" + ",".join(["0", "1", "m", "c", "respond", "site-000", "up", "response",
                                                     "20", "64", "1"]) + "\n")
    ledger = Ledger(path)
    ledger.record(site="site-001", direction="down", mtype="request", nbytes=30)
    ledger.flush()
    ledger.record(site="site-002", direction="down", mtype="request", nbytes=31)
    ledger.flush()
    rows = read_ledger(path)
    assert [r["site"] for r in rows] == ["site-000", "site-001", "site-002"]
    assert list(csvmodule.reader(open(path)))[0] == old and all(None not in r for r in rows)
    fresh = Ledger(tmp_path / "new.csv")
    fresh.record(site="site-000", direction="up", mtype="join", nbytes=9)
    fresh.flush()
    assert float(read_ledger(tmp_path / "new.csv")[0]["ts"]) > 1.7e9
