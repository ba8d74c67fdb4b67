"""Per-site orders (ell_1..ell_m, k) that bring the exact coverage as close to 1 - alpha as
possible from above: where paper 000 stops (appendix A.1 calls the search too costly).

1. Starts. The paper's rule (ell_j = ceil((1 - alpha)(n_j + 1))), the eq. (6) optimum when
   sizes are equal, and for smaller m a grid of common levels tau, ell_j(tau) =
   ceil(tau (n_j + 1)), each with its smallest valid k (stats.unbalanced's window search).
2. Descent. From a valid plan, lowering one ell_j changes only p_j(t), by
   Delta_j(t) = P(Bin(n_j, t) = ell_j - 1), and
       M(ell - e_j, k) = M(ell, k) - int Delta_j(t) P(W_{-j}(t) = k - 1) dt
   exactly, W_{-j} being the count without site j (a stable leave-one-out deconvolution of the
   Poisson-binomial law). We lower, largest effect first, the ell_j whose effects fit in the
   margin M - (1 - alpha), re-evaluate, and repeat until no single step fits. With dropouts the
   robustness constraint M(ell, m - d) >= 1 - alpha is kept the same way.
3. Verification. The final plan's coverage is recomputed with the precise evaluator
   (stats.unbalanced.coverage_unbalanced); if the search grid was optimistic we step back
   through the accepted plans until one verifies. The paper rule is a fallback candidate, so
   the result is never farther from 1 - alpha than it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.stats import binom

from stats.conformal import check_alpha
from stats.planner import (COVERAGE_TOLERANCE, QQPlan, is_robust, plan_paper_rule, plan_quantile_of_quantiles,
                           smallest_valid_k_unbalanced)
from stats.poissonbinomial import leave_one_out_at, poisson_binomial_below, poisson_binomial_pmf
from stats.unbalanced import (_bracket, _composite, coverage_unbalanced, distinct_pairs, finite_sites,
                              site_cdfs)

#: Search effort shrinks with m (each evaluation grows as m log^2 m): common levels tau tried
#: as starts, TAU_EFFORT // m of them (at most TAU_GRID), and descents from the STARTS_EFFORT // m
#: best starts (1..STARTS). At m = 1,000: the paper rule and 4 levels, one descent.
TAU_GRID = 24
TAU_EFFORT = 4800
STARTS = 4
STARTS_EFFORT = 800
MAX_STEPS = 80
#: What the descents may spend in all, in work units of a cost model of their arithmetic, each
#: about a nanosecond on the 2-core machine of bench/plan_time.py: WORK_PER_SITE_NODE for one
#: site's p_j(t) at one quadrature node multiplied into a law of W (the product tree), WORK_PER_CDF
#: for one p_j(t) (an incomplete beta function), WORK_PER_RECURSION for one step of a
#: leave-one-out recursion. A descent stops before a step that would take it past what is left
#: (each step costing what the one before it did), and later starts are not descended: the
#: verified plan found so far is returned, never worse than the paper rule. Issue 48 point 4:
#: one site at the join bound (10^6) among 9,999 of 20 made the descent take all its 80 steps over
#: 2,048 nodes (216 s in bench/plan_time.py's at_the_bound, 18 s now), and 10,000 sizes drawn up
#: to the bound spent 30 s in leave-one-out recursions: this caps the search whatever the sizes.
#: Every plan of bench/plan_time.py up to 1,000 sites (at the bound or not), and every unequal
#: case below the bound, spends less (the most, 100 sites drawn up to the bound: 2 x 10^10), so
#: those plans are what the search without a cap finds.
DESCENT_WORK = 3e10
WORK_PER_SITE_NODE = 200
WORK_PER_CDF = 700
WORK_PER_RECURSION = 5
#: Search-time coverages carry quadrature error; keep this much headroom until verification.
SEARCH_MARGIN = 1e-10


@lru_cache(maxsize=128)
def plan_optimized(sizes: tuple[int, ...], alpha: float, dropouts: int = 0) -> QQPlan:
    """Per-site orders ell_j and server order k whose exact coverage (paper 000, appendix A.1) is
    at least 1 - alpha and as close to it as the search finds: coordinate descent from valid
    starts, never worse than the paper's rule (plan_paper_rule), robust to `dropouts`."""
    check_alpha(alpha)
    sizes = tuple(int(s) for s in sizes)
    m = len(sizes)
    target = 1.0 - alpha
    paper = plan_paper_rule(sizes, alpha, dropouts)
    starts = _starts(sizes, alpha, dropouts)
    best = paper
    left = DESCENT_WORK
    for ells, k in starts[:int(np.clip(STARTS_EFFORT // m, 1, STARTS))]:
        if left <= 0:
            break
        plan, spent = _descend(sizes, np.array(ells), k, target, m - dropouts if dropouts else None, left)
        left -= spent
        if plan is not None and (best.infinite or plan.coverage < best.coverage):
            best = plan
    if best.infinite:
        return QQPlan(sizes, alpha, None, None, 1.0, "optimized", dropouts,
                      reason=f"no per-site orders reach {target:g}" +
                      (f" with {dropouts} dropout(s) allowed" if dropouts else "") +
                      "; the valid set is the whole line")
    return QQPlan(sizes, alpha, best.ells, best.k, best.coverage, "optimized", dropouts)


def _starts(sizes, alpha, dropouts):
    """(orders, k) pairs that are valid: the best start for each k, best (smallest coverage)
    first, so that the descents explore different server orders."""
    n = np.array(sizes, dtype=float)
    m = len(sizes)
    found = {}  # ells -> (coverage, k)
    for plan in (plan_paper_rule(sizes, alpha, dropouts),
                 plan_quantile_of_quantiles(m, sizes[0], alpha, dropouts) if len(set(sizes)) == 1 else None):
        if plan is not None and not plan.infinite:
            found[plan.ells] = (plan.coverage, plan.k)
    taus = int(np.clip(TAU_EFFORT // m, 0, TAU_GRID))
    for tau in np.linspace(max(0.02, 1.0 - 4.0 * alpha), 1.0, taus):
        ells = tuple(int(e) for e in np.clip(np.ceil(tau * (n + 1) - 1e-9), 1, n))
        if ells in found:
            continue
        if dropouts and not is_robust(sizes, ells, dropouts, alpha):
            continue
        k, coverage = smallest_valid_k_unbalanced(sizes, ells, alpha)
        if k:
            found[ells] = (coverage, k)
    best_per_k = {}
    for ells, (coverage, k) in sorted(found.items(), key=lambda item: item[1][0]):
        best_per_k.setdefault(k, (coverage, ells))
    return [(ells, k) for k, (_, ells) in sorted(best_per_k.items(), key=lambda item: item[1][0])]


class _Laws:
    """Per grid, the last orders' p_j(t) and law of W (an accepted trial's are the next step's),
    and the site-nodes spent computing laws."""

    def __init__(self):
        self.last, self.work = {}, 0


def _descend(sizes, ells, k, target, k_robust, budget=np.inf):
    """Greedy descent from a valid start (ells, k), spending at most `budget` site-nodes on laws
    of W (checked before each step); returns (the verified plan or None, site-nodes spent)."""
    sizes_arr = np.array(sizes, dtype=float)
    dropouts = len(sizes) - k_robust if k_robust else 0
    laws = _Laws()
    # one quadrature grid per constraint: M(ells, k) >= target, and M(ells, m - d) >= target
    grids = {kk: _search_grid(sizes_arr, ells, kk, laws) for kk in {k, k_robust} - {None}}
    history = [ells.copy()]
    step_cost = 0  # what the last step spent: the next is not taken if as much again would exceed the budget
    for _ in range(MAX_STEPS):
        if laws.work + step_cost > budget:
            break
        began = laws.work
        state = {kk: _evaluate(grid, sizes_arr, ells, kk, laws=laws) for kk, grid in grids.items()}
        margins = {kk: coverage_k - target - SEARCH_MARGIN for kk, (coverage_k, _) in state.items()}
        fits = ells > 1
        for kk, (_, effect) in state.items():
            fits &= effect <= margins[kk]
        if min(margins.values()) < 0 or not fits.any():
            break
        effect_k = state[k][1]
        order = np.flatnonzero(fits)[np.argsort(-effect_k[fits])]
        chosen, used = [], dict.fromkeys(state, 0.0)
        for j in order:  # largest first, half of each margin per round (interactions are second order)
            if chosen and any(used[kk] + state[kk][1][j] > 0.5 * margins[kk] for kk in state):
                continue
            chosen.append(j)
            for kk in state:
                used[kk] += state[kk][1][j]
        trial = ells.copy()
        trial[chosen] -= 1
        if any(_evaluate(grid, sizes_arr, trial, kk, effects=False, laws=laws)[0] < target + SEARCH_MARGIN
               for kk, grid in grids.items()):
            trial = ells.copy()
            trial[order[0]] -= 1  # a single step's effect is exact: it fits
        ells = trial
        history.append(ells.copy())
        step_cost = laws.work - began
    for candidate in reversed(history):  # verify with the precise evaluator, stepping back if needed
        coverage = coverage_unbalanced(sizes, candidate, k)
        robust_ok = not dropouts or is_robust(sizes, candidate, dropouts, 1.0 - target)
        if coverage >= target - COVERAGE_TOLERANCE and robust_ok:
            return QQPlan(tuple(sizes), 1.0 - target, tuple(int(e) for e in candidate), k,
                          float(coverage), "optimized"), laws.work
    return None, laws.work


def _search_grid(sizes, ells, k, laws=None):
    """Quadrature nodes over the transition of P(W <= k - 1), padded to the left, where lowering
    orders moves it; panels doubled until the coverage settles to 1e-12 (site-nodes counted in `laws`)."""
    a, b = _bracket(*finite_sites(sizes, ells), k)  # sites asked beyond their size never count
    width = max(b - a, 1e-6)
    a, b = max(0.0, a - width), min(1.0, b + 0.25 * width)
    panels = 2
    previous = None
    while True:
        t, w = _composite(a, b, panels)
        value = a + float(w @ poisson_binomial_below(site_cdfs(t, sizes, ells.astype(float)), k))
        if laws is not None:
            laws.work += t.size * (len(sizes) * WORK_PER_SITE_NODE + distinct_pairs(sizes, ells)[0].size * WORK_PER_CDF)
        if previous is not None and (abs(value - previous) < 1e-12 or panels >= 64):
            return a, t, w
        previous, panels = value, panels * 2


def _evaluate(grid, sizes, ells, k, effects=True, laws=None):
    """(M(ells, k), the exact change of M from lowering each ell_j by one) on one grid.

    Sites with the same (n_j, ell_j) have the same effect: it is computed once per pair. `laws`
    (a _Laws) keeps, per grid, the last orders' p_j(t) and law of W, reused when the same orders
    come back (and p_j(t) of the sites whose order is unchanged), and counts the site-nodes of the
    laws computed.
    """
    a, t, w = grid
    last = None if laws is None else laws.last.get(id(grid))
    if last is not None and np.array_equal(last[0], ells):
        p, pmf = last[1], last[2]
    else:
        changed = np.ones(ells.shape, dtype=bool) if last is None else last[0] != ells
        if last is None:
            p = site_cdfs(t, sizes, ells.astype(float))
        else:  # a step lowers a few orders: only their sites' p_j(t) change (the others' are the same bits)
            p = last[1].copy()
            p[:, changed] = site_cdfs(t, sizes[changed], ells[changed].astype(float))
        pmf = poisson_binomial_pmf(p)
        if laws is not None:
            laws.last[id(grid)] = (ells.copy(), p, pmf)
            laws.work += t.size * (len(sizes) * WORK_PER_SITE_NODE
                                   + distinct_pairs(sizes[changed], ells[changed])[0].size * WORK_PER_CDF)
    coverage = a + float(w @ pmf[:, :k].sum(axis=1))
    if not effects:
        return coverage, None
    n, ell, inverse, first = distinct_pairs(sizes, ells)
    step = binom.pmf(ell[None, :] - 1, n[None, :], t[:, None])  # Delta_j(t)
    recursions = [0]
    effects = (w @ (step * leave_one_out_at(pmf, p[:, first], k - 1, work=recursions)))[inverse]
    if laws is not None:
        laws.work += recursions[0] * WORK_PER_RECURSION + t.size * n.size * WORK_PER_CDF  # and Delta_j(t)
    return coverage, effects


#: FedCP-QQ's planners (paper 000): eq. (6) for equal sizes, the paper's rule of appendix A.1, or
#: the per-site orders closest to 1 - alpha (plan_optimized); `auto` is eq. (6) when sizes are
#: equal and `optimized` otherwise
PLANNERS = ("auto", "optimal", "paper_rule", "optimized")


def plan_orders(sizes: tuple[int, ...], alpha: float, planner: str = "auto", dropouts: int = 0) -> QQPlan | None:
    """FedCP-QQ's plan (per-site orders ell_j and server order k, paper 000 eqs. 5-6 and appendix
    A.1) for sites of these sizes by the named planner, robust to `dropouts` (at most m - 1);
    None where the planner cannot serve these sizes (`optimal` needs equal sizes)."""
    if planner not in PLANNERS:
        raise ValueError(f"planner must be one of {PLANNERS}, got {planner!r}")
    equal = len(set(sizes)) == 1
    dropouts = min(dropouts, len(sizes) - 1)
    if planner == "optimal" or (planner == "auto" and equal):
        return plan_quantile_of_quantiles(len(sizes), sizes[0], alpha, dropouts) if equal else None
    if planner == "paper_rule":
        return plan_paper_rule(sizes, alpha, dropouts)
    return plan_optimized(tuple(sizes), alpha, dropouts)
