"""Private prediction sets (paper 003, Angelopoulos, Bates, Zrnic, Jordan; algorithms 2-4).

The threshold is the exponential-mechanism quantile (algorithm 2) at level min(q-tilde, 1) of
eq. (3), with the number of bins m* and gamma* chosen as in appendix C (algorithm 5, eq. 9-10)
unless the scenario fixes the bin count. Theorem 2: coverage >= 1 - alpha; proposition 1:
epsilon-DP with respect to the calibration scores the mechanism sees.

  private_cp        central: every site sends its scores to the coordinator, a curator trusted
                    with them, which runs algorithm 3 on the pool (central epsilon-DP release).
  private_cp_local  local: every site calibrates its own prediction set on its own scores; the
                    coordinator only plans each site's level and collects the private bins.
                    Each site's set is evaluated separately (no collaboration: the baseline
                    FedCP²-QQ improves on).
"""

from __future__ import annotations

import numpy as np

from protocol.accounting import Spend
from protocol.noise import release_noise
from protocol.codecs import CODECS
from protocol.codecs.exp_mech_bins import ExpMechBins
from protocol.methods.base import AllScores, OneShotMethod, Outcome, Planned, per_site_removed
from results.conformal import Threshold
from protocol.methods.bins import maybe_bins, resolve_bins
from protocol.methods.private_bin import PrivateQuantileBin, bin_spend
from stats.dp import Bins, private_calibration, private_quantile_bin

PRIVATE_BINS_SPEC = {"type": "map", "fields": {
    "count": {"type": "int", "min": 0, "default": 0},  # 0: choose m* by paper 003 algorithm 5
    "lo": {"type": "float_or", "choices": ["training"], "default": 0.0},
    "hi": {"type": "float_or", "choices": ["training"]},
}}


class _PrivateCPBase(OneShotMethod):
    PARAMS = {"epsilon": {"type": "float", "gt": 0}, "bins": PRIVATE_BINS_SPEC}

    def __init__(self, alpha, epsilon: float, bins: dict):
        super().__init__(alpha, epsilon=epsilon, bins=bins)
        self.epsilon, self.bins_spec = float(epsilon), bins
        resolved = maybe_bins({**bins, "count": max(bins["count"], 1)})
        self.bounds = (resolved.lo, resolved.hi) if isinstance(resolved, Bins) else None

    def for_trial(self, public):
        if self.bounds is not None:
            return self
        spec = {**self.bins_spec, "count": max(self.bins_spec["count"], 1)}
        bins = resolve_bins(spec, public)
        return type(self)(self.alpha, self.epsilon, {**self.bins_spec, "lo": bins.lo, "hi": bins.hi})

    privacy_model: str

    @property
    def privacy(self):
        return {"epsilon": self.epsilon, "model": self.privacy_model}

    @property
    def score_range(self):
        return self.bounds

    def _grid(self, n: int) -> tuple[Bins, float, float]:
        if self.bounds is None:
            raise ValueError(f"{self.name}: bins refer to the training split; resolve with for_trial()")
        count, gamma, level = private_calibration(n, self.alpha, self.epsilon, self.bins_spec["count"])
        return Bins(self.bounds[0], self.bounds[1], count), gamma, level

    def _theorem3(self, sites, n: int, bins: Bins, gamma: float) -> dict:
        """The public inputs of paper 003's theorem 3 for one calibrated set (results.conformal
        evaluates the bound with p_max^m of the scores, which the simulation knows)."""
        return {"sites": list(sites), "n": int(n), "alpha": self.alpha, "epsilon": self.epsilon,
                "bins": bins.as_body(), "gamma": float(gamma)}


class PrivateCP(_PrivateCPBase):
    name = "private_cp"
    codec = "raw_scores"
    privacy_model = "central"

    def plan(self, sizes):
        return Planned({site: {} for site in sizes})

    def combine(self, sizes, planned, answers, dropped, rng):
        pooled = np.concatenate([np.asarray(v, dtype=float) for v in answers.values()])
        bins, gamma, level = self._grid(pooled.size)
        # the curator's central mechanism: noise from the OS CSPRNG, never from the scenario's seed
        index = private_quantile_bin(pooled, bins, level, self.epsilon, release_noise(rng))
        return Threshold.ok(bins.right_edge(index), guarantee=1.0 - self.alpha, level=level, gamma=gamma,
                          bins=bins.count, pooled=int(pooled.size), top_bin=index == bins.count - 1,
                          m=len(sizes), answered=len(answers), dropped=sorted(dropped),
                          theorem3=[self._theorem3(sorted(answers), pooled.size, bins, gamma)])

    @classmethod
    def site(cls, rows, rng, site_id):
        return AllScores(rows)

    @classmethod
    def spend(cls, phase, body):
        return Spend("none", model="every score to a curator trusted with them (central DP on its release)")


class PrivateCPLocal(_PrivateCPBase):
    name = "private_cp_local"
    codec = "exp_mech_bins"
    privacy_model = "local"

    def make_codec(self):
        self._codec = _PerSiteBins()
        return self._codec

    def plan(self, sizes):
        requests, grids = {}, {}
        for site, n in sorted(sizes.items()):
            bins, gamma, level = self._grid(n)
            grids[site] = bins
            requests[site] = {"level": level, "epsilon": self.epsilon, "bins": bins.as_body()}
        if getattr(self, "_codec", None) is not None:
            self._codec.largest = max(bins.count for bins in grids.values())
        return Planned(requests, state=grids)

    def combine(self, sizes, planned, answers, dropped, rng):
        grids = planned.state
        for site, index in answers.items():
            if not 0 <= index < grids[site].count:
                return Outcome.aborted(f"{site} answered bin {index} outside its {grids[site].count} bins")
        thresholds = {site: grids[site].right_edge(index) for site, index in sorted(answers.items())}
        values = np.array(list(thresholds.values()))
        return Threshold("ok", "", {
            "guarantee": 1.0 - self.alpha, "m": len(sizes), "answered": len(answers),
            "dropped": sorted(dropped), "top_bin": any(answers[s] == grids[s].count - 1 for s in answers),
            "theorem3": [self._theorem3([site], sizes[site], grids[site], self._grid(sizes[site])[1])
                         for site in sorted(answers)],
        }, float(np.median(values)), per_site=thresholds)

    @classmethod
    def site(cls, rows, rng, site_id):
        return PrivateQuantileBin(rows, rng)

    @classmethod
    def spend(cls, phase, body):
        return bin_spend(body)

    @classmethod
    def release_shape(cls, phase, body):
        """The epsilon: each site's grid and level follow from its own n_j (paper 003)."""
        return per_site_removed(body, ("level", "bins"))

    def planned_spend(self, sites):
        return Spend("dp", self.epsilon, 0.0, "local")


class _PerSiteBins(ExpMechBins):
    """Decoder for bin indices whose range differs per site: the range is checked in combine()."""

    largest = 1  # the largest B_j of the session, set when planning

    def decode(self, body):
        return CODECS["exp_mech_bins"](count=2**63 - 1).decode(body)

    def information_bits(self, value):
        return CODECS["exp_mech_bins"](count=self.largest).information_bits(value)
