"""Multi-round federated learning as a session (paper 002, section 3.3 and appendix A).

Phases (PHASES, a table): `setup` (every site gets the training configuration and its private
architecture, builds its networks, and answers with its feature count and split sizes), then
`round` 0, 1, ... (on the wire round-0, round-1, ...):
the coordinator samples a fraction of the sites with its own seeded Generator, sends each the
global weights (when the method has any), and averages the weights that come back, weighted by
each site's training size n_j (FedAvg, McMahan et al. 2017); finally `evaluate`: every site that
completed setup scores the final models on its own test split.

Weights travel through the `tensors` codec in the precision the scenario picks. Sites report
their accuracies as metrics (they hold the test data; the coordinator never sees a private
model). The coordinator half keeps one record per round: what each answering site reported,
and the weight bytes that went down and up, next to what they would have been had each site
sent (and received) its private model instead.
"""

from __future__ import annotations

import math
import re
from abc import abstractmethod
from typing import Any, ClassVar, Mapping

import numpy as np

from learning.nets import ARCHITECTURE_FIELDS
from protocol.codecs.tensors import PRECISIONS, pack_tensors, unpack_tensors
from protocol.codecs.base import PayloadError
from protocol.methods.base import CoordinatorHalf, Method, Outcome, RequestError, Send, SiteHalf
from protocol.phases import Phase, PhaseStep, PhaseTable
from results.learning import LearningRun
from stats.randomness import data_rng

MAX_ROUNDS = 1000
#: setup, then rounds 0, 1, ... (each sampled sites' local training and the server's average), then
#: the evaluation of the final models
PHASES = PhaseTable(PhaseStep("setup", then=("round",)),
                    PhaseStep("round", then=("round", "evaluate"), numbered=True),
                    PhaseStep("evaluate"), rounds=MAX_ROUNDS)
ARCHITECTURE = {"type": "map", "fields": ARCHITECTURE_FIELDS}
LEARNING_PARAMS = {
    "classes": {"type": "int", "min": 2},
    "rounds": {"type": "int", "min": 1, "max": MAX_ROUNDS, "default": 20},
    "fraction": {"type": "float", "gt": 0, "le": 1, "default": 1.0},
    "lr": {"type": "float", "gt": 0, "default": 1e-3},
    "batch_size": {"type": "int", "min": 1, "default": 16},
    "local_epochs": {"type": "int", "min": 1, "default": 5},
    "passes": {"type": "int", "min": 1, "default": 1},
    "precision": {"type": "str", "choices": ["float16", "float32"], "default": "float32"},
    "device": {"type": "str", "choices": ["auto", "cpu", "cuda"], "default": "auto"},
}
PRIVATE_MODELS = {"type": "list", "min_len": 1, "of": ARCHITECTURE,
                  "default": [{"kind": "mlp", "hidden": [256, 256], "channels": [], "image": []}]}
PROXY_MODEL = {**ARCHITECTURE, "default": {"kind": "mlp", "hidden": [32], "channels": [], "image": []}}


def weighted_average(weights: list[Mapping[str, np.ndarray]], sizes: list[int]) -> dict[str, np.ndarray]:
    """FedAvg's server step (McMahan et al. 2017; paper 002 section 3.3): sum_j n_j w_j / sum_j n_j,
    per tensor, in float64, returned as float32."""
    total = float(sum(sizes))
    return {name: (sum(np.asarray(w[name], dtype=np.float64) * n for w, n in zip(weights, sizes)) / total
                   ).astype(np.float32) for name in weights[0]}


def sample_sites(sites: list[str], fraction: float, rng: np.random.Generator) -> list[str]:
    """max(1, round(fraction x m)) sites without replacement (the cross-device setting's B of N)."""
    count = min(len(sites), max(1, int(round(fraction * len(sites)))))
    return sorted(rng.choice(sites, size=count, replace=False).tolist()) if count < len(sites) else list(sites)


def spread(values: list[float]) -> dict[str, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return {"mean": math.nan, "sd": math.nan, "min": math.nan, "max": math.nan}
    array = np.asarray(values, dtype=float)
    return {"mean": float(array.mean()), "sd": float(array.std()), "min": float(array.min()),
            "max": float(array.max())}


#: what a site may report per local epoch of a round (paper 002 appendix I, table 7), each as one
#: number metric per epoch, `epoch{r}_{quantity}` (r = 1 .. local_epochs): the tensors codec carries
#: numbers only, so the list travels flattened; each quantity's range, the set size's in classes
EPOCH_QUANTITIES = {"proxy_accuracy": (0.0, 1.0), "set_size": (0.0, None)}
EPOCH_KEY = re.compile(r"^epoch(\d+)_(.*)$")


def epoch_metrics(epochs: list[dict]) -> dict[str, float]:
    """A site's per-epoch records (learning.train.uarl_round's `epochs`) as round metrics,
    `epoch{r}_{quantity}`; a NaN value (no sets fitted, no test points) is left out."""
    return {f"epoch{e['epoch']}_{key}": float(e[key]) for e in epochs for key in EPOCH_QUANTITIES
            if key in e and not math.isnan(float(e[key]))}


def split_epoch_metrics(metrics: Mapping[str, Any], local_epochs: int, classes: int
                        ) -> tuple[dict, dict[int, dict[str, float]], str]:
    """A round answer's metrics as (the others, {epoch: {quantity: value}}, why the epoch values
    were refused ('' when they were not)). They are the site's word, checked as untrusted: an epoch
    number in 1 .. local_epochs, a known quantity, a finite number in its range (an accuracy in
    [0, 1], a set size in [0, classes]); one bad value refuses all of that site's epoch values for
    the round, naming it (its update and round metrics stay)."""
    rest, epochs = {}, {}
    for key, value in metrics.items():
        match = EPOCH_KEY.match(key) if isinstance(key, str) and key.startswith("epoch") else None
        if match is None:
            rest[key] = value
            continue
        digits, quantity = match.group(1), match.group(2)
        name = key if len(key) <= 40 else key[:40] + "..."
        epoch = int(digits) if len(digits) <= 9 else 0  # a 5,000-digit number is no epoch (nor an int() to try)
        if quantity not in EPOCH_QUANTITIES:
            return _other_metrics(metrics), {}, f"{name}: unknown per-epoch quantity"
        if not 1 <= epoch <= local_epochs:
            return _other_metrics(metrics), {}, f"{name}: epoch outside 1..{local_epochs} (local_epochs)"
        low, high = EPOCH_QUANTITIES[quantity]
        high = float(classes) if high is None else high
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not low <= value <= high:
            return _other_metrics(metrics), {}, f"{name}: {repr(value)[:40]} is not a finite number in [{low:g}, {high:g}]"
        epochs.setdefault(epoch, {})[quantity] = float(value)
    return rest, epochs, ""


def _other_metrics(metrics: Mapping[str, Any]) -> dict:
    return {k: v for k, v in metrics.items() if not (isinstance(k, str) and EPOCH_KEY.match(k))}


def epoch_rows(record: dict) -> list[dict]:
    """epochs.csv's rows for one round record: per local epoch any site reported, the site means
    of its values, and the sites whose epoch values were refused, with why."""
    reported = record.get("epochs", {})
    refused = "; ".join(f"{s}: {r}" for s, r in sorted(record.get("epochs_refused", {}).items()))
    numbers = sorted({e for values in reported.values() for e in values})
    return [{"round": record["round"], "epoch": e, "sites": sum(e in v for v in reported.values()),
             **{q: spread([v[e].get(q) for v in reported.values() if e in v])["mean"] for q in EPOCH_QUANTITIES},
             "refused": refused} for e in numbers] or (
        [{"round": record["round"], "epoch": "", "sites": 0, **{q: math.nan for q in EPOCH_QUANTITIES},
          "refused": refused}] if refused else [])


def architecture_from(body: dict, key: str) -> dict:
    """The architecture a setup request names under `key` (private, proxy), checked by the site
    (RequestError when it is not one: learning.nets.ARCHITECTURE_FIELDS)."""
    from specs.schema import ScenarioError, validate

    try:
        return validate(ARCHITECTURE, body.get(key), f"setup.{key}")
    except ScenarioError as exc:
        raise RequestError(str(exc)) from None


class PrivateModels:
    """Mixin: a method whose sites get a private architecture from the `private_models` list."""

    def private_request(self, request: dict, index: int) -> dict:
        models = self.params["private_models"]
        request["private"] = models[index % len(models)]
        return request


class LearningMethod(Method):
    """A federated learning method; subclasses say which architectures exist and what counts as
    the method's accuracy (`primary`: the site metric its results report)."""

    codec = "tensors"
    phases = PHASES
    data = "examples"
    result = LearningRun
    primary: ClassVar[str] = "private_accuracy"
    uses_weights: ClassVar[bool] = True
    site_noise = False  # a learning site's randomness orders minibatches; it protects no release

    def __init__(self, alpha: float, **params: Any) -> None:
        super().__init__(alpha, **params)
        self.rounds, self.fraction = params["rounds"], params["fraction"]

    def setup_request(self, index: int) -> dict:
        """The configuration the site at position `index` (in site-id order) trains with."""
        p = self.params
        request = {key: p[key] for key in ("classes", "lr", "batch_size", "local_epochs", "passes", "device")}
        request["precision"] = PRECISIONS[p["precision"]]
        return request

    def global_architecture(self) -> dict | None:
        """The architecture whose weights the coordinator averages (None: no model is shared)."""
        return None

    def initial_global(self, features: int, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
        """What round 0 sends every sampled site (None: nothing): by default a freshly initialized
        network of the global architecture, seeded from the coordinator's Generator."""
        architecture = self.global_architecture()
        if architecture is None:
            return None
        from learning.nets import build_net, get_weights

        return get_weights(build_net(architecture, features, self.params["classes"], seed=int(rng.integers(2**31 - 1))))

    def aggregate(self, tensors: list[dict[str, np.ndarray]], sizes: list[int]) -> dict[str, np.ndarray]:
        """The server step over the answers of a round: FedAvg by default (`weighted_average`)."""
        return weighted_average(tensors, sizes)

    def coordinator(self, sizes, rng) -> CoordinatorHalf:
        return RoundsCoordinator(self, dict(sizes), rng)

    @property
    def privacy(self):
        return {"epsilon": None, "model": "no differential privacy; weights in the clear"}


class RoundsCoordinator(CoordinatorHalf):
    def __init__(self, method: LearningMethod, sizes: dict[str, int], rng: np.random.Generator) -> None:
        self.method, self.sites, self.rng = method, sorted(sizes), rng
        self.members: dict[str, dict] = {}  # site -> its setup metrics
        self.weights: dict[str, np.ndarray] | None = None
        self.records: list[dict] = []
        self.excluded: dict[str, str] = {}
        self.steps = {"setup": self._after_setup, "round": self._after_round, "evaluate": self._finish}

    def start(self):
        if not self.sites:
            return Outcome.aborted("no site joined the session")
        return Send("setup", {site: self.method.setup_request(i) for i, site in enumerate(self.sites)})

    def advance(self, phase, answers, dropped):
        return self.steps[phase.name](phase, answers, dropped)  # the engine kept to PHASES

    def _after_setup(self, phase, answers, dropped):
        self.excluded.update({site: f"setup: {reason}" for site, reason in dropped.items()})
        if not answers:
            named = "; ".join(f"{site}: {reason}" for site, reason in sorted(dropped.items())[:3])
            return Outcome.aborted(f"no site completed setup ({len(dropped)} dropped; {named})", dropped=dict(dropped))
        features = {site: int(value["metrics"]["features"]) for site, value in answers.items()}
        if len(set(features.values())) > 1:
            return Outcome.aborted(f"sites disagree on the feature count: {features}")
        self.members = {site: value["metrics"] for site, value in answers.items()}
        self.weights = self.method.initial_global(next(iter(features.values())), self.rng)
        return self._round(0)

    def _round(self, t: int):
        chosen = sample_sites(sorted(self.members), self.method.fraction, self.rng)
        phase = Phase("round", t)
        self.records.append({"round": t + 1, "phase": phase, "sampled": len(chosen), "sites": {}, "dropped": {},
                             "weights_bytes_down": 0, "weights_bytes_up": 0, "private_weights_bytes": 0})
        return Send(phase, {site: self._weights_body() for site in chosen})

    def _weights_body(self) -> dict:
        if self.weights is None:
            return {}
        precision = self.method.params["precision"]
        return {"weights": pack_tensors({k: v.astype(precision) for k, v in self.weights.items()})}

    def _accept(self, answers, dropped, record) -> tuple[list, list]:
        """The answers whose tensors fit the global architecture (others are named in `dropped`)."""
        record["dropped"].update(dropped)
        kept, sizes = [], []
        weights = self.weights or {}
        bytes_per_value = np.dtype(self.method.params["precision"]).itemsize
        shapes = {k: v.shape for k, v in weights.items()}
        sent = sum(v.size for v in weights.values()) * bytes_per_value
        for site, value in answers.items():
            tensors, metrics = value["tensors"], value["metrics"]
            got = {k: v.shape for k, v in tensors.items()}
            if got != shapes:
                record["dropped"][site] = f"tensors {sorted(got)} do not match the global architecture"
                continue
            metrics, epochs, refused = split_epoch_metrics(metrics, self.method.params["local_epochs"],
                                                           self.method.params["classes"])
            if epochs:
                record.setdefault("epochs", {})[site] = epochs
            if refused:
                record.setdefault("epochs_refused", {})[site] = refused
            record["sites"][site] = metrics
            record["weights_bytes_up"] += sum(a.nbytes for a in tensors.values())
            record["weights_bytes_down"] += sent
            record["private_weights_bytes"] += 2 * int(self.members[site].get("private_parameters", 0)) * bytes_per_value
            if tensors:
                kept.append(tensors)
                sizes.append(int(self.members[site]["train"]))
        return kept, sizes

    def _after_round(self, phase, answers, dropped):
        t, record = phase.round, self.records[-1]
        kept, sizes = self._accept(answers, dropped, record)
        if len(self.records) > 1:  # the global model these sites received: the aggregate after round t
            self.records[-2]["global"] = {s: m.get("global_accuracy") for s, m in record["sites"].items()}
        if kept and self.weights is not None and sum(sizes) > 0:
            self.weights = self.method.aggregate(kept, sizes)
        if t + 1 < self.method.rounds:
            return self._round(t + 1)
        return Send("evaluate", {site: self._weights_body() for site in sorted(self.members)})

    def _finish(self, phase, answers, dropped):
        if self.records:
            self.records[-1]["global"] = {s: v["metrics"].get("global_accuracy") for s, v in answers.items()}
        if not answers:
            return Outcome.aborted(f"no site answered the evaluation ({len(dropped)} dropped)", dropped=dict(dropped))
        final = {site: value["metrics"] for site, value in answers.items()}
        primary = spread([m.get(self.method.primary) for m in final.values()])
        mean = {key: spread([m.get(key) for m in final.values()])["mean"]
                for key in ("global_accuracy", "proxy_accuracy", "private_accuracy", "set_coverage", "test_set_size")}
        return LearningRun("ok", "", {"answered": len(final), "excluded": {**self.excluded, **dropped},
                                      "training_device": _devices(self.members.values()),
                                      "training_devices": _device_counts(self.members.values()),
                                      "private_accuracy": mean["private_accuracy"],
                                      "test_set_size": mean["test_set_size"]},
                           accuracy=primary["mean"], accuracy_sd=primary["sd"],
                           global_accuracy=mean["global_accuracy"], proxy_accuracy=mean["proxy_accuracy"],
                           set_coverage=mean["set_coverage"], rounds=tuple(self._summary(r) for r in self.records),
                           epochs=tuple(row for r in self.records for row in epoch_rows(r)))

    def _summary(self, record: dict) -> dict:
        """One row of rounds.csv (results.learning; the harness adds the wire bytes of its phase)."""
        sites = record["sites"]
        global_accuracy = list(record.get("global", {}).values())
        primary = global_accuracy if self.method.primary == "global_accuracy" else \
            [m.get(self.method.primary) for m in sites.values()]
        row = {"round": record["round"], "phase": record["phase"], "sampled": record["sampled"], "answered": len(sites),
               **{f"accuracy_{k}": v for k, v in spread(primary).items()},
               "global_accuracy": spread(global_accuracy)["mean"]}
        for key in ("private_accuracy", "proxy_accuracy", "set_size", "private_set_size", "eta"):
            row[key] = spread([m.get(key) for m in sites.values()])["mean"]
        row.update({k: record[k] for k in ("weights_bytes_down", "weights_bytes_up", "private_weights_bytes")})
        row["dropped"] = "; ".join(f"{s}: {r}" for s, r in sorted(record["dropped"].items()))
        return row


def _devices(metrics) -> str:
    cuda = {int(m.get("cuda", 0)) for m in metrics}
    return "cuda" if cuda == {1} else "cpu" if cuda == {0} else "mixed"


def _device_counts(metrics) -> dict[str, int]:
    """{device: sites} that set up to train, from each site's setup answer (runner.devices)."""
    cuda = [int(m.get("cuda", 0)) for m in metrics]
    return {device: n for device, n in (("cpu", cuda.count(0)), ("cuda", len(cuda) - cuda.count(0))) if n}


class LearningSite(SiteHalf):
    """What every learning site does: split its rows 7:2:1 (learning.train.SPLIT), check the
    configuration, and answer setup; subclasses build networks and train."""

    def __init__(self, rows: np.ndarray, rng: np.random.Generator) -> None:
        rows = np.asarray(rows, dtype=float)
        if rows.ndim != 2 or rows.shape[1] < 2:
            raise RequestError(f"this method needs examples data (features then label per row), the site holds "
                               f"shape {rows.shape}")
        self.rows, self.rng = rows, rng
        self.config = None
        self.round = -1

    def answer(self, phase, body):
        if phase.name == "setup":
            return self._setup(body)
        if self.config is None:
            raise RequestError(f"{phase} before setup in this session (was this site restarted?)")
        if phase.name == "evaluate":
            return {"tensors": {}, "metrics": self.evaluate(self._weights(body))}
        t = phase.round
        if t <= self.round:
            raise RequestError(f"{phase} after round-{self.round}: rounds only go forward")
        self.round = t
        tensors, metrics = self.train_round(self._weights(body))
        return {"tensors": tensors, "metrics": {"train": len(self.data.y_train), **metrics}}

    def _setup(self, body):
        from learning.train import TRAINING_OPTIONS, SiteData, TrainingConfig
        from models.torch_nets import resolve_device

        if self.config is not None:
            raise RequestError("setup twice in one session")
        expected = {"classes", "lr", "batch_size", "local_epochs", "passes", "device", "precision", *self.extra_keys}
        if set(body) != expected:
            raise RequestError(f"setup needs exactly the keys {sorted(expected)}, got {sorted(body)}")
        labels = self.rows[:, -1]
        if np.any(labels != np.round(labels)) or labels.min() < 0 or labels.max() >= body["classes"]:
            raise RequestError(f"labels must be integers in [0, {body['classes']}) for classes = {body['classes']}")
        try:
            device = resolve_device(body["device"])
        except RuntimeError as exc:
            raise RequestError(str(exc)) from None
        self.device, self.precision, self.classes = device, {"f2": "float16", "f4": "float32"}[body["precision"]], \
            int(body["classes"])
        try:
            self.config = TrainingConfig(float(body["lr"]), int(body["batch_size"]), int(body["local_epochs"]),
                                         int(body["passes"]), **{k: body[k] for k in self.extra_keys
                                                                 if k in TRAINING_OPTIONS})
        except (TypeError, ValueError) as exc:
            raise RequestError(f"setup: {exc}") from None
        # the split is a function of the rows, not of the session: every method sees the same points
        self.data = SiteData.split(self.rows, data_rng(self.rows, "learning split"), device)
        features = self.rows.shape[1] - 1
        try:
            metrics = self.build(body, features)
        except (ValueError, RequestError) as exc:  # learning.nets.ArchitectureError; a refused setting
            self.config = None  # a refused setup leaves the site as it was
            raise RequestError(str(exc)) from None
        return {"tensors": {}, "metrics": {"features": features, "train": len(self.data.y_train),
                                           "test": len(self.data.y_test), "validation": len(self.data.y_val),
                                           "cuda": int(device.startswith("cuda")), **metrics}}

    @staticmethod
    def _weights(body) -> dict[str, np.ndarray] | None:
        if "weights" not in body:
            return None
        try:
            return unpack_tensors(body["weights"], "weights")
        except PayloadError as exc:
            raise RequestError(str(exc)) from None

    def load_global(self, net, weights) -> None:
        """Start `net` from the global weights of the request (refused: none sent, or a misfit)."""
        from learning.nets import ArchitectureError, set_weights

        if weights is None:
            raise RequestError("this method needs the global weights in every round")
        try:
            set_weights(net, weights)
        except ArchitectureError as exc:
            raise RequestError(str(exc)) from None

    def seed(self) -> int:
        return int(self.rng.integers(2**31 - 1))

    def optimizer(self, net):
        import torch

        return torch.optim.Adam(net.parameters(), lr=self.config.lr)

    extra_keys: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def build(self, body: dict, features: int) -> dict:
        """Build the networks from the setup body; return metrics (e.g. private_parameters)."""

    @abstractmethod
    def train_round(self, weights) -> tuple[dict, dict]:
        """One round of local training from the received weights: (tensors to send, metrics)."""

    @abstractmethod
    def evaluate(self, weights) -> dict:
        """Test-split metrics of the final models (weights: the final global ones, if any)."""
