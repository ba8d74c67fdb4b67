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

Robust unmasking (issue 48): a secret whose shares fail the consistency check is decoded
(shamir.recover_secret: Gao's Reed-Solomon decoder, up to floor((n - t) / 2) wrong shares of n
corrected), and the holders whose shares were off the polynomial are named (`Unmasked.wrong`).
A holder found wrong in one secret has its shares left out of the later ones where they do not
check; the jobs that still failed are run again here, in order, leaving out every holder found
wrong anywhere (errors and erasures), until that finds no one new: the sum, the holders named
and the first failure's reason do not depend on how the jobs were split between processes
(a decoded secret is the one polynomial within reach of its shares, whoever decoded it).
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Collection, Mapping

import numpy as np

from protocol.secagg import primitives as crypto
from protocol.secagg.shamir import ShareError, recover_secret

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
    holders: Mapping[int, str] = field(default_factory=dict)  # Shamir index -> site, to name them

    def name(self, index: int) -> str:
        return self.holders.get(index, f"holder {index}")

    def names(self, indices: Collection[int]) -> str:
        return ", ".join(self.name(x) for x in sorted(indices))


@dataclass
class Unmasked:
    """What the jobs give: the sum of their masks mod 2^bits (those that failed left out), the
    Shamir indices of the holders whose shares were off the rebuilt polynomial, by job position
    (corrected, and left out of the secret), and each failed job's reason, by position, with the
    holders it was tried without (`tried`: the distrusted among its holders, all its result
    depends on)."""

    total: np.ndarray
    wrong: dict[int, tuple[int, ...]]
    failures: dict[int, str]
    tried: dict[int, frozenset[int]] = field(default_factory=dict)

    @property
    def failure(self) -> str | None:
        """The reason of the first job, in order, that failed."""
        return self.failures[min(self.failures)] if self.failures else None


def seed_bytes(secret: int) -> bytes:
    """A rebuilt 32-byte secret (a mask seed or an X25519 private key) as bytes."""
    if secret >= 1 << (8 * crypto.KEY_BYTES):
        raise ShareError("rebuilt secret is longer than 32 bytes")
    return secret.to_bytes(crypto.KEY_BYTES, "big")


def job_masks(job: SelfMask | PairwiseMasks, ring: Ring,
              distrusted: Collection[int] = ()) -> tuple[np.ndarray, tuple[int, ...]]:
    """The sum (mod 2^bits) of what `job` puts into the survivors' masked inputs, to be taken off
    their sum, and the holders (Shamir indices) whose shares were off the polynomial (corrected;
    `distrusted`: holders found wrong in other secrets, see shamir.recover_secret). ValueError
    (ShareError among them) with the reason when it cannot be rebuilt."""
    if isinstance(job, SelfMask):
        try:
            seed, wrong = recover_secret(job.shares, ring.threshold, distrusted)
            return crypto.mask_vector(seed_bytes(seed), ring.length, ring.bits), wrong
        except ShareError as exc:
            raise ShareError(f"cannot remove the self mask of {job.site}: {_named(exc, ring)}") from None
    try:
        secret, wrong = recover_secret(job.shares, ring.threshold, distrusted)
        key = crypto.private_from_bytes(seed_bytes(secret))
    except (ShareError, ValueError) as exc:
        raise ValueError(f"cannot rebuild the mask key of dropped site {job.site}: {_named(exc, ring)}") from None
    if crypto.public_bytes(key) != job.advertised:
        corrected = f" (with the shares of {ring.names(wrong)} corrected)" if wrong else ""
        raise ValueError(f"the shares of dropped site {job.site}'s mask key rebuild a key{corrected} that does not "
                         f"match the one it advertised")
    total = np.zeros(ring.length, dtype=np.uint64)
    for public, sign in job.survivors:
        mask = crypto.mask_vector(crypto.agree(key, public, b"mask", ring.nonce, ring.context), ring.length, ring.bits)
        total = (total + mask) if sign > 0 else (total - mask)
    return _reduce(total, ring.bits), wrong


def _named(exc: Exception, ring: Ring) -> str:
    """A ShareError's reason with the holders it left out named."""
    left_out = getattr(exc, "left_out", ())
    return f"{exc}; left out: the shares of {ring.names(left_out)}" if left_out else str(exc)


def run_jobs(jobs: list, ring: Ring, distrusted: Collection[int] = ()) -> Unmasked:
    """Every job in order: the sum of the masks of those that succeed, the holders found wrong and
    the failures, by position in `jobs`. A holder found wrong is distrusted in the jobs after."""
    total = np.zeros(ring.length, dtype=np.uint64)
    distrusted = set(distrusted)
    wrong, failures, tried = {}, {}, {}
    for position, job in enumerate(jobs):
        try:
            mask, off = job_masks(job, ring, distrusted)
        except ValueError as exc:
            failures[position], tried[position] = str(exc), frozenset(distrusted.intersection(job.shares))
            continue
        total = total + mask
        if off:
            wrong[position] = off
            distrusted.update(off)
    return Unmasked(_reduce(total, ring.bits), wrong, failures, tried)


def unmask(jobs: list, ring: Ring, parallel_from: int | None = None) -> Unmasked:
    """Sum of all the jobs' masks mod 2^bits, the holders found wrong and the failures, by job
    position. From `parallel_from` jobs on, when this machine has a second core, every other job
    runs in a worker process (multiprocessing's fork server: the one that started the site hosts,
    already holding these modules) while this process runs the rest (default: PARALLEL_FROM).
    Then the failed jobs run again here, in order, each leaving out every holder found wrong so
    far among its own, until a pass finds no one new; a job whose holders hold no one newly found
    is not run again (its result would be the same). Nothing to do when nothing failed.
    A job runs the decoder at most once per pass it is run in: all of them failing (more wrong
    holders than any secret corrects) cost one decoding each, 37 ms at n = 200, 0.7 ms at 29."""
    if len(jobs) < (PARALLEL_FROM if parallel_from is None else parallel_from) or (os.cpu_count() or 1) < 2:
        result = run_jobs(jobs, ring)
    else:
        result = _split(jobs, ring)
    distrusted = set().union(*result.wrong.values()) if result.failures else set()
    found = True
    while found:
        found = False
        for position in sorted(result.failures):
            relevant = frozenset(distrusted.intersection(jobs[position].shares))
            if relevant == result.tried[position]:
                continue
            result.tried[position] = relevant
            try:
                mask, off = job_masks(jobs[position], ring, distrusted)
            except ValueError as exc:
                result.failures[position] = str(exc)
                continue
            del result.failures[position], result.tried[position]
            result.total = _reduce(result.total + mask, ring.bits)
            if off:
                result.wrong[position] = off
                found = found or not distrusted.issuperset(off)
                distrusted.update(off)
    return result


def masks_total(jobs: list, ring: Ring, parallel_from: int | None = None) -> tuple[np.ndarray, str | None]:
    """`unmask`'s sum and the reason of the first job (in order) that failed, or None."""
    result = unmask(jobs, ring, parallel_from)
    return result.total, result.failure


def _split(jobs: list, ring: Ring) -> Unmasked:
    """run_jobs with the odd-numbered jobs in a worker process, the even ones here."""
    ours, theirs = jobs[0::2], jobs[1::2]
    pool = _worker()
    try:
        future = pool.submit(_run_interleaved, theirs, ring) if pool is not None else None
    except Exception:  # a pool that broke before it took the jobs
        future = None
    began = time.monotonic()
    mine = run_jobs(ours, ring)
    try:  # as many jobs as ours: a worker still busy long after is treated as gone
        other = (future.result(timeout=WORKER_GRACE_S + 3 * (time.monotonic() - began))
                 if future is not None else _run_interleaved(theirs, ring))
    except Exception:  # the worker died, hung or could not run: its jobs run here, with the same result
        other = _run_interleaved(theirs, ring)
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    return Unmasked(_reduce(mine.total + other.total, ring.bits),
                    {**{2 * p: w for p, w in mine.wrong.items()}, **other.wrong},
                    {**{2 * p: f for p, f in mine.failures.items()}, **other.failures},
                    {**{2 * p: d for p, d in mine.tried.items()}, **other.tried})


def _run_interleaved(jobs: list, ring: Ring) -> Unmasked:
    """run_jobs on the odd-numbered jobs, positions counted in the whole list (1, 3, 5, ...)."""
    result = run_jobs(jobs, ring)
    return Unmasked(result.total, {2 * p + 1: w for p, w in result.wrong.items()},
                    {2 * p + 1: f for p, f in result.failures.items()},
                    {2 * p + 1: d for p, d in result.tried.items()})


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
