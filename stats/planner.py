"""Choosing the orders of the quantile of quantiles: who sends which local order statistic, and
which of the answers the server keeps.

Equal sizes (paper 000, eq. 6): (ell*, k*) = argmin {M[ell, k] : M[ell, k] >= 1 - alpha}. M is
non-decreasing in ell and in k (appendix A.2), so for each ell the feasible k form an interval
[k_min(ell), m]; a vectorized bisection finds k_min for every ell at once.

Unequal sizes (appendix A.1): the paper's rule fixes ell_j = ceil((1 - alpha)(n_j + 1)) and
takes the smallest valid k; `stats.optimizer` chooses every ell_j. Both coverages are exact
(stats.unbalanced).

Dropouts. Sites are asked before we know who will answer, so only k can change afterwards.
A plan is robust to d dropouts when M(ell, m - d) >= 1 - alpha: for any set R of at least m - d
answering sites, max_{j in R} U_j is at least the (m - d)-th smallest of all m, so k = |R| is
valid for R whatever R is. After the answers arrive, `replan_after_dropouts` takes the
smallest valid k for the sites that answered (valid when dropping out does not depend on the
scores); when none exists the outcome is the whole line, with the reason.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.special import betainc, ndtri

from stats.conformal import check_alpha, split_conformal_order
from stats.dp import correction_order
from stats.orderstats import qq_coverage
from stats.unbalanced import coverage_unbalanced, smallest_order_reaching

#: Coverages are computed to ~1e-13; a plan within this of 1 - alpha counts as reaching it (so
#: that exact cases such as n = 1, M = k / (m + 1) = 1 - alpha are not lost to rounding).
COVERAGE_TOLERANCE = 1e-12

#: Probability level of the conditional guarantee reported with each plan (theorem 3.3).
CONDITIONAL_DELTA = 0.05


@dataclass(frozen=True)
class QQPlan:
    """Per-site orders `ells`, server order `k`, and the exact coverage they guarantee.

    `ells` and `k` are None when no plan reaches 1 - alpha: the only valid set is then the whole
    line (the infinite quantile of paper 000 eq. 2), and `reason` says why.
    """

    sizes: tuple[int, ...]
    alpha: float
    ells: tuple[int, ...] | None
    k: int | None
    coverage: float
    rule: str = "optimal"
    dropouts: int = 0
    reason: str = ""

    @property
    def m(self) -> int:
        return len(self.sizes)

    @property
    def infinite(self) -> bool:
        return self.ells is None

    @property
    def ell(self) -> int | None:
        """The common local order, or None when sites use different ones."""
        if self.ells is None or len(set(self.ells)) != 1:
            return None
        return self.ells[0]

    def conditional_bound(self, delta: float = CONDITIONAL_DELTA) -> float | None:
        """Theorem 3.3: with probability >= 1 - delta over the calibration data, the miscoverage
        is at most alpha + sqrt(log(1/delta) / (2N)), when L >= (1 - alpha) N; None otherwise.

        L = ell * k for equal sizes; for unequal sizes the proof (appendix C.2) needs only a
        lower bound on the number of scores at or below Q, and at least the k smallest ell_j
        of the finite answers lie there, so L is their sum.
        """
        if self.infinite:
            return None
        total = sum(self.sizes)
        finite = sorted(e for e, n in zip(self.ells, self.sizes) if e <= n)
        at_most_q = sum(finite[: self.k])
        if at_most_q < (1.0 - self.alpha) * total:
            return None
        return self.alpha + math.sqrt(math.log(1.0 / delta) / (2.0 * total))

    def as_dict(self, per_site: bool = False) -> dict:
        equal = len(set(self.sizes)) == 1 and not per_site
        out = {"m": self.m, "alpha": self.alpha, "rule": self.rule, "dropouts": self.dropouts}
        if equal:
            out.update(n=self.sizes[0], ell=self.ell if self.ells is not None else None)
        else:
            out.update(sizes=list(self.sizes), ell=list(self.ells) if self.ells is not None else None)
        out.update(k=self.k, coverage=self.coverage)
        bound = self.conditional_bound()
        out["conditional"] = ({"delta": CONDITIONAL_DELTA, "miscoverage_bound": bound}
                              if bound is not None else None)
        if self.reason:
            out["reason"] = self.reason
        return out


# ---------------------------------------------------------------------------------------------
# Equal sizes


def first_reaching(evaluate, lo, hi, threshold: float, guess=None):
    """For each row i, the smallest integer x in lo_i + 1 .. hi_i - 1 with evaluate(rows, xs) >=
    `threshold`, the evaluation being non-decreasing in x (M is, in ell and in k): hi_i when there
    is none, which callers pass as one past the largest x (virtual: never evaluated). Returns
    (x, value there; NaN where x = hi_i was never evaluated).

    A bracketed search. Each round probes, for every row whose bracket (lo, hi) is not closed, the
    pair (x - 1, x) around the predicted crossing x: from `guess` first, then by the secant
    through the bracket's ends, or Newton's step from its one evaluated end with the slope of the
    last pair. M is smooth and nearly linear over a few orders, so a pair usually closes the
    bracket in two or three rounds where bisection takes log2(hi - lo); a round that does not
    halve the bracket is followed by a bisection step, so the worst case stays logarithmic. The
    answer is the one bisection finds (the same smallest x, and the same value: an evaluation
    depends only on its own (ell, k))."""
    lo, hi = np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)
    rows = lo.size
    lo_val, hi_val = np.full(rows, np.nan), np.full(rows, np.nan)
    slope = np.full(rows, np.nan)
    bisect = np.zeros(rows, dtype=bool)
    pending = np.zeros(rows, dtype=bool) if guess is None else np.ones(rows, dtype=bool)
    guess = np.zeros(rows) if guess is None else np.asarray(guess, dtype=float)
    while True:
        act = np.flatnonzero(hi - lo > 1)
        if not act.size:
            return hi, hi_val
        a_lo, a_hi = lo[act], hi[act]
        l_val, h_val, s = lo_val[act], hi_val[act], slope[act]
        with np.errstate(divide="ignore", invalid="ignore"):
            secant = a_lo + (threshold - l_val) / (h_val - l_val) * (a_hi - a_lo)
            from_lo = a_lo + (threshold - l_val) / s
            from_hi = a_hi - (h_val - threshold) / s
        x = np.where(~np.isnan(l_val) & ~np.isnan(h_val), secant,
                     np.where(~np.isnan(l_val) & (s > 0), from_lo,
                              np.where(~np.isnan(h_val) & (s > 0), from_hi, np.nan)))
        x = np.where(pending[act], guess[act], x)
        mid = (a_lo + a_hi) // 2
        bad = bisect[act] | ~np.isfinite(x)
        upper = np.where(bad, mid, np.clip(np.ceil(np.where(np.isfinite(x), x, 0.0)), a_lo + 1, a_hi - 1))
        upper = upper.astype(np.int64)
        lower = upper - 1
        pair = ~bad & (lower > a_lo)  # probe lower as well: closes the bracket when the prediction is right
        width = a_hi - a_lo
        probe_rows = np.concatenate([act[pair], act])
        probe_x = np.concatenate([lower[pair], upper])
        values = np.asarray(evaluate(probe_rows, probe_x), dtype=float).reshape(-1)
        low_vals, up_vals = values[:pair.sum()], values[pair.sum():]
        # the lower probes first, then the upper: each keeps the bracket's invariants
        for idx, xs, vals in ((act[pair], lower[pair], low_vals), (act, upper, up_vals)):
            ok = vals >= threshold
            take_hi = ok & (xs < hi[idx])
            hi[idx[take_hi]], hi_val[idx[take_hi]] = xs[take_hi], vals[take_hi]
            take_lo = ~ok & (xs > lo[idx])
            lo[idx[take_lo]], lo_val[idx[take_lo]] = xs[take_lo], vals[take_lo]
        slope[act[pair]] = up_vals[pair] - low_vals
        pending[act] = False
        bisect[act] = (hi[act] - lo[act]) * 2 > width


def smallest_valid_k(m: int, n: int, ell, alpha: float):
    """For each ell, the smallest k with M[ell, k] >= 1 - alpha, and that coverage.

    Returns (k, coverage) arrays; k is 0 and coverage NaN where even k = m falls short.
    """
    ells = np.atleast_1d(np.asarray(ell, dtype=np.int64))
    threshold = 1.0 - alpha - COVERAGE_TOLERANCE
    # E[U_(ell,k)] ~ G_ell^{-1}(k / (m + 1)), so the crossing is near k = (m + 1) G_ell(1 - alpha)
    guess = np.ceil((m + 1) * betainc(ells, n - ells + 1, 1.0 - alpha))
    ks, covs = first_reaching(lambda rows, xs: qq_coverage(m, n, ells[rows], xs),
                              np.zeros(ells.shape, dtype=np.int64), np.full(ells.shape, m + 1), threshold, guess)
    none = ks > m
    return np.where(none, 0, ks), np.where(none, np.nan, covs)


def smallest_valid_ell(m: int, n: int, k, alpha: float, at_least: int = 1):
    """For each k, the smallest ell >= `at_least` with M[ell, k] >= 1 - alpha, and that coverage
    (M is increasing in ell: paper 000 eq. 5), by `first_reaching` over ell: a few evaluations of
    M per k where smallest_valid_k costs as many per ell. Returns (ell, coverage) arrays; ell is 0
    and coverage NaN where even ell = n falls short."""
    ks = np.atleast_1d(np.asarray(k, dtype=np.int64))
    threshold = 1.0 - alpha - COVERAGE_TOLERANCE
    # the k-th smallest of m sites' ell-th order statistics is near the ell at which
    # P(Bin(n, 1 - alpha) >= ell) = k / (m + 1) (a normal approximation: only a first guess)
    spread = math.sqrt(n * (1.0 - alpha) * alpha)
    guess = n * (1.0 - alpha) + 0.5 + spread * ndtri(1.0 - ks / (m + 1.0))
    ells, covs = first_reaching(lambda rows, xs: qq_coverage(m, n, xs, ks[rows]),
                                np.full(ks.shape, at_least - 1), np.full(ks.shape, n + 1), threshold, guess)
    none = ells > n
    return np.where(none, 0, ells), np.where(none, np.nan, covs)


@lru_cache(maxsize=256)
def plan_quantile_of_quantiles(m: int, n: int, alpha: float, dropouts: int = 0) -> QQPlan:
    """(ell*, k*) of paper 000 eq. (6) for m sites with n scores each, robust to `dropouts`.

    The least coverage at or above 1 - alpha over every (ell, k) (ties: the smallest ell). M is
    increasing in ell and in k, so a plan's ell lies between ell_0, the smallest ell valid with
    m - dropouts answers (with no dropouts: valid at all), and ell_1, the smallest valid with k = 1
    (above it k = 1 is valid and M[ell, 1] only grows). The plan is found either ell by ell over
    ell_0..ell_1 (each ell's smallest valid k) or k by k (each k's smallest valid ell), whichever
    has fewer rows: the same plan (tested against the whole table), a few evaluations of M per row
    (`first_reaching`). ell_1 - ell_0 is about the spread of the binomial's quantiles over the k,
    2 sqrt(n alpha (1 - alpha)) Phi^{-1}(1 - 1/(m + 1)): some 2,200 rows at n = 10^6 and m = 10,000
    (growing like sqrt(log m)), where the k-by-k bisection took 21 evaluations for each of m rows.
    Issue 48: a peer's announced size must not stall everyone's session; the cost at the join
    bound is in bench/plan_time.py."""
    check_alpha(alpha)
    _check_dropouts(m, dropouts)
    sizes = (n,) * m
    ends, _ = smallest_valid_ell(m, n, [m - dropouts, 1], alpha)
    floor, cap = int(ends[0]), int(ends[1]) or n
    if floor == 0:
        return _no_valid_plan(m, n, alpha, dropouts)
    if m < cap - floor + 1:
        return _plan_by_k(m, n, alpha, dropouts, floor)
    ells = np.arange(floor, max(cap, floor) + 1)
    ks, covs = smallest_valid_k(m, n, ells, alpha)
    if not (ks > 0).any():
        return _no_valid_plan(m, n, alpha, dropouts)
    covs = np.where(ks > 0, covs, np.inf)
    i = int(np.argmin(covs))
    return QQPlan(sizes, alpha, (int(ells[i]),) * m, int(ks[i]), float(covs[i]), "optimal", dropouts)


def _no_valid_plan(m: int, n: int, alpha: float, dropouts: int) -> QQPlan:
    """The infinite plan of eq. (6) when no (ell, k) reaches 1 - alpha, saying how close the best
    (every site's maximum) comes."""
    worst = m - dropouts
    best = float(qq_coverage(m, n, n, worst))
    return QQPlan((n,) * m, alpha, None, None, 1.0, "optimal", dropouts,
                  reason=(f"no (ell, k) reaches coverage {1 - alpha:g} with {worst} of m={m} sites "
                          f"of n={n} scores answering (the best, every site's maximum, gives "
                          f"{best:.6f}); the valid set is the whole line"))


def _plan_by_k(m: int, n: int, alpha: float, dropouts: int, floor: int | None = None) -> QQPlan:
    """plan_quantile_of_quantiles k by k: for each k the smallest valid ell (at least `floor`,
    the smallest ell that stays valid with m - dropouts answers, M being increasing in ell), then
    the least coverage (ties: the smallest ell, then the smallest k, as the ell-by-ell search picks)."""
    sizes = (n,) * m
    if floor is None:
        robust, _ = smallest_valid_ell(m, n, [m - dropouts], alpha)
        floor = int(robust[0])
    ks = np.arange(1, m + 1)
    ells, covs = smallest_valid_ell(m, n, ks, alpha, at_least=floor) if floor else (np.zeros(m, int), np.zeros(m))
    valid = ells > 0
    if not valid.any():
        return _no_valid_plan(m, n, alpha, dropouts)
    order = np.lexsort((ks[valid], ells[valid], covs[valid]))
    i = np.flatnonzero(valid)[order[0]]
    return QQPlan(sizes, alpha, (int(ells[i]),) * m, int(ks[i]), float(covs[i]), "optimal", dropouts)


# ---------------------------------------------------------------------------------------------
# Unequal sizes and re-planning


def smallest_valid_k_unbalanced(sizes, ells, alpha: float) -> tuple[int, float]:
    """The smallest k with M(ells, k) >= 1 - alpha (exact), or (0, nan) if none.

    Only k up to the number of finite answers (ell_j <= n_j) are considered: beyond it the k-th
    answer is surely +inf, which is the whole line, not a plan.
    """
    sizes, ells = tuple(int(s) for s in sizes), tuple(int(e) for e in ells)
    m = sum(e <= n for e, n in zip(ells, sizes))
    if m == 0:
        return 0, math.nan
    if len(set(sizes)) == 1 and len(set(ells)) == 1 and ells[0] <= sizes[0]:
        ks, covs = smallest_valid_k(m, sizes[0], [ells[0]], alpha)
        return int(ks[0]), float(covs[0])
    return smallest_order_reaching(sizes, ells, 1.0 - alpha - COVERAGE_TOLERANCE)


@lru_cache(maxsize=256)
def plan_paper_rule(sizes: tuple[int, ...], alpha: float, dropouts: int = 0) -> QQPlan:
    """Paper 000 appendix A.1: ell_j = ceil((1 - alpha)(n_j + 1)), then the smallest valid k.

    A site with n_j < ell_j answers +inf (eq. 2). With `dropouts` > 0 the plan must also be
    robust (see the module docstring); the rule has no freedom to make it so, so it refuses.
    """
    check_alpha(alpha)
    sizes = tuple(int(s) for s in sizes)
    _check_dropouts(len(sizes), dropouts)
    ells = tuple(split_conformal_order(n, alpha) for n in sizes)
    m = len(sizes)
    if dropouts and not is_robust(sizes, ells, dropouts, alpha):
        return QQPlan(sizes, alpha, None, None, 1.0, "paper_rule", dropouts,
                      reason=(f"the paper rule's orders cannot absorb {dropouts} dropout(s): with "
                              f"{m - dropouts} answering sites even their maximum falls short of "
                              f"{1 - alpha:g}; the valid set is the whole line"))
    k, coverage = smallest_valid_k_unbalanced(sizes, ells, alpha)
    if k == 0:
        finite = sum(e <= n for e, n in zip(ells, sizes))
        return QQPlan(sizes, alpha, None, None, 1.0, "paper_rule", dropouts,
                      reason=(f"with ell_j = ceil((1 - alpha)(n_j + 1)) no k reaches {1 - alpha:g} "
                              f"({finite} of {m} sites hold enough scores to answer finitely); "
                              f"the valid set is the whole line"))
    return QQPlan(sizes, alpha, ells, k, float(coverage), "paper_rule", dropouts)


def is_robust(sizes, ells, dropouts: int, alpha: float) -> bool:
    """Whether every set of at least m - dropouts answering sites admits a valid k.

    With F the sites that answer finitely, any such set keeps at least |F| - dropouts of them,
    whose maximum is at least the (|F| - dropouts)-th smallest finite answer of all m.
    """
    finite = [(n, e) for n, e in zip(sizes, ells) if e <= n]
    keep = len(finite) - dropouts
    if keep < 1:
        return False
    f_sizes, f_ells = zip(*finite)
    return coverage_unbalanced(f_sizes, f_ells, keep) >= 1.0 - alpha - COVERAGE_TOLERANCE


def replan_after_dropouts(sizes, ells, alpha: float) -> QQPlan:
    """Server order k for the sites that answered, their orders ell_j being fixed."""
    check_alpha(alpha)
    sizes, ells = tuple(int(s) for s in sizes), tuple(int(e) for e in ells)
    if not sizes:
        return QQPlan((), alpha, None, None, 1.0, "replan", reason="no site answered")
    k, coverage = smallest_valid_k_unbalanced(sizes, ells, alpha)
    if k == 0:
        best = coverage_unbalanced(sizes, ells, len(sizes))
        return QQPlan(sizes, alpha, None, None, 1.0, "replan",
                      reason=(f"with {len(sizes)} answering sites and their orders, even k=m gives "
                              f"coverage {best:.6f} < {1 - alpha:g}; the valid set is the whole line"))
    return QQPlan(sizes, alpha, ells, k, float(coverage), "replan")


def replan_server_order(m_answered: int, n: int, ell: int, alpha: float) -> QQPlan:
    """Equal-size shorthand of `replan_after_dropouts`."""
    return replan_after_dropouts((n,) * m_answered, (ell,) * m_answered, alpha)


def _check_dropouts(m: int, dropouts: int) -> None:
    if not 0 <= dropouts < m:
        raise ValueError(f"dropouts must lie in [0, m - 1] = [0, {m - 1}], got {dropouts}")


MAX_CANDIDATES = 5000


def k_after_dropouts(sizes: dict[str, int], ells: dict[str, int], dropped, answers: int,
                     level_alpha: float) -> int | str:
    """k for the sites whose bins arrived (replan_after_dropouts), or why there is none. Answers
    may be anonymous (a shuffled batch): the senders are known, but when some of their
    ciphertexts did not open, not which. Then every possible set of `answers` senders is tried
    and the largest k kept (coverage grows with k), so the guarantee holds whichever it was."""
    senders = [s for s in sorted(sizes) if s not in dropped]
    groups = sorted({(sizes[s], ells[s]) for s in senders})
    if len(senders) == answers or len(groups) == 1:
        candidates = [senders[:answers]]
    elif math.comb(len(senders), answers) <= MAX_CANDIDATES:
        candidates = itertools.combinations(senders, answers)
    else:
        return (f"{len(senders) - answers} of {len(senders)} sealed messages did not open and the sites "
                f"differ in size: too many possibilities ({len(senders)} choose {answers}) to plan for all")
    best = None
    for chosen in candidates:
        replanned = replan_after_dropouts([sizes[s] for s in chosen], [ells[s] for s in chosen], level_alpha)
        if replanned.infinite:
            return replanned.reason
        best = replanned.k if best is None else max(best, replanned.k)
    return best


#: Room for the rounding of computed coverages (about 1e-13) when a level's lower bound rules out
#: every gamma beyond it in choose_gamma.
PROXY_SLACK = 1e-9


@lru_cache(maxsize=256)
def choose_gamma(sizes: tuple[int, ...], alpha: float, epsilon: float, bins: int, grid: int, dropouts: int):
    """Paper 000 section 4, 'Choosing gamma': over gamma = 1/(G+1), ..., G/(G+1), the feasible
    plan whose proxy M[ell_gamma + ell_cor, k_gamma] is smallest (the first such). Returns
    (gamma, plan at the adjusted level, ell_cor, proxy) or None when no gamma is feasible.

    Two shortcuts give the same choice as planning every gamma. A plan at gamma covers at least
    (1 - alpha) / (1 - gamma alpha) and raising its orders by ell_cor only adds coverage, so no
    proxy at gamma or beyond (the bound grows with gamma) can be smaller than a proxy already at
    or below that bound: the search stops there (at the join bound, n_j = 10^6, after the first
    feasible gamma). And the paper rule's orders follow from the sizes alone, so a gamma whose
    raised orders exceed some n_j is skipped before its server order is searched for."""
    m = len(sizes)
    equal = len(set(sizes)) == 1
    best = None
    for gamma in np.arange(1, grid + 1) / (grid + 1):
        level_alpha = 1.0 - (1.0 - alpha) / (1.0 - gamma * alpha)
        if level_alpha <= 0:
            continue
        if best is not None and (1.0 - level_alpha) - COVERAGE_TOLERANCE - PROXY_SLACK > best[3]:
            break
        correction = correction_order(epsilon, bins, gamma, alpha, m)
        if not equal and any(split_conformal_order(n, level_alpha) + correction > n for n in set(sizes)):
            continue
        plan = (plan_quantile_of_quantiles(m, sizes[0], level_alpha, dropouts) if equal
                else plan_paper_rule(sizes, level_alpha, dropouts))
        if plan.infinite:
            continue
        raised = [e + correction for e in plan.ells]
        if any(r > n for r, n in zip(raised, sizes)):
            continue
        proxy = (float(qq_coverage(m, sizes[0], raised[0], plan.k)) if equal
                 else coverage_unbalanced(sizes, raised, plan.k))
        if best is None or proxy < best[3]:
            best = (float(gamma), plan, correction, proxy)
    return best
