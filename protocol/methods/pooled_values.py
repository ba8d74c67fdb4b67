"""The centralized reference of paper 004: every site sends all its values (both groups), and the
coordinator runs the test or estimate on the pooled data. Its bytes are the price of pooling.

statistic: mwu        one-sided Mann-Whitney on the pooled groups (stats.mannwhitney.pooled_test,
                      checked against scipy.stats.mannwhitneyu)
           quantiles  the pooled sample quantiles y_(ceil(p N)) (the minimizer of eq. 4)
"""

from __future__ import annotations

import numpy as np

from protocol.codecs.summary import Summary
from protocol.methods.base import (LEVELS, LEVELS_SPEC, OneShotMethod, Outcome, Planned, SiteHalf, expect_empty,
                                   two_sample_groups)
from results.estimates import Estimates
from results.hypothesis import HypothesisTest
from stats.conformal import order_statistic
from stats.fedquantiles import pooled_rank
from stats.mannwhitney import pooled_test


class PooledValues(OneShotMethod):
    name = "pooled_values"
    codec = "summary"
    data = "two_sample"
    PARAMS = {"statistic": {"type": "str", "choices": ["mwu", "quantiles"], "default": "mwu"}, "levels": LEVELS_SPEC}

    def __init__(self, alpha, statistic="mwu", levels=None):
        levels = list(LEVELS if levels is None else levels)
        super().__init__(alpha, statistic=statistic, levels=levels)
        self.statistic, self.levels = statistic, levels
        self.result = Estimates if statistic == "quantiles" else HypothesisTest

    @property
    def privacy(self):
        return {"epsilon": None, "model": "none: every value is sent"}

    def make_codec(self):
        return Summary({"x": "floats", "y": "floats"})

    def plan(self, sizes):
        return Planned({site: {} for site in sizes})

    def combine(self, sizes, planned, answers, dropped, rng):
        x = np.concatenate([a["x"] for a in answers.values()])
        y = np.concatenate([a["y"] for a in answers.values()])
        common = {"answered": len(answers), "dropped": sorted(dropped), "n_x": int(x.size), "n_y": int(y.size)}
        if self.statistic == "quantiles":
            pooled = np.concatenate([x, y])
            if not pooled.size:
                return Outcome.aborted("no values were sent", **common)
            return Estimates.of({p: order_statistic(pooled, pooled_rank(p, pooled.size)) for p in self.levels},
                                     **common)
        if not x.size or not y.size:
            return Outcome.aborted("a group is empty in the pooled data", **common)
        z, p = pooled_test(x, y)
        return HypothesisTest.of(p, z, **common)

    @classmethod
    def site(cls, rows, rng, site_id):
        return SiteValues(rows)


class SiteValues(SiteHalf):
    def __init__(self, rows):
        self.rows = rows

    def answer(self, phase, body):
        expect_empty(body)
        x, y = two_sample_groups(self.rows)
        return {"x": x, "y": y}
