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
from scipy.special import betainc

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


def smallest_valid_k(m: int, n: int, ell, alpha: float, *, at_least=None):
    """For each ell, the smallest k with M[ell, k] >= 1 - alpha, and that coverage.

    Returns (k, coverage) arrays; k is 0 and coverage NaN where even k = m falls short.
    """
    ells = np.atleast_1d(np.asarray(ell, dtype=np.int64))
    threshold = 1.0 - alpha - COVERAGE_TOLERANCE
    cov_hi = np.asarray(qq_coverage(m, n, ells, m), dtype=float).reshape(-1)
    feasible = cov_hi >= threshold
    k_out = np.zeros(ells.shape, dtype=np.int64)
    cov_out = np.full(ells.shape, np.nan)
    if not feasible.any():
        return k_out, cov_out
    e = ells[feasible]
    cov_hi = cov_hi[feasible]
    lo = np.zeros(e.shape, dtype=np.int64)  # invariant: M[e, lo] < threshold (lo = 0: virtual)
    hi = np.full(e.shape, m, dtype=np.int64)  # invariant: M[e, hi] >= threshold

    def probe(sel, ks):
        ok_cov = np.asarray(qq_coverage(m, n, e[sel], ks), dtype=float).reshape(-1)
        ok = ok_cov >= threshold
        idx = np.flatnonzero(sel)
        hi[idx[ok]], cov_hi[idx[ok]] = ks[ok], ok_cov[ok]
        lo[idx[~ok]] = ks[~ok]

    # Seed: E[U_(ell,k)] ~ G_ell^{-1}(k / (m + 1)), so k ~ (m + 1) G_ell(1 - alpha); probe around it.
    guess = np.ceil((m + 1) * betainc(e, n - e + 1, 1.0 - alpha)).astype(np.int64)
    for offset in (-2, 2):
        ks = np.clip(guess + offset, lo + 1, hi - 1)
        sel = hi - lo > 1
        if sel.any():
            probe(sel, ks[sel])
    while True:
        sel = hi - lo > 1
        if not sel.any():
            break
        probe(sel, (lo[sel] + hi[sel]) // 2)
    k_out[feasible], cov_out[feasible] = hi, cov_hi
    return k_out, cov_out


def smallest_valid_ell(m: int, n: int, k, alpha: float, at_least: int = 1):
    """For each k, the smallest ell >= `at_least` with M[ell, k] >= 1 - alpha, and that coverage
    (M is increasing in ell: paper 000 eq. 5), by bisection over ell: O(m log n) evaluations of
    M where smallest_valid_k costs O(n log m). Returns (ell, coverage) arrays; ell is 0 and
    coverage NaN where even ell = n falls short."""
    ks = np.atleast_1d(np.asarray(k, dtype=np.int64))
    threshold = 1.0 - alpha - COVERAGE_TOLERANCE
    cov_hi = np.asarray(qq_coverage(m, n, np.full(ks.shape, n), ks), dtype=float).reshape(-1)
    feasible = cov_hi >= threshold
    ell_out, cov_out = np.zeros(ks.shape, dtype=np.int64), np.full(ks.shape, np.nan)
    if not feasible.any():
        return ell_out, cov_out
    kf, cov_hi = ks[feasible], cov_hi[feasible]
    lo = np.full(kf.shape, at_least - 1, dtype=np.int64)  # invariant: M[lo, k] < threshold (or lo virtual)
    hi = np.full(kf.shape, n, dtype=np.int64)  # invariant: M[hi, k] >= threshold
    while True:
        sel = hi - lo > 1
        if not sel.any():
            break
        mid = (lo[sel] + hi[sel]) // 2
        cov = np.asarray(qq_coverage(m, n, mid, kf[sel]), dtype=float).reshape(-1)
        ok = cov >= threshold
        idx = np.flatnonzero(sel)
        hi[idx[ok]], cov_hi[idx[ok]] = mid[ok], cov[ok]
        lo[idx[~ok]] = mid[~ok]
    ell_out[feasible], cov_out[feasible] = hi, cov_hi
    return ell_out, cov_out


@lru_cache(maxsize=256)
def plan_quantile_of_quantiles(m: int, n: int, alpha: float, dropouts: int = 0) -> QQPlan:
    """(ell*, k*) of paper 000 eq. (6) for m sites with n scores each, robust to `dropouts`.

    The least coverage at or above 1 - alpha over every (ell, k) (ties: the smallest ell). M is
    increasing in ell and in k, so it is found either ell by ell (each ell's smallest valid k,
    O(n log m) evaluations of M) or k by k (each k's smallest valid ell, O(m log n)), whichever is
    fewer: the same plan (tested), and planning for sites of a million scores takes milliseconds
    where the ell-by-ell search took 44 s and 1.6 GiB (issue 48: a peer's announced size must
    not stall everyone's session)."""
    check_alpha(alpha)
    _check_dropouts(m, dropouts)
    sizes = (n,) * m
    if m * max(1, math.ceil(math.log2(n + 1))) < n:
        return _plan_by_k(m, n, alpha, dropouts)
    ells = np.arange(1, n + 1)
    if dropouts:
        robust = np.asarray(qq_coverage(m, n, ells, m - dropouts)) >= 1 - alpha - COVERAGE_TOLERANCE
        ells = ells[robust]
    ks, covs = smallest_valid_k(m, n, ells, alpha) if ells.size else (np.zeros(0, int), np.zeros(0))
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


def _plan_by_k(m: int, n: int, alpha: float, dropouts: int) -> QQPlan:
    """plan_quantile_of_quantiles k by k: for each k the smallest valid ell (at least the smallest
    ell that stays valid with m - dropouts answers, M being increasing in ell), then the least
    coverage (ties: the smallest ell, then the smallest k, as the ell-by-ell search picks)."""
    sizes, floor = (n,) * m, 1
    if dropouts:
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


@lru_cache(maxsize=256)
def choose_gamma(sizes: tuple[int, ...], alpha: float, epsilon: float, bins: int, grid: int, dropouts: int):
    """Paper 000 section 4, 'Choosing gamma': over gamma = 1/(G+1), ..., G/(G+1), the feasible
    plan whose proxy M[ell_gamma + ell_cor, k_gamma] is smallest. Returns
    (gamma, plan at the adjusted level, ell_cor, proxy) or None when no gamma is feasible."""
    m = len(sizes)
    equal = len(set(sizes)) == 1
    best = None
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
