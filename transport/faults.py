"""Scripted faults, applied by the generic drivers (never inside methods).

A scenario's `faults:` list holds rules; each names an action, where it applies and when:

    action     crash | kill_host | straggle | delay | drop | duplicate | reorder | corrupt | kill_coordinator
    sites      all (default) | site-003 | [site-001, site-007] | {fraction: 0.2, seed: 1}
               (with direction: down, `shuffler` names the coordinator's messages to the shuffler,
               e.g. a delayed batch_open; `all` never includes it)
    trials     all (default) | 3 | [0, 4]
    phase      join | respond | ... (default: any)        method   a method's label (default: any)
    direction  up (site -> coordinator, default) | down (coordinator -> site)
    probability  of applying to each matching message (default 1)
    seconds    for delay and reorder (default 1)           mode     corrupt: bytes | truncate | types | content

Site behaviour (applied by the site driver when it is asked something that matches):
  crash     the site ends instead of answering: its connections close at once and it never
            answers again (a site alone in its process kills the process, SIGKILL)
  kill_host the site's whole host process kills itself (SIGKILL): every site it serves is gone
  straggle  the site stays alive and never answers
  delay     the answer leaves `seconds` late
Message faults (applied to the outgoing messages of the matching side):
  drop, duplicate, reorder (held back until the next message from the same side, or `seconds`),
  corrupt (bytes: a few random bytes changed; truncate: cut short; types: a payload value
  replaced by one of another type; content: one byte flipped inside a binary payload value,
  e.g. a sealed ciphertext; the message otherwise well formed in the last two).
kill_coordinator: the coordinator process kills itself when the matching phase begins.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import msgpack
import numpy as np

from protocol.sessions import method_index
from protocol.wire import CHECKSUM_BYTES, SHUFFLER_ID, seal
from stats.randomness import stable_key

SITE_ACTIONS = ("crash", "kill_host", "straggle", "delay")
MESSAGE_ACTIONS = ("drop", "duplicate", "reorder", "corrupt")
ACTIONS = SITE_ACTIONS + MESSAGE_ACTIONS + ("kill_coordinator",)

FAULT_FIELDS = {
    "action": {"type": "str", "choices": list(ACTIONS)},
    "sites": {"type": "any", "default": "all"},
    "trials": {"type": "any", "default": "all"},
    "phase": {"type": "str", "default": None},
    "method": {"type": "str", "default": None},
    "direction": {"type": "str", "choices": ["up", "down"], "default": "up"},
    "probability": {"type": "float", "ge": 0, "le": 1, "default": 1.0},
    "seconds": {"type": "float", "ge": 0, "default": 1.0},
    "mode": {"type": "str", "choices": ["bytes", "truncate", "types", "content"], "default": "bytes"},
}


@dataclass(frozen=True)
class FaultRule:
    index: int
    action: str
    sites: frozenset[str] | None  # None: every site
    trials: frozenset[int] | None  # None: every trial
    phase: str | None
    method: str | None  # the label, as the scenario names it
    method_index: int | None  # its place in the scenario's methods: what a session number tells
    direction: str
    probability: float
    seconds: float
    mode: str

    def applies(self, trial, phase, session, site=None) -> bool:
        """Whether the rule concerns a message of this trial, phase and session (whose number
        tells the method, protocol.sessions) to or from `site`."""
        return ((self.trials is None or trial in self.trials) and (self.phase is None or phase == self.phase)
                and (self.method_index is None or method_index(session) == self.method_index)
                and (site is None or (self.sites is None and site != SHUFFLER_ID)
                     or (self.sites is not None and site in self.sites)))


def resolve_rules(specs: list[dict], site_ids: list[str], seed: int, labels: list[str]) -> list[FaultRule]:
    """Turn validated fault entries into rules with concrete site sets (fractions drawn once);
    `labels`: the scenario's method labels in order, which a rule's `method` names."""
    rules = []
    for index, spec in enumerate(specs):
        method = spec["method"]
        if method is not None and method not in labels:
            raise ValueError(f"faults[{index}].method: {method!r} is not one of the labels {list(labels)}")
        rules.append(FaultRule(index, spec["action"], resolve_sites(spec["sites"], site_ids, seed, index),
                               _resolve_trials(spec["trials"]), spec["phase"], method,
                               None if method is None else list(labels).index(method), spec["direction"],
                               spec["probability"], spec["seconds"], spec["mode"]))
    return rules


def resolve_sites(selector, site_ids: list[str], seed: int, index: int) -> frozenset[str] | None:
    if selector == "all":
        return None
    if isinstance(selector, str):
        return frozenset([selector])
    if isinstance(selector, list):
        return frozenset(selector)
    count = int(round(selector["fraction"] * len(site_ids)))
    rng = np.random.default_rng([selector.get("seed", seed), index, 0xFA17])
    return frozenset(rng.choice(site_ids, size=count, replace=False).tolist())


def _resolve_trials(selector) -> frozenset[int] | None:
    if selector == "all":
        return None
    return frozenset([selector] if isinstance(selector, int) else selector)


def check_fault(spec: dict, site_ids: list[str], path: str) -> str | None:
    """A reason why a validated entry cannot apply to these sites, or None."""
    sites = spec["sites"]
    if spec["direction"] == "down" and spec["action"] in MESSAGE_ACTIONS + ("delay",):
        site_ids = [*site_ids, SHUFFLER_ID]  # the coordinator's messages to the shuffler can be hit too
    if isinstance(sites, str) and sites != "all" and sites not in site_ids:
        return f"{path}.sites: a site id of this scenario ({site_ids[0]} ... {site_ids[-1]}), got {sites!r}"
    if isinstance(sites, list) and (not sites or any(s not in site_ids for s in sites)):
        return f"{path}.sites: expected known site ids, got {sites!r}"
    if isinstance(sites, dict):
        fraction = sites.get("fraction")
        if set(sites) - {"fraction", "seed"} or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            return f"{path}.sites: expected {{fraction: 0..1, seed: int}}, got {sites!r}"
    if not (isinstance(sites, (str, list, dict))):
        return f"{path}.sites: expected 'all', a site id, a list or {{fraction, seed}}, got {sites!r}"
    trials = spec["trials"]
    if not (trials == "all" or (isinstance(trials, int) and trials >= 0) or
            (isinstance(trials, list) and all(isinstance(t, int) and t >= 0 for t in trials))):
        return f"{path}.trials: expected 'all', a trial number or a list of them, got {trials!r}"
    if spec["action"] in SITE_ACTIONS and spec["direction"] == "down" and spec["action"] != "delay":
        return f"{path}.direction: {spec['action']} is a site behaviour, direction must be 'up'"
    return None


class FaultInjector:
    """The faults one party (a site id, or "coordinator") applies to what it sends."""

    def __init__(self, rules: list[FaultRule], party: str, seed: int, skip=frozenset()) -> None:
        self.party = party
        self.rules = [r for r in rules if r.index not in skip]
        self.rngs = {r.index: np.random.default_rng([seed, r.index, stable_key(party)]) for r in self.rules}
        self.held: list[tuple[float, bytes, str | None]] = []  # reordered: (release time, data, peer)
        self.fired: list[tuple[FaultRule, dict]] = []  # what happened, for the log

    def _draw(self, rule: FaultRule) -> bool:
        return rule.probability >= 1 or self.rngs[rule.index].random() < rule.probability

    def behaviour(self, trial, phase, session) -> tuple[str, float] | None:
        """Site side: ("crash"|"kill_host"|"straggle"|"delay", seconds) for a request it is about to answer."""
        for rule in self.rules:
            if rule.action in SITE_ACTIONS and rule.direction == "up" and rule.applies(trial, phase, session, self.party):
                if self._draw(rule):
                    self.fired.append((rule, {"trial": trial, "phase": phase}))
                    return rule.action, rule.seconds
        return None

    def kill_coordinator(self, trial, phase, session) -> FaultRule | None:
        for rule in self.rules:
            if rule.action == "kill_coordinator" and rule.applies(trial, phase, session) and self._draw(rule):
                return rule
        return None

    def transform(self, data: bytes, now: float, trial, phase, session, peer=None):
        """What actually leaves, as (earliest send time, bytes, peer); a held message is released
        right after the next one that leaves. `peer` is the destination site of the coordinator's
        messages (None for a site's own)."""
        site = peer if peer is not None else self.party
        direction = "down" if peer is not None else "up"
        out = [(now, data, peer)]
        for rule in self.rules:
            if rule.direction != direction or not rule.applies(trial, phase, session, site):
                continue
            if rule.action == "delay" and direction == "down" and self._draw(rule):
                self.fired.append((rule, {"trial": trial, "phase": phase, "site": site}))
                out = [(t + rule.seconds, d, p) for t, d, p in out]
            elif rule.action in MESSAGE_ACTIONS and self._draw(rule):
                self.fired.append((rule, {"trial": trial, "phase": phase, "site": site}))
                out = self._apply(rule, out, now)
        if out and self.held:
            latest = max(t for t, _, _ in out)
            out += [(latest, d, p) for _, d, p in self.held]
            self.held = []
        return out

    def due(self, now: float):
        """Held messages whose release time has come (no later message came to carry them)."""
        ready = [(t, d, p) for t, d, p in self.held if t <= now]
        self.held = [h for h in self.held if h[0] > now]
        return ready

    def next_release(self) -> float | None:
        return min((t for t, _, _ in self.held), default=None)

    def _apply(self, rule, out, now):
        rng = self.rngs[rule.index]
        if rule.action == "drop":
            return []
        if rule.action == "duplicate":
            return out + out
        if rule.action == "reorder":
            self.held.extend((now + rule.seconds, d, p) for _, d, p in out)
            return []
        return [(t, corrupt(d, rule.mode, rng), p) for t, d, p in out]


def corrupt(data: bytes, mode: str, rng: np.random.Generator) -> bytes:
    if mode == "truncate":
        return data[: int(rng.integers(1, len(data)))]
    if mode in ("types", "content"):
        obj = msgpack.unpackb(data[:-CHECKSUM_BYTES], raw=False)
        (_retype if mode == "types" else _flip_binary)(obj, rng)
        return seal(msgpack.packb(obj, use_bin_type=True))
    damaged = bytearray(data)
    for position in rng.choice(len(damaged), size=min(len(damaged), int(rng.integers(1, 5))), replace=False):
        damaged[position] ^= int(rng.integers(1, 256))
    return bytes(damaged)


_ODD_VALUES = ["text", None, True, 3, -7, 2.5, [1, 2], {"x": 1}, b"\x00\x01", 2**63 - 1]


def _retype(obj, rng) -> None:
    """Replace one randomly chosen value inside the envelope's payload by one of another type."""
    target, key = obj, "p"
    while isinstance(target.get(key) if isinstance(target, dict) else None, dict) and target[key] and rng.random() < 0.7:
        target = target[key]
        key = list(target)[int(rng.integers(len(target)))]
    current = target[key]
    choices = [v for v in _ODD_VALUES if type(v) is not type(current)]
    target[key] = choices[int(rng.integers(len(choices)))]


def _flip_binary(obj, rng) -> None:
    """Flip one byte of the first binary value found in the payload (depth first); a message
    without one is left as it was."""
    stack = [(obj, "p")]
    while stack:
        parent, key = stack.pop()
        value = parent[key]
        if isinstance(value, bytes) and value:
            damaged = bytearray(value)
            damaged[int(rng.integers(len(damaged)))] ^= int(rng.integers(1, 256))
            parent[key] = bytes(damaged)
            return
        if isinstance(value, dict):
            stack.extend((value, k) for k in reversed(list(value)))
        elif isinstance(value, list):
            stack.extend((value, i) for i in reversed(range(len(value))))


def kill_self() -> None:
    """Die as a crashed process would: no cleanup, no goodbye."""
    os.kill(os.getpid(), signal.SIGKILL)
