"""FedCP-QQ: one-shot federated conformal prediction by quantile of quantiles (paper 000, alg. 1).

Coordinator: plan per-site orders ell_j and a server order k for the sites that joined; ask
site j for its ell_j-th smallest score; return the k-th smallest answer (eq. 3). Planners:
    auto        eq. (6) when sizes are equal, `optimized` otherwise
    optimal     eq. (6) (equal sizes only)
    paper_rule  ell_j = ceil((1 - alpha)(n_j + 1)), smallest valid k (appendix A.1)
    optimized   per-site ell_j chosen to bring the exact coverage closest to 1 - alpha
`dropouts: d` makes the plan robust to d sites not answering. Sites that do not answer shrink
the set: k is re-planned for those that did (their ell_j were already sent), and when no k
keeps the guarantee the outcome is the infinite set, with the reason.
"""

from __future__ import annotations

from protocol.methods.base import LocalOrderStatistic, OneShotMethod, Outcome, Planned, per_site_removed
from results.conformal import Threshold
from stats.conformal import quantile_of_quantiles
from stats.optimizer import PLANNERS, plan_orders
from stats.planner import replan_after_dropouts


class FedCPQQ(OneShotMethod):
    name = "fedcp_qq"
    codec = "raw_quantile"
    PARAMS = {
        "planner": {"type": "str", "choices": list(PLANNERS), "default": "auto"},
        "dropouts": {"type": "int", "min": 0, "default": 0},
    }

    def __init__(self, alpha, planner: str = "auto", dropouts: int = 0):
        super().__init__(alpha, planner=planner, dropouts=dropouts)
        if planner not in PLANNERS:
            raise ValueError(f"planner must be one of {PLANNERS}")
        self.planner, self.dropouts = planner, dropouts

    def plan(self, sizes):
        sites = sorted(sizes)
        plan = plan_orders(tuple(sizes[s] for s in sites), self.alpha, self.planner, self.dropouts)
        if plan is None:
            return Outcome.aborted(f"planner 'optimal' (eq. 6) needs equal site sizes; got n_j in "
                                   f"{sorted(set(sizes.values()))} (use 'optimized' or 'paper_rule')")
        if plan.infinite:
            return Threshold.infinite(plan.reason, m=plan.m)
        return Planned({s: {"ell": e} for s, e in zip(sites, plan.ells)}, state=plan)

    def combine(self, sizes, planned, answers, dropped, rng):
        asked = plan = planned.state
        if len(answers) < asked.m:
            answered = sorted(answers)
            plan = replan_after_dropouts([sizes[s] for s in answered],
                                         [planned.requests[s]["ell"] for s in answered], self.alpha)
            if plan.infinite:
                return Threshold.infinite(plan.reason, ell=_ell_label(asked), m=asked.m,
                                        answered=len(answers), dropped=sorted(dropped))
        threshold = quantile_of_quantiles(list(answers.values()), plan.k)
        return Threshold.ok(threshold, ell=_ell_label(asked), k=plan.k, guarantee=plan.coverage,
                          planned_guarantee=asked.coverage, rule=asked.rule,
                          conditional_bound=plan.conditional_bound(),
                          m=asked.m, answered=len(answers), dropped=sorted(dropped))

    @classmethod
    def site(cls, rows, rng, site_id):
        return LocalOrderStatistic(rows)

    @classmethod
    def release_shape(cls, phase, body):
        """A site's own order statistic `ell` follows from its n_j: nothing else is asked."""
        return per_site_removed(body, ("ell",))


def _ell_label(plan) -> int | str:
    """The common local order, or 'min..max' when sites were asked for different ones."""
    if plan.ell is not None:
        return plan.ell
    return f"{min(plan.ells)}..{max(plan.ells)}"
