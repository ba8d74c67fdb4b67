"""FedCP-QQ: one-shot federated conformal prediction by quantile of quantiles (paper 000, alg. 1).

Coordinator: (ell*, k*) = argmin {M[ell, k] >= 1 - alpha} (eq. 6); ask every site for its ell*-th
smallest score; return the k*-th smallest answer (eq. 3). Sites that do not answer shrink m: the
server order is re-planned for the sites that did (ell was already sent), and when no k keeps
the guarantee the outcome is the infinite set, with the reason.
"""

from __future__ import annotations

from protocol.conformal import quantile_of_quantiles
from protocol.methods.base import LocalOrderStatistic, OneShotMethod, Outcome, Planned
from protocol.planner import plan_quantile_of_quantiles, replan_server_order


class FedCPQQ(OneShotMethod):
    name = "fedcp_qq"
    codec = "raw_quantile"

    def plan(self, sizes):
        n_values = sorted(set(sizes.values()))
        if len(n_values) != 1:
            return Outcome.aborted(f"{self.name} plans for equal site sizes; got n_j in {n_values}")
        plan = plan_quantile_of_quantiles(len(sizes), n_values[0], self.alpha)
        if plan.infinite:
            return Outcome.infinite(plan.reason, m=plan.m, n=plan.n)
        return Planned({site: {"ell": plan.ell} for site in sizes}, state=plan)

    def combine(self, sizes, planned, answers, dropped):
        asked = plan = planned.state
        if len(answers) < asked.m:
            plan = replan_server_order(len(answers), asked.n, asked.ell, self.alpha)
            if plan.infinite:
                return Outcome.infinite(plan.reason, ell=asked.ell, m=asked.m,
                                        answered=len(answers), dropped=sorted(dropped))
        threshold = quantile_of_quantiles(list(answers.values()), plan.k)
        return Outcome.ok(threshold, ell=plan.ell, k=plan.k, guarantee=plan.coverage,
                          m=asked.m, answered=len(answers), dropped=sorted(dropped))

    @classmethod
    def site(cls, scores, rng):
        return LocalOrderStatistic(scores)
