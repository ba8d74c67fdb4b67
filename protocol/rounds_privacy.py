"""Privacy over rounds of private federated training (DP-FedAvg, DP-Δ-FL: paper 001, section 5
and appendix B.2 / B.3; issue 49, point 2), in zero-concentrated DP (zCDP, Bun and Steinke 2016).

One round of algorithm 4 releases a DDG quantile of the sampled clients' losses (algorithm 1 or
2) and the noisy sum of their clipped updates; each is a zCDP mechanism and zCDP adds (claim 13).
Over T rounds the rounds' rhos add too; the total converts ONCE to (epsilon, delta) (Canonne,
Kamath and Steinke 2020, proposition 12, the conversion dp_accounting's RdpAccountant and
stats.ddg.zcdp_to_approx_dp both use). Booking each round as an (epsilon, delta) event instead
and composing those costs far more: 1,000 DDG rounds whose zCDP composition is epsilon 7 come to
epsilon 52-65 that way (tests/test_rounds_accounting.py).

Neighbouring relation. Every rho here is for one client's contribution added or removed
(zero-out: its clipped update, its loss bin), as theorem 1 / 2 and `gaussian_sum_rho` give it.
Sampling without or with replacement draws a fixed number of clients from a public population,
and its amplification theorems are stated for one client's data REPLACED (Wang, Balle and
Kasiviswanathan 2019); a replaced client is one removed and one added, so a rho-zCDP round is
4 rho-zCDP under replacement (zCDP group privacy, k^2 rho for k = 2; exact for a Gaussian sum,
whose replace-one sensitivity is 2C). Those two kinds are reported for replaced clients,
"none" and "poisson" for added or removed ones.

Amplification by subsampling: is a rho-zCDP round "a Gaussian"? A rho-zCDP mechanism has the
RDP curve eps(alpha) <= alpha rho, that of a GaussianDpEvent with noise multiplier
1 / sqrt(2 rho). dp_accounting's subsampled bounds are Gaussian-specific: for Poisson sampling,
the exact RDP of the sampled Gaussian (Mironov, Talwar and Zhang 2019), whose second direction,
D_alpha(P || (1-q) P + q Q), is shown smaller than the first only for Gaussians, and its
fractional orders integrate the Gaussian density; for sampling without replacement, WBK19's
strengthened theorem 27, whose forward-difference terms are the Gaussian's. A round here is not a
Gaussian: the DDG quantile is a sum of discrete Gaussians whose zCDP (lemma 9) holds only up to
its psi slack, and nothing says its subsampled divergence is the Gaussian's. So by default
(`bound="generic"`) we use bounds that hold for ANY mechanism with that RDP curve:

- poisson (one client added or removed; sampled with probability q = sample / population):
  paper 001 cites Zhu and Wang 2019 ([27]), whose general bound (theorem 6) is optimal only up
  to an additive log(3) / (alpha - 1) at every order (their abstract), a term that does not
  vanish as rho -> 0: over 1,000 rounds at 100 / 2,500 and rho = 1e-4, theorem 6 as we read it
  (the sampled Gaussian's sum with its terms l >= 3 tripled) gives epsilon 1.49 at delta 1/2500,
  the bound below 0.11 and dp_accounting's Gaussian-only one 0.036. We use instead the
  larger of two bounds, one per direction, each valid for any rho-zCDP round (P the output
  without the client, Q with it, R = (1 - q) P + q Q the sampled one, L = Q / P):
  D_alpha(R || P) at integer alpha: E_P[(1 - q + q L)^alpha] expands binomially into non-negative
  terms C(alpha, l) (1 - q)^(alpha - l) q^l E_P[L^l], and E_P[L^l] = exp((l - 1) D_l(Q || P)) <=
  exp((l - 1) l rho), which is the sampled Gaussian's own moment: dp_accounting computes it
  (PoissonSampledDpEvent of GaussianDpEvent(1 / sqrt(2 rho)); so the Gaussian's value IS valid in
  this direction); D_alpha(P || R) = log E_P[(1 - q + q L)^-(alpha - 1)] / (alpha - 1), bounded
  by the second-order Taylor expansion around L = 1 (E_P[L] = 1, the second derivative at most
  alpha (alpha - 1) q^2 (1 - q)^-(alpha + 1) for L >= 0, E_P[(L - 1)^2] = exp(D_2(Q || P)) - 1 <=
  exp(2 rho) - 1): log(1 + C(alpha, 2) q^2 (1 - q)^-(alpha + 1) (exp(2 rho) - 1)) / (alpha - 1).
  For the Gaussian itself the second direction is known to be the smaller (Mironov, Talwar and
  Zhang 2019); for a DDG round it need not be, so it is bounded, not assumed.
- without_replacement: Wang, Balle and Kasiviswanathan 2019, theorem 9 (the generic bound, no
  pure-DP part): (1/(alpha-1)) log[1 + q^2 C(alpha,2) min(4 (e^eps(2) - 1), 2 e^eps(2)) + sum_{j>=3}
  2 q^j C(alpha,j) e^((j-1) eps(j))], q = sample / population, eps(j) = 4 rho j (replacement).
  dp_accounting computes only the strengthened Gaussian form (it takes, term by term, the min of
  this and theorem 27's), so this one is computed here. Its terms j >= 3 do not vanish with rho
  (2 q^j C(alpha, j) at rho = 0), so at each order we take the smaller of it and joint
  convexity's log(1 - q + q exp((alpha - 1) alpha 4 rho)) / (alpha - 1) (the client is in the
  sample with probability q; first order in q, but vanishing with rho): both hold for any
  mechanism, so their minimum does.
- with_replacement: dp_accounting 0.6.0 defines SampledWithReplacementDpEvent but no accountant
  composes it (RdpAccountant and PLDAccountant answer "unsupported"). We bound it by joint
  convexity: a sample of m draws from n holds the client K ~ Binomial(m, 1/n) times, and given
  the draws the two outputs differ in K replaced clients, (2K)^2 rho-zCDP; so
  exp((alpha-1) eps'(alpha)) <= E_K exp((alpha-1) alpha 4 K^2 rho). A client drawn k times has k
  times the sensitivity, and the rare samples holding it many times would dominate every moment,
  so they are folded into delta: the rounds are conditioned on K <= k in each, k the fewest
  copies exceeded with probability at most delta / 10 over all rounds (copies_bound; (epsilon,
  delta - tail) of the conditioned rounds gives (epsilon, delta)). Conservative (first order in
  the sampling rate where the others are second order), valid for any mechanism.

Subsampled curves are evaluated at integer orders (plus orders in (1, 2), bounded by order 2's:
Renyi divergence does not decrease with the order), composed by adding (T rounds: T times the
curve, which is what SelfComposedDpEvent does) and converted by dp_accounting's own
compute_epsilon. `bound="gaussian"` runs dp_accounting's RdpAccountant on
SelfComposedDpEvent(PoissonSampledDpEvent / SampledWithoutReplacementDpEvent(GaussianDpEvent))
directly: valid only when every round is exactly a Gaussian mechanism (DP-FedAvg with continuous
Gaussian noise on the update sum and no DDG quantile).

Who may claim which figure: the amplified epsilon is the central guarantee, and holds only if the
coordinator samples as it says; a site cannot check that, so its own account books the
unamplified rho of every round it takes part in (`site_account_epsilon`; protocol.policy's
`trust_sampling`).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.optimize import brentq
from scipy.special import gammaln, logsumexp

from stats import ddg

SAMPLINGS = ("none", "poisson", "without_replacement", "with_replacement")
BOUNDS = ("generic", "gaussian")
#: orders of the subsampled curves: integers (the generic bounds are stated there), and below 2
#: order 2's value (Renyi divergence is non-decreasing in the order)
INTEGER_ORDERS = tuple(range(2, 65)) + (72, 80, 96, 112, 128, 160, 192, 256)
LOW_ORDERS = (1.1, 1.25, 1.5, 1.75)
SUBSAMPLED_ORDERS = LOW_ORDERS + INTEGER_ORDERS
#: orders for an unamplified zCDP curve (alpha rho): fine enough that dp_accounting's conversion
#: on them agrees with stats.ddg.zcdp_to_approx_dp's continuous optimum to about 1e-4, and holding
#: dp_accounting's default orders (so never above its own RdpAccountant's answer)
ZCDP_ORDERS = tuple(sorted(set(np.round(1.0 + np.geomspace(0.0101, 1e5, 1500), 12).tolist())
                           | {1.0 + x / 10.0 for x in range(1, 100)} | set(map(float, range(11, 64)))
                           | {128.0, 256.0, 512.0, 1024.0}))


# -- one round ----------------------------------------------------------------------------------


def gaussian_sum_rho(clip: float, sigma: float) -> float:
    """zCDP of adding N(0, sigma^2 I) to a sum of vectors each of l2 norm <= `clip`, one vector
    added or removed: rho = C^2 / (2 sigma^2) (Bun and Steinke 2016, proposition 1.6). This is
    the corrected Gaussian term of paper 001's claim 13, which prints sigma_w^2 / (2 C^2):
    inverted (more noise would cost more privacy). Quorum puts the noise on the SUM, so `sigma`
    is the noise of the sum (tail_count times the sigma of algorithm 4's average)."""
    if clip < 0 or sigma <= 0:
        raise ValueError(f"need clip >= 0 and sigma > 0, got ({clip!r}, {sigma!r})")
    return clip**2 / (2.0 * sigma**2)


def gaussian_average_rho(clip: float, sigma: float, tail_count: int) -> float:
    """Algorithm 4, line 12 as printed: xi ~ N(0, sigma_w^2 I) added to the AVERAGE
    (1/m(t)) sum delta_i, with m(t) = `tail_count` public (appendix B.2 assumes it): the
    sensitivity is C / m(t), so rho = (C / m(t))^2 / (2 sigma_w^2), the same as
    gaussian_sum_rho(clip, tail_count * sigma). Quorum adds the noise to the sum instead
    (gaussian_sum_rho), so that its sigma does not depend on how many clients are in the tail."""
    if tail_count < 1:
        raise ValueError("the tail holds at least one client")
    return gaussian_sum_rho(clip / tail_count, sigma)


def ddg_rho(epsilon_concentrated: float) -> float:
    """rho = (1/2) eps^2 for the (1/2) eps^2-concentrated DP of paper 001's theorem 1 / 2
    (lemma 9; stats.ddg.histogram_concentrated_epsilon gives eps)."""
    return 0.5 * float(epsilon_concentrated) ** 2


def quantile_round_rho(c: float, sites: int, sigma2: float, bins: int, hierarchical: bool,
                       accounting: str = "exact") -> float:
    """One DDG quantile's rho (algorithm 1 flat, or 2 hierarchical; theorem 1 / 2): c the
    scaling, `sites` the noise-adding sites, sigma2 each site's discrete Gaussian variance."""
    return ddg_rho(ddg.histogram_concentrated_epsilon(c, sites, sigma2, bins, hierarchical, accounting))


def round_rho(rho_quantile: float, rho_update: float) -> float:
    """Claim 13 corrected: a round of algorithm 4 is (rho_quantile + rho_update)-zCDP (zCDP adds,
    Bun and Steinke 2016, lemma 2.3), rho_update = gaussian_sum_rho(C, sigma), not the printed
    sigma_w^2 / (2 C^2)."""
    if rho_quantile < 0 or rho_update < 0:
        raise ValueError("rho is never negative")
    return float(rho_quantile) + float(rho_update)


# -- curves -------------------------------------------------------------------------------------


def _log_comb(n: np.ndarray, k: np.ndarray) -> np.ndarray:
    return gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)


def _check_sampling(sampling: str, sample: int, population: int) -> float:
    """The sampling rate (1.0 for none)."""
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {SAMPLINGS}, got {sampling!r}")
    if sampling == "none":
        return 1.0
    if not (isinstance(sample, (int, np.integer)) and isinstance(population, (int, np.integer))
            and 1 <= sample and 1 <= population):
        raise ValueError(f"sampling {sampling} needs integers 1 <= sample and 1 <= population, got "
                         f"({sample!r}, {population!r})")
    if sampling != "with_replacement" and sample > population:
        raise ValueError(f"a sample of {sample} from a population of {population}")
    return sample / population


@lru_cache(maxsize=4096)
def _gaussian_poisson_log_moments(rho: float, q: float) -> tuple[float, ...]:
    """log A(alpha) = (alpha - 1) eps(alpha) of the Poisson-sampled Gaussian with noise multiplier
    1/sqrt(2 rho) at INTEGER_ORDERS, from dp_accounting's RdpAccountant."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    accountant = rdp.RdpAccountant(orders=list(INTEGER_ORDERS))
    accountant.compose(dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(1.0 / math.sqrt(2.0 * rho))))
    return tuple((accountant.rdp * (np.asarray(INTEGER_ORDERS, dtype=float) - 1.0)).tolist())


def _poisson_generic(rho: float, q: float) -> np.ndarray:
    """Poisson sampling at rate q, one client added or removed, at INTEGER_ORDERS: the larger of
    the two directions' bounds (module docstring), P the output without the client, Q with it in
    the sample, R = (1 - q) P + q Q, L = Q / P:
    D_alpha(R || P): E_P[(1 - q + q L)^alpha] = sum_l C(alpha, l) (1 - q)^(alpha - l) q^l E_P[L^l]
    (integer alpha, every term >= 0) and E_P[L^l] = exp((l - 1) D_l(Q || P)) <= exp((l - 1) l rho):
    the sampled Gaussian's moment, which dp_accounting computes (Mironov, Talwar and Zhang 2019);
    D_alpha(P || R): E_P[(1 - q + q L)^-(alpha - 1)], whose second-order Taylor bound around L = 1
    (E_P[L] = 1; f'' at most alpha (alpha - 1) q^2 (1 - q)^-(alpha + 1) for L >= 0;
    E_P[(L - 1)^2] = exp(D_2(Q || P)) - 1 <= exp(2 rho) - 1) gives
    1 + C(alpha, 2) q^2 (1 - q)^-(alpha + 1) (exp(2 rho) - 1)."""
    a = np.asarray(INTEGER_ORDERS, dtype=float)
    first = np.asarray(_gaussian_poisson_log_moments(rho, q))
    second = np.log1p(np.exp(_log_comb(a, 2.0) + 2.0 * math.log(q) - (a + 1.0) * math.log1p(-q)
                             + _log_expm1(2.0 * rho)))
    return np.maximum(first, second) / (a - 1.0)


def _log_expm1(x: float) -> float:
    """log(e^x - 1), without overflow for large x (a round whose rho is beyond any budget)."""
    return x + math.log1p(-math.exp(-x)) if x > 1.0 else math.log(math.expm1(x))


def _without_replacement_generic(rho: float, q: float) -> np.ndarray:
    """Wang, Balle and Kasiviswanathan 2019, theorem 9 (eps(inf) = inf), replace-one RDP of the
    base mechanism eps(j) = 4 rho j, at INTEGER_ORDERS."""
    r = 4.0 * rho
    out = []
    for alpha in INTEGER_ORDERS:
        j = np.arange(3, alpha + 1, dtype=float)
        second = (2.0 * math.log(q) + float(_log_comb(np.float64(alpha), np.float64(2.0)))
                  + min(math.log(4.0) + _log_expm1(2.0 * r), math.log(2.0) + 2.0 * r))
        terms = [0.0, second]
        if len(j):
            terms.extend((math.log(2.0) + j * math.log(q) + _log_comb(np.float64(alpha), j) + (j - 1.0) * j * r).tolist())
        wbk = float(logsumexp(terms))
        # joint convexity (the client is in the sample with probability q): first order, but it
        # vanishes with rho where theorem 9's terms j >= 3 (2 q^j C(alpha, j) at rho = 0) do not
        convex = float(np.logaddexp(math.log1p(-q), math.log(q) + (alpha - 1.0) * alpha * r))
        out.append(min(wbk, convex) / (alpha - 1.0))
    return np.asarray(out)


def _with_replacement_generic(rho: float, sample: int, population: int, most: int) -> np.ndarray:
    """Joint convexity over K copies of the client in a sample of m draws from n, K ~
    Binomial(m, 1/n) conditioned on K <= `most`: (alpha - 1) eps'(alpha) <=
    log E_K exp((alpha - 1) alpha 4 K^2 rho), at INTEGER_ORDERS."""
    k = np.arange(0, most + 1, dtype=float)
    p = 1.0 / population
    if p >= 1.0:
        log_w = np.where(k == sample, 0.0, -np.inf)
    else:
        log_w = _log_comb(np.float64(sample), k) + k * math.log(p) + (sample - k) * math.log1p(-p)
    log_w = log_w - logsumexp(log_w)
    a = np.asarray(INTEGER_ORDERS, dtype=float)[:, None]
    return logsumexp(log_w[None, :] + (a - 1.0) * a * 4.0 * k[None, :] ** 2 * rho, axis=1) / (a[:, 0] - 1.0)


def copies_bound(sample: int, population: int, rounds: int, delta: float) -> tuple[int, float]:
    """(k, tail): the fewest copies k of one client that m draws with replacement from n exceed,
    in any of `rounds` rounds, with probability `tail` <= delta / 10 (a union bound). A client
    drawn more often would make its rounds' sensitivity grow without bound; that event is folded
    into delta instead of into the RDP curve, whose moments it would dominate."""
    from scipy.stats import binom

    ks = np.arange(0, sample + 1)
    tails = rounds * binom.sf(ks, sample, 1.0 / population)
    ok = np.flatnonzero(tails <= delta / 10.0)
    k = int(ks[ok[0]]) if len(ok) else sample
    return k, float(min(tails[k], 1.0)) if k < sample else 0.0


@lru_cache(maxsize=4096)
def _round_curve(rho: float, sampling: str, sample: int, population: int, most: int = 0) -> tuple[float, ...]:
    q = _check_sampling(sampling, sample, population)
    if sampling == "poisson" and q < 1.0:
        integer = _poisson_generic(rho, q)
    elif sampling == "without_replacement" and q < 1.0:
        integer = _without_replacement_generic(rho, q)
    elif sampling == "with_replacement":
        integer = _with_replacement_generic(rho, sample, population, most or sample)
    else:  # no sampling, or everyone sampled: the round itself (replace-one for a fixed-size sample)
        integer = np.asarray(INTEGER_ORDERS, dtype=float) * rho * (4.0 if sampling == "without_replacement" else 1.0)
    if sampling in ("poisson", "without_replacement"):  # never more than the round itself (convexity)
        plain = np.asarray(INTEGER_ORDERS, dtype=float) * rho * (1.0 if sampling == "poisson" else 4.0)
        integer = np.minimum(integer, plain)
    low = [float(integer[0])] * len(LOW_ORDERS)
    return tuple(low + integer.tolist())


def round_curve(rho: float, sampling: str = "none", sample: int = 0, population: int = 0,
                most: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(orders, RDP) of one rho-zCDP round on a client sampled by `sampling` (the generic bounds
    of the module docstring), at SUBSAMPLED_ORDERS; `most`: with replacement, the most copies of
    the client a sample is conditioned on (copies_bound; 0: no condition)."""
    if not rho > 0:
        return np.asarray(SUBSAMPLED_ORDERS), np.zeros(len(SUBSAMPLED_ORDERS))
    return np.asarray(SUBSAMPLED_ORDERS), np.asarray(_round_curve(float(rho), sampling, int(sample), int(population),
                                                                  int(most)))


def _epsilon_from_rdp(orders, rdp, delta: float) -> float:
    from dp_accounting.rdp import rdp_privacy_accountant as acc

    if not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")
    return float(acc.compute_epsilon(list(orders), list(rdp), delta)[0])


def zcdp_epsilon(rho: float, delta: float) -> float:
    """(epsilon, delta)-DP of rho-zCDP through dp_accounting (RdpAccountant with a ZCDpEvent, on
    ZCDP_ORDERS): Canonne, Kamath and Steinke 2020, proposition 12, as stats.ddg.zcdp_to_approx_dp
    (the same formula, there minimised continuously)."""
    if rho <= 0:
        return 0.0
    return _zcdp_epsilon(float(rho), float(delta))


@lru_cache(maxsize=8192)
def _zcdp_epsilon(rho: float, delta: float) -> float:
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    if not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")
    accountant = rdp.RdpAccountant(orders=list(ZCDP_ORDERS))
    accountant.compose(dp_accounting.ZCDpEvent(rho))
    return float(accountant.get_epsilon(delta))


def _gaussian_rounds_epsilon(rho: float, rounds: int, delta: float, sampling: str, sample: int,
                             population: int) -> float:
    """dp_accounting's RdpAccountant on SelfComposedDpEvent(<sampled GaussianDpEvent>, rounds):
    the sampled-Gaussian bounds, valid only when every round IS that Gaussian."""
    import dp_accounting
    from dp_accounting.rdp import rdp_privacy_accountant as rdp

    relation = dp_accounting.NeighboringRelation
    if sampling == "poisson":
        accountant = rdp.RdpAccountant()
        event = dp_accounting.PoissonSampledDpEvent(sample / population,
                                                    dp_accounting.GaussianDpEvent(1.0 / math.sqrt(2.0 * rho)))
    elif sampling == "without_replacement":
        accountant = rdp.RdpAccountant(neighboring_relation=relation.REPLACE_ONE)
        event = dp_accounting.SampledWithoutReplacementDpEvent(
            population, sample, dp_accounting.GaussianDpEvent(1.0 / math.sqrt(2.0 * 4.0 * rho)))
    else:
        raise ValueError(f"dp_accounting 0.6.0 has no accountant for sampling {sampling}")
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds))
    return float(accountant.get_epsilon(delta))


# -- over rounds --------------------------------------------------------------------------------


def rounds_epsilon(rho_per_round: float, rounds: int, delta: float, sampling: str = "none", sample: int = 0,
                   population: int = 0, bound: str = "generic") -> float:
    """(epsilon, delta)-DP of `rounds` rounds, each a `rho_per_round`-zCDP mechanism (claim 13
    corrected, round_rho), on a client sampled each round by `sampling`: "none" (every round sees
    it: T rho, converted once, through dp_accounting's ZCDpEvent), "poisson" (rate sample /
    population; the larger of the two directions' bounds, module docstring),
    "without_replacement" (sample of population; WBK19 theorem 9 or joint convexity, replaced
    clients), "with_replacement" (joint convexity, replaced clients). The
    per-round curve composes over the rounds by adding (SelfComposedDpEvent's rule) and converts
    with dp_accounting's compute_epsilon. `bound="gaussian"`: dp_accounting's sampled-Gaussian
    accountant itself, for rounds that are exactly Gaussian (module docstring)."""
    if bound not in BOUNDS:
        raise ValueError(f"bound must be one of {BOUNDS}, got {bound!r}")
    if rounds < 0 or int(rounds) != rounds:
        raise ValueError(f"rounds must be a non-negative integer, got {rounds!r}")
    _check_sampling(sampling, sample, population)
    if rho_per_round < 0:
        raise ValueError("rho is never negative")
    if rounds == 0 or rho_per_round == 0:
        return 0.0
    if sampling == "none":
        return zcdp_epsilon(rounds * rho_per_round, delta)
    if sampling in ("poisson", "without_replacement") and sample >= population:  # everyone, every round
        return zcdp_epsilon(rounds * rho_per_round * (1.0 if sampling == "poisson" else 4.0), delta)
    if bound == "gaussian":
        return _gaussian_rounds_epsilon(float(rho_per_round), int(rounds), delta, sampling, int(sample), int(population))
    if sampling == "with_replacement":  # a client drawn more than `most` times: folded into delta
        most, tail = copies_bound(sample, population, rounds, delta)
        orders, curve = round_curve(rho_per_round, sampling, sample, population, most)
        return _epsilon_from_rdp(orders, rounds * curve, delta - tail)
    orders, curve = round_curve(rho_per_round, sampling, sample, population)
    # sampling never costs more than the rounds themselves (joint convexity), and the plain
    # conversion has orders near 1 that the subsampled grid lacks (where rho is large)
    plain = zcdp_epsilon(rounds * rho_per_round * (1.0 if sampling == "poisson" else 4.0), delta)
    return min(_epsilon_from_rdp(orders, rounds * curve, delta), plain)


def combined_epsilon(rho: float, amplified: list[tuple[float, int, str, int, int]], delta: float) -> float:
    """(epsilon, delta) of unamplified zCDP totalling `rho` composed with trainings booked as
    amplified, each (rho_per_round, rounds, sampling, sample, population): their RDP curves add
    (unamplified rho as the curve alpha rho) and convert once. With none amplified, zcdp_epsilon."""
    if not amplified:
        return zcdp_epsilon(rho, delta)
    orders = np.asarray(SUBSAMPLED_ORDERS, dtype=float)
    total = rho * orders
    for rho_round, rounds, sampling, sample, population in amplified:
        total = total + rounds * round_curve(rho_round, sampling, sample, population)[1]
    return _epsilon_from_rdp(orders, total, delta)


def site_account_epsilon(rho_per_round: float, participations: int, delta: float) -> float:
    """A site's own, unamplified account: it cannot check the coordinator's sampling, so each
    round it took part in costs the round's whole rho; participations x rho, converted once."""
    if participations < 0:
        raise ValueError("participations is never negative")
    return zcdp_epsilon(participations * rho_per_round, delta)


def sigma_for_epsilon(target_epsilon: float, delta: float, rounds: int, clip: float, sample: int, population: int,
                      sampling: str = "without_replacement", quantile_ratio: float = 0.0, bound: str = "generic",
                      tolerance: float = 1e-4) -> dict:
    """The update noise sigma (on the SUM of clipped updates, gaussian_sum_rho) for which `rounds`
    rounds meet (target_epsilon, delta), each round spending rho_update = C^2 / (2 sigma^2) on the
    update and rho_quantile = quantile_ratio * rho_update on the quantile (paper 001 appendix B.3:
    "we allocate r-times the privacy budget of the weight updates to the quantile updates").
    Solves rounds_epsilon(rho_round) = target for rho_round (epsilon grows with rho), by Brent's
    method on log rho. Returns {"sigma", "rho_update", "rho_quantile", "rho_round", "epsilon"}
    ("epsilon": rounds_epsilon at the plan, within `tolerance` of the target, never above it)."""
    if not target_epsilon > 0:
        raise ValueError("target epsilon must be positive")
    if quantile_ratio < 0:
        raise ValueError("quantile_ratio is never negative")
    if clip <= 0:
        raise ValueError("clip must be positive")

    def eps_of(log_rho: float) -> float:
        return rounds_epsilon(math.exp(log_rho), rounds, delta, sampling, sample, population, bound)

    lo, hi = math.log(1e-12), math.log(1.0)
    while eps_of(hi) < target_epsilon:
        lo, hi = hi, hi + math.log(100.0)
        if hi > math.log(1e12):
            raise ValueError("no finite rho reaches this epsilon")
    while eps_of(lo) > target_epsilon:
        lo -= math.log(100.0)
    log_rho = brentq(lambda x: eps_of(x) - target_epsilon, lo, hi, xtol=1e-10, rtol=1e-10)
    for _ in range(60):  # the bounds step at orders, so land at or just below the target
        epsilon = eps_of(log_rho)
        if epsilon <= target_epsilon:
            break
        log_rho -= 1e-6 * (1 + _)
    rho_round = math.exp(log_rho)
    rho_update = rho_round / (1.0 + quantile_ratio)
    return {"sigma": clip / math.sqrt(2.0 * rho_update), "rho_update": rho_update,
            "rho_quantile": quantile_ratio * rho_update, "rho_round": rho_round, "epsilon": epsilon}
