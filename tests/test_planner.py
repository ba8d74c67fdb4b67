"""Choosing (ell*, k*) (paper 000 eq. 6) and re-planning k after dropouts."""

import numpy as np
import pytest

from stats.orderstats import qq_coverage, qq_coverage_table
from stats.planner import COVERAGE_TOLERANCE, plan_paper_rule, plan_quantile_of_quantiles, replan_server_order


def brute_force_plan(m, n, alpha):
    table = qq_coverage_table(m, n)
    feasible = np.where(table >= 1 - alpha - COVERAGE_TOLERANCE, table, np.inf)
    ell, k = np.unravel_index(np.argmin(feasible), table.shape)
    return int(ell) + 1, int(k) + 1, float(table[ell, k])


@pytest.mark.parametrize("m", [1, 2, 5, 10, 37, 50, 100])
@pytest.mark.parametrize("n", [1, 3, 10, 20, 64])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2])
def test_plan_is_the_argmin_over_the_full_table(m, n, alpha):
    plan = plan_quantile_of_quantiles(m, n, alpha)
    if m * n / (m * n + 1) < 1 - alpha:
        assert plan.infinite and "whole line" in plan.reason
        return
    ell, k, coverage = brute_force_plan(m, n, alpha)
    assert plan.coverage == pytest.approx(coverage, abs=1e-14)
    assert plan.coverage >= 1 - alpha - COVERAGE_TOLERANCE
    # ties in M are possible in principle; the chosen pair must attain the same minimum
    assert qq_coverage(m, n, plan.ell, plan.k) == pytest.approx(coverage, abs=1e-14)


def test_published_plan_m5_n10():
    plan = plan_quantile_of_quantiles(5, 10, 0.1)
    assert (plan.ell, plan.k) == (10, 3)
    assert plan.coverage == pytest.approx(0.9256259545517654, abs=1e-12)


def test_exact_boundary_case_is_not_lost_to_rounding():
    # n = 1: M[1, k] = k / (m + 1); with m = 9, k = 9 reaches exactly 0.9.
    plan = plan_quantile_of_quantiles(9, 1, 0.1)
    assert (plan.ell, plan.k) == (1, 9)


def test_infinite_plan_when_even_the_maximum_falls_short():
    plan = plan_quantile_of_quantiles(1, 5, 0.1)  # best coverage 5/6 < 0.9
    assert plan.infinite and plan.ell is None and plan.coverage == 1.0


@pytest.mark.parametrize("answered", [50, 45, 30, 12, 5])
def test_replanned_k_is_the_smallest_valid_one(answered):
    plan = replan_server_order(answered, 20, 18, 0.1)
    if plan.infinite:
        assert qq_coverage(answered, 20, 18, answered) < 0.9
        return
    assert qq_coverage(answered, 20, 18, plan.k) >= 0.9 - COVERAGE_TOLERANCE
    if plan.k > 1:
        assert qq_coverage(answered, 20, 18, plan.k - 1) < 0.9


def test_replan_refuses_when_too_few_answer():
    plan = replan_server_order(2, 20, 18, 0.1)
    assert plan.infinite and "2 answering sites" in plan.reason
    assert replan_server_order(0, 20, 18, 0.1).infinite


def test_rejects_bad_alpha():
    with pytest.raises(ValueError):
        plan_quantile_of_quantiles(5, 10, 1.0)


def whole_table_plan(m: int, n: int, alpha: float, dropouts: int):
    """Eq. (6) by the whole table: the least M[ell, k] >= 1 - alpha over ells still valid with
    m - dropouts answers (ties: the smallest ell, then the smallest k)."""
    from stats.orderstats import qq_coverage_table
    from stats.planner import COVERAGE_TOLERANCE

    table = qq_coverage_table(m, n)
    threshold = 1 - alpha - COVERAGE_TOLERANCE
    best = None
    for ell in range(1, n + 1):
        if dropouts and table[ell - 1, m - dropouts - 1] < threshold:
            continue
        for k in range(1, m + 1):
            cov = table[ell - 1, k - 1]
            if cov >= threshold and (best is None or cov < best[2]):
                best = (ell, k, cov)
    return best


@pytest.mark.parametrize("m,n,dropouts", [(1, 9, 0), (2, 30, 0), (2, 30, 1), (3, 17, 0), (3, 17, 1), (5, 40, 0),
                                          (5, 40, 1), (8, 12, 0), (8, 12, 1), (12, 50, 0), (12, 50, 1), (20, 7, 0),
                                          (20, 7, 1)])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.25])
def test_planning_k_by_k_gives_the_plan_of_the_whole_table(m, n, alpha, dropouts):
    """Issue 48 point 4: the optimal planner searches k by k (O(m log n)) for large n, ell by ell
    (O(n log m)) otherwise; both give eq. (6)'s plan as the whole table does."""
    from stats.planner import _plan_by_k, plan_quantile_of_quantiles

    expected = whole_table_plan(m, n, alpha, dropouts)
    for plan in (_plan_by_k(m, n, alpha, dropouts), plan_quantile_of_quantiles.__wrapped__(m, n, alpha, dropouts)):
        if expected is None:
            assert plan.infinite
        else:
            assert (plan.ells[0], plan.k) == expected[:2] and plan.coverage == pytest.approx(expected[2], abs=1e-12)


def test_planning_for_a_million_scores_a_site_is_quick_and_the_same_plan():
    """Two sites of a million scores each took 44 s and 1.6 GiB to plan (the issue); k by k it
    is a few dozen evaluations (the bound is timed in bench/plan_time.py, not here). At 50,000
    scores, where the ell-by-ell search still runs in a second, both give the same plan."""
    from stats.planner import _plan_by_k, smallest_valid_k

    plan = plan_quantile_of_quantiles.__wrapped__(2, 10**6, 0.1)
    assert 0.9 <= plan.coverage < 0.9 + 1e-5
    assert plan.coverage == pytest.approx(qq_coverage(2, 10**6, plan.ells[0], plan.k), abs=1e-15)
    m, n = 3, 50_000
    ells = np.arange(1, n + 1)
    ks, covs = smallest_valid_k(m, n, ells, 0.1)
    i = int(np.argmin(np.where(ks > 0, covs, np.inf)))
    by_k = _plan_by_k(m, n, 0.1, 0)
    assert (by_k.ells[0], by_k.k, by_k.coverage) == (int(ells[i]), int(ks[i]), float(covs[i]))


# ---------------------------------------------------------------------------------------------
# Issue 48 point 4: planning at the join bound, the same plans faster


@pytest.mark.parametrize("seed", range(6))
def test_first_reaching_is_the_smallest_index_reaching_the_threshold(seed):
    """The bracketed search gives what a scan gives, for every row, whatever its guess; rows with
    no index reaching the threshold get their virtual upper end; values are the evaluated ones."""
    from stats.planner import first_reaching

    rng = np.random.default_rng(seed)
    rows, width = 40, 300
    table = np.sort(rng.random((rows, width)) ** rng.uniform(0.3, 3.0), axis=1)  # non-decreasing rows
    table[::7] = np.floor(table[::7] * 4) / 4  # plateaus and ties
    threshold = float(rng.uniform(0.2, 0.95))
    lo = rng.integers(-1, 50, size=rows)
    hi = np.full(rows, width)  # virtual: one past the last index
    evaluated = []

    def evaluate(r, xs):
        evaluated.append(xs)
        return table[r, xs]

    x, values = first_reaching(evaluate, lo, hi, threshold, guess=rng.uniform(-20, width + 20, size=rows))
    for i in range(rows):
        reaching = [j for j in range(lo[i] + 1, width) if table[i, j] >= threshold]
        assert x[i] == (reaching[0] if reaching else width)
        assert values[i] == table[i, x[i]] if reaching else np.isnan(values[i])
    assert all(((xs > -1) & (xs < width)).all() for xs in evaluated)  # nothing outside the brackets


@pytest.mark.parametrize("m,n", [(1, 50), (2, 1000), (3, 17), (40, 5000), (200, 300), (1000, 40), (7, 100_000)])
@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.3])
@pytest.mark.parametrize("dropouts", [0, 1, 2])
def test_smallest_orders_are_those_a_scan_finds(m, n, alpha, dropouts):
    """Each row's smallest valid order, against a scan of M at both neighbours: M at the order
    reaches 1 - alpha and M one below falls short (values exactly those of qq_coverage)."""
    from stats.planner import smallest_valid_ell, smallest_valid_k

    if dropouts >= m:
        return
    threshold = 1 - alpha - COVERAGE_TOLERANCE
    ks = np.unique(np.linspace(1, m, 12).astype(int))
    ells, covs = smallest_valid_ell(m, n, ks, alpha, at_least=1 + dropouts)
    for k, ell, cov in zip(ks, ells, covs):
        if ell == 0:
            assert qq_coverage(m, n, n, k) < threshold
            continue
        assert cov == qq_coverage(m, n, ell, k) and cov >= threshold
        assert ell == 1 + dropouts or qq_coverage(m, n, ell - 1, k) < threshold
    rows = np.unique(np.linspace(1, n, 12).astype(int))
    ks, covs = smallest_valid_k(m, n, rows, alpha)
    for ell, k, cov in zip(rows, ks, covs):
        if k == 0:
            assert qq_coverage(m, n, ell, m) < threshold
            continue
        assert cov == qq_coverage(m, n, ell, k) and cov >= threshold
        assert k == 1 or qq_coverage(m, n, ell, k - 1) < threshold


#: eq. (6) plans at the join bound as the bisection planner (before issue 48's speed-up) made them
#: and the whole-table search would: (m, n, alpha) -> (ell, k, coverage)
PLANS_AT_THE_BOUND = {(2, 10**6, 0.1): (899832, 2, 0.9000004837264534),
                      (1000, 10**6, 0.1): (899477, 960, 0.9000000002487452)}


@pytest.mark.parametrize("case", sorted(PLANS_AT_THE_BOUND))
def test_plans_at_the_bound_are_unchanged(case):
    """Sites of 10^6 scores (the join bound): the plan the k-by-k bisection made, bit for bit (at
    10,000 sites, (899993, 5102, 0.9000000000529103), checked by bench/plan_time.py)."""
    plan = plan_quantile_of_quantiles.__wrapped__(*case)
    assert (plan.ells[0], plan.k, plan.coverage) == PLANS_AT_THE_BOUND[case]


def _choose_gamma_every_gamma(sizes, alpha, epsilon, bins, grid, dropouts):
    """Paper 000 section 4's grid search as written: every gamma planned, the first smallest proxy."""
    from stats.dp import correction_order
    from stats.planner import coverage_unbalanced, plan_paper_rule

    m, equal, best = len(sizes), len(set(sizes)) == 1, None
    for gamma in np.arange(1, grid + 1) / (grid + 1):
        level_alpha = 1.0 - (1.0 - alpha) / (1.0 - gamma * alpha)
        if level_alpha <= 0:
            continue
        plan = (plan_quantile_of_quantiles(m, sizes[0], level_alpha, dropouts) if equal
                else plan_paper_rule(sizes, level_alpha, dropouts))
        if plan.infinite:
            continue
        correction = correction_order(epsilon, bins, gamma, alpha, m)
        raised = [e + correction for e in plan.ells]
        if any(r > n for r, n in zip(raised, sizes)):
            continue
        proxy = (float(qq_coverage(m, sizes[0], raised[0], plan.k)) if equal
                 else coverage_unbalanced(sizes, raised, plan.k))
        if best is None or proxy < best[3]:
            best = (float(gamma), plan, correction, proxy)
    return best


@pytest.mark.parametrize("sizes", [(40,) * 5, (500,) * 3, (5000,) * 20, (100_000,) * 2, (20, 30, 45),
                                   (300, 800, 2500, 7000), (60,) * 9 + (10**6,), (1000, 10**6) * 4])
@pytest.mark.parametrize("epsilon", [1.0, 8.0])
@pytest.mark.parametrize("dropouts", [0, 1])
def test_choosing_gamma_gives_the_choice_of_planning_every_gamma(sizes, epsilon, dropouts):
    """choose_gamma stops where no later gamma's proxy can be smaller and skips gammas whose raised
    paper-rule orders exceed a site's size: the same (gamma, plan, ell_cor, proxy), bit for bit."""
    from stats.planner import choose_gamma

    for alpha, grid in ((0.1, 50), (0.2, 7)):
        expected = _choose_gamma_every_gamma(sizes, alpha, epsilon, 20, grid, dropouts)
        got = choose_gamma.__wrapped__(sizes, alpha, epsilon, 20, grid, dropouts)
        if expected is None:
            assert got is None
            continue
        assert got[0] == expected[0] and got[2:] == expected[2:]
        assert (got[1].ells, got[1].k, got[1].coverage) == (expected[1].ells, expected[1].k, expected[1].coverage)


def test_laws_are_the_same_a_few_nodes_at_a_time(monkeypatch):
    """The product tree and the unequal-size quadrature hold a few nodes' laws at a time (bounded
    memory at the join bound): each node's law is its own, so the coverages are the same bits."""
    from stats import poissonbinomial, unbalanced

    rng = np.random.default_rng(3)
    sizes = tuple(int(v) for v in rng.integers(10, 10**6, size=300)) + (20,) * 40
    ells = tuple(max(1, int(np.ceil(0.9 * (n + 1))) - 1) for n in sizes)
    p = rng.random((70, 700)) ** 2
    whole = [unbalanced.coverage_window(sizes, ells, 150, 160), poissonbinomial.pmf_by_product_tree(p)]
    monkeypatch.setattr(unbalanced, "NODE_CHUNK", 7)
    monkeypatch.setattr(poissonbinomial, "TREE_ROWS", 3)
    parts = [unbalanced.coverage_window(sizes, ells, 150, 160), poissonbinomial.pmf_by_product_tree(p)]
    monkeypatch.setattr(unbalanced, "NODE_CHUNK", 10**9)
    monkeypatch.setattr(poissonbinomial, "TREE_ROWS", 10**9)
    at_once = [unbalanced.coverage_window(sizes, ells, 150, 160), poissonbinomial.pmf_by_product_tree(p)]
    for a, b, c in zip(whole, parts, at_once):
        assert np.array_equal(a, b) and np.array_equal(a, c)


def _leave_one_out_before(pmf, p, c, floor=1e-14):
    """stats.poissonbinomial.leave_one_out_at as it was: both recursions over every column."""
    rows, width = pmf.shape
    m = width - 1
    out = np.zeros_like(p)
    near = pmf[:, c] if c + 1 > m else np.maximum(pmf[:, c], pmf[:, c + 1])
    active = near > floor
    if not active.any():
        return out
    pmf, p = pmf[active], p[active]
    q = 1.0 - p
    cdf = np.cumsum(pmf, axis=1)
    below = np.flatnonzero((cdf <= floor).all(axis=0))
    start = min(int(below[-1]) + 1 if below.size else 0, c)
    above = np.flatnonzero((cdf >= 1.0 - floor).all(axis=0))
    stop = max(int(above[0]) if above.size else m, c)
    f = np.ascontiguousarray(pmf.T)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        up = np.zeros_like(p)
        for i in range(start, c + 1):
            up = (f[i][:, None] - p * up) / q
        down = np.zeros_like(p)
        for i in range(stop, c, -1):
            down = (f[i][:, None] - q * down) / p
    out[active] = np.where(p <= 0.5, up, down)
    return out


@pytest.mark.parametrize("m", [30, 300, 1500])
def test_leave_one_out_runs_each_recursion_where_it_is_kept(m, monkeypatch):
    """Each (node, site) runs only the recursion it keeps, a chunk at a time: the same bits as
    both recursions over every column, on the laws the optimizer's descent sees."""
    from stats import poissonbinomial
    from stats.poissonbinomial import leave_one_out_at, poisson_binomial_pmf
    from stats.unbalanced import site_cdfs

    rng = np.random.default_rng(m)
    sizes = np.concatenate([rng.integers(10, 10**6, size=m // 2), np.full(m - m // 2, 20)]).astype(float)
    ells = np.ceil(0.9 * (sizes + 1)) - 1
    p = site_cdfs(np.linspace(0.8, 0.97, 96), sizes, ells)
    pmf = poisson_binomial_pmf(p)
    monkeypatch.setattr(poissonbinomial, "LOO_CHUNK", 1000)
    for c in (0, m // 3, m // 2, m - 1):
        steps = [0]
        assert np.array_equal(leave_one_out_at(pmf, p, c, work=steps), _leave_one_out_before(pmf, p, c))
        assert steps[0] >= 0


def test_the_descent_budget_stops_the_search_with_a_verified_plan(monkeypatch):
    """With DESCENT_WORK spent, the optimizer returns the best verified plan found so far: exact
    coverage at least 1 - alpha, never farther from it than the paper rule; with the budget not
    reached the plan is the one the unbounded search finds."""
    from stats import optimizer
    from stats.unbalanced import coverage_unbalanced

    sizes = (20,) * 59 + (10**6,)
    unbounded = optimizer.plan_optimized.__wrapped__(sizes, 0.1)
    monkeypatch.setattr(optimizer, "DESCENT_WORK", 10**30)
    assert optimizer.plan_optimized.__wrapped__(sizes, 0.1) == unbounded
    paper = plan_paper_rule(sizes, 0.1)
    for budget in (0, 1e6, 3e7, 1e8):
        monkeypatch.setattr(optimizer, "DESCENT_WORK", budget)
        plan = optimizer.plan_optimized.__wrapped__(sizes, 0.1)
        assert plan.coverage == pytest.approx(coverage_unbalanced(sizes, plan.ells, plan.k), abs=1e-12)
        assert plan.coverage >= 0.9 - COVERAGE_TOLERANCE
        assert unbounded.coverage <= plan.coverage <= paper.coverage
    assert plan.coverage < paper.coverage  # some descent fits in 10^8
