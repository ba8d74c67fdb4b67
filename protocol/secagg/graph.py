"""Who masks against and shares with whom.

Full graph (Bonawitz et al. 2017): every pair of sites. Cost per site grows with m.
Sparse graph (SecAgg+, Bell et al. 2020, section 3): a Harary graph H(m, k) on a seeded
arrangement of the sites: site at position i is joined to the k/2 positions on either side
(mod m), so each site has k = O(log m) neighbours, and masks, shares and unmasking stay local
to neighbourhoods. Each site's secrets are held by its neighbours and itself, and any t of these
k + 1 holders rebuild them.
"""

from __future__ import annotations

import math


def default_degree(sites: int) -> int:
    """k = 2 ceil(log2 m), at most m - 1 (then it is the full graph): SecAgg+'s O(log m)."""
    if sites <= 1:
        return 0
    return min(sites - 1, 2 * math.ceil(math.log2(sites)))


def default_threshold(degree: int, mode: str = "semi-honest") -> int:
    """t: a strict majority of the k + 1 holders of each secret (semi-honest); in the active mode
    more than two thirds of them (Bonawitz et al. 2017, section 6: t > 2n/3 against a server
    that lies with fewer than n/3 corrupt users), so that two views of one session signed by
    t holders each would need 2t - (k + 1) > (k + 1) / 3 holders signing both: that many colluders
    with the coordinator, or none can break the consistency round (tolerated_colluders)."""
    if mode == "active":
        return 2 * (degree + 1) // 3 + 1
    return (degree + 1) // 2 + 1


def tolerated_colluders(degree: int, threshold: int) -> int:
    """How many sites of one neighbourhood may collude with the coordinator before two views
    of a session can each gather t signatures there: 2t - (k + 1) - 1 (the active mode)."""
    return max(0, 2 * threshold - (degree + 1) - 1)


def graph_seed(nonce: int, context: bytes) -> bytes:
    """The public seed of a session's arrangement: SHA-256 of its nonce and request digest. Every
    site computes it, so the arrangement of the indices is part of what every site agrees on
    (issue 48), and each site checks its place in it. The coordinator still assigns the indices
    (which site is where), so it places the colluders it has: docs/privacy.md counts colluders
    per neighbourhood."""
    import hashlib

    return hashlib.sha256(b"quorum-secagg-graph|" + str(int(nonce)).encode() + b"|" + bytes(context)).digest()


def harary_by_index(count: int, degree: int, seed: bytes) -> "HararyArrangement":
    """H(count, degree) over the Shamir indices 1..count, arranged by a permutation drawn from
    `seed` (graph_seed): what the coordinator uses and each site checks its own neighbourhood
    against (degree >= count - 1: the full graph)."""
    return HararyArrangement(count, degree, seed)


class HararyArrangement:
    """The neighbours of each index 1..count in H(count, k) over a seeded arrangement: the site at
    position p is joined to the k/2 positions either side (mod count). The arrangement is the
    affine permutation p(i) = (a (i - 1) + b) mod count, a coprime to count, (a, b) drawn from
    the seed, so one index's neighbours cost O(k) whatever the count (a site checks its own
    without building a permutation of every site: red team round 4, a share request naming a
    billion sites)."""

    def __init__(self, count: int, degree: int, seed: bytes) -> None:
        self.count, self.full = count, degree >= count - 1
        self.half = (degree + 1) // 2
        if not self.full:
            draw = int.from_bytes(seed, "big")
            a = 1 + draw % (count - 1)
            while math.gcd(a, count) != 1:
                a = a % (count - 1) + 1
            self.a, self.b = a, (draw >> 64) % count
            self.a_inverse = pow(a, -1, count)

    def index_at(self, position: int) -> int:
        """The index at `position` of the arrangement (0 .. count - 1)."""
        if self.full:
            return position + 1
        return self.a_inverse * ((position - self.b) % self.count) % self.count + 1

    def neighbours(self, index: int) -> frozenset[int]:
        if self.full:
            return frozenset(range(1, self.count + 1)) - {index}
        at = (self.a * (index - 1) + self.b) % self.count
        return frozenset(self.a_inverse * ((at + d - self.b) % self.count) % self.count + 1
                         for d in range(-self.half, self.half + 1) if d != 0)
