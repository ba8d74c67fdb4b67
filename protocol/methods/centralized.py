"""Centralized split conformal on the pooled calibration scores (paper 000, eq. 2).

The reference every federated method is compared with. Here it runs through the same runtime:
every site sends all its scores (codec raw_scores), so its communication cost is measured too.
Sites that drop out simply leave fewer pooled scores; split CP stays valid on those.
"""

from __future__ import annotations

import numpy as np

from protocol.methods.base import AllScores, OneShotMethod, Planned
from results.conformal import Threshold
from stats.conformal import split_conformal_order, split_conformal_threshold


class Centralized(OneShotMethod):
    name = "centralized"
    codec = "raw_scores"

    def plan(self, sizes):
        return Planned({site: {} for site in sizes})

    def combine(self, sizes, planned, answers, dropped, rng):
        pooled = np.concatenate([np.asarray(v, dtype=float) for v in answers.values()])
        order = split_conformal_order(pooled.size, self.alpha)
        return Threshold.ok(split_conformal_threshold(pooled, self.alpha), order=order,
                          pooled=int(pooled.size), guarantee=min(1.0, order / (pooled.size + 1)),
                          m=len(sizes), answered=len(answers), dropped=sorted(dropped))

    @classmethod
    def site(cls, rows, rng, site_id):
        return AllScores(rows)

