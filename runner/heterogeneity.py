"""What the harness (which sees every site's data) reports about heterogeneity.

  site_summary       per site: n_j, mean response, median conformity score
  spread             between-site spread: sd of the sites' median scores over the pooled sd
  proposition_34     paper 000 proposition 3.4's coverage loss bound for FedCP-QQ,
                     E_S[ d_TV( PoissonBinomial(p_1(S)..p_m(S)), PoissonBinomial(p~_1(S)..p~_m(S)) ) ]
                     with p_j(s) = P(S^(j)_(ell_j) <= s) under site j's score law and p~_j(s) the
                     same under the reference (test) law; coverage >= M - this.

The site laws F_j are taken from the (unshifted, unpartitioned) test set, never from a site's
n_j points (a plug-in on those would be noisy and biased upwards):
  none               0: every site law is the reference
  location, scale    the test scores with site j's shift applied (exact up to the test sample)
  sort, response     the test points whose blended sorting key falls in site j's block of ranks
                     (needs at least MIN_BLOCK test points per site, else not estimated)
  cluster, dirichlet not estimated
Where the bound is not estimated, the summary's `proposition_34_tv` is null and
`proposition_34_why` says why (NotEstimable's reason); the printed sites line repeats it.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betainc

from data.heterogeneity import blended_key, shift_response
from models.scores import SCORES
from stats.optimizer import plan_orders
from stats.poissonbinomial import poisson_binomial_pmf

EVALUATION_POINTS = 400
MIN_BLOCK = 30


def site_summary(world) -> dict[str, dict]:
    out = {}
    for site, (_, y) in world.shards.items():
        scores = world.site_scores[site]
        scores = scores[:, 0] if scores.ndim == 2 else scores  # two_sample data: (value, group) rows
        out[site] = {"n": int(len(y)), "y_mean": float(np.mean(y)) if len(y) else None,
                     "score_median": float(np.median(scores)) if len(y) else None}
    return out


def spread(world, summary: dict[str, dict]) -> float | None:
    medians = np.array([s["score_median"] for s in summary.values() if s["score_median"] is not None])
    pooled = world.calibration_scores
    pooled = pooled[:, 0] if pooled.ndim == 2 else pooled
    if medians.size < 2 or np.std(pooled) == 0:
        return None
    return float(np.std(medians) / np.std(pooled))


class NotEstimable(Exception):
    """Proposition 3.4's bound cannot be estimated here; the message says why."""


def proposition_34(world, spec: dict, sizes: list[int], ells: list[int], rng: np.random.Generator) -> float:
    """The TV term of proposition 3.4 for orders `ells`; NotEstimable with the reason where
    the site laws cannot be told from the test set."""
    kind = spec["kind"]
    if kind == "none":
        return 0.0
    if world.task != "regression":
        raise NotEstimable(f"the bound is about conformal regression scores; this is {world.task} data")
    score = SCORES[world.model.score][0]  # the test set's base predictions serve every site law
    reference = np.sort(score(world.y_test, world.test_base))
    if kind in ("location", "scale"):
        site_laws = [np.sort(score(shift_response(kind, world.y_test, alpha), world.test_base))
                     for alpha in world.shifts]
    elif kind in ("sort", "response"):
        site_laws = _block_laws(world, spec, sizes, reference.size, score, rng)
    else:
        raise NotEstimable(f"{kind} heterogeneity gives no site law that the test set can stand for")
    points = rng.choice(reference, size=min(EVALUATION_POINTS, reference.size), replace=False)
    ells, sizes = np.asarray(ells, dtype=float), np.asarray(sizes, dtype=float)
    p_ref = betainc(ells, sizes - ells + 1, _ecdf(reference, points)[:, None])
    p_site = np.column_stack([betainc(e, n - e + 1, _ecdf(law, points))
                              for e, n, law in zip(ells, sizes, site_laws)])
    tv = 0.5 * np.abs(poisson_binomial_pmf(p_site) - poisson_binomial_pmf(p_ref)).sum(axis=1)
    return float(np.mean(tv))


def _block_laws(world, spec, sizes, n_test, score, rng):
    """Site j's score law under a sort/response partition: the test points whose blended key
    ranks in the same fraction of the order as site j's block of the sites' points."""
    key = world.y_test if spec["kind"] == "response" else world.X_test[:, spec["feature"]]
    order = np.argsort(blended_key(key, spec["strength"], rng), kind="stable")
    bounds = np.rint(np.cumsum([0, *sizes]) / sum(sizes) * n_test).astype(int)
    if np.diff(bounds).min() < MIN_BLOCK:
        raise NotEstimable(f"{spec['kind']} partition: the smallest site's block holds "
                           f"{np.diff(bounds).min()} of the {n_test} test points, fewer than the "
                           f"{MIN_BLOCK} needed to estimate its law (more data, a larger test "
                           f"fraction or fewer sites)")
    scores = score(world.y_test, world.test_base)
    return [np.sort(scores[order[bounds[j]:bounds[j + 1]]]) for j in range(len(sizes))]


def _ecdf(sorted_sample: np.ndarray, points: np.ndarray) -> np.ndarray:
    return np.searchsorted(sorted_sample, points, side="right") / sorted_sample.size


class HeterogeneityReport:
    """Accumulates the per-trial figures into the run summary."""

    def __init__(self, heterogeneity: dict, alpha: float, planner: str = "auto", dropouts: int = 0) -> None:
        """heterogeneity: the scenario's sites.heterogeneity; alpha, planner, dropouts: the FedCP-QQ
        plan whose orders the bound is about (the scenario's first fedcp_qq entry, or the defaults)."""
        self.kind, self.spec = heterogeneity["kind"], heterogeneity
        self.alpha, self.planner, self.dropouts = alpha, planner, dropouts
        self.sites: dict[str, list[dict]] = {}
        self.spreads, self.tvs = [], []
        self.why_not: str | None = None  # why proposition 3.4's bound was not estimated

    def add(self, world, rng) -> None:
        summary = site_summary(world)
        for site, stats in summary.items():
            self.sites.setdefault(site, []).append(stats)
        value = spread(world, summary)
        if value is not None:
            self.spreads.append(value)
        sizes = [stats["n"] for stats in summary.values()]
        try:
            self.tvs.append(proposition_34(world, self.spec, sizes, self._orders(world, sizes), rng))
        except NotEstimable as exc:
            self.why_not = str(exc)

    def _orders(self, world, sizes) -> list[int]:
        """FedCP-QQ's per-site orders ell_j, which the bound is about."""
        if world.task != "regression":  # no FedCP-QQ plan for classification or two-sample statistics
            raise NotEstimable(f"the bound is about FedCP-QQ's conformal regression scores; this is "
                               f"{world.task} data")
        if not all(sizes):
            raise NotEstimable("a site joined with no calibration points")
        plan = plan_orders(tuple(sizes), self.alpha, self.planner, self.dropouts)
        ells = None if plan is None or plan.infinite else list(plan.ells)
        if ells is None:
            raise NotEstimable(f"FedCP-QQ has no valid plan for these site sizes at alpha "
                               f"(n_j from {min(sizes)} to {max(sizes)})")
        return ells

    def summary(self) -> dict:
        def mean(key, items):
            values = [i[key] for i in items if i[key] is not None]
            return float(np.mean(values)) if values else None

        return {
            "kind": self.kind, "parameters": self.spec,
            "sites": {site: {"n": items[-1]["n"], "y_mean": mean("y_mean", items),
                             "score_median": mean("score_median", items)} for site, items in self.sites.items()},
            "spread": float(np.mean(self.spreads)) if self.spreads else None,
            "proposition_34_tv": float(np.mean(self.tvs)) if self.tvs else None,
            "proposition_34_why": None if self.tvs else self.why_not,
            "averaged_over": {"sites": "each site's y_mean and score_median: the mean over the trials it joined",
                              "spread": f"the mean over the {len(self.spreads)} trials it was measured in",
                              "proposition_34_tv": f"the mean over the {len(self.tvs)} trials it was estimated in"},
        }
