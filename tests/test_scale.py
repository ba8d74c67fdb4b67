"""Issue 40: lean at scale, with nothing changed in what a run computes or guarantees.

The harness holds no site's secret key (each host makes its sites' pairs in memory); the ZAP
handler that replaced pyzmq's authenticator still refuses every key not on the allow-list, and a
secure socket with no handler refuses rather than admits; a host's group commit lets no answer
leave before the account record it follows is on disk; the ledger sums a session's bytes as it
flushes instead of holding every row; the timeline of a large run draws a sample of its sites,
every troubled one among them; and a run this machine cannot hold is refused before anything is
written, naming each limit.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest
import yaml
import zmq

from runner import limits as machine_limits
from runner.study import run_study
from runner.trace import sampled_sites
from sites import storage
from sites.storage import GroupCommit, account_path, append_account, read_account
from scenarios.scenario import validate_scenario
from tests.support import TINY
from tests.test_hosts import events_of, scenario
from transport.ledger import Ledger, read_ledger
from transport.security import (SiteAuthenticator, ZAP_ENDPOINT, read_site_publics, secure_client, secure_server,
                                ServerKeys, ClientKeys, new_key_pair)


def test_a_local_run_keeps_no_site_secret_and_records_the_public_keys_its_hosts_sent(tmp_path):
    out = tmp_path / "run"
    run_study(scenario(3, count=7, trials=1), out)
    secrets = sorted(p.name for p in out.rglob("*.key_secret"))
    assert secrets == ["coordinator.key_secret"]  # the harness's own pair only (a shuffler makes its own)
    publics = read_site_publics(out / "keys")
    assert sorted(publics) == [f"site-{i:03d}" for i in range(7)] and len(set(publics.values())) == 7
    keys = next(e for e in events_of(out) if e["event"] == "keys")
    assert keys["made_by"] == "site hosts (local processes)" and keys["sites"] == 7
    assert len([e for e in events_of(out) if e["event"] == "hello"]) == 7  # every site admitted by its key


def curve_router(context, sites=None):
    public, secret = new_key_pair()
    router = context.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    secure_server(router, ServerKeys(public, secret, sites or {}))
    router.bind("tcp://127.0.0.1:*")
    return router, public


def knock(context, router, server_public, keys, timeout_s=2.0):
    """Connect with `keys` and say hello; the site id the ROUTER's ZAP named the sender by, or None
    when nothing came through."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    secure_client(dealer, ClientKeys(server_public, *keys))
    dealer.connect(router.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        dealer.send(b"hello", flags=zmq.NOBLOCK)
    except zmq.Again:  # the handshake was refused first: no connection to queue the hello on
        dealer.close(0)
        return None
    try:
        if not router.poll(int(timeout_s * 1000)):
            return None
        frames = router.recv_multipart(copy=False)
        return frames[1].get("User-Id")
    finally:
        dealer.close(0)


def test_the_zap_handler_names_allowed_keys_refuses_others_and_no_handler_admits_no_one():
    context = zmq.Context()
    try:
        allowed, stranger = new_key_pair(), new_key_pair()
        router, server_public = curve_router(context)
        authenticator = SiteAuthenticator(context, {allowed[0]: "site-007"})
        authenticator.start()
        assert knock(context, router, server_public, allowed) == "site-007"
        assert knock(context, router, server_public, stranger, timeout_s=1.0) is None
        late = new_key_pair()
        authenticator.allow(late[0], "site-008")  # a key a host made and sent after the start
        assert knock(context, router, server_public, late) == "site-008"
        authenticator.stop()
        # no handler bound any more: even an allow-listed key is refused, never admitted unnamed
        assert knock(context, router, server_public, allowed, timeout_s=1.0) is None
        router.close(0)
        assert authenticator.reply([b"1.0", b"7", b"quorum", b"", b"", b"PLAIN", b"u", b"p"])[2] == b"400"
        assert authenticator.reply([b"0.9", b"7"])[2] == b"500"
    finally:
        context.term()


def test_a_host_answer_waits_for_its_account_to_be_durable(tmp_path, monkeypatch):
    order = []
    monkeypatch.setattr(storage, "_sync_file_system", lambda directory: order.append(("syncfs", directory.name)))
    monkeypatch.setattr(storage, "_fsync_path", lambda path: order.append(("fsync", Path(path).name)))
    commit = GroupCommit()
    commit.after(lambda: order.append("nothing written: at once"))
    record = {"trial": 0, "session": 1, "method": "m", "kind": "dp", "epsilon": 0.1}
    for site in ("site-0", "site-1"):
        append_account(tmp_path, site, [record], commit)
        commit.after(lambda site=site: order.append(f"answer of {site}"))
    assert order == ["nothing written: at once"] and commit.pending
    assert read_account(tmp_path, "site-1") == [record]  # written already, durable at the flush
    commit.flush()  # two files: each fsync'ed, their new directory entries too, then both answers
    shards = sorted({account_path(tmp_path, site).parent.name for site in ("site-0", "site-1")})
    assert order[1:] == [("fsync", "site-0.msgpack"), ("fsync", "site-1.msgpack"),
                         *[("fsync", shard) for shard in shards], ("fsync", "privacy"),  # the new shards' entries
                         "answer of site-0", "answer of site-1"]
    del order[:]
    for site in range(GroupCommit.SYNCFS_FROM):  # many files: one syncfs of their file system
        append_account(tmp_path, f"site-{site}", [record], commit)
    commit.after(lambda: order.append("answers"))
    commit.flush()
    if storage._LIBC is not None and hasattr(storage._LIBC, "syncfs"):  # one, whatever the shards
        assert len(order) == 2 and order[0][0] == "syncfs"
    assert order[-1] == "answers" and not commit.pending
    append_account(tmp_path, "site-99", [record])  # no group commit: fsync'ed at once, as before
    assert account_path(tmp_path, "site-99").exists()


def test_group_commit_makes_many_records_durable_with_the_real_sync(tmp_path):
    commit = GroupCommit()
    for site in range(50):
        append_account(tmp_path, f"site-{site}", [{"session": site}], commit)
    sent = []
    commit.after(lambda: sent.append(True))
    commit.flush()  # the real syncfs (or an fsync of each file where the C library lacks it)
    assert sent == [True] and [r["session"] for r in read_account(tmp_path, "site-49")] == [49]


def test_the_ledger_sums_each_session_as_it_flushes_without_holding_rows(tmp_path):
    ledger = Ledger(tmp_path / "ledger.csv", keep_rows=False)
    ledger.context = {"trial": 0, "session": 1, "method": "a", "codec": "c", "phase": "respond"}
    for site in range(5):
        ledger.record(site=f"site-{site}", direction="down", mtype="request", nbytes=100 + site)
        row = ledger.record(site=f"site-{site}", direction="up", mtype="response", nbytes=50)
        row["phase"] = "respond"
    ledger.context = {"trial": 1, "session": 1001, "method": "a", "codec": "c", "phase": "respond"}
    ledger.record(site="site-0", direction="up", mtype="response", nbytes=7)
    ledger.flush()
    assert ledger.rows == []
    assert ledger.session_wire(0, "a") == {("respond", "down"): 510, ("respond", "up"): 250}
    assert ledger.session_wire(1, "a") == {("respond", "up"): 7} and ledger.session_wire(2, "a") == {}
    on_disk = read_ledger(tmp_path / "ledger.csv")
    assert sum(int(r["bytes"]) for r in on_disk if r["trial"] == "0") == 760 and len(on_disk) == 11


def test_a_large_timeline_draws_a_sample_with_every_troubled_site():
    sites = [f"site-{i:05d}" for i in range(10_000)]
    events = [{"event": "dropout", "site": "site-04321"}, {"event": "hello", "site": "site-00001"},
              {"event": "connection_lost", "site": "site-09998"}]
    kept, note = sampled_sites(sites, events, 500)
    assert len(kept) == 500 == len(set(kept)) and kept == sorted(kept)
    assert {"site-04321", "site-09998", "site-00000", "site-09999"} <= set(kept)
    assert "500 of 10000 sites shown" in note and "all 2 with a dropout" in note
    gaps = [int(b[5:]) - int(a[5:]) for a, b in zip(kept, kept[1:])]
    assert max(gaps) <= 2 * 10_000 / 500  # evenly spread, not the first 500
    assert sampled_sites(sites[:20], events, 500) == (sites[:20], "")


def test_a_run_this_machine_cannot_hold_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 20_000))
    monkeypatch.setattr(machine_limits, "loopback_ports", lambda: 28_232)
    monkeypatch.setattr(machine_limits, "available_memory", lambda: 24 * 2**30)
    run = dict(shuffled=False, sites_per_process="auto", local_sites=True, bind="tcp://127.0.0.1:*")
    found = machine_limits.limits(50_000, **run)
    # descriptors (a site each, the spare, a pipe to each of 25 hosts while they start), loopback ports
    assert [limit.needed for limit in found] == [50_001 + 256 + 2 * 25, 50_001]  # 25 hosts of 2,000
    assert machine_limits.limits(19_000, **run) == []
    assert machine_limits.most_sites_here(**run) == 19_723  # s + 1 + 256 + 2 ceil(s / 2000) <= 20,000
    # memory: each site's measured cost against what is available
    monkeypatch.setattr(machine_limits, "available_memory", lambda: 2 * 2**30)
    assert [limit.name.split(" ")[0] for limit in machine_limits.limits(19_000, **run)] == ["memory"]
    # sites on other machines need no loopback ports, and their hosts are not this machine's
    away = machine_limits.limits(25_000, **{**run, "local_sites": False, "bind": "tcp://0.0.0.0:*"})
    assert [limit.needed for limit in away] == [25_257]
    raw = yaml.safe_load(TINY.read_text())
    raw["sites"]["count"], raw["data"]["n"] = 50_000, 300_000  # the check comes before any row is made
    started = time.monotonic()
    with pytest.raises(machine_limits.MachineLimits, match=r"(?s)50,000 sites cannot run.*open files of the "
                                                            r"coordinator.*ulimit -Hn.*loopback ports.*at most about"):
        run_study(validate_scenario(raw), tmp_path / "big")
    assert not (tmp_path / "big").exists() and time.monotonic() - started < 30


def test_the_connection_floor_benchmark_hears_every_connection_with_and_without_curve():
    """bench/connection_floor.py, the floor docs/scale.md sets issue 40's start-up and memory goals
    against, on a handful of connections: every hello arrives, and each run reports its cost."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "connection_floor.py"
    spec = importlib.util.spec_from_file_location("connection_floor", path)
    floor = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floor)
    for curve in (False, True):
        run = floor.measure(24, 10, curve)
        assert run["heard"] == 24 and run["processes"] == 4
        assert run["security"] == ("curve" if curve else "plain")
        assert run["seconds_to_all_hellos"] > 0 and run["peak_memory_gib"] > 0
