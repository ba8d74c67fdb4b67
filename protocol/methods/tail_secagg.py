"""DP-Δ-FL and DP-FedAvg with distributed discrete Gaussian noise under SecAgg+ (Quorum's threat
model: no party sees a site's update or loss): paper 001 algorithm 4 with its quantile by
algorithm 1 / 2 and its update sum by the distributed discrete Gaussian of Kairouz, Liu and
Steinke 2021. A shared part of the Δ-FL family (protocol.methods.delta_fl): it defines no method.

Each round is one or two secure sums (protocol.methods.secure_sum) over the m sampled sites:
`loss-*` (DP-Δ-FL: each site's one-hot loss bin, as algorithm 1 / 2, c = 1 scale, N_Z(0,
sigma_q^2) per entry), whose noisy total gives the tail's first bin and the tail's size, then
`update-*` (each site in the tail sends its clipped update scaled by `scale` and rounded at
random to integers, the others zeros, every site adding N_Z(0, sigma_w^2) per coordinate);
DP-FedAvg's one sum a round is `average-*`. The server step is (sum / scale) / m^(t).

Privacy of a round, each site's own check: lemma 9 (stats.ddg.ddg_concentrated_epsilon) over the
planned number of noisy inputs, with the rounded update's sensitivities
S2 = scale C + sqrt(d), S1 = sqrt(d) scale C + d (random rounding moves each coordinate by less
than 1). The noise is planned for `inputs` = m - dropouts sites; a sum with fewer masked inputs
is not unmasked (its round is skipped, and the round's record says by how much the noise fell
short), so every released sum holds at least the planned noise.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np
from scipy.optimize import brentq

from learning.tail_fl import clip_updates, histogram_length, loss_bins, tail_start_bin
from protocol.accounting import Spend, request_key
from protocol.codecs.tensors import pack_tensors
from protocol.methods.base import Outcome, RequestError, Send, checked
from protocol.methods.secure_sum import (SecureSumCoordinator, SecureSumSite, advertise_shape, graph_shape,
                                        secure_sum_steps, sum_parts, sum_phase)
from protocol.methods.tail_rounds import MECHANISM_FIELDS, TailCoordinator, TailSite, site_step
from protocol.noise import max_sigma2, site_discrete_gaussian
from protocol.phases import Phase, PhaseStep, PhaseTable
from protocol.secagg.protocol import QUESTION, Aggregate, SecAggParams, phase_of, role_of, row_of
from stats.ddg import (centred, ddg_concentrated_epsilon, estimated_cdf, hierarchical_cumulative,
                       histogram_concentrated_epsilon, to_ring)

SUMS = ("loss", "update", "average")  # loss then update (DP-Δ-FL), or average (DP-FedAvg)
ROUND_OPENERS = ("round", *(sum_phase(prefix, phase_of(QUESTION)) for prefix in ("loss", "average")))
DISTRIBUTED_MODEL = "distributed discrete Gaussian under SecAgg+"
#: the distributed mechanism's public parameters (the site computes its cost from these alone)
DISTRIBUTED = {"type": "map", "fields": {
    **MECHANISM_FIELDS,
    "noise": {"type": "str", "choices": ["distributed"]},
    "scale": {"type": "float", "gt": 0, "le": 2.0 ** 50, "finite": True},
    "sigma2_update": {"type": "float", "ge": 0.25, "le": max_sigma2(), "finite": True},
    "histogram_scale": {"type": "int", "min": 1, "max": 1 << 20},
    "sigma2_histogram": {"type": "float", "ge": 0.25, "le": max_sigma2(), "finite": True},
    "inputs": {"type": "int", "min": 1, "max": 100_000},
    "dimension": {"type": "int", "min": 1, "max": 1 << 24},
    "modulus_bits": {"type": "int", "min": 8, "max": 62},
}}


def tail_phase_table(rounds: int) -> PhaseTable:
    """The family's phases: setup; each round either one `round` (trusted curator) or its secure
    sums' phases; evaluate. Any phase may be followed by the next round's opening or by evaluate
    (a sum that could not be unmasked skips its round)."""
    after_any = ROUND_OPENERS + ("evaluate",)
    steps = [PhaseStep("setup", ROUND_OPENERS), PhaseStep("round", ("round", "evaluate"), numbered=True, opens=True)]
    for prefix in SUMS:  # the loss sum is followed by the round's update sum; every sum opens a round but that one
        then_last = (sum_phase("update", phase_of(QUESTION)),) if prefix == "loss" else ()
        steps += secure_sum_steps(prefix, then_last, after_any, numbered=True, opens=prefix != "update")
    steps.append(PhaseStep("evaluate"))
    return PhaseTable(*steps, rounds=rounds)


def update_sensitivities(scale: float, clip: float, dimension: int) -> tuple[float, float]:
    """(S2, S1) of one site's rounded, scaled, clipped update: ||round(scale x)||_2 <= scale C + sqrt(d)
    and ||.||_1 <= sqrt(d) scale C + d, since random rounding moves each coordinate by less than 1
    (Kairouz, Liu and Steinke 2021 bound it more tightly with conditional rounding; this bound
    needs no condition)."""
    return scale * clip + math.sqrt(dimension), math.sqrt(dimension) * scale * clip + dimension


def distributed_round_rhos(mechanism: Mapping[str, Any], records: bool = False) -> tuple[float, float]:
    """(rho of the loss sum, rho of the update sum) of one round over `inputs` noisy inputs:
    lemma 9 / theorems 1-2 (paper 001), rho = eps^2 / 2; the loss sum costs nothing when tail = 0.
    A client added or removed (the paper's guarantee); `records`: one of a site's records changed,
    what its account books (tail_rounds.round_rho): the rounded update moves by up to twice its
    norm bound (S2 and S1 doubled), the loss histogram from one bin to another (flat: S2 sqrt(2) c,
    S1 2c; hierarchical: one node changed on each side of every level)."""
    inputs, d = mechanism["inputs"], mechanism["dimension"]
    s2, s1 = update_sensitivities(mechanism["scale"], mechanism["clip"], d)
    k = 2.0 if records else 1.0
    rho_update = ddg_concentrated_epsilon(k * s2, inputs, mechanism["sigma2_update"], d, l1_sensitivity=k * s1) ** 2 / 2
    rho_loss = 0.0
    if mechanism["tail"] > 0:
        from stats.ddg import histogram_sensitivities

        c, bins = mechanism["histogram_scale"], mechanism["bins"]
        h2, h1, dh = histogram_sensitivities(c, bins, mechanism["hierarchical"])
        if records:
            h2, h1 = math.sqrt(2.0) * h2, 2.0 * h1
        rho_loss = ddg_concentrated_epsilon(h2, inputs, mechanism["sigma2_histogram"], dh, l1_sensitivity=h1) ** 2 / 2
    return rho_loss, rho_update


def sigma2_for_rho(rho: float, rho_of_sigma2) -> float:
    """The per-site sigma^2 at which a DDG sum costs `rho` (rho_of_sigma2 falls as sigma^2 grows),
    by Brent's method on log sigma^2 from lemma 9's smallest sigma^2 = 1/4."""
    lo, hi = math.log(0.25), math.log(0.25)
    if rho_of_sigma2(0.25) <= rho:
        return 0.25
    while rho_of_sigma2(math.exp(hi)) > rho:
        hi += math.log(10.0)
        if hi > math.log(max_sigma2()):
            raise ValueError(f"no sigma^2 within the sampler's range gives rho {rho:g}")
    return math.exp(brentq(lambda x: rho_of_sigma2(math.exp(x)) - rho, lo, hi, xtol=1e-12)) * (1 + 1e-9)


def plan_distributed(rho_update: float, rho_quantile: float, *, clip: float, tail: float, loss_bound: float,
                     bins: int, hierarchical: bool, dimension: int, sample: int, population: int, rounds: int,
                     dropouts: int, granularity: float, sampling: str = "without_replacement") -> dict:
    """The distributed mechanism meeting the per-round budget the calibration split (protocol.rounds_privacy
    .sigma_for_epsilon's rho_update and rho_quantile) over `inputs` = sample - dropouts noisy inputs:
    the update scaled so that C maps to `granularity` units, sigma_w^2 solved from lemma 9; the loss
    histogram at c = 1 (or the smallest c that keeps sigma_q^2 >= 1), sigma_q^2 likewise; the ring wide
    enough for the sum of every site's largest entry and 12 standard deviations of the noise."""
    inputs = max(1, sample - dropouts)
    scale = granularity / clip
    s2, s1 = update_sensitivities(scale, clip, dimension)
    sigma2_update = sigma2_for_rho(rho_update, lambda v: ddg_concentrated_epsilon(s2, inputs, v, dimension, s1) ** 2 / 2)
    c, sigma2_hist = 1, 0.25
    if tail > 0:
        def rho_hist(c_, v):
            return histogram_concentrated_epsilon(c_, inputs, v, bins, hierarchical) ** 2 / 2
        sigma2_hist = sigma2_for_rho(rho_quantile, lambda v: rho_hist(1, v))
        while sigma2_hist < 1.0 and c < (1 << 20):
            c *= 2
            sigma2_hist = sigma2_for_rho(rho_quantile, lambda v: rho_hist(c, v))
    largest = max(sample * (scale * clip + 1), sample * c) + 12 * math.sqrt(sample * max(sigma2_update, sigma2_hist))
    bits = min(62, max(16, math.ceil(math.log2(2 * largest + 1)) + 1))
    return {"noise": "distributed", "clip": float(clip), "tail": float(tail), "loss_bound": float(loss_bound),
            "bins": int(bins), "hierarchical": bool(hierarchical), "scale": float(scale),
            "sigma2_update": float(sigma2_update), "histogram_scale": int(c), "sigma2_histogram": float(sigma2_hist),
            "inputs": int(inputs), "dimension": int(dimension), "modulus_bits": int(bits), "sampling": sampling,
            "sample": int(sample),
            "population": int(population), "rounds": int(rounds)}


def checked_sum(phase_name: str, body: Any, sums: tuple[str, ...]) -> tuple[str, dict, dict]:
    """(the sum's prefix, its mechanism, its secure-aggregation parameters) from an advertise request,
    checked as a site can: the method has such sums (`sums`: none for Δ-FL without privacy; loss then
    update for DP-Δ-FL; average for DP-FedAvg), the mechanism's tail agrees with the sum, the vector
    the sum asks for is the mechanism's (the histogram's length, or the update's `dimension`: the
    sensitivity the site books rests on it), and the sample it claims is the session's (without
    replacement, the m sites the session asked; Poisson, within 6 standard deviations of the claimed
    mean). RequestError names what does not hold."""
    prefix = sum_parts(phase_name)[0]
    if prefix not in sums:
        raise RequestError(f"this method has no {prefix} sums ({', '.join(sums) or 'no secure sums at all'})")
    if not isinstance(body, Mapping) or not isinstance(body.get("method"), Mapping) \
            or not isinstance(body.get("params"), Mapping):
        raise RequestError("advertise needs {params, nonce, method}")
    mechanism = checked(DISTRIBUTED, body["method"].get("mechanism"), "advertise request.method.mechanism")
    if (prefix == "average") != (mechanism["tail"] == 0):
        raise RequestError(f"a {prefix} sum with tail {mechanism['tail']}: the loss and update sums are DP-Δ-FL's "
                           f"(tail > 0), the average sum DP-FedAvg's (tail 0)")
    params = body["params"]
    length, sites = params.get("length"), params.get("sites")
    want = histogram_length(mechanism["bins"], mechanism["hierarchical"]) if prefix == "loss" \
        else mechanism["dimension"]
    if length != want:
        raise RequestError(f"the {prefix} sum asks for vectors of {length!r} entries where its mechanism's are {want}")
    if not isinstance(sites, int) or isinstance(sites, bool) or not 2 <= sites <= mechanism["population"]:
        raise RequestError(f"the session asks {sites!r} sites, not between 2 and the population "
                           f"{mechanism['population']} its mechanism states")
    sample = mechanism["sample"]
    if mechanism["sampling"] == "without_replacement" and sites != sample:
        raise RequestError(f"the mechanism claims a sample of {sample} without replacement, the session asks {sites}")
    if mechanism["sampling"] == "poisson" and abs(sites - sample) > 6 * math.sqrt(sample) + 3:
        raise RequestError(f"the mechanism claims Poisson samples of {sample} on average, the session asks {sites}")
    return prefix, mechanism, dict(params)


def distributed_spend(phase_name: str, body: Any, method: str, sums: tuple[str, ...]) -> Spend | None:
    """What a site books for a round of secure sums, computed from the advertise request it
    received: the whole round's rho at its first sum (DP-Δ-FL's loss sum books the loss and the
    update sums together, one amplified event per round of the training when the site trusts the
    sampling, and the per-release cap checks the round), nothing at the update sum (the site holds
    it to the round's booked mechanism, DistributedSite), DP-FedAvg's average sum its own."""
    prefix, mechanism, _ = checked_sum(phase_name, body, sums)
    if prefix == "update":
        return None
    try:
        rho = sum(distributed_round_rhos(mechanism, records=True))
    except (OverflowError, ValueError) as exc:
        raise RequestError(f"the mechanism's cost cannot be computed: {exc}") from None
    if not 0 < rho < math.inf:
        raise RequestError(f"the mechanism's cost per round is rho {rho!r}: refusing")
    return Spend("zcdp", rho=rho,
                 model=f"{DISTRIBUTED_MODEL} over {mechanism['inputs']} inputs", contributors=mechanism["inputs"],
                 sampling=mechanism["sampling"], sample=mechanism["sample"], population=mechanism["population"],
                 rounds=mechanism["rounds"], key=request_key(method, "training", mechanism))


def distributed_claim(mechanism: Mapping[str, Any]) -> Spend:
    """The noisy inputs a sum's noise is planned for, which the site's secure-sum half holds the
    coordinator to (protocol.methods.secure_sum.SecureSumSite)."""
    return Spend("zcdp", rho=max(sum(distributed_round_rhos(mechanism)), 1e-300), contributors=mechanism["inputs"])


def randomly_rounded(values: np.ndarray, noise) -> np.ndarray:
    """Each value rounded down or up at random, up with probability its fractional part (unbiased;
    Kairouz, Liu and Steinke 2021 section 4), the coins from the site's noise source."""
    floor = np.floor(values)
    return (floor + (noise.random(values.size).reshape(values.shape) < values - floor)).astype(np.int64)


class DistributedCoordinator(TailCoordinator):
    """The rounds as secure sums: the loss sum's noisy total gives the tail, the update sum's the
    step; a sum that cannot be unmasked skips its round (named in the round's record); a lie a site
    catches ends the training."""

    def _round(self, t: int):
        chosen = self._sample(t)
        first = "loss" if self.mechanism["tail"] > 0 else "average"
        self.round_state = {"t": t, "chosen": chosen}
        return self._open(first, t, chosen, {})

    def _open(self, prefix: str, t: int, chosen: list[str], extra: dict):
        mech = self.mechanism
        length = (histogram_length(mech["bins"], mech["hierarchical"]) if prefix == "loss"
                  else self.weights.size)
        m = len(chosen)
        if m < 2:
            return self._skip(t, f"{m} site(s) sampled: a secure sum needs 2")
        if m < mech["inputs"]:  # the sites would refuse a claim of more inputs than asked; nothing is asked
            return self._skip(t, f"noise shortfall: {m} sites left to sample where the noise was planned for "
                                 f"{mech['inputs']} inputs: the sum would hold {m}/{mech['inputs']} of the planned "
                                 f"noise variance")
        degree, threshold = graph_shape(self.method.secagg, m)
        params = SecAggParams(mech["modulus_bits"], length, degree, threshold, m, self.method.secagg["mode"])
        p = self.method.params
        mech = self.round_mechanism(m)
        public = {"mechanism": mech, "weights": pack_tensors({"W": self.weights}), "lr": p["lr"],
                  "steps": p["local_steps"], "weight_decay": p["weight_decay"], **extra}
        phase = Phase(sum_phase(prefix, phase_of(QUESTION)), t)
        self.sum_prefix = prefix
        self.sum = SecureSumCoordinator(params, chosen, self.rng, public,
                                        lambda aggregate: self._summed(prefix, t, aggregate),
                                        lambda inputs: self._short(inputs),
                                        digest=lambda body: self.method.request_digest(phase, body))
        return self._wrap(self.sum.start(), t)

    def _wrap(self, step, t: int):
        if isinstance(step, Send) and not isinstance(step.phase, Phase) and row_of(step.phase) is not None:
            return Send(Phase(sum_phase(self.sum_prefix, step.phase), t), step.requests, step.minimum)
        return step

    def _short(self, inputs: int) -> str | None:
        planned = self.mechanism["inputs"]
        if inputs >= planned:
            return None
        return (f"noise shortfall: {inputs} masked inputs where the noise was planned for {planned}: the sum would "
                f"hold {inputs}/{planned} of the planned noise variance")

    def advance(self, phase, answers, dropped):
        prefix, inner = sum_parts(phase.name)
        if prefix not in SUMS:
            return super().advance(phase, answers, dropped)
        if role_of(inner) == QUESTION:  # fewer keys than the noise was planned for: ask nothing more
            kind = row_of(inner).answer
            keys = sum(1 for value in answers.values() if isinstance(value, tuple) and value[0] == kind)
            if keys < self.mechanism["inputs"] and not any(self._lie(why) for why in dropped.values()):
                self.records[-1]["dropped"].update(dropped)
                return self._skip(phase.round, f"noise shortfall: {keys} sites advertised where the noise was planned "
                                               f"for {self.mechanism['inputs']} inputs (the others: "
                                               f"{'; '.join(sorted(set(dropped.values())))[:300]})")
        return self._wrap(self.sum.advance(inner, answers, dropped), phase.round)

    @staticmethod
    def _lie(reason: str) -> bool:
        from protocol.secagg.protocol import LIES

        return any(lie in reason for lie in LIES)

    def _summed(self, prefix: str, t: int, aggregate: Aggregate):
        record = self.records[-1]
        record["dropped"].update({s: why for s, why in aggregate.dropped.items()}
                                 if isinstance(aggregate.dropped, dict) else {})
        if not aggregate.ok:
            if "caught lying" in (aggregate.reason or ""):
                return Outcome.aborted(f"round {t + 1}, {prefix} sum: {aggregate.reason}")
            return self._skip(t, f"{prefix} sum: {aggregate.reason}")
        record["released"] = True  # a sum was unmasked: the round counts in the central guarantee
        mech = self.mechanism
        total = centred(aggregate.total, mech["modulus_bits"]).astype(np.float64)
        if prefix == "loss":
            counts = total / mech["histogram_scale"]
            if mech["hierarchical"]:
                cumulative = hierarchical_cumulative(counts, mech["bins"])
                cdf = cumulative / cumulative[-1] if cumulative[-1] > 0 else np.full(mech["bins"], np.nan)
                start = tail_start_bin(cdf, mech["tail"])
                tail_count = cumulative[-1] - (cumulative[start - 1] if start > 0 else 0.0)
            else:
                start = tail_start_bin(estimated_cdf(counts, "estimated"), mech["tail"])
                tail_count = counts[start:].sum()
            # m^(t), estimated from the noisy histogram (no extra release), kept within [1, the inputs summed]
            tail_count = min(max(1.0, float(tail_count)), float(len(aggregate.included)))
            record.update({"tail_bin": start, "tail": tail_count})
            self.round_state.update(tail_bin=start, tail_count=tail_count)
            return self._open("update", t, self.round_state["chosen"], {"tail_bin": start})
        count = self.round_state.get("tail_count", float(len(aggregate.included)))
        if prefix == "average":
            record["tail"] = len(aggregate.included)
        self.weights = self.weights + (total / mech["scale"]).reshape(self.weights.shape) / count
        record["answered"] = len(aggregate.included)
        return self._next(t)

    def _skip(self, t: int, why: str):
        self.records[-1]["skipped"] = why
        return self._next(t)


class DistributedSite:
    """A TailSite's secure sums: at each sum's advertise the site computes (once a round, from the
    weights in the request) its loss bin and clipped update, checks the mechanism and makes its
    secure-sum half, whose input vector is its noisy histogram or its noisy, rounded update."""

    def __init__(self, site: TailSite, noise) -> None:
        self.site, self.noise = site, noise
        self.half: SecureSumSite | None = None
        self.round = -1
        self.computed: tuple[int, np.ndarray] | None = None  # (loss bin, raw update) of this round
        self.fixed, self.stage, self.prefix = b"", "", ""

    def answer(self, phase: Phase, body, digest, method: str, sums: tuple[str, ...]):
        prefix, inner = sum_parts(phase.name)
        if role_of(inner) != QUESTION:
            if self.half is None or phase.round != self.round or prefix != self.prefix:
                raise RequestError(f"{phase} before its advertise")
            return self.half.answer(inner, body)
        self.half = None  # a refused advertise leaves no half behind
        prefix, mechanism, _ = checked_sum(phase.name, body, sums)
        if phase.round >= mechanism["rounds"]:
            raise RequestError(f"{phase} beyond the {mechanism['rounds']} rounds its training states")
        peers = self.site.identity.peers() if self.site.identity is not None else {}
        if peers and mechanism["population"] > len(peers):
            raise RequestError(f"the mechanism claims a population of {mechanism['population']} sites, the party "
                               f"registry lists {len(peers)}")
        public = body["method"]
        # what the round's first sum fixed, the update sum must keep: the mechanism booked, the weights
        # and the local settings the update was computed from (only the tail's first bin is new)
        fixed = request_key("round", mechanism, public.get("weights"), public.get("lr"), public.get("steps"),
                            public.get("weight_decay"))
        if prefix == "update":
            if phase.round != self.round or self.computed is None or self.stage != "loss":
                raise RequestError(f"{phase} without this round's loss sum, or a second update sum in one round")
            if fixed != self.fixed:
                raise RequestError(f"{phase} changes the round's mechanism, weights or local settings from its loss "
                                   f"sum: refusing (the round was booked for the loss sum's)")
            computed = self.computed
        else:
            if phase.round <= self.round:
                raise RequestError(f"{phase} after round-{self.round}: rounds only go forward")
            computed = self._compute(public, mechanism)
        vector = self._histogram if prefix == "loss" else self._update
        half = SecureSumSite(self.site.site_id, lambda pub, params: vector(mechanism, pub, params, computed),
                             lambda pub: distributed_claim(mechanism), digest, self.site.identity)
        answer = half.answer(inner, body)
        # only an advertise answered (and so booked by the site) opens the round: a refused loss sum
        # leaves nothing for an update sum to follow
        self.half, self.round, self.fixed, self.computed = half, phase.round, fixed, computed
        self.stage = self.prefix = prefix
        return answer

    def _compute(self, public, mechanism) -> tuple[int, np.ndarray]:
        W = self.site._weights(public)
        if W.size != mechanism["dimension"]:
            raise RequestError(f"the weights have {W.size} entries, the mechanism's dimension is {mechanism['dimension']}")
        lr, steps, decay = self.site._local_config(public)
        losses, updates = site_step(W, self.site.X1, self.site.y, lr, steps, decay, None)  # unclipped: clipped at the update sum
        return int(loss_bins(losses, mechanism["loss_bound"], mechanism["bins"])[0]), updates[0]

    def _histogram(self, mechanism, public, params: SecAggParams, computed) -> np.ndarray:
        """Algorithm 1 / 2 lines 1-2: the one-hot (or dyadic) histogram of the loss bin, scaled by c,
        plus N_Z(0, sigma_q^2) per entry, mod M."""
        from stats.ddg import hierarchical_from_flat

        flat = np.zeros(mechanism["bins"], dtype=np.int64)
        flat[computed[0]] = 1
        counts = hierarchical_from_flat(flat) if mechanism["hierarchical"] else flat
        noise = site_discrete_gaussian(self.noise, mechanism["sigma2_histogram"], counts.size)
        return to_ring(mechanism["histogram_scale"] * counts + noise, params.modulus_bits)

    def _update(self, mechanism, public, params: SecAggParams, computed) -> np.ndarray:
        """Algorithm 4 line 10 under distributed noise: the clipped update, if this site's loss bin is
        in the tail (every site under DP-FedAvg), scaled and randomly rounded; plus N_Z(0, sigma_w^2)
        per coordinate, mod M."""
        start = public.get("tail_bin", 0)
        if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start < mechanism["bins"]:
            raise RequestError(f"tail_bin must be a bin index, got {start!r}")
        update = clip_updates(computed[1][None], mechanism["clip"])[0].ravel()  # the booked mechanism's C
        mine = randomly_rounded(mechanism["scale"] * update, self.noise) if computed[0] >= start \
            else np.zeros(update.size, dtype=np.int64)
        if mine.size != params.length:
            raise RequestError(f"my update has {mine.size} entries, the sum expects {params.length}")
        return to_ring(mine + site_discrete_gaussian(self.noise, mechanism["sigma2_update"], mine.size),
                       params.modulus_bits)


def distributed_release_shape(phase, body):
    """A sum's advertise request is one question for every site (its whole body); its later phases
    ask nothing the advertise did not fix."""
    return advertise_shape(body) if asks_question(phase) else None


def asks_question(phase) -> bool:
    """Whether a phase of the family's table (a Phase or its name) is a sum's question: its
    advertise (loss-advertise, update-advertise, average-advertise)."""
    return role_of(sum_parts(str(getattr(phase, "name", phase)))[1]) == QUESTION
