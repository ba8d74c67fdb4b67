"""Choosing the orders (ell, k) of the quantile-of-quantiles (paper 000, eq. 6).

(ell*, k*) = argmin { M[ell, k] : M[ell, k] >= 1 - alpha }.

M is non-decreasing in ell and in k (paper 000, appendix A.2), so for each ell the feasible k
form an interval [k_min(ell), m] and the smallest feasible coverage for that ell is
M[ell, k_min(ell)]. We find k_min for all ell at once by a vectorized bisection seeded with the
approximation E[U_(ell,k)] ~ G_ell^{-1}(k / (m + 1)), then take the argmin over ell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import betainc

from protocol.conformal import check_alpha
from protocol.orderstats import qq_coverage

#: Coverages are computed to ~1e-15; a plan whose coverage is within this of 1 - alpha counts as
#: reaching it (so that exact cases such as n = 1, M = k / (m + 1) are not lost to rounding).
COVERAGE_TOLERANCE = 1e-12


@dataclass(frozen=True)
class QQPlan:
    """Orders for FedCP-QQ and the exact coverage they guarantee.

    `ell` and `k` are None when no pair reaches 1 - alpha: the only valid set is then the whole
    line (the infinite quantile of paper 000 eq. 2), and `reason` says why.
    """

    m: int
    n: int
    alpha: float
    ell: int | None
    k: int | None
    coverage: float
    reason: str = ""

    @property
    def infinite(self) -> bool:
        return self.ell is None

    def as_dict(self) -> dict:
        out = {"m": self.m, "n": self.n, "alpha": self.alpha, "ell": self.ell, "k": self.k,
               "coverage": self.coverage}
        if self.reason:
            out["reason"] = self.reason
        return out


def smallest_valid_k(m: int, n: int, ell, alpha: float):
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


def plan_quantile_of_quantiles(m: int, n: int, alpha: float) -> QQPlan:
    """(ell*, k*) of paper 000 eq. (6) for m sites with n scores each."""
    check_alpha(alpha)
    ells = np.arange(1, n + 1)
    ks, covs = smallest_valid_k(m, n, ells, alpha)
    if not (ks > 0).any():
        best = float(qq_coverage(m, n, n, m))
        return QQPlan(m, n, alpha, None, None, 1.0,
                      reason=(f"no (ell, k) reaches coverage {1 - alpha:g} with m={m} sites of n={n} "
                              f"scores (the best, ell=n, k=m, gives {best:.6f} = mn/(mn+1)); "
                              f"the valid set is the whole line"))
    covs = np.where(ks > 0, covs, np.inf)
    i = int(np.argmin(covs))
    return QQPlan(m, n, alpha, int(ells[i]), int(ks[i]), float(covs[i]))


def replan_server_order(m_answered: int, n: int, ell: int, alpha: float) -> QQPlan:
    """Server order k for the sites that actually answered, the local order ell being fixed.

    Used after dropouts: the sites were asked for their ell-th score before we knew who would
    answer, so only k can change; if no k reaches 1 - alpha the outcome is the infinite set.
    """
    check_alpha(alpha)
    if m_answered < 1:
        return QQPlan(0, n, alpha, None, None, 1.0, reason="no site answered")
    ks, covs = smallest_valid_k(m_answered, n, [ell], alpha)
    if ks[0] == 0:
        best = float(qq_coverage(m_answered, n, ell, m_answered))
        return QQPlan(m_answered, n, alpha, None, None, 1.0,
                      reason=(f"with {m_answered} answering sites and ell={ell}, even k=m gives "
                              f"coverage {best:.6f} < {1 - alpha:g}; the valid set is the whole line"))
    return QQPlan(m_answered, n, alpha, ell, int(ks[0]), float(covs[0]))
