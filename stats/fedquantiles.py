"""Federated quantile estimation (paper 004, section 5).

- `naive_table_quantile`: the smallest bin limit whose table CDF exceeds p (section 5.2).
- YJ table (eq. 6-9): lambda in [0, 2] maximizing cor(Phi^-1(F(b_k)), h_lambda(b_k)) over the
  interior limits, a_0 and a_1 by least squares, Q_p = h^-1(a_0 + a_1 Phi^-1(p)). One pass: only
  the K-anonymous table is used.
- YJ likelihood (eq. 10-12), one pass: every site returns, for a public grid of lambda values,
  n_l, sum h_lambda(x), sum h_lambda(x)^2 and sum sign(x) log(|x| + 1); the coordinator takes
  the grid point of largest log likelihood and Q_p = h^-1(mu + sigma Phi^-1(p)).
  `yj_likelihood_continuous` maximizes the same likelihood over lambda continuously (iterative);
  `golden_section_step` is the search the protocol's `fit: continuous` runs, one round a step.
- `linear_table_quantile`: the table CDF interpolated linearly between bin limits (section 5.2).
- Quantile loss (eq. 4): iterative; each round every site returns its loss and (sub)gradient at
  the coordinator's q. Not privacy preserving (section 5.1: the loss changes slope at every data
  value, so repeated calls reveal the values); reported as such.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import optimize, stats

LAMBDA_RANGE = (0.0, 2.0)  # eq. (9): h_lambda maps onto R only for 0 <= lambda <= 2


def yeo_johnson(x: np.ndarray, lam: float) -> np.ndarray:
    """Eq. (5), the Yeo-Johnson transformation h_lambda."""
    x = np.asarray(x, dtype=float)
    out = np.empty_like(x)
    pos = x >= 0
    if abs(lam) > 1e-12:
        out[pos] = ((1.0 + x[pos]) ** lam - 1.0) / lam
    else:
        out[pos] = np.log1p(x[pos])
    if abs(lam - 2.0) > 1e-12:
        out[~pos] = -((1.0 - x[~pos]) ** (2.0 - lam) - 1.0) / (2.0 - lam)
    else:
        out[~pos] = -np.log1p(-x[~pos])
    return out


def yeo_johnson_inverse(z: np.ndarray, lam: float) -> np.ndarray:
    """h_lambda^-1, defined on all of R for lambda in [0, 2] (eq. 9)."""
    z = np.asarray(z, dtype=float)
    out = np.empty_like(z)
    pos = z >= 0
    if abs(lam) > 1e-12:
        out[pos] = (1.0 + lam * z[pos]) ** (1.0 / lam) - 1.0
    else:
        out[pos] = np.expm1(z[pos])
    if abs(lam - 2.0) > 1e-12:
        out[~pos] = 1.0 - (1.0 - (2.0 - lam) * z[~pos]) ** (1.0 / (2.0 - lam))
    else:
        out[~pos] = -np.expm1(-z[~pos])
    return out


def table_cdf(counts: np.ndarray) -> np.ndarray:
    """F-hat at the upper limit of each bin of a one-group table."""
    counts = np.asarray(counts, dtype=float)
    return np.cumsum(counts) / counts.sum()


def naive_table_quantile(limits: np.ndarray, counts: np.ndarray, p: float) -> float:
    """Section 5.2: the smallest bin limit b_i with F-hat(b_i) > p (>= for the last)."""
    cdf = table_cdf(counts)
    i = int(np.searchsorted(cdf, p, side="right"))
    return float(np.asarray(limits, dtype=float)[1 + min(i, cdf.size - 1)])


def linear_table_quantile(limits: np.ndarray, counts: np.ndarray, p: float) -> float:
    """Section 5.2, the linear-interpolation estimate the paper tried and did not report ("the
    results were poor"): F-hat interpolated linearly between bin limits (a uniform distribution
    within each bin), F-hat(b_0) = 0, and Q_p where it crosses p. With infinite extreme limits the
    extreme bins have no width to interpolate over: Q_p is then the finite inner limit."""
    limits = np.asarray(limits, dtype=float)
    cdf = np.concatenate([[0.0], table_cdf(counts)])
    i = int(np.clip(np.searchsorted(cdf, p, side="left"), 1, cdf.size - 1))  # cdf[i-1] < p <= cdf[i]
    lo, hi, f_lo, f_hi = limits[i - 1], limits[i], cdf[i - 1], cdf[i]
    if not np.isfinite(lo) or not np.isfinite(hi) or f_hi <= f_lo:
        return float(hi if np.isfinite(hi) else lo)
    return float(lo + (p - f_lo) / (f_hi - f_lo) * (hi - lo))


def yj_table_fit(limits: np.ndarray, counts: np.ndarray) -> tuple[float, float, float]:
    """Eq. (6) and (8): (lambda, a_0, a_1) from the interior limits whose CDF lies in (0, 1)."""
    limits = np.asarray(limits, dtype=float)
    cdf = table_cdf(counts)[:-1]
    interior = limits[1:-1]
    keep = (cdf > 0) & (cdf < 1)
    b, z = interior[keep], stats.norm.ppf(cdf[keep])
    if b.size < 2:
        raise ValueError(f"the YJ table method needs two interior limits with 0 < F < 1, the table has {b.size}")

    def negative_correlation(lam):
        h = yeo_johnson(b, lam)
        return -float(np.corrcoef(z, h)[0, 1]) if np.std(h) > 0 else 1.0

    grid = np.linspace(*LAMBDA_RANGE, 41)
    best = grid[int(np.argmin([negative_correlation(v) for v in grid]))]
    lo, hi = max(LAMBDA_RANGE[0], best - 0.05), min(LAMBDA_RANGE[1], best + 0.05)
    lam = float(optimize.minimize_scalar(negative_correlation, bounds=(lo, hi), method="bounded").x)
    a1, a0 = np.polyfit(z, yeo_johnson(b, lam), 1)
    return lam, float(a0), float(a1)


def yj_table_quantile(limits, counts, p: float) -> float:
    """Eq. (7)."""
    lam, a0, a1 = yj_table_fit(limits, counts)
    return float(yeo_johnson_inverse(np.array([a0 + a1 * stats.norm.ppf(p)]), lam)[0])


def lambda_grid(points: int = 101) -> list[float]:
    """Paper 004, section 5.2 (YJ likelihood method): the grid of Yeo-Johnson lambdas sent to the
    sites, `points` evenly over LAMBDA_RANGE."""
    return [float(v) for v in np.linspace(*LAMBDA_RANGE, points)]


def yj_site_moments(values: np.ndarray, grid: list[float]) -> dict:
    """A site's answer for the one-pass YJ likelihood: n_l, per-lambda sum h and sum h^2, and
    sum sign(x) log(|x| + 1) (the Jacobian term of eq. 10)."""
    x = np.asarray(values, dtype=float)
    h = [yeo_johnson(x, lam) for lam in grid]
    return {"n": int(x.size), "sum_h": [float(v.sum()) for v in h], "sum_h2": [float((v * v).sum()) for v in h],
            "jacobian": float(np.sum(np.sign(x) * np.log1p(np.abs(x))))}


def yj_likelihood_fit(moments: list[dict], grid: list[float]) -> tuple[float, float, float, np.ndarray]:
    """Eq. (10)-(11) summed over sites: (lambda-hat, mu, sigma, log likelihood on the grid)."""
    n = sum(m["n"] for m in moments)
    s1 = np.sum([m["sum_h"] for m in moments], axis=0)
    s2 = np.sum([m["sum_h2"] for m in moments], axis=0)
    jac = sum(m["jacobian"] for m in moments)
    mean = s1 / n
    var = np.maximum(s2 / n - mean ** 2, 1e-300)
    loglik = -n / 2.0 * np.log(var) + (np.asarray(grid) - 1.0) * jac
    i = int(np.argmax(loglik))
    return float(grid[i]), float(mean[i]), float(math.sqrt(var[i])), loglik


def yj_quantile(lam: float, mu: float, sigma: float, p: float) -> float:
    """Eq. (12): Q_p = h_lambda^-1(mu + sigma Phi^-1(p))."""
    return float(yeo_johnson_inverse(np.array([mu + sigma * stats.norm.ppf(p)]), lam)[0])


def yj_likelihood_quantile(moments: list[dict], grid: list[float], p: float) -> float:
    """Eq. (12) at the grid maximizer."""
    lam, mu, sigma, _ = yj_likelihood_fit(moments, grid)
    return yj_quantile(lam, mu, sigma, p)


INVPHI = (math.sqrt(5.0) - 1.0) / 2.0  # the golden section, 0.618...


def golden_section_step(state: tuple[float, ...], asked: list[float] | None,
                        objective: dict) -> tuple[tuple[float, float, float, float], list[float]]:
    """One step of a golden-section search for the minimum of a unimodal function, in a form that
    asks for values rather than calling a function (the federated continuous YJ fit, section 5.2:
    each step is one round of yj_site_moments at the lambdas asked). `asked` None: `state` is the
    interval (a, b); returns (a, c, d, b), c = b - 0.618 (b - a) and d = a + 0.618 (b - a), and
    [c, d] to evaluate. Else `state` is (a, c, d, b) and `objective` maps c and d to their values:
    the side of the worse one is cut off (ties cut the right) and the one new point to evaluate
    returned; the interval holding the minimizer shrinks by 0.618 a step."""
    if asked is None:
        a, b = state
        c, d = b - INVPHI * (b - a), a + INVPHI * (b - a)
        return (a, c, d, b), [c, d]
    a, c, d, b = state
    if objective[c] <= objective[d]:  # the minimum lies in [a, d]
        b, d = d, c
        c = b - INVPHI * (b - a)
        return (a, c, d, b), [c]
    a, c = c, d  # in [c, b]
    d = a + INVPHI * (b - a)
    return (a, c, d, b), [d]


def yj_likelihood_continuous(moments_at, bounds: tuple[float, float] = LAMBDA_RANGE,
                             xtol: float = 1e-6) -> tuple[float, float, float]:
    """Eq. (10)-(11) maximized over lambda in `bounds` by a bounded scalar search instead of the
    one-pass grid (section 5.2: "a simple optimization routine that maximizes the log likelihood
    over lambda", iterative: every evaluation is one more round of yj_site_moments at one lambda).
    `moments_at(lam)` returns the sites' yj_site_moments at [lam]. Returns (lambda-hat, mu, sigma)."""
    def fit(lam):
        lam_hat, mu, sigma, loglik = yj_likelihood_fit(moments_at(lam), [lam])
        return -float(loglik[0]), mu, sigma

    lam = float(optimize.minimize_scalar(lambda v: fit(v)[0], bounds=bounds, method="bounded",
                                         options={"xatol": xtol}).x)
    _, mu, sigma = fit(lam)
    return lam, mu, sigma


def yj_continuous_quantile(sites: list[np.ndarray], p: float) -> float:
    """Eq. (12) at the continuous maximizer (yj_likelihood_continuous) of the sites' values."""
    lam, mu, sigma = yj_likelihood_continuous(lambda v: [yj_site_moments(x, [v]) for x in sites])
    return yj_quantile(lam, mu, sigma, p)


def quantile_loss_terms(values: np.ndarray, q: float, p: float) -> dict:
    """A site's answer in the iterative quantile-loss method: its part of eq. (4) at q and the
    right derivative, (1 - p) #{y <= q} - p #{y > q}."""
    y = np.asarray(values, dtype=float)
    loss = float((p - 1.0) * np.sum(y[y < q] - q) + p * np.sum(y[y >= q] - q))
    below = int(np.sum(y <= q))
    return {"loss": loss, "slope": float((1.0 - p) * below - p * (y.size - below)), "below": below, "n": int(y.size)}


def pooled_rank(p: float, n: int) -> int:
    """The rank of the minimizer of eq. (4) over n pooled values: the smallest r with
    (1 - p) r - p (n - r) >= 0, i.e. r = ceil(p n), computed so that p n landing a rounding error
    above an integer (0.07 x 100 = 7.000000000000001) does not skip a rank."""
    return max(1, math.ceil(p * n - 1e-9 * max(1.0, p * n)))
