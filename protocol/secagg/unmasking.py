"""The server's last step of secure aggregation as independent jobs (Bonawitz et al. 2017, figure 4,
round 4 'Unmasking'): each survivor's self mask PRG(b_u), and each dropped site's pairwise masks
with its surviving neighbours, rebuilt from the unmask answers' Shamir shares and summed on Z_M.

The sum of the masks does not depend on the order the jobs run in (addition mod 2^bits), so a
large session splits them between this process and one worker on another core: at 10,000 sites
the coordinator rebuilt about 10,000 secrets and 28,000 pairwise masks on one core for 7-8 s
while every site host waited (issue 40). The total is the same bits either way; a job that fails
(shares that do not rebuild, a key that does not match its advertisement) is reported by the
first failing job in the jobs' order, whichever process ran it, so the reason is the same too.
A worker that cannot start or dies is no failure of the session: its jobs run here instead.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from protocol.secagg import primitives as crypto
from protocol.secagg.shamir import ShareError, reconstruct_secret

#: fewer jobs than this run here alone (starting a worker costs about 0.1 s; a job 0.5-2.5 ms)
PARALLEL_FROM = 2000
WORKER_GRACE_S = 30.0  # beyond three times our own share of the jobs, on top of this, a worker is given up


@dataclass(frozen=True)
class SelfMask:
    """A survivor's self mask: its seed b_u from the holders' shares {Shamir index: share}."""

    site: str
    shares: dict[int, int]


@dataclass(frozen=True)
class PairwiseMasks:
    """A dropped site d's masks with its surviving neighbours: its mask key s_d from the shares,
    checked against the public key it advertised, then agreed with each survivor's public key.
    `survivors`: (public key, sign) with sign +1 where y_u holds +PRG(s_ud), -1 where it holds minus."""

    site: str
    shares: dict[int, int]
    advertised: bytes
    survivors: tuple[tuple[bytes, int], ...]


@dataclass(frozen=True)
class Ring:
    """What every job needs: the threshold t, the vector length, the ring's bits, the session nonce
    and the request digest the survivors' mask keys are bound to (SecAggServer.context)."""

    threshold: int
    length: int
    bits: int
    nonce: int
    context: bytes = b""


def seed_bytes(secret: int) -> bytes:
    """A rebuilt 32-byte secret (a mask seed or an X25519 private key) as bytes."""
    if secret >= 1 << (8 * crypto.KEY_BYTES):
        raise ShareError("rebuilt secret is longer than 32 bytes")
    return secret.to_bytes(crypto.KEY_BYTES, "big")


def job_masks(job: SelfMask | PairwiseMasks, ring: Ring) -> np.ndarray:
    """The sum (mod 2^bits) of what `job` puts into the survivors' masked inputs, to be taken off
    their sum. ValueError (ShareError among them) with the reason when it cannot be rebuilt."""
    if isinstance(job, SelfMask):
        try:
            seed = reconstruct_secret(job.shares, ring.threshold)
            return crypto.mask_vector(seed_bytes(seed), ring.length, ring.bits)
        except ShareError as exc:
            raise ShareError(f"cannot remove the self mask of {job.site}: {exc}") from None
    try:
        key = crypto.private_from_bytes(seed_bytes(reconstruct_secret(job.shares, ring.threshold)))
    except (ShareError, ValueError) as exc:
        raise ValueError(f"cannot rebuild the mask key of dropped site {job.site}: {exc}") from None
    if crypto.public_bytes(key) != job.advertised:
        raise ValueError(f"the shares of dropped site {job.site}'s mask key rebuild a key that does not match "
                         f"the one it advertised")
    total = np.zeros(ring.length, dtype=np.uint64)
    for public, sign in job.survivors:
        mask = crypto.mask_vector(crypto.agree(key, public, b"mask", ring.nonce, ring.context), ring.length, ring.bits)
        total = (total + mask) if sign > 0 else (total - mask)
    return _reduce(total, ring.bits)


def run_jobs(jobs: list, ring: Ring) -> tuple[np.ndarray, tuple[int, str] | None]:
    """Sum of `jobs`' masks mod 2^bits, in order, up to the first that fails: (sum, None), or
    (partial sum, (its position in `jobs`, reason))."""
    total = np.zeros(ring.length, dtype=np.uint64)
    for position, job in enumerate(jobs):
        try:
            total = total + job_masks(job, ring)
        except ValueError as exc:
            return _reduce(total, ring.bits), (position, str(exc))
    return _reduce(total, ring.bits), None


def masks_total(jobs: list, ring: Ring, parallel_from: int | None = None) -> tuple[np.ndarray, str | None]:
    """Sum of all the jobs' masks mod 2^bits, or the reason of the first job (in order) that fails.
    From `parallel_from` jobs on, when this machine has a second core, every other job runs in a
    worker process (multiprocessing's fork server: the one that started the site hosts, already
    holding these modules) while this process runs the rest (default: PARALLEL_FROM)."""
    if len(jobs) < (PARALLEL_FROM if parallel_from is None else parallel_from) or (os.cpu_count() or 1) < 2:
        total, failure = run_jobs(jobs, ring)
        return total, failure[1] if failure else None
    ours, theirs = jobs[0::2], jobs[1::2]
    pool = _worker()
    try:
        future = pool.submit(_run_interleaved, theirs, ring) if pool is not None else None
    except Exception:  # a pool that broke before it took the jobs
        future = None
    began = time.monotonic()
    total, failure = run_jobs(ours, ring)
    failures = [(2 * failure[0], failure[1])] if failure else []
    try:  # as many jobs as ours: a worker still busy long after is treated as gone
        other, other_failure = (future.result(timeout=WORKER_GRACE_S + 3 * (time.monotonic() - began))
                                if future is not None else _run_interleaved(theirs, ring))
    except Exception:  # the worker died, hung or could not run: its jobs run here, with the same result
        other, other_failure = _run_interleaved(theirs, ring)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    if other_failure:
        failures.append(other_failure)
    return _reduce(total + other, ring.bits), min(failures)[1] if failures else None


def _run_interleaved(jobs: list, ring: Ring) -> tuple[np.ndarray, tuple[int, str] | None]:
    """run_jobs on the odd-numbered jobs, positions counted in the whole list (1, 3, 5, ...)."""
    total, failure = run_jobs(jobs, ring)
    return total, (2 * failure[0] + 1, failure[1]) if failure else None


def _worker() -> ProcessPoolExecutor | None:
    try:
        return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("forkserver"),
                                   initializer=_shared_pages_untouched)
    except (OSError, ValueError):
        return None


def _shared_pages_untouched() -> None:
    """First thing in the worker: leave what it shares with the fork server out of garbage
    collection, whose passes would write to (and so copy) every page of it: 40 MB or more."""
    gc.freeze()


def _reduce(vector: np.ndarray, bits: int) -> np.ndarray:
    """uint64 arithmetic wraps mod 2^64, which 2^bits divides: one mask at the end is exact."""
    return vector & np.uint64((1 << bits) - 1) if bits < 64 else vector
