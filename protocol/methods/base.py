"""The shape of a method: a pure coordinator half, a pure site half, and a codec.

Coordinator half (built per session from the joined sites' sizes and a seeded Generator for
any coordinator-side randomness): `start()` and `advance(phase, answers, dropped)` each return a
Step, either
`Send(phase, requests)` (run this phase: send each site its request body and bring back the
decoded answers) or an `Outcome` (the session's result). It never sees a socket or a clock.

Site half (built by `Method.site(rows, rng, site_id)` from the site's own data): `answer(phase,
body)` turns a request body into a value that the method's codec encodes; it raises RequestError
for a request it will not serve.
"""

from __future__ import annotations

from collections import Counter
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import msgpack
import numpy as np

from protocol.accounting import Spend, request_key
from protocol.phases import PhaseTable
from results import Outcome
from results.conformal import Threshold
from stats.conformal import order_statistic

#: what a method whose privacy depends on how many sites answer does when fewer answered than
#: planned: abort before anything is released (default), or release and say so (status "shortfall")
SHORTFALL_SPEC = {"type": "str", "choices": ["abort", "report"], "default": "abort"}


class RequestError(ValueError):
    """A site half refuses a request; str(error) is sent back to the coordinator as the reason."""


@dataclass(frozen=True)
class Send:
    phase: str  # a name of the method's phase table, or a Phase("round", t) of a numbered one
    requests: dict[str, dict]  # site id -> request body
    #: the fewest answers the phase's privacy was planned for: a shuffler withholds a smaller
    #: batch (protocol.shuffle), so that nothing weaker than planned reaches the coordinator
    minimum: int = 0


Step = Send | Outcome


def guarded(call, *args) -> Step:
    """A coordinator half's step (`start`, `advance`, or building the half from the sizes the
    sites announced), run so that an exception raised on what the sites sent becomes the
    session's aborted outcome with the reason (issue 36): no peer can end the run."""
    try:
        return call(*args)
    except Exception as exc:  # a method's bug or a peer's garbage: this session ends, the run goes on
        return Outcome.aborted(f"the coordinator half failed on what the sites sent: {type(exc).__name__}: "
                               f"{str(exc)[:300]}")


class CoordinatorHalf(ABC):
    @abstractmethod
    def start(self) -> Step: ...

    @abstractmethod
    def advance(self, phase: str, answers: Mapping[str, Any], dropped: Mapping[str, str]) -> Step:
        """answers: site -> decoded value; dropped: site -> why it did not answer."""


class Decided(CoordinatorHalf):
    """A coordinator half whose outcome is settled before anything is asked (a plan that cannot
    reach its guarantee, parameters the sites could never serve): it asks nothing."""

    def __init__(self, outcome: Outcome) -> None:
        self.outcome = outcome

    def start(self) -> Step:
        return self.outcome

    def advance(self, phase, answers, dropped) -> Step:
        return self.outcome


class SiteHalf(ABC):
    #: the site's long-term identity (protocol.secagg.identity.SiteIdentity: its signing key, the
    #: party registry's keys of the others, its secure-sum policy), set by the site's driver on
    #: the half it builds; a half that signs or verifies peers reads it, others ignore it
    identity = None
    #: what the site keeps for this half's session across the half's rebuilds (after a `close`, or
    #: a reopened trial, the site builds a fresh half for the same session: sites.local), set by
    #: the site's driver; a half that bounds what it answers in a session keeps its count here, not
    #: on itself. None: no driver keeps anything (a half built by a test); such a half keeps its own
    session_memory: dict | None = None

    @abstractmethod
    def answer(self, phase: str, body: Mapping[str, Any]) -> Any: ...

    def unseen_claim(self, phase: str, body: Mapping[str, Any]) -> str | None:
        """A claim this half booked that it cannot check from what it has seen, as of answering
        `phase` (e.g. a secure sum's global count of inputs under a sparse graph), or None. The
        site's policy (`unseen_claims`) decides whether to answer anyway."""
        return None


class Method(ABC):
    """A statistical method. Subclasses set `name`, `codec`, `phases`, and optional `PARAMS`.

    PARAMS maps each scenario parameter of the method to its spec (specs.schema: type, default,
    bounds); the scenario loader validates against it and passes the values to __init__ as keyword
    arguments. A method built directly (`FedCPQQ(0.1)`, in a test or a notebook) is validated the
    same way: missing parameters take their defaults, a missing required one or a wrong value is a
    ScenarioError naming `NAME.FIELD`.
    """

    name: ClassVar[str]
    codec: ClassVar[str]
    #: its phases and which may follow which (protocol.phases.PhaseTable), or a tuple of names
    #: that follow one another in order, each once
    phases: ClassVar[PhaseTable | tuple[str, ...]] = ("respond",)
    PARAMS: ClassVar[dict[str, dict]] = {}
    #: whether the site half's randomness protects what it releases (the exponential mechanism,
    #: K-anonymous limits): then the site hands it the OS CSPRNG (protocol.noise.PrivacyNoise, with
    #: `random` and `uniform`), or the scenario's seed only where its policy says `noise: seeded`.
    #: False (learning methods): the half gets a seeded numpy Generator for work that protects
    #: nothing (minibatch order), so that it reproduces.
    site_noise: ClassVar[bool] = True
    #: what the site half works on: "scores" (a model's conformity scores, for calibration),
    #: "two_sample" ((value, group) rows of models.two_sample, for paper 004's statistics) or
    #: "examples" (features then label per row, for learning)
    data: ClassVar[str] = "scores"
    #: the result family its sessions return (results.base): a prediction set's threshold by
    #: default; results.hypothesis.HypothesisTest, results.estimates.Estimates,
    #: results.learning.LearningRun, or a plugin's own subclass of Outcome
    result: ClassVar[type[Outcome]] = Threshold

    def __init__(self, alpha: float, **params: Any) -> None:
        from specs.schema import validate

        self.alpha = alpha
        self.params = validate({"type": "map", "fields": self.PARAMS}, params, self.name)

    @abstractmethod
    def coordinator(self, sizes: Mapping[str, int], rng: np.random.Generator) -> CoordinatorHalf:
        """The coordinator half for one session, given n_j of the sites that joined."""

    @classmethod
    def phase_table(cls) -> PhaseTable:
        """The method's `phases` as a table (built once per class)."""
        table = cls.__dict__.get("_phase_table")
        if table is None or table[0] is not cls.phases:
            table = (cls.phases, PhaseTable.of(cls.phases))
            cls._phase_table = table
        return table[1]

    @classmethod
    def codec_class(cls) -> type:
        """The class of this method's codec, by registered name or import path (imported on first
        use: the method's own code names it, never a request)."""
        from protocol.codecs import CODECS

        return CODECS.load(cls.codec)

    def make_codec(self):
        """The coordinator's decoder for this method's responses."""
        return self.codec_class()()

    def for_trial(self, public: Mapping[str, float]) -> "Method":
        """This method with parameters that refer to public per-trial facts resolved (e.g. a
        score bound taken from the training split); most methods have none."""
        return self

    @property
    def privacy(self) -> dict[str, Any]:
        """The differential privacy this method provides: {"epsilon": ..., "model": ...}."""
        return {"epsilon": None, "model": "none"}

    @property
    def score_range(self) -> tuple[float, float] | None:
        """Public (lo, hi) bounds the method bins scores into, if any (scores above hi are clipped)."""
        return None

    @classmethod
    @abstractmethod
    def site(cls, rows: np.ndarray, rng: np.random.Generator, site_id: str) -> SiteHalf:
        """The site half for one session, built by the site from its own data and the request
        alone, never from coordinator state: `rows` is what the site holds for this method (its
        conformity scores, (value, group) rows, or examples: `data`), `rng` its randomness
        (protocol.noise) and `site_id` who it is (a secure sum binds its keys to it)."""

    @classmethod
    def spend(cls, phase: str, body: Mapping[str, Any]) -> Spend | None:
        """What answering this request releases (protocol.accounting), computed by the site from
        the request it received; None when the phase releases nothing of the site's data.
        Default: a release with no formal privacy guarantee."""
        return Spend("none", model="no formal privacy")

    def planned_spend(self, sites: int) -> Spend | None:
        """What this method, as the scenario sets it up, will ask each of `sites` sites to release:
        the Spend its `spend` will compute from the requests (for checking a scenario against the
        sites' policy before a run, protocol.policy). Default: no formal privacy, as `spend`."""
        return Spend("none", model=self.privacy["model"])

    @classmethod
    def release_shape(cls, phase: str, body: Mapping[str, Any]) -> Any:
        """The public parameters of this request that shape what answering it releases (issue 47,
        "one question for every contributor"), computed by the site from the request it received
        (the method's own body, after the codec): everything that changes the privacy of the
        answer or lets it be told apart from the others' (method, bins, epsilon, K, grids, claims,
        ring and graph parameters) must be in it, and nothing that legitimately differs between
        the sites of one session (a site's own order statistic or quantile level for unequal
        sizes, its Shamir index, its neighbours). Default: the whole body, so that a method that
        sends per-site fields must say which. None: the phase shapes nothing beyond what an
        earlier phase of the session fixed (a secure sum's share, mask and unmask phases)."""
        return body

    @classmethod
    def request_digest(cls, phase: str, body: Mapping[str, Any]) -> bytes:
        """SHA-256 of this method's name, the phase and the canonical form of `release_shape`:
        equal for every site asked the same question, whatever a request's per-site fields. A
        shuffled answer carries it in its claim (the shuffler withholds a batch that mixes
        digests); a secure sum binds its pairwise masks and share ciphertexts to it."""
        return request_digest(cls.name, phase, cls.release_shape(phase, body))

    @classmethod
    def sealing_claim(cls, phase: str, body: Mapping[str, Any]) -> dict:
        """What a site's sealed answer to this request (as wrapped by a shuffled codec) claims
        outside its ciphertext, for the shuffler to check (protocol.shuffle.sealing_claim): the
        fewest messages the answer was planned and booked for (1: it stands alone), the key it
        was sealed to and the digest of the question it answers (`sealed_digest`)."""
        from protocol.shuffle import sealing_claim

        encoder, inner = cls.codec_class().for_site(body)
        spend = cls.spend(phase, inner)
        return sealing_claim(max(1, spend.contributors if spend is not None else 1), encoder.public_key,
                             cls.sealed_digest(phase, body))

    @classmethod
    def sealed_digest(cls, phase: str, body: Mapping[str, Any]) -> bytes:
        """The request digest a sealed answer claims, from the request as the site received it
        (wrapped by the shuffled codec): the method's release shape and the inner codec the
        answer is encoded with (a site told to encode with another would be told apart once its
        message is opened). The key it is sealed to is claimed apart (its own digest)."""
        encoder, inner = cls.codec_class().for_site(body)
        sealed_with = getattr(getattr(encoder, "inner", None), "name", None)
        return request_digest(cls.name, phase, {"inner": sealed_with, "request": cls.release_shape(phase, inner)})


def canonical(value: Any) -> Any:
    """`value` as a site receives it (a msgpack round trip, as the wire makes it: tuples become
    lists, numpy floats plain floats) with every map's keys in sorted order, so that the same
    question packs to the same bytes however its dicts were built."""
    def sort(item):
        if isinstance(item, dict):
            return {key: sort(item[key]) for key in sorted(item, key=lambda k: (type(k).__name__, k))}
        if isinstance(item, list):
            return [sort(v) for v in item]
        return item

    try:
        received = msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False, strict_map_key=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"a request's shape must be msgpack data: {exc}") from None
    return sort(received)


def per_site_removed(body: Any, fields: tuple[str, ...]) -> Any:
    """A request body without the fields that legitimately differ between the sites of one
    session (a release_shape); a body that is not a map is kept whole (the site refuses it)."""
    return {key: value for key, value in body.items() if key not in fields} if isinstance(body, Mapping) else body


def request_digest(method: str, phase: str, shape: Any) -> bytes:
    """The request digest of `shape` (Method.release_shape) for `method`'s `phase`: 32 bytes,
    SHA-256 over canonical msgpack (protocol.accounting.request_key)."""
    return request_key("quorum request v1", str(method), str(phase), canonical(shape))


@dataclass(frozen=True)
class Planned:
    """What a one-shot method decided before asking: per-site request bodies and its own notes."""

    requests: dict[str, dict]
    state: Any = None
    minimum: int = 0  # see Send.minimum


class OneShotMethod(Method):
    """One round: plan from the sizes, ask every site once, combine the answers (paper 000 setting)."""

    def coordinator(self, sizes: Mapping[str, int], rng: np.random.Generator) -> CoordinatorHalf:
        return _OneShotCoordinator(self, dict(sizes), rng)

    @abstractmethod
    def plan(self, sizes: dict[str, int]) -> Planned | Outcome:
        """Per-site requests, or an Outcome when no communication can help."""

    @abstractmethod
    def combine(self, sizes: dict[str, int], planned: Planned, answers: Mapping[str, Any],
                dropped: Mapping[str, str], rng: np.random.Generator) -> Outcome: ...


class _OneShotCoordinator(CoordinatorHalf):
    def __init__(self, method: OneShotMethod, sizes: dict[str, int], rng: np.random.Generator) -> None:
        self.method, self.sizes, self.rng, self.planned = method, sizes, rng, None

    def start(self) -> Step:
        if not self.sizes:
            return Outcome.aborted("no site joined the session")
        planned = self.method.plan(self.sizes)
        if isinstance(planned, Outcome):
            return planned
        self.planned = planned
        return Send(self.method.phase_table().opening(), planned.requests, planned.minimum)

    def advance(self, phase, answers, dropped) -> Step:
        if not answers:
            counts = Counter(dropped.values()).most_common(3)
            why = "; ".join(f"{n} x {reason}" for reason, n in counts)
            return Outcome.aborted(f"no site answered ({len(dropped)} dropped: {why})", dropped=sorted(dropped))
        return self.method.combine(self.sizes, self.planned, answers, dropped, self.rng)


def expect_empty(body) -> None:
    """Refuse a request body where the method sends none (one-round methods that ask for everything)."""
    if body:
        raise RequestError(f"expected an empty body, got {dict(body)!r}")


def two_sample_groups(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A site's two_sample data ((value, group) rows, models.two_sample) as (control x, treatment y)."""
    rows = np.asarray(rows, dtype=float)
    if rows.ndim != 2 or rows.shape[1] != 2:
        raise RequestError(f"this method needs two_sample data ((value, group) rows), the site holds shape "
                           f"{rows.shape}")
    treated = rows[:, 1] > 0
    return rows[~treated, 0], rows[treated, 0]


def two_sample_values(rows: np.ndarray) -> np.ndarray:
    """All of a site's values, both groups (quantile estimation treats them as one sample)."""
    x, y = two_sample_groups(rows)
    return np.concatenate([x, y])


#: the quantile levels paper 004 reports (section 5.4), and the `levels` parameter of its estimators
LEVELS = [0.02, 0.25, 0.5, 0.75, 0.98]
LEVELS_SPEC = {"type": "list", "of": {"type": "float", "gt": 0, "lt": 1}, "default": LEVELS}


def checked(spec: Mapping[str, Any], value, where: str):
    """A request's value checked against its spec, in the spec language scenarios and PARAMS use
    (specs.schema: the one validation dialect): the value with defaults filled in, or
    RequestError naming the field and what was expected. A body is `{"type": "map", "fields":
    {...}}`: a field it does not name, or one it names and the body lacks, is refused too."""
    from specs.schema import ScenarioError, validate

    try:
        return validate(dict(spec), value, where)
    except ScenarioError as exc:
        raise RequestError(str(exc)) from None


LEVELS_REQUEST = {"type": "list", "of": {"type": "float", "gt": 0, "lt": 1}, "min_len": 1, "max_len": 1000}


def levels_from_request(levels) -> list[float]:
    """A request's quantile levels, checked: 1 to 1000 numbers in (0, 1)."""
    return checked(LEVELS_REQUEST, levels, "levels")


class AllScores(SiteHalf):
    """Answers an empty request with all of the site's scores (no privacy: raw values)."""

    def __init__(self, scores: np.ndarray) -> None:
        self.scores = scores

    def answer(self, phase, body):
        expect_empty(body)
        return self.scores


class LocalOrderStatistic(SiteHalf):
    """Answers {"ell": l} with the site's l-th smallest score Q_(l) (paper 000 eq. 2; +inf if l > n_j)."""

    def __init__(self, scores: np.ndarray) -> None:
        self.scores = scores

    REQUEST = {"type": "map", "fields": {"ell": {"type": "int", "min": 1}}}

    def answer(self, phase, body):
        return order_statistic(self.scores, checked(self.REQUEST, body, f"{phase} request")["ell"])
