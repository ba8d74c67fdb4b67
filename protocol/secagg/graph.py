"""Who masks against and shares with whom.

Full graph (Bonawitz et al. 2017): every pair of sites. Cost per site grows with m.
Sparse graph (SecAgg+, Bell et al. 2020, section 3): a Harary graph H(m, k) on a random
arrangement of the sites: site at position i is joined to the k/2 positions on either side
(mod m), so each site has k = O(log m) neighbours, and masks, shares and unmasking stay local
to neighbourhoods. Each site's secrets are held by its neighbours and itself, and any t of these
k + 1 holders rebuild them.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np


def default_degree(sites: int) -> int:
    """k = 2 ceil(log2 m), at most m - 1 (then it is the full graph): SecAgg+'s O(log m)."""
    if sites <= 1:
        return 0
    return min(sites - 1, 2 * math.ceil(math.log2(sites)))


def default_threshold(degree: int) -> int:
    """t: a strict majority of the k + 1 holders of each secret."""
    return (degree + 1) // 2 + 1


def harary_neighbours(sites: Sequence[str], degree: int, rng: np.random.Generator) -> dict[str, frozenset[str]]:
    """Neighbour sets of H(m, k) over a random arrangement (k is rounded up to even; k >= m - 1
    gives the full graph)."""
    m = len(sites)
    if degree >= m - 1:
        return {s: frozenset(sites) - {s} for s in sites}
    half = (degree + 1) // 2
    order = [sites[i] for i in rng.permutation(m)]
    out = {}
    for i, s in enumerate(order):
        out[s] = frozenset(order[(i + d) % m] for d in range(-half, half + 1) if d != 0)
    return out


def graph_seed(nonce: int, context: bytes) -> bytes:
    """The public seed of a session's arrangement: SHA-256 of its nonce and request digest. Every
    site computes it, so the graph is part of what every site agrees on (issue 48): the
    coordinator picks neither who neighbours whom nor a graph that falls apart in pieces."""
    import hashlib

    return hashlib.sha256(b"quorum-secagg-graph|" + str(int(nonce)).encode() + b"|" + bytes(context)).digest()


def harary_by_index(count: int, degree: int, seed: bytes) -> "HararyArrangement":
    """H(count, degree) over the Shamir indices 1..count, arranged by a permutation drawn from
    `seed` (graph_seed): what the coordinator uses and each site checks its own neighbourhood
    against (degree >= count - 1: the full graph)."""
    return HararyArrangement(count, degree, seed)


class HararyArrangement:
    """The neighbours of each index 1..count in H(count, k) over a seeded arrangement: site at
    position i of the permutation is joined to the k/2 positions either side (mod count)."""

    def __init__(self, count: int, degree: int, seed: bytes) -> None:
        self.count, self.full = count, degree >= count - 1
        self.half = (degree + 1) // 2
        if not self.full:
            rng = np.random.Generator(np.random.PCG64(int.from_bytes(seed, "big")))
            self.order = rng.permutation(count) + 1  # position -> index
            self.position = np.empty(count + 1, dtype=np.int64)
            self.position[self.order] = np.arange(count)

    def neighbours(self, index: int) -> frozenset[int]:
        if self.full:
            return frozenset(range(1, self.count + 1)) - {index}
        at = int(self.position[index])
        return frozenset(int(self.order[(at + d) % self.count]) for d in range(-self.half, self.half + 1) if d != 0)
