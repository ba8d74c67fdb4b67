"""FedCP-Avg: the average of local split-conformal quantiles (Lu & Kalpathy-Cramer 2021).

The baseline of paper 000 (sections 2.2 and 5): site j sends its ceil((n_j + 1)(1 - alpha))-th
smallest score and the server averages them. It carries no coverage guarantee.
"""

from __future__ import annotations

from protocol.methods.base import LocalOrderStatistic, OneShotMethod, Planned, per_site_removed
from results.conformal import Threshold
from stats.conformal import average_of_quantiles, split_conformal_order


class FedCPAvg(OneShotMethod):
    name = "fedcp_avg"
    codec = "raw_quantile"

    def plan(self, sizes):
        return Planned({site: {"ell": split_conformal_order(n, self.alpha)} for site, n in sizes.items()})

    def combine(self, sizes, planned, answers, dropped, rng):
        return Threshold.ok(average_of_quantiles(list(answers.values())),
                          m=len(sizes), answered=len(answers), dropped=sorted(dropped))

    @classmethod
    def site(cls, rows, rng, site_id):
        return LocalOrderStatistic(rows)

    @classmethod
    def release_shape(cls, phase, body):
        """A site's own order statistic `ell` follows from its n_j: nothing else is asked."""
        return per_site_removed(body, ("ell",))
