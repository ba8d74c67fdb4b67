"""What the sites hold for a trial, on their host's disk: their calibration rows and the trial's model.

The layout is defined here only; the harness writes with these functions and sites read with
them. All sites' rows of a trial are in one pair of arrays, so that a host serving a thousand
sites maps two files instead of opening a thousand; `read_rows` maps them read-only and a site
takes nothing but its own slice (and the shared model).

    WORKDIR/trial-0003/model.pkl
    WORKDIR/trial-0003/X.npy, y.npy     (every site's calibration rows, site after site)
    WORKDIR/trial-0003/ids.npy          (each row's record identity, protocol.accounting.record_ids)
    WORKDIR/trial-0003/rows.json        ({site id: [first row, end row]} into X and y)
    WORKDIR/locks/load-N                (model_slot's lock files)
    WORKDIR/privacy/site-007.msgpack    (site-007's privacy account: every release it made, appended
                                         as it is made, so that a restarted site keeps counting)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import pickle
import shutil
import struct
import time
import uuid
import zlib
from contextlib import contextmanager
from pathlib import Path

import msgpack
import numpy as np

_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True) if ctypes.util.find_library("c") else None


def trial_dir(workdir: str | Path, trial: int) -> Path:
    return Path(workdir) / f"trial-{trial:04d}"


def rows_path(workdir, trial: int) -> Path:
    return trial_dir(workdir, trial) / "rows.json"


def model_path(workdir, trial: int) -> Path:
    return trial_dir(workdir, trial) / "model.pkl"


def write_trial(workdir, trial: int, model, shards: dict[str, tuple[np.ndarray, np.ndarray]],
                records: dict[str, np.ndarray] | None = None) -> None:
    """Write the model and every site's rows (and `records`: each row's record identity, which
    keys the site's budget; None: each row is identified by its own values); each file
    atomically (temporary file, then rename), the row index last, so that a reader who finds
    rows.json finds the arrays it indexes."""
    directory = trial_dir(workdir, trial)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    _atomic_write(model_path(workdir, trial), pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL))
    sites = list(shards)
    bounds = np.cumsum([0] + [len(shards[s][1]) for s in sites]).tolist()
    columns = [("X", [np.asarray(shards[s][0]) for s in sites]), ("y", [np.asarray(shards[s][1]) for s in sites])]
    if records is not None:
        columns.append(("ids", [np.asarray(records[s], dtype=np.uint64) for s in sites]))
    else:  # no stale identities from an earlier write of this trial
        (directory / "ids.npy").unlink(missing_ok=True)
    for name, arrays in columns:
        target = directory / f"{name}.npy"
        tmp = _private_temp(target, ".npy")
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as handle:
            np.save(handle, np.concatenate(arrays) if arrays else np.zeros(0), allow_pickle=False)
        os.replace(tmp, target)
    index = {site: [bounds[i], bounds[i + 1]] for i, site in enumerate(sites)}
    _atomic_write(rows_path(workdir, trial), json.dumps(index).encode())


def read_rows(workdir, trial: int) -> tuple[np.ndarray, np.ndarray, dict[str, list[int]]]:
    """The trial's X and y, memory-mapped read-only, and the row index {site: [start, end]}."""
    directory = trial_dir(workdir, trial)
    index = json.loads(rows_path(workdir, trial).read_bytes())
    return np.load(directory / "X.npy", mmap_mode="r"), np.load(directory / "y.npy", mmap_mode="r"), index


def read_record_ids(workdir, trial: int) -> np.ndarray | None:
    """Each row's record identity (ids.npy, memory-mapped), or None when the trial has none."""
    path = trial_dir(workdir, trial) / "ids.npy"
    return np.load(path, mmap_mode="r") if path.exists() else None


def read_model(workdir, trial: int):
    # The model file is written by this run's own harness (see write_trial), never received.
    with open(model_path(workdir, trial), "rb") as handle:
        return pickle.load(handle)


MODEL_MEMORY_FACTOR = 3  # memory a loaded model takes, per byte of its pickle, with head room
MAX_SLOTS = 64


def load_slots(model_bytes: int, available: int | None = None) -> int:
    """How many processes of this host may hold a model of `model_bytes` at once: as many as
    fit in half the memory available now (at least one)."""
    if available is None:
        available = available_memory()
    if available is None:
        return MAX_SLOTS
    return int(max(1, min(MAX_SLOTS, available // 2 // max(1, MODEL_MEMORY_FACTOR * model_bytes))))


@contextmanager
def model_slot(workdir, trial: int):
    """Hold one of the host's model-loading slots (an flock'ed file under WORKDIR/locks).

    Every site process on a host loads the trial's model at the same moment; a forest of a few
    hundred MB times a hundred sites would swap the host to a halt. Sites queue here instead
    and free the model before they leave the slot."""
    slots = load_slots(model_path(workdir, trial).stat().st_size)
    locks = Path(workdir) / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    while True:
        for index in range(slots):
            fd = os.open(locks / f"load-{index}", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        time.sleep(0.02)


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


#: account files are spread over this many directories, `privacy/XX/SITE.msgpack` (XX: the site
#: id's CRC-32 mod ACCOUNT_SHARDS, in hex): ten site hosts creating 10,000 accounts in one
#: directory queued on its lock, spinning: 8.3 s of CPU and 6.7 s of wall time where 64
#: directories take 0.9 s and 0.5 s (issue 40: that was most of a 10,000-site secure sum's first phase)
ACCOUNT_SHARDS = 64


def account_path(workdir, site_id: str) -> Path:
    """A site's privacy account; one a run made before accounts were sharded stays where it is."""
    privacy = Path(workdir) / "privacy"
    legacy = privacy / f"{site_id}.msgpack"
    if legacy.exists():
        return legacy
    return privacy / f"{zlib.crc32(site_id.encode()) % ACCOUNT_SHARDS:02x}" / f"{site_id}.msgpack"


class AccountCorrupt(RuntimeError):
    """A privacy account that cannot be read whole: the site serves nothing until its operator
    acts (fail closed), since a budget that forgot a release could be spent twice."""


#: each record's header: its length, its CRC-32 and the header's own CRC-32 (of the first 8
#: bytes), big-endian, then the msgpack record
FRAME = struct.Struct(">III")


def _frame(body: bytes) -> bytes:
    head = struct.pack(">II", len(body), zlib.crc32(body))
    return head + struct.pack(">I", zlib.crc32(head)) + body


def read_account(workdir, site_id: str, repair: bool = False) -> list[dict]:
    """The records of a site's privacy account (protocol.accounting.SiteAccount), [] if none yet.
    The file is a sequence of framed records (FRAME), appended and fsync'ed one release at a time
    before the answer leaves. A last record cut short by a crash mid-write (a header cut short, or
    a sound header whose record runs past the end of the file) was never acknowledged: it is
    ignored, and with `repair` (the site itself, before it appends) cut off the file. Anything else
    that does not read (a bad checksum in a header or a record) raises AccountCorrupt, naming the
    file and the byte, instead of forgetting what follows (issue 36)."""
    path = account_path(workdir, site_id)
    if not path.exists():
        return []
    blob = path.read_bytes()
    records: list[dict] = []
    at = 0
    while at < len(blob):
        torn = len(blob) - at < FRAME.size
        if not torn:
            size, crc, head_crc = FRAME.unpack_from(blob, at)
            if zlib.crc32(blob[at:at + 8]) != head_crc:
                raise AccountCorrupt(f"{path}: the record header at byte {at} is corrupt ({len(blob) - at} bytes "
                                     f"from there); the site refuses to serve until its operator restores the "
                                     f"file from a backup or removes it knowingly")
            torn = at + FRAME.size + size > len(blob)
        if torn:  # the last write never completed: its answer never left
            if repair:
                os.truncate(path, at)
            break
        body = blob[at + FRAME.size:at + FRAME.size + size]
        if zlib.crc32(body) != crc:
            raise AccountCorrupt(f"{path}: the record at byte {at} fails its checksum; the site refuses to "
                                 f"serve until its operator restores the file from a backup or removes it knowingly")
        try:
            records.append(msgpack.unpackb(body, raw=False))
        except Exception as exc:  # a checksummed record that does not decode: written by something else
            raise AccountCorrupt(f"{path}: the record at byte {at} does not decode ({exc})") from None
        at += FRAME.size + size
    return records


def append_account(workdir, site_id: str, records: list[dict], commit: "GroupCommit | None" = None) -> None:
    """Append new records to a site's account and make them durable (write, flush, fsync; the
    directory fsync'ed when the file is new) before the answer they account for may leave
    (cost: the new records only, however long the account). With `commit` (a site host's group
    commit) the records are written now and made durable by the host's next `commit.flush()`,
    which the answer waits for."""
    if not records:
        return
    path = account_path(workdir, site_id)
    new_shard = not path.parent.is_dir()
    if new_shard:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    new = not path.exists()
    data = memoryview(b"".join(_frame(msgpack.packb(record, use_bin_type=True)) for record in records))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        while data:
            data = data[os.write(fd, data):]
        if commit is None:
            os.fsync(fd)
    finally:
        os.close(fd)
    if commit is not None:
        commit.written(path, new, new_shard)
    elif new:
        _fsync_directory(path.parent)
        if new_shard:  # the shard's own entry (once per shard and run)
            _fsync_directory(path.parent.parent)


class GroupCommit:
    """Durability for many sites' accounts at once (issue 40): a site host writes the records of
    all the answers it is about to send, makes them durable together, and only then lets the
    answers go, through the actions `after` queued. A few files are fsync'ed one by one (as
    without a group commit); from SYNCFS_FROM files on, one `syncfs(2)` of their file system
    makes all of them durable (where the C library has it): 20 ms against 200 ms of fsyncs for
    1,000 files here. No answer leaves before the release it accounts for is on disk."""

    SYNCFS_FROM = 16

    def __init__(self) -> None:
        self._paths: dict[Path, bool] = {}  # written since the last flush -> whether the file is new
        self._new_directories: set[Path] = set()  # made since the last flush: their entries need a sync
        self._actions: list = []

    @property
    def pending(self) -> bool:
        return bool(self._paths)

    def written(self, path: Path, new: bool = False, new_directory: bool = False) -> None:
        """`path` was written (`new`: created; `new_directory`: in a directory made for it)."""
        self._paths[path] = self._paths.get(path, False) or new
        if new_directory:
            self._new_directories.add(path.parent)

    def after(self, action) -> None:
        """Run `action()` once what was written so far is durable (at once when nothing waits)."""
        if self.pending:
            self._actions.append(action)
        else:
            action()

    def flush(self) -> list:
        """Make everything written durable, then run the waiting actions; their results."""
        if len(self._paths) >= self.SYNCFS_FROM and _LIBC is not None and hasattr(_LIBC, "syncfs"):
            by_device: dict[int, Path] = {}  # one syncfs per file system, however many directories
            for directory in sorted({path.parent for path in self._paths}):
                by_device.setdefault(os.stat(directory).st_dev, directory)
            for directory in by_device.values():
                _sync_file_system(directory)
        else:
            for path in self._paths:
                _fsync_path(path)
            for directory in sorted({path.parent for path, new in self._paths.items() if new}):
                _fsync_directory(directory)
            for directory in sorted({directory.parent for directory in self._new_directories}):
                _fsync_directory(directory)
        self._paths.clear()
        self._new_directories.clear()
        actions, self._actions = self._actions, []
        return [action() for action in actions]


def _sync_file_system(directory: Path) -> None:
    """Every write to `directory`'s file system durable (syncfs), the directory entries included;
    OSError when the kernel reports a write error."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        if _LIBC.syncfs(fd) != 0:
            raise OSError(ctypes.get_errno(), f"syncfs of {directory} failed")
    finally:
        os.close(fd)


def _fsync_path(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    _fsync_path(directory)


def remove_trial(workdir, trial: int) -> None:
    shutil.rmtree(trial_dir(workdir, trial), ignore_errors=True)


def _atomic_write(path: Path, blob: bytes) -> None:
    """Write `blob` to `path` atomically, the file readable by its owner only (0600)."""
    tmp = _private_temp(path, ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(blob)
    os.replace(tmp, path)


def _private_temp(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}{suffix}")
