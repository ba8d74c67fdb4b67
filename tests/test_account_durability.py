"""Issue 36, point 5: budgets that survive a crash.

A site's account is appended and fsync'ed record by record before the answer leaves. A writer
killed with SIGKILL mid-write leaves at most one cut record at the end, which the site ignores
(its answer never left) and cuts off before it appends again; a corrupt record anywhere makes
the site refuse to serve, naming the file, instead of forgetting what follows; a `trial`-scoped
budget is scoped by the data's fingerprint, not by the trial number the coordinator names.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from protocol.accounting import Budget, SiteAccount
from protocol.codecs import CODECS
from protocol.methods import RequestError
from sites.local import SiteLocal
from sites.storage import AccountCorrupt, account_path, read_account

ROOT = Path(__file__).resolve().parents[1]
WRITER = """
import sys
sys.path.insert(0, {root!r})
from sites.storage import append_account
i = 0
while True:
    append_account({work!r}, "site-0", [{{"trial": 0, "session": i, "method": "m", "kind": "dp", "epsilon": 0.1,
                                          "delta": 0.0, "model": "local", "data": "x" * (i % 5000), "key": b"",
                                          "reused": False, "reason": "", "body": None}}])
    i += 1
"""


def test_a_writer_killed_mid_write_leaves_a_readable_prefix(tmp_path):
    """Ten writers killed from outside at random moments: each time the account reads back as an
    unbroken run of records 0, 1, 2, ... (a cut last record dropped), and appending goes on."""
    rng = np.random.default_rng(0)
    seen, seen_bytes = 0, 0
    for round_ in range(10):
        writer = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), work=str(tmp_path))])
        started = time.monotonic()  # the writer has written records (however loaded the machine), then dies at random
        while not (account_path(tmp_path, "site-0").exists() and os.path.getsize(account_path(tmp_path, "site-0")) > seen_bytes + 4096):
            assert time.monotonic() - started < 60, "the writer wrote nothing in 60 s"
            time.sleep(0.01)
        time.sleep(float(rng.uniform(0, 0.3)))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        records = read_account(tmp_path, "site-0", repair=True)
        sessions = [r["session"] for r in records]
        # every writer counts from 0: the account is whole runs 0, 1, 2, ... with nothing lost between
        assert len(sessions) >= seen and sessions[0] == 0
        assert all(b == a + 1 or b == 0 for a, b in zip(sessions, sessions[1:]))
        assert sessions.count(0) == round_ + 1
        seen = len(sessions)
        seen_bytes = os.path.getsize(account_path(tmp_path, "site-0"))
        assert seen_bytes > 0
    assert seen > 10


def test_a_corrupt_record_makes_the_site_refuse_to_serve(tmp_path):
    rows = np.linspace(0.0, 1.0, 50)
    local = SiteLocal("site-0", tmp_path, policy={"non_private": "allow"})
    local.hold(0, 0, rows)
    body = CODECS["exp_mech_bins"]().wrap_request({"level": 0.5, "epsilon": 1.0, "bins": {"lo": 0, "hi": 1, "count": 8}})
    for session in range(3):
        local.answer(session, "fedcp2_qq", "respond", body)
    path = account_path(tmp_path, "site-0")
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 3] ^= 0xFF  # a flipped byte in the middle of the account
    path.write_bytes(bytes(blob))
    with pytest.raises(AccountCorrupt, match="byte"):
        read_account(tmp_path, "site-0")
    restarted = SiteLocal("site-0", tmp_path, policy={"non_private": "allow"})
    restarted.hold(0, 0, rows)
    with pytest.raises(RequestError, match="privacy account cannot be read: .*site-0.msgpack"):
        restarted.answer(3, "fedcp2_qq", "respond", body)


def test_a_trial_budget_follows_the_data_not_the_trial_number(tmp_path):
    """epsilon 1 per trial: the same data asked under trial numbers 0, 1, 2 (a coordinator that
    renames the trial) is one budget; new data is a new one."""
    budget = {"epsilon": 1.0, "composition": "basic"}
    body = CODECS["exp_mech_bins"]().wrap_request({"level": 0.5, "epsilon": 0.6, "bins": {"lo": 0, "hi": 1, "count": 8}})
    data = np.linspace(0.0, 1.0, 50)
    local = SiteLocal("site-0", tmp_path, budget=budget)
    local.hold(0, 0, data)
    local.answer(1, "fedcp2_qq", "respond", body)
    local.hold(1, 0, data)  # trial 1, the same data
    with pytest.raises(RequestError, match="privacy budget"):
        local.answer(1001, "fedcp2_qq", "respond", body)
    local.hold(2, 0, data + 5.0)  # fresh data (no record shared: data + 1 would share the value 1.0)
    local.answer(2001, "fedcp2_qq", "respond", body)
    account = SiteAccount(Budget(epsilon=1.0, composition="basic"), read_account(tmp_path, "site-0"))
    assert account.dp_events(0, account.records[0]["data"]) == [(0.6, 0.0)]
