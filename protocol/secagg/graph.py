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
