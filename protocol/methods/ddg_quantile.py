"""DP federated quantile by distributed discrete Gaussian noise and secure aggregation (paper 001,
algorithm 1 options 1 and 2, algorithm 2), used as a calibration threshold.

Sites histogram their scores over public bins (flat, or hierarchical for algorithm 2), scale by
c, add N_Z(0, sigma^2) per entry and mask the result on Z_M; the coordinator learns only the
noisy sum, estimates the CDF and returns the bin edge l_j* of eq. (1) at the requested level
(by default the split-conformal level ceil((1 - alpha)(N + 1)) / N of the pooled count N; the
noise makes this an approximate, not a finite-sample, guarantee: theorem 1 bounds the quantile
error with high probability). c and sigma^2 come from the requested (epsilon, delta) by
theorems 1 / 2 with the noise of `m - dropouts` sites; the report gives the epsilon actually
obtained with the sites whose inputs entered the sum. Fewer masked inputs than the noise was
planned for (m - dropouts) would mean less noise in the sum than the epsilon needs: the sum is
then not unmasked and the session aborts (`on_shortfall: abort`, the default), or it is released
with status `shortfall` naming the epsilon obtained (`report`). Each site checks the central
(epsilon, delta) the request claims against theorem 1 / 2 for the planned number of noisy inputs
before it counts that epsilon against its own budget. A ring too small for the theorems'
no-wrap-around condition is refused before anything is sent. `accounting: exact` (default)
uses the hierarchical histogram's exact l2 / l1 sensitivities, `paper` theorem 2 as printed.
"""

from __future__ import annotations

import math

import numpy as np

from protocol.accounting import MAX_CLAIMED, Spend
from protocol.methods.base import SHORTFALL_SPEC, CoordinatorHalf, Decided, Method, Outcome, RequestError, checked
from results.conformal import Threshold
from protocol.methods.bins import BINS_SPEC, bins_as_spec, maybe_bins, resolve_bins
from protocol.methods.private_bin import bins_from_request
from protocol.methods.secure_sum import (SECAGG_SPEC, SECURE_SUM_PHASES, SecureSumCoordinator, SecureSumSite,
                                        advertise_shape, graph_shape, question_digest)
from protocol.noise import discrete_gaussian, max_sigma2
from protocol.secagg.protocol import QUESTION, Aggregate, SecAggParams, role_of
from stats.ddg import (ACCOUNTING, centred, estimated_cdf, flat_histogram, hierarchical_cumulative,
                       hierarchical_histogram, histogram_epsilon, quantile_index, ring_bits_required,
                       scaling_for_epsilon, to_ring)
from stats.dp import Bins

DEFAULT_LEVELS = [round(0.1 * i, 1) for i in range(1, 10)]
MAX_BINS = 1 << 20


class DDGQuantile(Method):
    name = "ddg_quantile"
    codec = "secagg_ddg"
    phases = SECURE_SUM_PHASES
    PARAMS = {
        "epsilon": {"type": "float", "gt": 0},
        "delta": {"type": "float", "gt": 0, "lt": 1, "default": 1e-5},
        "sigma2": {"type": "float", "ge": 0.25, "default": 2.0},
        "bins": {**BINS_SPEC, "fields": {**BINS_SPEC["fields"], "count": {"type": "int", "min": 2, "default": 64}}},
        "histogram": {"type": "str", "choices": ["flat", "hierarchical"], "default": "flat"},
        "count": {"type": "str", "choices": ["estimated", "exact"], "default": "estimated"},
        "accounting": {"type": "str", "choices": list(ACCOUNTING), "default": "exact"},
        "level": {"type": "float_or", "choices": ["conformal"], "default": "conformal"},
        "modulus_bits": {"type": "int", "min": 0, "max": 62, "default": 0},
        "failure": {"type": "float", "gt": 0, "lt": 1, "default": 1e-6},
        "dropouts": {"type": "int", "min": 0, "default": 0},
        "on_shortfall": SHORTFALL_SPEC,
        "secagg": SECAGG_SPEC,
        "report_levels": {"type": "list", "of": {"type": "float", "gt": 0, "lt": 1}, "default": DEFAULT_LEVELS},
    }

    def __init__(self, alpha, epsilon, bins, delta=1e-5, sigma2=2.0, histogram="flat", count="estimated",
                 accounting="exact", level="conformal", modulus_bits=0, failure=1e-6, dropouts=0, on_shortfall="abort",
                 secagg=None, report_levels=None):
        secagg = {"graph": "sparse", "degree": 0, "threshold": 0, "mode": "active", **(secagg or {})}
        report_levels = list(DEFAULT_LEVELS if report_levels is None else report_levels)
        bins = bins_as_spec(bins)
        super().__init__(alpha, epsilon=epsilon, bins=bins, delta=delta, sigma2=sigma2, histogram=histogram,
                         count=count, accounting=accounting, level=level, modulus_bits=modulus_bits, failure=failure,
                         dropouts=dropouts, on_shortfall=on_shortfall, secagg=secagg, report_levels=report_levels)
        self.epsilon, self.delta, self.sigma2 = float(epsilon), float(delta), float(sigma2)
        self.hierarchical = histogram == "hierarchical"
        self.accounting = accounting
        self.count, self.level, self.modulus_bits, self.failure = count, level, modulus_bits, failure
        self.dropouts, self.secagg, self.report_levels = dropouts, secagg, report_levels
        self.on_shortfall = on_shortfall
        self.bins_spec = bins
        self.bins = maybe_bins(bins)
        b = bins["count"]
        if self.hierarchical and (b < 2 or b & (b - 1)):
            raise ValueError(f"ddg_quantile: a hierarchical histogram needs bins.count a power of two, got {b}")

    def for_trial(self, public):
        if isinstance(self.bins, Bins):
            return self
        return DDGQuantile(self.alpha, **{**self.params, "bins": resolve_bins(self.bins_spec, public)})

    @property
    def privacy(self):
        return {"epsilon": self.epsilon, "model": "central (DDG + secure aggregation)"}

    @property
    def score_range(self):
        return (self.bins.lo, self.bins.hi) if isinstance(self.bins, Bins) else None

    def make_codec(self):
        return self.codec_class()(self.length())

    def length(self) -> int:
        return 2 * self.bins.count - 2 if self.hierarchical else self.bins.count

    def session_parameters(self, sizes: dict[str, int]) -> tuple[SecAggParams, dict] | str:
        """The public parameters of a session, or why none can run."""
        m, b = len(sizes), self.bins.count
        if m < 2:
            return f"secure aggregation needs at least 2 sites, {m} joined"
        noise_sites = self.planned_inputs(m)
        try:
            c, sigma2 = scaling_for_epsilon(self.epsilon, self.delta, noise_sites, self.sigma2, b, self.hierarchical,
                                           self.accounting)
        except ValueError as exc:
            return str(exc)
        need = ring_bits_required(c, sum(sizes.values()), m, sigma2, b, self.hierarchical, self.failure)
        bits = self.modulus_bits or max(need, 16)
        if bits < need:
            return (f"ring too small: M = 2^{bits} but c={c}, sigma^2={sigma2:.3g}, {sum(sizes.values())} values "
                    f"and {m} sites need M >= 2^{need} to avoid wrap-around with probability "
                    f"1 - {self.failure:g} (paper 001 theorem {2 if self.hierarchical else 1}); "
                    f"raise modulus_bits or lower epsilon")
        degree, threshold = self.graph_shape(m)
        try:
            params = SecAggParams(bits, self.length(), degree, threshold, m, self.secagg["mode"])
        except ValueError as exc:
            return f"secure aggregation parameters: {exc}"
        # the guarantee each site may count: as asked, for the planned inputs, which the unmask
        # step enforces; under `report` only what the secagg threshold's inputs give (any sum holds
        # at least that many)
        inputs = noise_sites if self.on_shortfall == "abort" else threshold
        claim = self.epsilon if self.on_shortfall == "abort" else (1 + 1e-9) * histogram_epsilon(
            c, inputs, sigma2, b, self.hierarchical, self.delta, self.accounting)
        public = {"c": c, "sigma2": sigma2, "bins": self.bins.as_body(),
                  "histogram": "hierarchical" if self.hierarchical else "flat",
                  "central": {"epsilon": claim, "delta": self.delta, "inputs": inputs, "accounting": self.accounting}}
        return params, public

    def graph_shape(self, m: int) -> tuple[int, int]:
        """(degree, threshold) of the session's secure-aggregation graph over m sites."""
        return graph_shape(self.secagg, m)

    def planned_spend(self, sites):
        """As session_parameters() claims: the epsilon asked over the planned inputs (abort), or under `report`
        what the threshold's inputs give, which this check takes as the contributors."""
        if self.on_shortfall == "abort" or sites < 2:
            return Spend("dp", self.epsilon, self.delta, self.privacy["model"],
                         contributors=max(1, self.planned_inputs(sites)))
        inputs = self.graph_shape(sites)[1]
        b = self.bins.count if isinstance(self.bins, Bins) else self.bins_spec["count"]
        c, sigma2 = scaling_for_epsilon(self.epsilon, self.delta, self.planned_inputs(sites), self.sigma2, b,
                                        self.hierarchical, self.accounting)
        claim = (1 + 1e-9) * histogram_epsilon(c, inputs, sigma2, b, self.hierarchical, self.delta, self.accounting)
        return Spend("dp", claim, self.delta, self.privacy["model"], contributors=inputs)

    def coordinator(self, sizes, rng) -> CoordinatorHalf:
        sizes = dict(sizes)
        planned = self.session_parameters(sizes)
        if isinstance(planned, str):
            return Decided(Outcome.aborted(planned))
        params, public = planned
        return SecureSumCoordinator(params, sorted(sizes), rng, public,
                                    lambda aggregate: self.finish(aggregate, sizes, params, public),
                                    lambda inputs: self.unmask_refusal(public, inputs, len(sizes)),
                                    digest=question_digest(self))

    def obtained_epsilon(self, public: dict, inputs: int) -> float:
        """Theorem 1 / 2: the epsilon of a sum holding `inputs` sites' noise."""
        return histogram_epsilon(public["c"], inputs, public["sigma2"], self.bins.count, self.hierarchical,
                                 self.delta, self.accounting)

    def planned_inputs(self, sites: int) -> int:
        """How many sites' noise the scaling is planned for: all but the dropouts allowed."""
        return max(1, sites - self.dropouts)

    def shortfall(self, public: dict, inputs: int, sites: int) -> str | None:
        """Why a sum of `inputs` noisy histograms is weaker than asked, or None."""
        obtained = self.obtained_epsilon(public, inputs)
        if obtained <= self.epsilon * (1 + 1e-9):
            return None
        return (f"privacy shortfall: {inputs} noisy inputs where the noise was planned for "
                f"{self.planned_inputs(sites)}, so the sum is (epsilon {obtained:.4g}, delta {self.delta:g})-DP, "
                f"not the epsilon {self.epsilon:g} asked")

    def unmask_refusal(self, public: dict, inputs: int, sites: int) -> str | None:
        return self.shortfall(public, inputs, sites) if self.on_shortfall == "abort" else None

    def finish(self, aggregate: Aggregate, sizes, params: SecAggParams, public: dict) -> Outcome:
        common = {"dropped": sorted(aggregate.dropped), "c": public["c"], "sigma2": public["sigma2"],
                  "modulus_bits": params.modulus_bits, "degree": params.degree, "threshold_t": params.threshold}
        if not aggregate.ok:
            return Outcome.aborted(f"secure aggregation: {aggregate.reason}", answered=len(aggregate.included), **common)
        included = aggregate.included
        n = sum(sizes[s] for s in included)
        noisy = centred(aggregate.total, params.modulus_bits) / public["c"]
        b = self.bins.count
        if self.hierarchical:
            cdf = hierarchical_cumulative(noisy, b) / n
        else:
            cdf = estimated_cdf(noisy, self.count, n)
        level = (min(1.0, math.ceil((1 - self.alpha) * (n + 1)) / n) if self.level == "conformal" else float(self.level))
        j = quantile_index(cdf, level)
        obtained = self.obtained_epsilon(public, len(included))
        outcome = Threshold.ok(float(self.bins.edges[j]), answered=len(included), included=included, level=level,
                          bin=j, epsilon_obtained=obtained, delta=self.delta,
                          privacy_shortfall=obtained > self.epsilon * (1 + 1e-9),
                          quantile_indices={str(p): quantile_index(cdf, p) for p in self.report_levels},
                          **common)
        short = self.shortfall(public, len(included), len(sizes))
        if short is None:
            return outcome
        if self.on_shortfall == "abort":  # the coordinator half stops before unmasking; kept as a second line
            return Outcome.aborted(short + "; nothing released (on_shortfall: abort)", **common)
        return outcome.short_of_privacy(short)

    @classmethod
    def spend(cls, phase, body):
        """Counted when the site accepts the session (advertise), before it makes any key."""
        if role_of(phase) != QUESTION or not isinstance(body, dict) or not isinstance(body.get("method"), dict):
            return None
        return check_public(body["method"])

    @classmethod
    def release_shape(cls, phase, body):
        """The whole advertise request (ring, length, graph, nonce, c, sigma^2, bins, histogram,
        central claim: every site gets the same); the later phases ask nothing it did not fix."""
        return advertise_shape(body) if role_of(phase) == QUESTION else None

    @classmethod
    def site(cls, rows, rng, site_id):
        return SecureSumSite(site_id, lambda public, params: noisy_histogram(rows, public, params), check_public,
                             question_digest(cls))




def ddg_spend(public) -> Spend:
    """The central (epsilon, delta) a site counts for one DDG sum, checked against theorem 1 / 2
    for the request's c, sigma^2, bins and planned number of noisy inputs (RequestError if the
    claim is not backed)."""
    central = checked(CENTRAL, public["central"], "central")
    count = public["bins"]["count"]
    backed = histogram_epsilon(public["c"], central["inputs"], float(public["sigma2"]), count,
                               public["histogram"] == "hierarchical", float(central["delta"]), central["accounting"])
    if backed > central["epsilon"] * (1 + 1e-6):
        raise RequestError(f"the claimed central epsilon {central['epsilon']:g} is not backed: c={public['c']}, "
                           f"sigma^2={public['sigma2']:.4g} over {central['inputs']} inputs give {backed:.4g}")
    return Spend("dp", float(central["epsilon"]), float(central["delta"]),
                 f"central by distributed discrete Gaussian over {central['inputs']} inputs",
                 contributors=int(central["inputs"]))


#: the central guarantee a DDG request claims: (epsilon, delta) over `inputs` noisy inputs, accounted so
CENTRAL = {"type": "map", "fields": {"epsilon": {"type": "float", "gt": 0, "finite": True},
                                     "delta": {"type": "float", "gt": 0, "lt": 1},
                                     "inputs": {"type": "int", "min": 1, "max": MAX_CLAIMED},
                                     "accounting": {"type": "str", "choices": list(ACCOUNTING)}}}
#: the method's public parameters in the advertise request: the scale c, sigma^2 (lemma 9's 1/4 at
#: least; at most what fits 64-bit draws, checked after), the bins, the histogram
PUBLIC = {"type": "map", "fields": {"c": {"type": "int", "min": 1},
                                    "sigma2": {"type": "float", "ge": 0.25, "finite": True},
                                    "bins": {"type": "any"}, "histogram": {"type": "str", "choices": ["flat", "hierarchical"]},
                                    "central": {"type": "any"}}}


def check_public(public) -> Spend:
    """A site's own check of the parameters it is asked to use, before it makes any key; returns
    the central guarantee they back (ddg_spend)."""
    public = checked(PUBLIC, public, "advertise request.method")
    if public["sigma2"] > max_sigma2():
        raise RequestError(f"sigma^2 must be at most {max_sigma2():.4g} (draws that fit 64-bit integers, "
                           f"protocol.noise.max_sigma2), got {public['sigma2']!r}")
    count = bins_from_request(public["bins"], min_count=2, max_count=MAX_BINS).count
    if public["histogram"] == "hierarchical" and count & (count - 1):
        raise RequestError("a hierarchical histogram needs a power-of-two bin count")
    return ddg_spend(public)  # the central guarantee claimed must follow from these parameters


def noisy_histogram(scores, public, params: SecAggParams) -> np.ndarray:
    """Algorithm 1 / 2, lines 1-2, at one site: (c x + xi) mod M, xi ~ N_Z(0, sigma^2) per entry."""
    bins = public["bins"]
    edges = Bins(float(bins["lo"]), float(bins["hi"]), bins["count"]).edges
    counts = hierarchical_histogram(scores, edges) if public["histogram"] == "hierarchical" else flat_histogram(scores, edges)
    if counts.size != params.length:
        raise RequestError(f"my histogram has {counts.size} entries, the session expects {params.length}")
    noise = discrete_gaussian(float(public["sigma2"]), counts.size)
    return to_ring(public["c"] * counts + noise, params.modulus_bits)
