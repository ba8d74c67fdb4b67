"""FedCP²-QQ: FedCP-QQ where each site sends an epsilon-LDP bin (paper 000, section 4, alg. 3).

Coordinator, for a grid of gamma in (0, 1): plan (ell_gamma, k_gamma) as FedCP-QQ at coverage
(1 - alpha) / (1 - gamma alpha); add ell_cor of eq. (10); keep the gamma whose non-private
proxy M[ell_gamma + ell_cor, k_gamma] is smallest (the paper's grid search), among those with
ell_gamma + ell_cor <= n_j at every site (otherwise the proof of theorem 4.1 has nothing to stand
on). Site j runs algorithm 2 at level max((ell_gamma + ell_cor) / n_j, 1/2) and sends only its bin;
the server returns the right edge of the k_gamma-th smallest bin. Theorem 4.1: epsilon-LDP and
coverage >= 1 - alpha. Unequal sizes use the paper's rule at the adjusted level (appendix A.1);
dropouts re-plan k at the adjusted level for the sites that answered, as in FedCP-QQ.
"""

from __future__ import annotations


from protocol.accounting import Spend
from protocol.methods.base import SHORTFALL_SPEC, OneShotMethod, Outcome, Planned, per_site_removed
from results.conformal import Threshold
from protocol.methods.bins import BINS_SPEC, bins_as_spec, maybe_bins, resolve_bins
from protocol.methods.private_bin import PrivateQuantileBin, bin_spend
from stats.amplification import local_epsilon_for, shuffled_epsilon
from stats.dp import Bins
from stats.planner import choose_gamma, k_after_dropouts

class FedCP2QQ(OneShotMethod):
    name = "fedcp2_qq"
    codec = "exp_mech_bins"
    PARAMS = {
        "epsilon": {"type": "float", "gt": 0},
        "bins": BINS_SPEC,
        "gamma_grid": {"type": "int", "min": 1, "default": 50},
        "dropouts": {"type": "int", "min": 0, "default": 0},
    }

    def __init__(self, alpha, epsilon: float, bins: dict | Bins, gamma_grid: int = 50, dropouts: int = 0):
        bins = bins_as_spec(bins)
        super().__init__(alpha, epsilon=epsilon, bins=bins, gamma_grid=gamma_grid, dropouts=dropouts)
        self.epsilon, self.gamma_grid, self.dropouts = float(epsilon), gamma_grid, dropouts
        self.bins = maybe_bins(bins)
        self.bins_spec = bins

    def for_trial(self, public):
        if isinstance(self.bins, Bins):
            return self
        return type(self)(self.alpha, **{**self.params, "bins": resolve_bins(self.bins_spec, public)})

    def local_epsilon(self, sites: int) -> float:
        """The epsilon of each site's exponential mechanism: here the requested one (pure LDP);
        the shuffled and securely aggregated variants derive a larger one by amplification."""
        return self.epsilon

    @property
    def privacy(self):
        return {"epsilon": self.epsilon, "model": "local"}

    @property
    def score_range(self):
        return (self.bins.lo, self.bins.hi) if isinstance(self.bins, Bins) else None

    def make_codec(self):
        return self.codec_class()(self._bins().count)

    def plan(self, sizes):
        sites = sorted(sizes)
        bins = self._bins()
        epsilon = self.local_epsilon(len(sites))
        choice = choose_gamma(tuple(sizes[s] for s in sites), self.alpha, epsilon, bins.count,
                              self.gamma_grid, min(self.dropouts, len(sites) - 1))
        if choice is None:
            return Threshold.infinite(f"no gamma in the grid gives ell_gamma + ell_cor <= n_j at every site "
                                    f"(local epsilon={epsilon:g}, B={bins.count}): privacy this strong "
                                    f"needs more data per site; the valid set is the whole line")
        gamma, plan, correction, proxy = choice
        requests = {s: {"level": max((ell + correction) / sizes[s], 0.5), "epsilon": epsilon,
                        "bins": bins.as_body()} for s, ell in zip(sites, plan.ells)}
        return Planned(requests, state=(gamma, plan, correction, proxy))

    def combine(self, sizes, planned, answers, dropped, rng):
        gamma, plan, correction, proxy = planned.state
        level_alpha = 1.0 - (1.0 - self.alpha) / (1.0 - gamma * self.alpha)
        k = plan.k
        if len(answers) < plan.m:
            k = k_after_dropouts(sizes, dict(zip(sorted(sizes), plan.ells)), dropped, len(answers), level_alpha)
            if isinstance(k, str):
                return Threshold.infinite(k, gamma=gamma, answered=len(answers), dropped=sorted(dropped))
        bins = self._bins()
        values = sorted(bins.right_edge(b) for b in answers.values())
        return Threshold.ok(values[k - 1], ell=plan.ell if plan.ell is not None else
                          f"{min(plan.ells)}..{max(plan.ells)}", k=k, guarantee=1.0 - self.alpha,
                          gamma=gamma, ell_cor=correction, proxy_coverage=proxy,
                          top_bin=max(answers.values()) == bins.count - 1,
                          m=plan.m, answered=len(answers), dropped=sorted(dropped))

    @classmethod
    def site(cls, rows, rng, site_id):
        return PrivateQuantileBin(rows, rng)

    @classmethod
    def spend(cls, phase, body):
        return bin_spend(body, amplified=cls.codec_class().route == "shuffler")

    @classmethod
    def release_shape(cls, phase, body):
        """Everything but the site's own quantile level (set by its n_j for unequal sizes):
        epsilon, the bins and, shuffled or summed, the central claim."""
        return per_site_removed(body, ("level",))

    def planned_spend(self, sites):
        return Spend("dp", self.epsilon, 0.0, "local")

    def _bins(self) -> Bins:
        if not isinstance(self.bins, Bins):
            raise ValueError(f"{self.name}: bins {self.bins_spec} refer to the training split; "
                             f"resolve them with for_trial()")
        return self.bins


DELTA_SPEC = {"type": "float", "gt": 0, "lt": 1, "default": 1e-6}


class AmplifiedBins(FedCP2QQ):
    """FedCP²-QQ whose private bins reach the coordinator only as a multiset (a shuffle, or a
    one-hot secure sum), amplifying each site's epsilon_0-LDP bin to a central (epsilon, delta)
    (FMT21): the shared part of fedcp2_qq_shuffle and fedcp2_qq_secagg. Subclasses set `name`,
    `codec`, `MODEL` and the codec."""

    PARAMS = {**FedCP2QQ.PARAMS, "delta": DELTA_SPEC, "on_shortfall": SHORTFALL_SPEC}
    MODEL: str

    def __init__(self, alpha, epsilon, bins, gamma_grid=50, dropouts=0, delta=1e-6, on_shortfall="abort"):
        super().__init__(alpha, epsilon, bins, gamma_grid, dropouts)
        self.params["delta"] = self.delta = float(delta)
        self.params["on_shortfall"] = self.on_shortfall = on_shortfall

    @property
    def privacy(self):
        return {"epsilon": self.epsilon, "model": self.MODEL}

    def planned_messages(self, sites: int) -> int:
        """The fewest bins the amplification is planned for: every site but the dropouts allowed."""
        return max(1, sites - self.dropouts)

    def local_epsilon(self, sites: int) -> float:
        return local_epsilon_for(self.epsilon, self.planned_messages(sites), self.delta)

    def plan(self, sizes):
        planned = super().plan(sizes)
        if isinstance(planned, Outcome):
            return planned
        central = self.guaranteed(len(sizes), 1)
        return Planned({s: {**body, "central": central} for s, body in planned.requests.items()}, planned.state,
                       minimum=central["messages"] if self.on_shortfall == "abort" else 0)

    def guaranteed(self, sites: int, floor: int) -> dict:
        """The central guarantee each site may count (its `central` claim): with the abort policy
        the one asked, for the planned number of messages, which the shuffler or the unmask step
        enforces; with `report` only what `floor` messages (the fewest any release can hold)
        give, since a shortfall may then be released."""
        if self.on_shortfall == "abort":
            return {"epsilon": self.epsilon, "delta": self.delta, "messages": self.planned_messages(sites)}
        epsilon0 = self.local_epsilon(sites)
        return {"epsilon": shuffled_epsilon(epsilon0, floor, self.delta) * (1 + 1e-9) or epsilon0,
                "delta": self.delta, "messages": floor}

    def planned_spend(self, sites):
        central = self.guaranteed(sites, 1)
        return Spend("dp", central["epsilon"], central["delta"], self.MODEL, contributors=central["messages"])

    def combine(self, sizes, planned, answers, dropped, rng):
        privacy = central_privacy(self.local_epsilon(len(sizes)), len(answers), self.epsilon, self.delta)
        outcome = super().combine(sizes, planned, answers, dropped, rng).with_details(**privacy)
        if not privacy["privacy_shortfall"] or outcome.status != "ok":
            return outcome
        reason = shortfall_reason(len(answers), self.planned_messages(len(sizes)), privacy["epsilon_obtained"],
                                  self.epsilon, self.delta)
        if self.on_shortfall == "abort":
            return Outcome.aborted(reason + "; nothing released (on_shortfall: abort)", **outcome.details)
        return outcome.short_of_privacy(reason)


def shortfall_reason(inputs: int, planned: int, obtained: float, epsilon: float, delta: float) -> str:
    return (f"privacy shortfall: {inputs} private inputs where {planned} were planned for, so the release is "
            f"(epsilon {obtained:.4g}, delta {delta:g})-DP, not the epsilon {epsilon:g} asked")


def central_privacy(epsilon0: float, messages: int, epsilon: float, delta: float) -> dict:
    """What the report says of a shuffled (or one-hot aggregated) session: both guarantees."""
    obtained = shuffled_epsilon(epsilon0, messages, delta) if messages else 0.0
    return {"epsilon_local": epsilon0, "epsilon_obtained": obtained, "delta": delta, "messages": messages,
            "privacy_shortfall": obtained > epsilon * (1 + 1e-6)}
