"""Federated Mann-Whitney tests as methods (paper 004, section 4), on two_sample data.

`mwu_sites`: one round; each site sends (U_l, V_l, n_l, m_l) of its own data (section 4.2) and
the coordinator combines them by the chosen `test`: T_sum (eq. 1), T_w with the power-optimal
weights (eq. 2, section 4.3) or Fisher's combination of the per-site p-values (section 4.4).
`mwu_table`: the K-anonymous two-group table, built site by site (protocol.methods.kanon_table),
and U_fed with its tie variance on the table's bins (eq. 3, section 4.5).
All one-sided (treatment larger), normal p-values as in the paper.
"""

from __future__ import annotations

import math

import numpy as np

from protocol.codecs.summary import Summary
from protocol.accounting import Spend
from protocol.methods.base import (Method, OneShotMethod, Outcome, Planned, SiteHalf, expect_empty,
                                   two_sample_groups)
from results.hypothesis import HypothesisTest
from protocol.methods.kanon_table import (PHASES, TABLE_PARAMS, KAnonTableCoordinator, KAnonTableSite,
                                          table_codec, table_request, table_spend)
from stats.mannwhitney import (SiteStatistic, fisher_p_value, optimal_weights, p_value, site_statistic, t_sum,
                               t_weighted, u_federated, z_score)

TESTS = ("sum", "weighted", "fisher")
SITE_FIELDS = {"u": "float", "variance": "float", "n": "int", "m": "int"}


class MWUSites(OneShotMethod):
    name = "mwu_sites"
    codec = "summary"
    data = "two_sample"
    result = HypothesisTest
    PARAMS = {"test": {"type": "str", "choices": list(TESTS), "default": "weighted"}}

    def __init__(self, alpha, test="weighted"):
        super().__init__(alpha, test=test)
        self.test = test

    @property
    def privacy(self):
        return {"epsilon": None, "model": "per-site aggregates (U_l, V_l, n_l, m_l)"}

    def make_codec(self):
        return Summary(SITE_FIELDS)

    def plan(self, sizes):
        return Planned({site: {} for site in sizes})

    def combine(self, sizes, planned, answers, dropped, rng):
        stats = {site: SiteStatistic(a["u"], a["variance"], a["n"], a["m"]) for site, a in answers.items()}
        impossible = sorted(site for site, s in stats.items() if not plausible(s))
        usable = [s for site, s in stats.items() if s.variance > 0 and site not in impossible]
        common = {"answered": len(answers), "dropped": sorted(dropped), "sites_with_both_groups": len(usable),
                  "impossible": impossible}
        if not usable:
            return Outcome.aborted("no site holds both groups", **common)
        if self.test == "fisher":
            p_values = [p_value(z_score(s)) for s in usable]
            statistic = -2.0 * float(np.sum(np.log(np.clip(p_values, 1e-300, 1.0))))
            return HypothesisTest.of(fisher_p_value(p_values), statistic, **common)
        if self.test == "sum":
            z = t_sum(usable)
            return HypothesisTest.of(p_value(z), z, **common)
        weights = optimal_weights(usable)
        z = t_weighted(usable, weights)
        return HypothesisTest.of(p_value(z), z, weights=[round(float(w), 6) for w in weights], **common)

    @classmethod
    def site(cls, rows, rng, site_id):
        return SiteMWU(rows)


def plausible(stat: SiteStatistic) -> bool:
    """What any real (U_l, V_l, n_l, m_l) satisfies: |U| <= n m and 0 <= V <= n m (N + 1) / 3."""
    n, m = stat.n, stat.m
    return (n >= 0 and m >= 0 and abs(stat.u) <= n * m
            and 0 <= stat.variance <= n * m * (n + m + 1) / 3.0 * (1 + 1e-12))


class SiteMWU(SiteHalf):
    def __init__(self, rows):
        self.rows = rows

    def answer(self, phase, body):
        expect_empty(body)
        x, y = two_sample_groups(self.rows)
        stat = site_statistic(x, y)
        return {"u": stat.u, "variance": stat.variance, "n": stat.n, "m": stat.m}


class MWUTable(Method):
    name = "mwu_table"
    codec = "summary"
    data = "two_sample"
    result = HypothesisTest
    phases = PHASES
    PARAMS = TABLE_PARAMS

    def __init__(self, alpha, k=10, extremes="buffer", bounds=None):
        super().__init__(alpha, k=k, extremes=extremes, bounds=list(bounds or []))
        self.request = table_request(k, extremes, list(bounds or []))

    @property
    def privacy(self):
        return {"epsilon": None, "model": f"K-anonymous table (K = {self.request['k']})"}

    def make_codec(self):
        return table_codec(2)

    def coordinator(self, sizes, rng):
        return KAnonTableCoordinator(dict(sizes), self.request, 2, self.finish)

    @staticmethod
    def finish(table, contributed, skipped):
        fx, fy = np.asarray(table.counts[0]), np.asarray(table.counts[1])
        u, variance = u_federated(fx, fy)
        common = {"answered": len(contributed), "contributed": contributed, "skipped": skipped,
                  "bins": table.bins, "n_x": float(fx.sum()), "n_y": float(fy.sum())}
        if variance <= 0:
            return Outcome.aborted("the table has no spread across both groups (variance 0)", **common)
        z = u / math.sqrt(variance)
        return HypothesisTest.of(p_value(z), z, **common)

    @classmethod
    def site(cls, rows, rng, site_id):
        return KAnonTableSite(list(two_sample_groups(rows)), rng)

    @classmethod
    def spend(cls, phase, body):
        return table_spend("control and treatment", body)

    def planned_spend(self, sites):
        return Spend("kanon", model=self.privacy["model"], k=self.request["k"])
