"""The halves of the Δ-FL family (protocol.methods.delta_fl): the coordinator's rounds (sampling,
the server step, the evaluation, the privacy report) and the client's, over the learning phase
table; the math is learning.tail_fl's. A shared part: it defines no method."""

from __future__ import annotations

import math

import numpy as np

from learning.tail_fl import (client_losses, clip_updates, error_summary, histogram_length, initial_weights,
                              local_updates, loss_bins, misclassification, plain_round_step, private_round_step,
                              with_intercept)
from protocol.codecs.base import PayloadError
from protocol.codecs.tensors import pack_tensors, unpack_tensors
from protocol.methods.base import CoordinatorHalf, Outcome, RequestError, Send, SiteHalf, checked
from protocol.methods.learning_rounds import spread
from protocol.noise import gaussian, release_noise
from protocol.phases import Phase
from results.robust_training import RobustTraining

#: what every private round's mechanism states, whoever adds the noise
MECHANISM_FIELDS = {
    "clip": {"type": "float", "gt": 0, "finite": True},
    "tail": {"type": "float", "ge": 0, "lt": 1},
    "loss_bound": {"type": "float", "gt": 0, "finite": True},
    "bins": {"type": "int", "min": 2, "max": 4096},
    "hierarchical": {"type": "bool"},
    "sampling": {"type": "str", "choices": ["without_replacement", "poisson"]},
    "sample": {"type": "int", "min": 1}, "population": {"type": "int", "min": 1},
    "rounds": {"type": "int", "min": 1},
}
#: what a private round to a trusted curator carries: the mechanism, from which the site computes its cost
MECHANISM = {"type": "map", "fields": {
    **MECHANISM_FIELDS,
    "sigma_update": {"type": "float", "gt": 0, "finite": True},
    "sigma_histogram": {"type": "float", "ge": 0, "finite": True},
}}


def sample_round(training: list[str], m: int, sampling: str, rng: np.random.Generator) -> list[str]:
    """A round's clients from the coordinator's seeded Generator: m of the training sites without
    replacement (algorithm 3 line 2), or each independently with probability m / n (`poisson`: the
    sampling the amplification bound of the paper's accounting, its reference [27], is for), in
    site order."""
    if not training or m <= 0:
        return []
    if sampling == "poisson":
        return [site for site, keep in zip(training, rng.random(len(training)) < m / len(training)) if keep]
    return sorted(rng.choice(training, size=min(m, len(training)), replace=False).tolist())
CURATOR_MODEL = "central Gaussian noise by a trusted curator (clipped update and loss bin sent in the clear)"


def histogram_sensitivity2(bins: int, hierarchical: bool) -> float:
    """The squared l2 sensitivity of the loss histogram to one client (added or removed): one
    count (flat), one count on each of log2 b levels (hierarchical; stats.ddg's exact norms)."""
    return math.log2(bins) if hierarchical else 1.0


def round_rho(mechanism: dict, records: bool = False) -> float:
    """One round's zCDP, claim 13 corrected (paper 001 appendix B.2; zCDP adds): the update sum's
    C^2 / (2 sigma^2) plus, when the round releases a loss histogram (tail > 0), its
    S^2 / (2 sigma_q^2). The printed claim has the Gaussian term inverted (sigma_w^2 / 2C^2).
    That is a client added or removed (the paper's guarantee, the run's central figure); a site's
    account is per record (protocol.accounting), and one record changed moves the site's clipped
    update anywhere in the C-ball (2C apart: 4 times the update's rho) and its loss bin from one
    bin to another (twice the histogram's): `records` gives that, what a site books."""
    from protocol.rounds_privacy import gaussian_sum_rho

    rho = gaussian_sum_rho(mechanism["clip"], mechanism["sigma_update"]) * (4.0 if records else 1.0)
    if mechanism["tail"] > 0:
        if mechanism["sigma_histogram"] <= 0:
            raise RequestError("a loss histogram with no noise (sigma_histogram 0) is not private")
        rho += histogram_sensitivity2(mechanism["bins"], mechanism["hierarchical"]) / (
            2.0 * mechanism["sigma_histogram"] ** 2) * (2.0 if records else 1.0)
    return rho


def server_step(mechanism: dict | None, tail: float, numbers: np.ndarray, updates: np.ndarray,
                rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """The coordinator's step after a round, from the answering clients' losses (no privacy) or
    loss bins (private) and their (clipped) updates, in site order: Δ-FL / FedAvg exactly
    (learning.tail_fl.plain_round_step), or DP-Δ-FL / DP-FedAvg with the curator's Gaussian noise
    drawn from release_noise(rng) (the OS CSPRNG; the coordinator's Generator itself only in the
    explicit seeded mode), the histogram's first, then the update's. The fast path of
    bench/paper001_fig3.py calls this same function."""
    if mechanism is None:
        return plain_round_step(numbers, updates, tail)
    noise = release_noise(rng)
    histogram_noise = (gaussian(noise, mechanism["sigma_histogram"],
                                histogram_length(mechanism["bins"], mechanism["hierarchical"]))
                       if mechanism["tail"] > 0 else None)
    update_noise = gaussian(noise, mechanism["sigma_update"], updates[0].size).reshape(updates.shape[1:])
    return private_round_step(numbers.astype(np.int64), updates, mechanism["tail"], mechanism["bins"],
                              mechanism["hierarchical"], histogram_noise, update_noise)


def site_step(W: np.ndarray, X1: np.ndarray, y: np.ndarray, lr: float, steps: int, weight_decay: float,
              mechanism: dict | None) -> tuple[np.ndarray, np.ndarray]:
    """What the sampled clients compute from the global weights (a leading axis of clients: one
    at a live site, many in the fast path): (their losses, or loss bins under privacy; their
    updates, clipped under privacy)."""
    losses = client_losses(W, X1, y)
    updates = local_updates(W, X1, y, lr, steps, weight_decay)
    if mechanism is None:
        return losses, updates
    return (loss_bins(losses, mechanism["loss_bound"], mechanism["bins"]),
            clip_updates(updates, mechanism["clip"]))


class TailCoordinator(CoordinatorHalf):
    def __init__(self, method: TailMethod, sites: list[str], rng: np.random.Generator) -> None:
        self.method, self.sites, self.rng = method, sites, rng
        held = method.params["held_out"]
        self.held_out = set(sites[len(sites) - held:]) if held else set()
        self.weights: np.ndarray | None = None
        self.training: list[str] = []
        self.mechanism: dict | None = None
        self.records: list[dict] = []
        self.excluded: dict[str, str] = {}
        self.participation: dict[str, int] = {}

    def start(self):
        if not self.sites:
            return Outcome.aborted("no site joined the session")
        return Send("setup", {site: {"classes": self.method.params["classes"]} for site in self.sites})

    def advance(self, phase, answers, dropped):
        if phase.name == "setup":
            return self._after_setup(answers, dropped)
        if phase.name == "round":
            return self._after_round(phase, answers, dropped)
        if phase.name == "evaluate":
            return self._finish(answers, dropped)
        return Outcome.aborted(f"no such phase in this session: {phase}")

    def _after_setup(self, answers, dropped):
        self.excluded.update({site: f"setup: {why}" for site, why in dropped.items()})
        features = {site: int(value["metrics"]["features"]) for site, value in answers.items()}
        if len(set(features.values())) != 1:
            return Outcome.aborted(f"sites disagree on the feature count, or none answered setup: "
                                   f"{dict(list(features.items())[:5])}")
        self.training = sorted(s for s in answers if s not in self.held_out)
        if not self.training:
            return Outcome.aborted("no training site completed setup")
        count = next(iter(features.values()))
        self.weights = initial_weights(count, self.method.params["classes"])
        self.mechanism = (self.method.mechanism(len(self.training), count) if self.method.private
                          else self.method.mechanism(len(self.training)))
        return self._round(0)

    def _sample(self, t: int) -> list[str]:
        """Round t's clients: m of the n training sites without replacement (algorithm 3 line 2),
        from the coordinator's seeded Generator; a fresh record for the round."""
        if self.records:  # a site that did not answer the last round is not sampled again
            gone = set(self.records[-1]["dropped"])
            self.training = [site for site in self.training if site not in gone]
        m = min(self.method.params["clients_per_round"], len(self.training))
        chosen = sample_round(self.training, m, self.method.params["sampling"], self.rng)
        for site in chosen:
            self.participation[site] = self.participation.get(site, 0) + 1
        self.records.append({"round": t + 1, "phase": Phase("round", t), "sampled": len(chosen), "expected": m,
                             "pool": len(self.training), "dropped": {}})
        return chosen

    def _round(self, t: int):
        chosen = self._sample(t)
        p = self.method.params
        body = {"weights": pack_tensors({"W": self.weights}), "lr": p["lr"], "steps": p["local_steps"],
                "weight_decay": p["weight_decay"]}
        if self.mechanism is not None:
            body["mechanism"] = self.round_mechanism(len(chosen))
        return Send(Phase("round", t), {site: body for site in chosen})

    def round_mechanism(self, sampled: int) -> dict:
        """The mechanism as this round samples: the planned one, its sample and population those of
        the round when the pool of answering sites has shrunk below the plan (a site holds a sum's
        claimed sample to the sites the session asks; the amplification it may book is this round's)."""
        mechanism = dict(self.mechanism)
        pool = len(self.training)
        if pool < mechanism["population"]:
            mechanism["population"] = pool
            mechanism["sample"] = min(mechanism["sample"], pool) if mechanism["sampling"] == "poisson" else sampled
        return mechanism

    def _next(self, t: int):
        """Round t + 1, or the evaluation of the final model by the held-out sites (all sites when none)."""
        if t + 1 < self.method.params["rounds"]:
            return self._round(t + 1)
        evaluated = sorted(self.held_out) if self.held_out else list(self.sites)
        return Send("evaluate", {site: {"weights": pack_tensors({"W": self.weights})} for site in evaluated})

    def _valid(self, value) -> tuple[np.ndarray, float] | str:
        tensors, metrics = value.get("tensors", {}), value.get("metrics", {})
        update = tensors.get("update")
        if not isinstance(update, np.ndarray) or update.shape != self.weights.shape or not np.all(np.isfinite(update)):
            return f"an update that is not a finite {self.weights.shape} tensor"
        key = "loss_bin" if self.mechanism is not None else "loss"
        number = metrics.get(key)
        if not isinstance(number, (int, float)) or isinstance(number, bool) or not math.isfinite(number):
            return f"no {key}"
        if self.mechanism is not None:
            if number != int(number) or not 0 <= number < self.mechanism["bins"]:
                return f"loss_bin {number!r} outside 0..{self.mechanism['bins'] - 1}"
            if np.linalg.norm(update) > self.mechanism["clip"] * (1 + 1e-9):
                return f"an update of norm {np.linalg.norm(update):.4g} above the clip {self.mechanism['clip']}"
        return update, float(number)

    def _after_round(self, phase, answers, dropped):
        record = self.records[-1]
        record["dropped"].update(dropped)
        kept = {}
        for site, value in sorted(answers.items()):
            checked_value = self._valid(value)
            if isinstance(checked_value, str):
                record["dropped"][site] = checked_value
            else:
                kept[site] = checked_value
        record["answered"] = len(kept)
        if kept:
            record["released"] = True
            updates = np.stack([u for u, _ in kept.values()])
            numbers = np.array([x for _, x in kept.values()])
            step, info = server_step(self.mechanism, self.method.tail, numbers, updates, self.rng)
            self.weights = self.weights + step
            record.update(info)
        return self._next(phase.round)

    def _finish(self, answers, dropped):
        errors = {site: float(v["metrics"]["error"]) for site, v in answers.items()
                  if isinstance(v.get("metrics", {}).get("error"), (int, float))}
        validation = set(sorted(self.held_out)[:self.method.params["validation"]])
        tested = [e for site, e in errors.items() if site not in validation]
        if not tested:
            return Outcome.aborted(f"no test site answered the evaluation ({len(dropped)} dropped)",
                                   dropped=dict(dropped))
        summary = error_summary(np.array(tested))
        details = {"answered": len(errors), "excluded": {**self.excluded, **dropped}, **summary,
                   "training_sites": len(self.training), "training_device": "cpu",
                   "training_devices": {"cpu": len(self.training)}}  # numpy: the sites train on the CPU
        validated = [e for site, e in errors.items() if site in validation]
        if validated:
            details.update({f"validation_{k}": v for k, v in error_summary(np.array(validated)).items()})
        errors = tested
        if self.mechanism is not None:
            details.update(self._privacy_report())
        rounds = tuple({k: v for k, v in r.items() if k != "dropped"} | {"dropped": len(r["dropped"])}
                       for r in self.records)
        return RobustTraining("ok", "", details, accuracy=1.0 - summary["mean_error"],
                           accuracy_sd=spread(errors)["sd"], rounds=rounds)

    def _privacy_report(self) -> dict:
        """The two figures (issue 49): the central guarantee assuming the coordinator sampled as it
        says, and the unamplified account of the site that took part most often."""
        from collections import Counter

        from protocol.rounds_privacy import combined_epsilon, site_account_epsilon

        p = self.method.params
        delta = self.method.target_delta(self.mechanism["population"])
        rho = self.method.round_cost(self.mechanism)
        most = max(self.participation.values(), default=0)
        # every round that released anything, as it was sampled: m of the pool still answering (smaller
        # after sites were lost); a round skipped before any sum was unmasked released nothing
        pools = Counter((r["expected"], r["pool"]) for r in self.records if r.get("released"))
        def guarded(compute) -> float:
            try:
                return float(compute())
            except (OverflowError, ValueError):  # a rho beyond the accountant's range: no finite guarantee
                return math.inf

        sampling = self.mechanism["sampling"]
        amplified = [(rho, count, sampling, m, n) for (m, n), count in sorted(pools.items())]
        return {"epsilon_central": guarded(lambda: combined_epsilon(0.0, amplified, delta)) if amplified else 0.0,
                "rounds_released": sum(pools.values()),
                "epsilon_site_max": guarded(lambda: site_account_epsilon(rho, most, delta)) if most else 0.0,
                "delta": delta, "rho_round": rho, "participations_max": most,
                "noise": self.mechanism.get("noise", "central"),
                **{k: v for k, v in self.mechanism.items() if k.startswith("sigma") or k in ("scale", "inputs")}}


class TailSite(SiteHalf):
    """A client of appendix B.3: its examples (features then label); each round one local update
    from the global weights, its loss (clipped and binned under privacy) and the update (clipped)."""

    def __init__(self, rows: np.ndarray, rng=None, site_id: str = "", method: str = "",
                 sums: tuple[str, ...] = (), sums_half=None) -> None:
        """rng: the site's noise source (the random rounding of its update under distributed
        noise); site_id: who it is (its secure sums bind their keys to it); method: the method's
        name (what its spends are keyed by); sums: the secure sums its rounds may hold (none without
        privacy); sums_half(site, rng): what answers them (protocol.methods.tail_secagg's
        DistributedSite, passed by the method, which knows both halves)."""
        rows = np.asarray(rows, dtype=float)
        if rows.ndim != 2 or rows.shape[1] < 2 or len(rows) == 0:
            raise RequestError(f"this method needs examples data (features then label per row), the site holds "
                               f"shape {rows.shape}")
        self.X1 = with_intercept(rows[None, :, :-1])
        self.labels = rows[:, -1]
        self.classes = 0
        self.round = -1
        self.evaluated = False
        self.site_id, self.method, self.sum_kinds = site_id, method, sums
        self.identity = None  # the site's signing key and registry: its driver sets it
        self.sums = sums_half(self, rng) if sums_half is not None else None
        self.digest = None  # the method's request_digest: its class sets it

    def answer(self, phase, body):
        if phase.name == "setup":
            classes = body.get("classes") if isinstance(body, dict) else None
            if not isinstance(classes, int) or isinstance(classes, bool) or not 2 <= classes <= 10_000:
                raise RequestError("setup needs classes, an integer >= 2")
            if self.classes:
                raise RequestError("setup twice in one session")
            # the answer never depends on the labels (a refusal that did would tell the coordinator about
            # them, for free): rows whose label is not one of the study's classes take no part
            labels = self.labels
            fits = (labels == np.round(labels)) & (labels >= 0) & (labels < classes)
            self.X1, self.y = self.X1[:, fits], labels[fits].astype(np.int64)[None, :]
            self.classes = classes
            return {"tensors": {}, "metrics": {"features": self.X1.shape[-1] - 1, "train": len(labels)}}
        if not self.classes:
            raise RequestError(f"{phase} before setup in this session")
        if phase.name not in ("round", "evaluate"):
            if self.sums is None:
                raise RequestError(f"{phase}: this site holds no secure sums for {self.method or 'this method'}")
            return self.sums.answer(phase, body, lambda received: self.digest(phase, received), self.method,
                                    self.sum_kinds)
        W = self._weights(body)
        if phase.name == "evaluate":  # once a session, the error only (the final model's, on held-out data)
            if self.evaluated:
                raise RequestError("evaluate twice in one session")
            self.evaluated = True
            return {"tensors": {}, "metrics": {"error": float(misclassification(W, self.X1, self.y)[0])}}
        if phase.round <= self.round:
            raise RequestError(f"{phase} after round-{self.round}: rounds only go forward")
        self.round = phase.round
        lr, steps, decay = self._local_config(body)
        mechanism = body.get("mechanism")
        if mechanism is not None:
            mechanism = checked(MECHANISM, mechanism, "request.mechanism")
        numbers, updates = site_step(W, self.X1, self.y, lr, steps, float(decay), mechanism)
        key, number = ("loss", float(numbers[0])) if mechanism is None else ("loss_bin", int(numbers[0]))
        return {"tensors": {"update": updates[0]}, "metrics": {key: number}}

    @staticmethod
    def _local_config(body) -> tuple[float, int, float]:
        lr, steps, decay = body.get("lr"), body.get("steps"), body.get("weight_decay")
        if not (isinstance(lr, float) and 0 < lr < 100 and isinstance(steps, int) and 1 <= steps <= 100
                and isinstance(decay, (int, float)) and 0 <= decay < 1 / lr):
            raise RequestError("a round needs lr in (0, 100), steps in 1..100 and 0 <= weight_decay < 1 / lr")
        return lr, steps, float(decay)

    def _weights(self, body) -> np.ndarray:
        try:
            W = unpack_tensors(body.get("weights") if isinstance(body, dict) else None, "weights").get("W")
        except PayloadError as exc:
            raise RequestError(str(exc)) from None
        if not isinstance(W, np.ndarray) or W.shape != (self.X1.shape[-1], self.classes) or not np.all(np.isfinite(W)):
            raise RequestError(f"the weights must be one finite tensor W of shape {(self.X1.shape[-1], self.classes)}")
        return W.astype(np.float64)
