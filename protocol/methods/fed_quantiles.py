"""Federated quantile estimates as methods (paper 004, section 5), on two_sample data (the values
of both groups are one sample; paper004_gamma puts everything in group 0).

  kanon_quantiles  the K-anonymous one-group table, built site by site, then the naive bin-limit
                   estimate (section 5.2), the linear interpolation of the table CDF (section 5.2)
                   or the YJ table estimate (eq. 6-9), all from the one released table
  yj_likelihood    `fit: grid`, one pass: per-site moments on a public lambda grid (eq. 10-12);
                   `fit: continuous`: a golden-section search for lambda over LAMBDA_RANGE, every
                   round asking every site the same new lambda (section 5.2's "simple
                   optimization routine"; `rounds` + 2 lambdas disclosed in all)
  quantile_loss    iterative bisection on the pooled right derivative of the quantile loss (eq. 4);
                   converges to the pooled sample quantile. NOT privacy preserving: the sites'
                   extremes and their counts below every probed point are revealed (section 5.1)
"""

from __future__ import annotations

import math

import numpy as np

from protocol.codecs.summary import Summary
from protocol.accounting import Spend
from protocol.methods.base import (LEVELS, LEVELS_REQUEST, LEVELS_SPEC, CoordinatorHalf, Method, OneShotMethod,
                                   Outcome, Planned, RequestError, Send, SiteHalf, checked, expect_empty,
                                   two_sample_values)
from protocol.phases import Phase, PhaseStep, PhaseTable
from results.estimates import Estimates
from protocol.methods.kanon_table import (PHASES, TABLE_PARAMS, KAnonTableCoordinator, KAnonTableSite,
                                          table_codec, table_request, table_spend)
from stats.fedquantiles import (LAMBDA_RANGE, golden_section_step, lambda_grid, linear_table_quantile,
                                naive_table_quantile, pooled_rank, quantile_loss_terms, yj_likelihood_fit,
                                yj_likelihood_quantile, yj_quantile, yj_site_moments, yj_table_fit, yj_table_quantile)

#: the most lambdas a site answers in one session (a grid, or the rounds of a continuous fit together)
MAX_GRID = 1001
#: the most search rounds of `fit: continuous`: 2 x 0.618^60 ~ 6e-13 is below what lambda can tell apart
MAX_FIT_ROUNDS = 60


class KAnonQuantiles(Method):
    name = "kanon_quantiles"
    codec = "summary"
    data = "two_sample"
    result = Estimates
    phases = PHASES
    PARAMS = {**TABLE_PARAMS, "estimator": {"type": "str", "choices": ["naive", "linear", "yj_table"],
                                                "default": "yj_table"},
              "levels": LEVELS_SPEC}

    def __init__(self, alpha, k=10, extremes="buffer", bounds=None, estimator="yj_table", levels=None):
        levels = list(LEVELS if levels is None else levels)
        super().__init__(alpha, k=k, extremes=extremes, bounds=list(bounds or []), estimator=estimator, levels=levels)
        self.request = table_request(k, extremes, list(bounds or []))
        self.estimator, self.levels = estimator, levels

    @property
    def privacy(self):
        return {"epsilon": None, "model": f"K-anonymous table (K = {self.request['k']})"}

    def make_codec(self):
        return table_codec(1)

    def coordinator(self, sizes, rng):
        return KAnonTableCoordinator(dict(sizes), self.request, 1, self.finish)

    def finish(self, table, contributed, skipped):
        limits, counts = np.asarray(table.limits), np.asarray(table.counts[0])
        common = {"answered": len(contributed), "contributed": contributed, "skipped": skipped, "bins": table.bins}
        if self.estimator == "naive":
            return Estimates.of({p: naive_table_quantile(limits, counts, p) for p in self.levels}, **common)
        if self.estimator == "linear":  # the coordinator's own reading of the same table: nothing more asked
            return Estimates.of({p: linear_table_quantile(limits, counts, p) for p in self.levels}, **common)
        if table.bins < 3:
            return Outcome.aborted(f"the YJ table fit needs at least 2 interior limits, the table has {table.bins - 1}",
                                   **common)
        lam, a0, a1 = yj_table_fit(limits, counts)
        return Estimates.of({p: yj_table_quantile(limits, counts, p) for p in self.levels},
                                 yj_lambda=lam, **common)

    @classmethod
    def site(cls, rows, rng, site_id):
        return KAnonTableSite([two_sample_values(rows)], rng)

    @classmethod
    def spend(cls, phase, body):
        return table_spend("both groups pooled", body)

    def planned_spend(self, sites):
        return Spend("kanon", model=self.privacy["model"], k=self.request["k"])


#: the grid's one phase, then (fit: continuous) the search rounds search-0, search-1, ...
YJ_PHASES = PhaseTable(PhaseStep("respond", then=("search",)), PhaseStep("search", then=("search",), numbered=True),
                       rounds=MAX_FIT_ROUNDS)


class YJLikelihood(OneShotMethod):
    name = "yj_likelihood"
    codec = "summary"
    data = "two_sample"
    result = Estimates
    phases = YJ_PHASES
    PARAMS = {"grid_points": {"type": "int", "min": 2, "max": MAX_GRID, "default": 101},
              "fit": {"type": "str", "choices": ["grid", "continuous"], "default": "grid"},
              "rounds": {"type": "int", "min": 1, "max": MAX_FIT_ROUNDS, "default": 30},
              "levels": LEVELS_SPEC}

    def __init__(self, alpha, grid_points=101, fit="grid", rounds=30, levels=None):
        levels = list(LEVELS if levels is None else levels)
        super().__init__(alpha, grid_points=grid_points, fit=fit, rounds=rounds, levels=levels)
        self.grid, self.levels, self.fit, self.rounds = lambda_grid(grid_points), levels, fit, rounds

    @property
    def privacy(self):
        return {"epsilon": None, "model": "summary moments (not K-anonymous)"}

    def make_codec(self):
        if self.fit == "continuous":  # 2 lambdas in the first round, 1 in each search round: the
            # coordinator half checks the lengths against what it asked
            return Summary({"n": "int", "sum_h": "floats", "sum_h2": "floats", "jacobian": "float"})
        size = len(self.grid)
        return Summary({"n": "int", "sum_h": "floats", "sum_h2": "floats", "jacobian": "float"},
                       {"sum_h": size, "sum_h2": size})

    def coordinator(self, sizes, rng):
        if self.fit == "continuous":
            return _GoldenSection(self, sorted(sizes))
        return super().coordinator(sizes, rng)

    def plan(self, sizes):
        return Planned({site: {"grid": self.grid} for site in sizes})

    def combine(self, sizes, planned, answers, dropped, rng):
        moments = [answer for answer in answers.values() if answer["n"] > 0]
        common = {"answered": len(answers), "dropped": sorted(dropped)}
        if sum(m["n"] for m in moments) < 2:
            return Outcome.aborted("fewer than 2 values in all", **common)
        lam, mu, sigma, _ = yj_likelihood_fit(moments, self.grid)
        return Estimates.of({p: yj_likelihood_quantile(moments, self.grid, p) for p in self.levels},
                                 yj_lambda=lam, **common)

    @classmethod
    def site(cls, rows, rng, site_id):
        return SiteMoments(rows)


class _GoldenSection(CoordinatorHalf):
    """`fit: continuous`: eq. (10)-(11) maximized over lambda in LAMBDA_RANGE by golden-section
    search (stats.fedquantiles.golden_section_step), each evaluation one round in which every site
    that answered the first is asked the same one lambda (the first round two), then eq. (12) at
    the best lambda evaluated. The sites' n and Jacobian term must not change between rounds, each
    answer must hold one sum per lambda asked, and every site must answer every round (the
    likelihood is over the same data throughout), else the session aborts, releasing nothing."""

    def __init__(self, method: YJLikelihood, sites: list[str]) -> None:
        self.method, self.sites = method, sites
        self.bracket = self.asked = None
        self.first: dict[str, tuple[int, float]] = {}
        self.seen: dict[float, tuple[float, float, float]] = {}  # lambda -> (-loglik, mu, sigma)
        self.rounds = 0

    def start(self):
        if not self.sites:
            return Outcome.aborted("no site joined the session")
        self.bracket, self.asked = golden_section_step(LAMBDA_RANGE, None, {})
        return Send("respond", {site: {"grid": self.asked} for site in self.sites})

    def advance(self, phase, answers, dropped):
        common = {"rounds": self.rounds, "lambdas_asked": len(self.seen) + len(self.asked)}
        if phase == "respond":
            if not answers:
                return Outcome.aborted(f"no site answered ({len(dropped)} dropped)", dropped=sorted(dropped))
            self.sites = sorted(answers)  # those lost before the search are not asked again
            self.dropped = sorted(dropped)
            self.first = {site: (a["n"], a["jacobian"]) for site, a in answers.items()}
        missing = sorted(set(self.sites) - set(answers))
        if missing:
            return Outcome.aborted(f"the continuous YJ fit needs every site in every round; {missing[0]} did not "
                                   f"answer {phase} ({dropped.get(missing[0], 'no answer')})", dropped=missing,
                                   **common)
        for site in self.sites:
            a = answers[site]
            if len(a["sum_h"]) != len(self.asked) or len(a["sum_h2"]) != len(self.asked):
                return Outcome.aborted(f"{site} answered {len(a['sum_h'])} sums for {len(self.asked)} lambdas asked",
                                       **common)
            if a["n"] < 0 or not (np.all(np.isfinite(a["sum_h"])) and np.all(np.isfinite(a["sum_h2"]))
                                  and np.isfinite(a["jacobian"])):
                return Outcome.aborted(f"{site} answered a negative n or moments that are not finite", **common)
            if (a["n"], a["jacobian"]) != self.first[site]:
                return Outcome.aborted(f"{site}'s n or Jacobian term changed between rounds", **common)
        moments = [a for a in answers.values() if a["n"] > 0]
        if sum(m["n"] for m in moments) < 2:
            return Outcome.aborted("fewer than 2 values in all", answered=len(self.sites), dropped=self.dropped)
        for i, lam in enumerate(self.asked):
            one = [{"n": m["n"], "sum_h": [m["sum_h"][i]], "sum_h2": [m["sum_h2"][i]], "jacobian": m["jacobian"]}
                   for m in moments]
            _, mu, sigma, loglik = yj_likelihood_fit(one, [lam])
            self.seen[lam] = (-float(loglik[0]), mu, sigma)
        if self.rounds >= self.method.rounds:
            return self._finish()
        self.bracket, self.asked = golden_section_step(self.bracket, self.asked,
                                                       {v: f for v, (f, _, _) in self.seen.items()})
        self.rounds += 1
        return Send(Phase("search", self.rounds - 1), {site: {"grid": self.asked} for site in self.sites})

    def _finish(self):
        lam = min(self.seen, key=lambda v: (self.seen[v][0], v))
        _, mu, sigma = self.seen[lam]
        return Estimates.of({p: yj_quantile(lam, mu, sigma, p) for p in self.method.levels}, yj_lambda=lam, answered=len(self.sites),
                            dropped=self.dropped, rounds=self.rounds, lambdas_asked=len(self.seen),
                            bracket=[self.bracket[0], self.bracket[-1]])


class SiteMoments(SiteHalf):
    """n, sum h_lambda, sum h_lambda^2 and the Jacobian term at the lambdas asked: one grid, or the
    rounds of a continuous fit, at most MAX_GRID distinct lambdas in one session in all. The
    lambdas answered are kept in the site's memory of the session (SiteHalf.session_memory), not
    on the half: a coordinator that closes the session, or reopens the trial, and asks again gets
    a fresh half but not a fresh count. A lambda answered before costs nothing (the same rows give
    the same moments: a resumed coordinator may ask its grid again)."""

    def __init__(self, rows):
        self.rows = rows
        self.session_memory = {}  # the site's driver replaces it with the session's own

    REQUEST = {"type": "map", "fields": {"grid": {"type": "list", "min_len": 1, "max_len": MAX_GRID, "of": {
        "type": "float", "ge": LAMBDA_RANGE[0], "le": LAMBDA_RANGE[1]}}}}

    def answer(self, phase, body):
        grid = checked(self.REQUEST, body, f"{phase} request")["grid"]
        answered = self.session_memory.get("yj_lambdas", np.empty(0))
        new = np.setdiff1d(np.asarray(grid, dtype=float), answered)
        if answered.size + new.size > MAX_GRID:
            raise RequestError(f"{phase} request: {answered.size} lambdas answered in this session already and "
                               f"{new.size} new ones asked, at most {MAX_GRID} in all")
        self.session_memory["yj_lambdas"] = np.union1d(answered, new)
        moments = yj_site_moments(two_sample_values(self.rows), grid)
        return {"n": moments["n"], "sum_h": np.asarray(moments["sum_h"]), "sum_h2": np.asarray(moments["sum_h2"]),
                "jacobian": moments["jacobian"]}


MAX_ROUNDS = 200
#: the sites' range, then bisection rounds loss-0, loss-1, ... on every level at once
LOSS_PHASES = PhaseTable(PhaseStep("range", then=("loss",)), PhaseStep("loss", then=("loss",), numbered=True),
                         rounds=MAX_ROUNDS)


class QuantileLoss(Method):
    name = "quantile_loss"
    codec = "summary"
    data = "two_sample"
    result = Estimates
    phases = LOSS_PHASES
    PARAMS = {"tolerance": {"type": "float", "gt": 0, "lt": 1, "default": 1e-6}, "levels": LEVELS_SPEC}

    def __init__(self, alpha, tolerance=1e-6, levels=None):
        levels = list(LEVELS if levels is None else levels)
        super().__init__(alpha, tolerance=tolerance, levels=levels)
        self.tolerance, self.levels = tolerance, levels

    @property
    def privacy(self):
        return {"epsilon": None, "model": "none: not privacy preserving (iterates reveal the data)"}

    def make_codec(self):
        return _LossCodec(len(self.levels))

    def coordinator(self, sizes, rng):
        return _Bisection(self, sorted(sizes))

    @classmethod
    def site(cls, rows, rng, site_id):
        return SiteLoss(rows)


class _LossCodec(Summary):
    """Either phase's answer: the range ({n, lo, hi}) or, per probed point q, #{y <= q}, from
    which the right derivative of the site's eq. (4) loss, (1 - p) C - p (n - C), follows exactly."""

    def __init__(self, levels: int) -> None:
        super().__init__()
        self.range_codec = Summary({"n": "int", "lo": "float", "hi": "float"})
        self.slope_codec = Summary({"below": "ints"}, {"below": levels})

    def decode(self, body):
        codec = self.slope_codec if isinstance(body, dict) and "below" in body else self.range_codec
        return codec.decode(body)


class _Bisection(CoordinatorHalf):
    """Per level p, the bracket (lo, hi] holds the smallest q with sum_l slope_l(q) >= 0, i.e.
    #{y <= q} >= p N: the pooled sample quantile y_(r), r = pooled_rank(p, N), the minimizer of
    eq. (4). Stops when every bracket is narrower than `tolerance` x the data's range."""

    def __init__(self, method: QuantileLoss, sites: list[str]) -> None:
        self.method, self.sites = method, sites
        self.lo = self.hi = None
        self.rounds = 0

    def start(self):
        return Send("range", {site: {} for site in self.sites})

    def advance(self, phase, answers, dropped):
        missing = sorted(set(self.sites) - set(answers))
        if missing:
            return Outcome.aborted(f"the iterative quantile loss needs every site in every round; "
                                   f"{missing[0]} did not answer {phase} ({dropped.get(missing[0], 'no answer')})",
                                   dropped=missing, rounds=self.rounds)
        if phase == LOSS_PHASES.opening():  # the sites' ranges
            present = [a for a in answers.values() if a["n"] > 0]
            if not present:
                return Outcome.aborted("no site holds any value")
            low, high = min(a["lo"] for a in present), max(a["hi"] for a in present)
            total = sum(a["n"] for a in present)
            self.ranks = np.array([pooled_rank(p, total) for p in self.method.levels])
            self.span = high - low
            self.lo = np.full(len(self.method.levels), np.nextafter(low, -math.inf))
            self.hi = np.full(len(self.method.levels), high)
        else:  # the pooled right derivative (1 - p) C - p (N - C) >= 0, exactly: C >= pooled_rank(p, N)
            below = np.sum([a["below"] for a in answers.values()], axis=0)
            above = below >= self.ranks
            self.hi = np.where(above, self.probe, self.hi)
            self.lo = np.where(above, self.lo, self.probe)
        if np.all(self.hi - self.lo <= self.method.tolerance * max(self.span, 1e-300)) or self.rounds >= MAX_ROUNDS:
            return Estimates.of(dict(zip(self.method.levels, self.hi.tolist())), answered=len(self.sites),
                                     rounds=self.rounds)
        self.probe = (self.lo + self.hi) / 2.0
        self.rounds += 1
        body = {"q": self.probe.tolist(), "levels": self.method.levels}
        return Send(Phase("loss", self.rounds - 1), {site: body for site in self.sites})


class SiteLoss(SiteHalf):
    def __init__(self, rows):
        self.rows = rows

    def answer(self, phase, body):
        values = two_sample_values(self.rows)
        if phase == LOSS_PHASES.opening():  # the range
            expect_empty(body)
            if not values.size:
                return {"n": 0, "lo": 0.0, "hi": 0.0}
            return {"n": int(values.size), "lo": float(values.min()), "hi": float(values.max())}
        request = checked({"type": "map", "fields": {"q": {"type": "list", "of": {"type": "float", "finite": True}},
                                                     "levels": LEVELS_REQUEST}}, body, f"{phase} request")
        q, levels = request["q"], request["levels"]
        if len(q) != len(levels):
            raise RequestError(f"{phase} request: {len(q)} points q for {len(levels)} levels (one each)")
        return {"below": np.array([quantile_loss_terms(values, float(v), p)["below"] for v, p in zip(q, levels)],
                                  dtype=np.int64)}
