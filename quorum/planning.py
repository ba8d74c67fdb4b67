"""FedCP-QQ's orders from Python (paper 000, eq. 5-6, appendix A.1), as `run.py plan` prints them.

    quorum.plan(alpha=0.1, sites=50, n=20)                  equal sizes: eq. 6
    quorum.plan(alpha=0.1, sizes=[30, 80, 200])             the paper's rule per site
    quorum.plan(alpha=0.1, sizes=[...], optimize=True)      per-site orders closest to 1 - alpha
    quorum.plan(alpha=0.1, sites=50, n=20, dropouts=5)      any 45 answering sites keep a valid k

Returns a dict: `ell` (one order, or a list per site), `k`, `coverage` (exact), the rule, and
`reason` when no finite plan exists (ell None); `table=True` adds M, indexed [ell-1][k-1].
"""

from __future__ import annotations


def plan(alpha: float, sites: int | None = None, n: int | None = None, sizes=None, *, optimize: bool = False,
         dropouts: int = 0, table: bool = False) -> dict:
    from stats.optimizer import plan_optimized
    from stats.orderstats import qq_coverage_table
    from stats.planner import plan_paper_rule, plan_quantile_of_quantiles

    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if sizes is not None:
        if sites is not None or n is not None:
            raise ValueError("give either sizes or sites with n, not both")
        size_list = tuple(int(v) for v in sizes)
        if not size_list or min(size_list) < 1:
            raise ValueError("sizes must be positive integers")
    elif sites is None or n is None:
        raise ValueError("give sites and n (equal sizes), or sizes")
    elif sites < 1 or n < 1:
        raise ValueError("sites and n must be positive")
    else:
        size_list = (n,) * sites
    if not 0 <= dropouts < len(size_list):
        raise ValueError(f"dropouts must lie in [0, {len(size_list)}) (below the number of sites)")
    if table and (sizes is not None or optimize):
        raise ValueError("table needs equal sizes (sites, n) without optimize")
    if optimize:
        chosen = plan_optimized(size_list, alpha, dropouts)
        result = chosen.as_dict(per_site=sizes is not None)
        paper = plan_paper_rule(size_list, alpha, dropouts)
        result["coverage_paper_rule"] = None if paper.infinite else paper.coverage
        result["k_paper_rule"] = paper.k
        if sizes is None:
            result["ell"] = list(chosen.ells) if chosen.ells is not None else None
    elif sizes is not None:
        result = plan_paper_rule(size_list, alpha, dropouts).as_dict(per_site=True)
    else:
        result = plan_quantile_of_quantiles(sites, n, alpha, dropouts).as_dict()
    if table:
        result["M"] = qq_coverage_table(sites, n).tolist()
    return result
