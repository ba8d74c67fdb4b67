"""FedCP²-QQ with each site's private bin summed by secure aggregation (paper 000 section 4,
'Privacy amplification by shuffling or aggregation').

Each site runs FedCP²-QQ's exponential mechanism at its level, encodes the bin as a one-hot
vector of length B on Z_M (M = 2^bits > m, so counts never wrap) and takes part in the four
secure aggregation phases of protocol.secagg; the coordinator learns only the histogram of the
bins, reads the multiset off it and takes the k-th smallest exactly as FedCP²-QQ does. The
histogram is what a shuffle reveals (the multiset of messages), so the central (epsilon, delta)
is accounted by the same amplification bound (FMT21), with the same assumption as the shuffled
variant (protocol.methods.fedcp2_qq_shuffle). Sites whose input is not in the sum (dropouts in
any phase) are replanned for as in FedCP²-QQ; the central epsilon is for the bins summed. With
fewer masked inputs than planned (m - dropouts) the sum is not unmasked (`on_shortfall: abort`,
the default) or released with status `shortfall` (`report`).
"""

from __future__ import annotations

import math

import numpy as np

from protocol.codecs.secagg_ddg import SecAggDDG
from protocol.methods.base import Decided, Outcome, RequestError, checked
from protocol.methods.fedcp2_qq import AmplifiedBins, central_privacy, shortfall_reason
from protocol.methods.private_bin import REQUEST, PrivateQuantileBin, bin_spend, bins_from_request
from protocol.methods.secure_sum import (SECAGG_SPEC, SECURE_SUM_PHASES, SecureSumCoordinator, SecureSumSite,
                                        advertise_shape, graph_shape, question_digest)
from protocol.secagg.protocol import QUESTION, Aggregate, SecAggParams, role_of
from protocol.shuffle import anonymous_label
from stats.dp import Bins


class FedCP2QQSecAgg(AmplifiedBins):
    """The amplified bins' accounting (eps_0, central epsilon in combine) over a one-hot secure sum."""

    name = "fedcp2_qq_secagg"
    codec = "secagg_ddg"
    phases = SECURE_SUM_PHASES
    PARAMS = {**AmplifiedBins.PARAMS, "secagg": SECAGG_SPEC}
    MODEL = "central: eps0-LDP one-hot bins, securely summed (FMT21)"

    def __init__(self, alpha, epsilon, bins, gamma_grid=50, dropouts=0, delta=1e-6, on_shortfall="abort",
                 secagg=None):
        super().__init__(alpha, epsilon, bins, gamma_grid, dropouts, delta, on_shortfall)
        self.params["secagg"] = self.secagg = {"graph": "sparse", "degree": 0, "threshold": 0, "mode": "active", **(secagg or {})}

    def make_codec(self):
        return SecAggDDG(self._bins().count)

    def coordinator(self, sizes, rng):
        sizes = dict(sizes)
        m = len(sizes)
        if m < 2:
            return Decided(Outcome.aborted(f"secure aggregation needs at least 2 sites, {m} joined"))
        planned = self.plan(sizes)
        if isinstance(planned, Outcome):
            return Decided(planned)
        bins = self._bins()
        try:
            params = SecAggParams(max(8, math.ceil(math.log2(m + 1))), bins.count, *graph_shape(self.secagg, m), m,
                                  self.secagg["mode"])
        except ValueError as exc:
            return Decided(Outcome.aborted(f"secure aggregation parameters: {exc}"))
        first = next(iter(planned.requests.values()))
        public = {"epsilon": first["epsilon"], "bins": bins.as_body(), "central": self.guaranteed(m, params.threshold)}
        return SecureSumCoordinator(params, sorted(sizes), rng, public,
                                    lambda aggregate: self.finish(aggregate, sizes, planned, bins, rng),
                                    lambda inputs: self.unmask_refusal(len(sizes), inputs),
                                    own={s: {"level": r["level"]} for s, r in planned.requests.items()},
                                    digest=question_digest(self))

    def unmask_refusal(self, sites: int, inputs: int) -> str | None:
        """Why the sum of `inputs` one-hot bins may not be revealed (abort policy), or None."""
        if self.on_shortfall != "abort":
            return None
        privacy = central_privacy(self.local_epsilon(sites), inputs, self.epsilon, self.delta)
        if not privacy["privacy_shortfall"]:
            return None
        return shortfall_reason(inputs, self.planned_messages(sites), privacy["epsilon_obtained"], self.epsilon,
                                self.delta)

    def finish(self, aggregate: Aggregate, sizes, planned, bins: Bins, rng) -> Outcome:
        if not aggregate.ok:
            return Outcome.aborted(f"secure aggregation: {aggregate.reason}", answered=len(aggregate.included),
                                   dropped=sorted(aggregate.dropped))
        counts = aggregate.total.astype(np.int64)
        if int(counts.sum()) != len(aggregate.included):
            return Outcome.aborted(f"the summed histogram counts {int(counts.sum())} bins for "
                                   f"{len(aggregate.included)} sites: some input was not one-hot, or the masks "
                                   f"did not cancel (sites asked different questions)")
        answers = {anonymous_label(i): int(b) for i, b in enumerate(np.repeat(np.arange(bins.count), counts))}
        included = set(aggregate.included)  # a list: `in` on it made this O(m^2), 1.3 s at 10,000 sites
        dropped = {s: f"not in the sum ({aggregate.dropped.get(s, 'dropped')})" for s in sizes if s not in included}
        return self.combine(sizes, planned, answers, dropped, rng)

    @classmethod
    def spend(cls, phase, body):
        """Counted when the site accepts the session (advertise), before it makes any key."""
        return (bin_spend(body.get("method"), amplified=True)  # a one-hot term of a secure sum
                if role_of(phase) == QUESTION and isinstance(body, dict) else None)

    @classmethod
    def release_shape(cls, phase, body):
        """The advertise request less the site's own level (the ring, length, graph, nonce, epsilon,
        bins and central claim); the later phases ask nothing the advertise did not fix."""
        return advertise_shape(body, ("level",)) if role_of(phase) == QUESTION else None

    @classmethod
    def site(cls, rows, rng, site_id):
        def one_hot(public, params: SecAggParams) -> np.ndarray:
            level = public["level"]
            bin_index = PrivateQuantileBin(rows, rng).answer(
                "mask", {"level": level, "epsilon": public["epsilon"], "bins": public["bins"]})
            if params.length != public["bins"]["count"]:
                raise RequestError(f"the session's vectors have {params.length} entries, not B")
            vector = np.zeros(params.length, dtype=np.uint64)
            vector[bin_index] = 1
            return vector

        return SecureSumSite(site_id, one_hot, check_public, question_digest(cls))


#: the method's parameters in a site's advertise request: its own quantile level, the mechanism's
#: epsilon, the bins and the central claim (protocol.methods.private_bin.CENTRAL)
PUBLIC = {"type": "map", "fields": {"level": REQUEST["fields"]["level"], "epsilon": {"type": "any"},
                                    "bins": {"type": "any"}, "central": {"type": "any"}}}


def check_public(public):
    public = checked(PUBLIC, public, "advertise request.method")
    spend = bin_spend(public, amplified=True)
    bins_from_request(public["bins"])
    return spend
