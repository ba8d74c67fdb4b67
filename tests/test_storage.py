"""Site storage: the model-loading slots that keep a hundred site processes from each holding a
large model at the same moment."""

from __future__ import annotations

import threading
import time

import numpy as np

import sites.storage as storage
from sites.storage import load_slots, model_slot, write_trial


def test_slots_fit_half_the_available_memory():
    assert load_slots(100, available=6000) == 10  # 3000 / (3 * 100)
    assert load_slots(10**9, available=10**9) == 1  # always at least one
    assert load_slots(1, available=10**12) == storage.MAX_SLOTS


def test_at_most_the_allowed_number_of_holders_at_once(tmp_path, monkeypatch):
    write_trial(tmp_path, 0, {"a model": 1}, {"site-000": (np.zeros((1, 1)), np.zeros(1))})
    monkeypatch.setattr(storage, "load_slots", lambda size: 2)
    holders, peak, lock = [0], [0], threading.Lock()

    def site():
        with model_slot(tmp_path, 0):  # separate flock'ed descriptions conflict, as across processes
            with lock:
                holders[0] += 1
                peak[0] = max(peak[0], holders[0])
            time.sleep(0.05)
            with lock:
                holders[0] -= 1

    threads = [threading.Thread(target=site) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert peak[0] == 2 and holders[0] == 0


def test_a_privacy_account_cut_short_by_a_crash_keeps_every_whole_record(tmp_path):
    from sites.storage import account_path, append_account, read_account

    records = [{"trial": 0, "session": s, "kind": "em", "epsilon": 0.5} for s in range(3)]
    append_account(tmp_path, "site-000", records[:2])
    append_account(tmp_path, "site-000", records[2:])
    whole = account_path(tmp_path, "site-000").read_bytes()
    account_path(tmp_path, "site-000").write_bytes(whole + whole[:7])  # a fourth record torn mid-write
    assert read_account(tmp_path, "site-000") == records


def test_accounts_live_in_shards_and_an_older_runs_account_stays_where_it_is(tmp_path):
    """Issue 40: a new account goes to privacy/XX/SITE.msgpack (XX: the id's CRC-32 mod 64);
    an account a run made before the shards (privacy/SITE.msgpack) is still the one read and
    appended to, so a resumed run never forgets what a site spent."""
    import shutil
    import zlib

    from sites.storage import ACCOUNT_SHARDS, account_path, append_account, read_account

    first, second = {"trial": 0, "session": 1, "kind": "em", "epsilon": 0.5}, {"trial": 1, "session": 9,
                                                                              "kind": "em", "epsilon": 0.5}
    append_account(tmp_path, "site-007", [first])
    shard = f"{zlib.crc32(b'site-007') % ACCOUNT_SHARDS:02x}"
    assert account_path(tmp_path, "site-007") == tmp_path / "privacy" / shard / "site-007.msgpack"
    assert read_account(tmp_path, "site-007") == [first]
    # an older run's layout: the account directly under privacy/
    legacy = tmp_path / "privacy" / "site-007.msgpack"
    shutil.move(tmp_path / "privacy" / shard / "site-007.msgpack", legacy)
    assert account_path(tmp_path, "site-007") == legacy and read_account(tmp_path, "site-007") == [first]
    append_account(tmp_path, "site-007", [second])
    assert read_account(tmp_path, "site-007") == [first, second]
    assert not (tmp_path / "privacy" / shard / "site-007.msgpack").exists()
