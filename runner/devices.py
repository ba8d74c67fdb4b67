"""Where a run computed: the sites' scoring, the harness's model training, the sites' training.

Three places compute with a model in a run, each on a device of its own:

  scoring         each site scores its calibration rows with the trial's model in its own
                  process, on the device that process resolved (`model.device: auto` is CUDA
                  where that host has it); the site says which when it joins (the `join`
                  payload's `device`)
  model_training  the harness fits the trial's model once per trial (world.trial) on
                  `model.device`; "none" for a model that fits nothing (`examples`,
                  `two_sample`: models.base.DataOnly)
  site_training   the sites of a learning method (FedType, FML, FedProto, FedAvg, local
                  training, Δ-FL) train on the method's `device`; each reports it in its
                  setup answer and the coordinator half counts them (`training_devices` in the
                  result's details); "none" for a method that trains nothing

Each is described by `describe(counts)`: "cpu", "cuda", "none" or "mixed (cpu 7, cuda 3)".
summary.json's `devices`, results.csv's `device` column, the terminal's sites line and
trace.json's `otherData.devices` all come from here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping


def describe(counts: Mapping[str, int]) -> str:
    """'none' (nothing ran), the one device, or 'mixed (cpu 7, cuda 3)' with the counts."""
    counts = {str(device): int(n) for device, n in counts.items() if n}
    if not counts:
        return "none"
    if len(counts) == 1:
        return next(iter(counts))
    return "mixed (" + ", ".join(f"{device} {n}" for device, n in sorted(counts.items())) + ")"


def count(devices: Mapping[str, str]) -> dict[str, int]:
    """{site: device} -> {device: number of sites}."""
    return dict(sorted(Counter(devices.values()).items()))


def training_counts(details: Mapping) -> dict[str, int]:
    """{device: sites} that trained in one session, from its result's details (empty: it trained nothing)."""
    counts = details.get("training_devices") if isinstance(details, Mapping) else None
    if not isinstance(counts, Mapping):
        return {}
    return {str(device): int(n) for device, n in counts.items() if isinstance(n, (int, float)) and n > 0}


def session_device(scoring: Mapping[str, int], model: str, training: Mapping[str, int]) -> str:
    """results.csv's `device` cell for one session: 'scoring=cpu; model_training=cpu; site_training=none'."""
    return f"scoring={describe(scoring)}; model_training={model}; site_training={describe(training)}"


class DeviceTally:
    """What a run's trials and sessions said about their devices, for summary.json's `devices`."""

    def __init__(self) -> None:
        self.scoring: dict[str, set[str]] = {}  # site -> devices it scored on over the trials
        self.model: Counter = Counter()  # device -> trials whose model the harness trained on it
        self.training: dict[str, Counter] = {}  # method label -> device -> most sites in one session

    def trial(self, site_devices: Mapping[str, str], model: str) -> None:
        for site, device in site_devices.items():
            self.scoring.setdefault(site, set()).add(device)
        if model != "none":
            self.model[model] += 1

    def session(self, label: str, training: Mapping[str, int]) -> None:
        if not training:
            return
        seen = self.training.setdefault(label, Counter())
        for device, n in training.items():
            seen[device] = max(seen[device], n)

    def summary(self) -> dict:
        """summary.json's `devices`: each place's device in words and its counts (scoring: sites
        per device over the run; model training: trials per device; site training: per device, the
        most sites that trained on it in one session, over the run and per method)."""
        scoring = Counter(device for devices in self.scoring.values() for device in devices)
        training = Counter()
        for seen in self.training.values():
            for device, n in seen.items():
                training[device] = max(training[device], n)
        return {
            "scoring": {"device": describe(scoring), "sites": dict(sorted(scoring.items()))},
            "model_training": {"device": describe(self.model), "trials": dict(sorted(self.model.items()))},
            "site_training": {"device": describe(training), "sites": dict(sorted(training.items())),
                              "methods": {label: describe(seen) for label, seen in self.training.items()}},
        }


def devices_words(devices: Mapping) -> str:
    """The terminal's words: 'scored on cpu; model trained on cpu; sites trained on mixed (cpu 2, cuda 1)'."""
    words = [f"scored on {devices['scoring']['device']}"]
    if devices["model_training"]["device"] != "none":
        words.append(f"model trained on {devices['model_training']['device']}")
    if devices["site_training"]["device"] != "none":
        words.append(f"sites trained on {devices['site_training']['device']}")
    return "; ".join(words)
