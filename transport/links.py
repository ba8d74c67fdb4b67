"""Networks you can script: each site's link (latency, jitter, bandwidth up and down, loss) and
when the site is online, as a scenario's `network:` section says (issue 39).

The model of one site's link, each direction a first-in first-out queue:

    start    = max(t, the direction free at)      one message on the link at a time
    free at  = start + 8 B / R                    serialization of B wire bytes at the direction's R bit/s
    arrival  = max(free at + L + J, last arrival) propagation L, jitter J (normal, sd `jitter`,
                                                   cut at -L); a link never reorders
and a message is lost (dropped, never arrives) with probability `loss`. B is the message's ZMTP
wire size, the ledger's (transport.ledger). The runtime applies the model at the coordinator's
socket (the shuffler's, for sealed answers): what a site sends is held there until its arrival,
what is sent to a site leaves the socket at its arrival, so every placement (site processes,
site hosts, Ray) and every site started by hand sees the same links (transport.emulation).

Availability: a site is online when its windows say so (seconds of the network's clock, `period`
repeating them, e.g. 86400 for a day) or its trace does; a site asked while offline is a dropout
with the reason `offline`. The network's clock runs `clock.scale` trace seconds per run second
from `clock.start`, so a run of minutes can cross a trace's day.

Traces (CSV or JSON) give per-site latency, bandwidth and availability over time (piecewise
constant from each row's `t` on); `fedscale_trace` converts FedScale's device and behaviour
traces (docs/networks.md).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from stats.randomness import stable_key

#: A link profile's fields (the spec language): one-way latency and jitter in milliseconds,
#: bandwidth in Mbit/s (0: unlimited), loss as the probability that a message is dropped
PROFILE_FIELDS = {
    "latency_ms": {"type": "float", "ge": 0, "finite": True, "default": 0.0},
    "jitter_ms": {"type": "float", "ge": 0, "finite": True, "default": 0.0},
    "up_mbps": {"type": "float", "ge": 0, "finite": True, "default": 0.0},
    "down_mbps": {"type": "float", "ge": 0, "finite": True, "default": 0.0},
    "loss": {"type": "float", "ge": 0, "lt": 1, "default": 0.0},
}

#: Named profiles, one-way figures (half the round trip). Sources, for the medians they take:
#:   datacentre  a round trip of 0.5 ms within one data centre (J. Dean's "latency numbers every
#:               programmer should know"), 10 Gbit/s ports
#:   broadband   the FCC's Measuring Broadband America fixed reports (12th and 13th, 2021-2022):
#:               cable and fibre idle latency of 10-25 ms round trip, median tiers of 100 Mbit/s
#:               down and 10-20 up; 20 ms round trip, 100/20 Mbit/s
#:   mobile-4g   Ookla's Speedtest US reports: mobile carriers' average latency 31-39 ms round
#:               trip, median download about 30 Mbit/s, upload about 8; 36 ms, 30/8 Mbit/s
#:   mobile-3g   HSPA as ITU IMT-2000 specifies and operators measured it: 2 Mbit/s down, 0.5 up,
#:               about 150 ms round trip
#:   hospital-vpn  issue 39's example, a hospital VPN with 80 ms of round trip; 50/50 Mbit/s
#:   satellite-geo a geostationary hop, 4 x 35,786 km at the speed of light (477 ms) plus
#:               processing: the FCC reports' satellite latency of about 600 ms round trip, 25/3 Mbit/s
PRESETS: dict[str, dict[str, float]] = {
    "loopback": {},
    "datacentre": {"latency_ms": 0.25, "jitter_ms": 0.05, "up_mbps": 10_000, "down_mbps": 10_000},
    "broadband": {"latency_ms": 10.0, "jitter_ms": 2.0, "up_mbps": 20, "down_mbps": 100},
    "mobile-4g": {"latency_ms": 18.0, "jitter_ms": 5.0, "up_mbps": 8, "down_mbps": 30},
    "mobile-3g": {"latency_ms": 75.0, "jitter_ms": 15.0, "up_mbps": 0.5, "down_mbps": 2},
    "hospital-vpn": {"latency_ms": 40.0, "jitter_ms": 2.0, "up_mbps": 50, "down_mbps": 50},
    "satellite-geo": {"latency_ms": 300.0, "jitter_ms": 10.0, "up_mbps": 3, "down_mbps": 25},
}

NETWORK_FIELDS = {
    "profiles": {"type": "any", "default": {}},  # name -> PROFILE_FIELDS, beside the presets
    "default": {"type": "str", "default": "loopback"},  # the profile of a site no rule names
    "links": {"type": "list", "of": {"type": "map", "fields": {
        "sites": {"type": "any", "default": "all"},  # all | site-003 | [..] | {fraction, seed}
        "profile": {"type": "str", "default": None},
        "mix": {"type": "any", "default": None},  # {profile: weight, ...}: each site draws one (seeded)
        "seed": {"type": "int", "min": 0, "default": 0},
    }}, "default": []},
    "availability": {"type": "list", "of": {"type": "map", "fields": {
        "sites": {"type": "any", "default": "all"},
        "online": {"type": "list", "of": {"type": "list", "of": {"type": "float", "finite": True}, "min_len": 2,
                                          "max_len": 2}, "min_len": 1},
        "period": {"type": "float", "gt": 0, "finite": True, "default": None},
    }}, "default": []},
    "traces": {"type": "str", "default": None},  # a CSV or JSON file of per-site traces
    "clock": {"type": "map", "fields": {
        "scale": {"type": "float", "gt": 0, "finite": True, "default": 1.0},  # trace seconds per run second
        "start": {"type": "float", "finite": True, "default": 0.0},  # the trace second the run starts at
    }},
    "seed": {"type": "int", "min": 0, "default": 0},  # jitter and loss draws
    # emulated: at the coordinator's socket (transport.emulation); kernel: real Linux links, htb and
    # netem in a network namespace the run makes (transport.kernel_links), to check the emulation
    "mode": {"type": "str", "choices": ["emulated", "kernel"], "default": "emulated"},
}


@dataclass(frozen=True)
class Profile:
    """One link's figures, in seconds and bit/s (0: unlimited)."""

    name: str
    latency: float = 0.0
    jitter: float = 0.0
    up: float = 0.0
    down: float = 0.0
    loss: float = 0.0

    @classmethod
    def of(cls, name: str, fields: Mapping[str, float]) -> "Profile":
        f = {**{k: v["default"] for k, v in PROFILE_FIELDS.items()}, **fields}
        return cls(name, f["latency_ms"] / 1e3, f["jitter_ms"] / 1e3, f["up_mbps"] * 1e6, f["down_mbps"] * 1e6,
                   f["loss"])

    @property
    def emulated(self) -> bool:
        """Whether the link differs from loopback at all."""
        return bool(self.latency or self.jitter or self.up or self.down or self.loss)

    def rate(self, direction: str) -> float:
        return self.up if direction == "up" else self.down

    def as_fields(self) -> dict[str, float]:
        return {"latency_ms": self.latency * 1e3, "jitter_ms": self.jitter * 1e3, "up_mbps": self.up / 1e6,
                "down_mbps": self.down / 1e6, "loss": self.loss}


def serialization_seconds(nbytes: int, rate: float) -> float:
    """The time to put `nbytes` on a link of `rate` bit/s: 8 B / R (0 for an unlimited link)."""
    return 8.0 * nbytes / rate if rate > 0 else 0.0


def transfer_seconds(nbytes: int, profile: Profile, direction: str) -> float:
    """An idle link's delivery time for one message, without jitter: L + 8 B / R."""
    return profile.latency + serialization_seconds(nbytes, profile.rate(direction))


@dataclass(frozen=True)
class Availability:
    """When a site is online: windows [start, end) of the network clock, repeating every
    `period` seconds when set; None windows: always online."""

    windows: tuple[tuple[float, float], ...] | None = None
    period: float | None = None

    def online(self, t: float) -> bool:
        if self.windows is None:
            return True
        at = t % self.period if self.period else t
        return any(start <= at < end for start, end in self.windows)


@dataclass(frozen=True)
class TraceStep:
    """From network-clock second `t` on (until the next step): the link's figures and whether
    the site is online (None: as the profile and windows say)."""

    t: float
    profile: Profile | None
    online: bool | None


class Network:
    """The links of a run's sites: which profile each has, when each is online, the clock."""

    def __init__(self, profiles: Mapping[str, Profile], assigned: Mapping[str, str],
                 availability: Mapping[str, Availability] | None = None,
                 traces: Mapping[str, list[TraceStep]] | None = None, scale: float = 1.0, start: float = 0.0,
                 seed: int = 0, mode: str = "emulated") -> None:
        self.profiles, self.assigned = dict(profiles), dict(assigned)
        self.mode = mode  # "emulated" (at the coordinator's socket) or "kernel" (transport.kernel_links)
        self.availability = dict(availability or {})
        self.traces = {site: sorted(steps, key=lambda s: s.t) for site, steps in (traces or {}).items()}
        self.scale, self.start, self.seed = scale, start, seed

    @property
    def emulated(self) -> bool:
        """Whether any site's link or availability is anything but loopback, always online."""
        return (any(self.profile(site).emulated for site in self.assigned) or bool(self.availability)
                or bool(self.traces))

    @property
    def kernel(self) -> bool:
        """Whether real kernel links carry the sites' traffic (mode: kernel)."""
        return self.mode == "kernel"

    def clock(self, run_seconds: float) -> float:
        """The network clock (trace seconds) at `run_seconds` since the run began."""
        return self.start + self.scale * run_seconds

    def _step(self, site: str, at: float) -> TraceStep | None:
        steps = self.traces.get(site)
        if not steps:
            return None
        index = int(np.searchsorted([s.t for s in steps], at, side="right")) - 1
        return steps[index] if index >= 0 else None

    def profile(self, site: str, at: float | None = None) -> Profile:
        """The site's link at network-clock second `at` (its trace's, else its profile)."""
        step = self._step(site, at) if at is not None else None
        if step is not None and step.profile is not None:
            return step.profile
        return self.profiles[self.assigned.get(site, "loopback")]

    def online(self, site: str, at: float) -> bool:
        step = self._step(site, at)
        if step is not None and step.online is not None:
            return step.online
        return self.availability.get(site, Availability()).online(at)

    def describe(self) -> dict[str, Any]:
        """summary.json's `network`: each profile used, its figures and how many sites have it."""
        counts: dict[str, int] = {}
        for site in self.assigned:
            counts[self.assigned[site]] = counts.get(self.assigned[site], 0) + 1
        return {"emulated": self.emulated, "mode": self.mode,
                "profiles": {name: {**self.profiles[name].as_fields(), "sites": n} for name, n in sorted(counts.items())},
                "availability": {"sites_with_windows": len(self.availability),
                                 "sites_with_traces": len(self.traces)},
                "clock": {"scale": self.scale, "start": self.start}}

    def rng(self, site: str, direction: str) -> np.random.Generator:
        """The jitter and loss draws of one site's direction (seeded: runs reproduce)."""
        return np.random.default_rng([self.seed, stable_key(site), stable_key(direction)])


def profile_table(custom: Mapping[str, Mapping[str, float]] | None = None) -> dict[str, Profile]:
    """The presets and a scenario's own profiles (which may not take a preset's name)."""
    table = {name: Profile.of(name, fields) for name, fields in PRESETS.items()}
    for name, fields in (custom or {}).items():
        table[name] = Profile.of(name, fields)
    return table


def network_of(spec: Mapping[str, Any] | None, site_ids: list[str], scenario_seed: int = 0,
               base: Path | None = None) -> Network:
    """The Network a validated `network:` section describes for these sites (None: loopback)."""
    from transport.faults import resolve_sites

    spec = spec or {"profiles": {}, "default": "loopback", "links": [], "availability": [], "traces": None,
                    "clock": {"scale": 1.0, "start": 0.0}, "seed": 0, "mode": "emulated"}
    profiles = profile_table(spec["profiles"])
    assigned = {site: spec["default"] for site in site_ids}
    for index, rule in enumerate(spec["links"]):
        chosen = resolve_sites(rule["sites"], site_ids, scenario_seed, 1000 + index)
        chosen = site_ids if chosen is None else sorted(chosen)
        if rule["profile"] is not None:
            assigned.update({site: rule["profile"] for site in chosen})
        else:
            names, weights = zip(*sorted(rule["mix"].items()))
            draws = np.random.default_rng([rule["seed"], index]).choice(
                len(names), size=len(chosen), p=np.asarray(weights, dtype=float) / sum(weights))
            assigned.update({site: names[d] for site, d in zip(chosen, draws)})
    availability = {}
    for index, rule in enumerate(spec["availability"]):
        chosen = resolve_sites(rule["sites"], site_ids, scenario_seed, 2000 + index)
        windows = Availability(tuple((float(a), float(b)) for a, b in rule["online"]), rule["period"])
        availability.update({site: windows for site in (site_ids if chosen is None else chosen)})
    traces = read_traces(Path(spec["traces"]) if base is None else base / spec["traces"], profiles) \
        if spec["traces"] else {}
    return Network(profiles, assigned, availability, traces, spec["clock"]["scale"], spec["clock"]["start"],
                   spec["seed"], spec.get("mode", "emulated"))


def network_problems(spec: Mapping[str, Any], site_ids: list[str]):
    """What is wrong in a `network:` section whose fields passed NETWORK_FIELDS (each a (field,
    expectation, got) triple): profiles that are not profiles or take a preset's name, unknown
    profile names, a rule naming no profile or both, weights, windows, sites out of range, a
    trace file that does not read."""
    from specs.schema import ScenarioError, validate

    custom = spec["profiles"]
    if not isinstance(custom, dict):
        yield "profiles", "a map of name -> {latency_ms, jitter_ms, up_mbps, down_mbps, loss}", custom
        return
    for name, fields in custom.items():
        if name in PRESETS:
            yield f"profiles.{name}", f"a name other than a preset's ({', '.join(PRESETS)})", name
            continue
        try:
            validate({"type": "map", "fields": PROFILE_FIELDS}, fields, f"profiles.{name}")
        except ScenarioError as exc:
            yield exc.field, exc.expectation, exc.got
    known = [*PRESETS, *custom]
    if spec["default"] not in known:
        yield "default", f"a profile: {', '.join(known)}", spec["default"]
    for index, rule in enumerate(spec["links"]):
        where = f"links[{index}]"
        yield from _sites_problems(rule["sites"], site_ids, f"{where}.sites")
        if (rule["profile"] is None) == (rule["mix"] is None):
            yield where, "either a profile or a mix ({profile: weight, ...})", {k: rule[k] for k in ("profile", "mix")}
        elif rule["profile"] is not None and rule["profile"] not in known:
            yield f"{where}.profile", f"a profile: {', '.join(known)}", rule["profile"]
        elif rule["mix"] is not None:
            mix = rule["mix"]
            if (not isinstance(mix, dict) or not mix or any(name not in known for name in mix)
                    or not all(isinstance(w, (int, float)) and not isinstance(w, bool) and w >= 0 for w in mix.values())
                    or sum(mix.values()) <= 0):
                yield f"{where}.mix", f"a map of profile -> weight >= 0, weights not all 0 (profiles: {', '.join(known)})", mix
    for index, rule in enumerate(spec["availability"]):
        where = f"availability[{index}]"
        yield from _sites_problems(rule["sites"], site_ids, f"{where}.sites")
        for number, (start, end) in enumerate(rule["online"]):
            if not start < end or (rule["period"] is not None and not 0 <= start < end <= rule["period"]):
                span = f"0 <= start < end <= period ({rule['period']:g})" if rule["period"] is not None else "start < end"
                yield f"{where}.online[{number}]", f"a window [start, end) with {span}", [start, end]
    if spec["traces"] is not None:
        try:
            traces = read_traces(Path(spec["traces"]))
        except ValueError as exc:
            yield "traces", f"a trace file that reads ({exc})", spec["traces"]
        else:
            unknown = sorted(set(traces) - set(site_ids))
            if unknown:
                yield "traces", f"traces of this scenario's sites ({site_ids[0]} ... {site_ids[-1]})", unknown[:3]
            elif spec.get("mode") == "kernel" and any(step.profile is not None for steps in traces.values()
                                                      for step in steps):
                yield "traces", ("traces of availability only under mode: kernel (a kernel link keeps its profile "
                                 "for the whole run; traces that change latency or bandwidth need mode: emulated)"), \
                    spec["traces"]


def _sites_problems(selector, site_ids: list[str], where: str):
    """A rule's `sites`, as a fault rule's: all, an id, a list of ids, {fraction, seed}."""
    if selector == "all":
        return
    names = [selector] if isinstance(selector, str) else selector if isinstance(selector, list) else None
    if names is not None:
        bad = [n for n in names if n not in site_ids]
        if bad or not names:
            yield where, f"site ids of this scenario ({site_ids[0]} ... {site_ids[-1]})", bad or names
    elif not (isinstance(selector, dict) and set(selector) <= {"fraction", "seed"}
              and isinstance(selector.get("fraction"), (int, float)) and 0 < selector["fraction"] <= 1):
        yield where, "all, a site id, a list of ids, or {fraction: (0, 1], seed}", selector


TRACE_COLUMNS = ("site", "t", "online", "latency_ms", "jitter_ms", "up_mbps", "down_mbps", "loss")


def read_traces(path: Path, profiles: Mapping[str, Profile] | None = None) -> dict[str, list[TraceStep]]:
    """Per-site traces from a CSV (columns TRACE_COLUMNS; `site` and `t` required, an empty cell
    keeps the site's profile value) or a JSON file ({site: [{t, ...}, ...]}). ValueError naming
    the file, the row and the field of any mistake."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such trace file")
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a map of site -> list of steps")
        rows = [{"site": site, **step} for site, steps in data.items() for step in steps]
    else:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
    traces: dict[str, list[TraceStep]] = {}
    for number, row in enumerate(rows, start=1):
        unknown = set(row) - set(TRACE_COLUMNS)
        if unknown:
            raise ValueError(f"{path}: row {number}: unknown field(s) {sorted(unknown)} (known: {', '.join(TRACE_COLUMNS)})")
        traces.setdefault(str(row["site"]), []).append(_trace_step(path, number, row))
    return traces


def _trace_step(path: Path, number: int, row: Mapping[str, Any]) -> TraceStep:
    def number_of(field):
        value = row.get(field)
        if value in (None, ""):
            return None
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{path}: row {number}: field '{field}': expected a number, got {value!r}") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{path}: row {number}: field '{field}': expected a finite number >= 0, got {value!r}")
        return value

    t = number_of("t")
    if t is None:
        raise ValueError(f"{path}: row {number}: field 't': expected a time in seconds (required)")
    online = row.get("online")
    if online not in (None, ""):
        if str(online).lower() not in ("0", "1", "true", "false"):
            raise ValueError(f"{path}: row {number}: field 'online': expected 0/1 or true/false, got {online!r}")
        online = str(online).lower() in ("1", "true")
    else:
        online = None
    figures = {field: number_of(field) for field in ("latency_ms", "jitter_ms", "up_mbps", "down_mbps", "loss")}
    if figures["loss"] is not None and figures["loss"] >= 1:
        raise ValueError(f"{path}: row {number}: field 'loss': expected a probability below 1, got {figures['loss']}")
    given = {k: v for k, v in figures.items() if v is not None}
    return TraceStep(t, Profile.of(f"trace:{row['site']}", given) if given else None, online)


def fedscale_trace(behaviour: Mapping[Any, Mapping[str, Any]], capacity: Mapping[Any, Mapping[str, Any]] | None,
                   site_ids: list[str], latency_ms: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    """FedScale's traces as Quorum's JSON trace (docs/networks.md): FedScale's `client_behave_trace`
    maps a client to {"active": [times it came online], "inactive": [times it went offline],
    "finish_time": its trace's end} in seconds; its `client_device_capacity` maps a client to
    {"communication": kbit/s, ...}. The i-th site takes the i-th client (sorted by id): an
    online step at each active time and an offline one at each inactive time, with the client's
    bandwidth both ways (FedScale gives one figure) and `latency_ms` (FedScale gives none)."""
    clients = sorted(behaviour, key=lambda c: (str(type(c)), c))
    if len(clients) < len(site_ids):
        raise ValueError(f"the behaviour trace has {len(clients)} clients for {len(site_ids)} sites")
    out = {}
    for site, client in zip(site_ids, clients):
        record = behaviour[client]
        mbps = None
        if capacity is not None and client in capacity and "communication" in capacity[client]:
            mbps = float(capacity[client]["communication"]) / 1e3
        steps = [{"t": float(t), "online": 1} for t in record.get("active", [])]
        steps += [{"t": float(t), "online": 0} for t in record.get("inactive", [])]
        steps.sort(key=lambda s: s["t"])
        if mbps is not None or latency_ms:
            figures = {"latency_ms": latency_ms, **({"up_mbps": mbps, "down_mbps": mbps} if mbps is not None else {})}
            if not steps or steps[0]["t"] > 0:
                steps.insert(0, {"t": 0.0, "online": 0 if record.get("active") else 1})
            steps = [{**step, **figures} for step in steps]
        out[site] = steps
    return out


def with_profile(network: Network, name: str | Profile) -> Network:
    """The same sites, availability and clock, every site on one profile (prediction)."""
    profile = name if isinstance(name, Profile) else network.profiles[name]
    profiles = {**network.profiles, profile.name: profile}
    return Network(profiles, {site: profile.name for site in network.assigned}, network.availability,
                   network.traces, network.scale, network.start, network.seed)  # predicted: emulated


__all__ = ["Availability", "NETWORK_FIELDS", "Network", "PRESETS", "PROFILE_FIELDS", "Profile", "TraceStep",
           "fedscale_trace", "network_of", "profile_table", "read_traces", "serialization_seconds",
           "transfer_seconds", "with_profile"]
