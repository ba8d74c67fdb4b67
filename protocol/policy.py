"""A site's own policy: what it serves, decided by the site, never by the study (issue 35).

The coordinator asks; the site decides. Before a site half may answer, the site checks the
request's `Spend` (computed by the method from the request the site received) against its
policy and refuses, with the reason, a request that asks for more than the policy allows:

- `methods`: the methods it answers ("all", or a list of names);
- `min_k`: the smallest K of a K-anonymous table it takes part in;
- `max_epsilon`: the largest epsilon of a single DP release ("unlimited" to lift it); the total
  over releases is the site's budget (protocol.accounting.Budget, `sites.budget`);
- `non_private`: whether it releases anything without a formal privacy guarantee (a raw local
  quantile, every score to a curator, model weights in the clear): "refuse" (the default) or
  "allow";
- `min_contributors`: the fewest inputs it accepts behind a claim whose privacy rests on other
  sites' inputs (a shuffle's messages, a secure sum's noisy inputs);
- `unseen_claims`: "trust" (the default) or "refuse" a claim the site cannot check from what it
  sees (a sparse secure sum's global count of inputs, beyond its neighbourhood);
- `secagg`: the secure sums it takes part in: "active" (the default: only the protocol with signed
  keys and a consistency round, protocol.secagg.protocol, against a coordinator that lies) or
  "semi-honest" (that too, and the cheaper protocol that trusts the coordinator to relay keys
  and survivor lists faithfully);
- `trials`: how many trials it builds data for, trial numbers 0 .. trials - 1 (100 by default): a
  coordinator that names another trial is refused before anything is built or scored (a site
  that builds its data from a scenario would otherwise draw a fresh data set for every number);
- `trust_sampling`: false (the default) or true. A round of private federated training is
  amplified by the coordinator's sampling of clients (protocol.rounds_privacy) only if the
  coordinator samples as it says, which no site can check: by default a site books the
  UNAMPLIFIED rho of every round it takes part in; with true it books a training that states
  its sampling at the amplified cost of all its rounds, once (protocol.accounting; `booked`);
- `curator`: "refuse" (the default) or "allow" a release sent in the clear to a coordinator
  trusted to add the noise itself (the central-noise setting of paper 001's DP-Δ-FL: clipped
  updates and loss bins to a trusted curator);
- `max_epsilon` of a zCDP release (`Spend(kind="zcdp")`) is checked on one round's own
  epsilon, its rho converted at the budget's delta (unamplified: one release is one round);
- `noise`: "os" (the default: every draw that protects a release comes from the operating
  system's CSPRNG, protocol.noise.PrivacyNoise) or "seeded" (the draws replay from the scenario
  seed: for reproducing figures and regression tests only; every output of such a run says that
  its releases are not private).

In a multi-host run the policy is the site operator's file (`run.py site --policy FILE`); in a
local run the scenario's `sites.policy` stands in for it, and a scenario that asks for what the
policy refuses fails validation before it starts (scenarios.scenario). The check at the site
is the one that counts: it runs whatever the coordinator sends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from protocol.accounting import DEFAULT_DELTA, DEFAULT_EPSILON, Spend
from protocol.noise import NOISE_SOURCES

#: the scenario's `sites.policy` and the `policy:` part of a site operator's file
POLICY_FIELDS = {
    "methods": {"type": "list", "of": {"type": "str"}, "min_len": 1, "default": ["all"]},
    "min_k": {"type": "int", "min": 2, "default": 5},
    "max_epsilon": {"type": "float_or", "choices": ["unlimited"], "gt": 0, "default": DEFAULT_EPSILON},
    "non_private": {"type": "str", "choices": ["refuse", "allow"], "default": "refuse"},
    "min_contributors": {"type": "int", "min": 1, "default": 3},
    "noise": {"type": "str", "choices": list(NOISE_SOURCES), "default": "os"},
    "unseen_claims": {"type": "str", "choices": ["trust", "refuse"], "default": "trust"},
    "trials": {"type": "int", "min": 1, "max": 1_000_000, "default": 100},
    "secagg": {"type": "str", "choices": ["active", "semi-honest"], "default": "active"},
    "trust_sampling": {"type": "bool", "default": False},
    "curator": {"type": "str", "choices": ["refuse", "allow"], "default": "refuse"},
}


@dataclass(frozen=True)
class SitePolicy:
    methods: tuple[str, ...] = ("all",)
    min_k: int = 5
    max_epsilon: float = DEFAULT_EPSILON  # the default total budget: one release may not spend more; inf: written "unlimited"
    non_private: str = "refuse"
    min_contributors: int = 3
    noise: str = "os"
    unseen_claims: str = "trust"
    trials: int = 100
    secagg: str = "active"
    trust_sampling: bool = False
    curator: str = "refuse"

    @staticmethod
    def from_spec(spec: dict | None) -> "SitePolicy":
        """From a validated `sites.policy` (None: the defaults)."""
        spec = dict(spec or {})
        if "methods" in spec:
            spec["methods"] = tuple(spec["methods"])
        if spec.get("max_epsilon") == "unlimited":
            spec["max_epsilon"] = math.inf
        return SitePolicy(**spec)

    @property
    def seeded(self) -> bool:
        return self.noise == "seeded"

    def trial_refusal(self, trial: int) -> str | None:
        """Why this site will not open `trial` (None: it may)."""
        if not 0 <= trial < self.trials:
            return f"site policy: this site opens trials 0-{self.trials - 1} only, not {trial}"
        return None

    def booked(self, spend: Spend | None) -> Spend | None:
        """The spend this site books for `spend`: a zCDP spend stating its sampling is marked
        `trusted` (booked at its training's amplified cost) only under `trust_sampling: true`;
        otherwise it is booked unamplified, whatever the method or the coordinator said."""
        if spend is None or spend.kind != "zcdp":
            return spend
        return replace(spend, trusted=bool(self.trust_sampling and spend.sampling != "none"))

    def refusal(self, method: str, spend: Spend | None, delta: float = DEFAULT_DELTA) -> str | None:
        """Why this site will not answer a request of `method` that releases `spend` (None: it
        may); `delta`: the budget's, at which a zCDP release's one-round epsilon is checked
        against max_epsilon (the default budget's, DEFAULT_DELTA, when the caller does not say).
        Every reason starts with "site policy:"."""
        if "all" not in self.methods and method not in self.methods:
            return f"site policy: this site answers only {', '.join(self.methods)}, not {method}"
        if spend is None:
            return None
        if spend.kind == "none" and self.non_private != "allow":
            return (f"site policy: {method} releases data with no formal privacy ({spend.model}); this site "
                    f"refuses such releases (non_private: refuse)")
        if spend.kind == "dp" and spend.epsilon > self.max_epsilon * (1 + 1e-12):
            return (f"site policy: epsilon {spend.epsilon:.4g} for one release is above this site's largest, "
                    f"{self.max_epsilon:g}")
        if spend.kind == "zcdp":
            one = spend.release_epsilon(delta)
            if one > self.max_epsilon * (1 + 1e-12):
                return (f"site policy: one round at rho {spend.rho:.4g} (zCDP) is epsilon {one:.4g} at delta "
                        f"{delta:g}, above this site's largest for one release, {self.max_epsilon:g}")
        if spend.curator and self.curator != "allow":
            return (f"site policy: {method} sends its data in the clear to a curator trusted to add the noise "
                    f"({spend.model}); this site refuses such releases (curator: refuse)")
        if spend.kind == "kanon" and spend.k < self.min_k:
            return f"site policy: K = {spend.k} is below the smallest K this site accepts, {self.min_k}"
        if 1 < spend.contributors < self.min_contributors:  # 1: the release stands on its own
            return (f"site policy: the release is planned for {spend.contributors} input(s); this site takes "
                    f"part only behind at least {self.min_contributors}")
        return None

    def to_summary(self) -> dict:
        return {"methods": list(self.methods), "min_k": self.min_k,
                "max_epsilon": None if math.isinf(self.max_epsilon) else self.max_epsilon,
                "non_private": self.non_private, "min_contributors": self.min_contributors, "noise": self.noise,
                "unseen_claims": self.unseen_claims, "trials": self.trials, "secagg": self.secagg,
                "trust_sampling": self.trust_sampling, "curator": self.curator}
