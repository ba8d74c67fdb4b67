"""A run, typed: the validated scenario as the values each part of a run needs, made once.

    run = RunSpec.of(scenario)      # a validated scenario mapping (quorum.Scenario.spec gives one)
    run.world                       # world.trial.WorldSpec: what every trial's world is made from
    run.methods                     # ((label, Method), ...): built and checked once
    run.runtime                     # Runtime: sockets, security, deadlines, placement, launcher
    run.site_service(...)           # sites.service.SiteService: what a site host serves with
    run.fault_rules                 # transport.faults.FaultRule: the faults, their sites drawn once
    run.network                     # transport.links.Network: each site's link and availability

A site host, a trial's world and a Ray actor each get one of these values, never the scenario
mapping and a dozen keywords; `mapping` is the scenario as run (scenario.yaml, and what a resumed
run must match).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from coordinator.driver import Deadlines
from protocol.methods import METHODS, Method
from protocol.noise import NOT_PRIVATE
from scenarios.scenario import method_params, plugin_paths, validate_scenario
from sites.service import SiteService
from transport.faults import FaultRule, resolve_rules
from transport.links import Network, network_of
from world.trial import WorldSpec


@dataclass(frozen=True)
class Runtime:
    """The scenario's `runtime`: how the run's processes meet."""

    bind: str  # the coordinator's address (a port of `*` is chosen at bind)
    shuffler_bind: str
    security: str  # "curve" or "plain"
    keys: str  # a key directory, or "" for new keys in the run directory
    sites_per_process: int | str  # a number, or "auto" (runner.processes.placement)
    launcher: Mapping[str, Any]  # kind (local, ray), address, hosts, resources
    max_n: int  # the largest n_j a site may join with
    deadlines: Deadlines
    clock: str = "auto"  # auto | virtual | real (transport.clock)

    @classmethod
    def of(cls, runtime: Mapping[str, Any]) -> "Runtime":
        return cls(runtime["bind"], runtime["shuffler_bind"], runtime["security"], runtime["keys"],
                   runtime["placement"]["sites_per_process"], runtime["launcher"], runtime["max_n"],
                   Deadlines(**runtime["deadlines"]), runtime["clock"])


@dataclass(frozen=True)
class RunSpec:
    name: str
    trials: int
    seed: int
    alpha: float
    world: WorldSpec
    methods: tuple[tuple[str, Method], ...]  # (label, method) in the scenario's order
    budget: Mapping[str, Any]  # each site's privacy budget (protocol.accounting)
    policy: Mapping[str, Any]  # what each site serves (protocol.policy), in a local run
    runtime: Runtime
    faults: tuple[Mapping[str, Any], ...]
    fault_rules: tuple[FaultRule, ...]  # the faults with their sites drawn (once, from the seed)
    attacks: tuple[Mapping[str, Any], ...]
    network: Network  # the sites' links and availability (transport.links); loopback by default
    mapping: Mapping[str, Any]  # the validated scenario: what scenario.yaml holds

    @classmethod
    def of(cls, scenario: "RunSpec | Mapping[str, Any]") -> "RunSpec":
        """The typed run of a validated scenario mapping (validated again if it is not: a
        mapping with defaults filled in validates to itself)."""
        if isinstance(scenario, RunSpec):
            return scenario
        s = validate_scenario(dict(scenario))
        methods = tuple((m["label"], METHODS[m["name"]](s["alpha"], **method_params(m))) for m in s["methods"])
        world = WorldSpec.of(s)
        rules = resolve_rules(s["faults"], world.site_ids, s["seed"], [label for label, _ in methods])
        return cls(s["name"], s["trials"], s["seed"], s["alpha"], world, methods, s["sites"]["budget"],
                   s["sites"]["policy"], Runtime.of(s["runtime"]), tuple(s["faults"]), tuple(rules),
                   tuple(s["attacks"]), network_of(s["network"], world.site_ids, s["seed"]), s)

    @property
    def site_ids(self) -> list[str]:
        return self.world.site_ids

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self.methods]

    @property
    def families(self) -> list[type]:
        """The result families of its methods (results.csv's columns)."""
        return [method.result for _, method in self.methods]

    @property
    def seeded_noise(self) -> bool:
        """The sites' policy says `noise: seeded`: releases are replayable, hence not private."""
        return self.policy["noise"] == "seeded"

    @property
    def noise(self) -> str:
        """Where the sites' privacy noise comes from, in words (results.csv's `noise`)."""
        return NOT_PRIVATE if self.seeded_noise else "os"

    @property
    def shuffled(self) -> bool:
        """Some method's answers go through a shuffler process."""
        return any(method.codec_class().route == "shuffler" for _, method in self.methods)

    @property
    def fedcp_qq_planner(self) -> tuple[str, int]:
        """(planner, dropouts) of its first fedcp_qq entry, or the defaults: the plan whose orders
        proposition 3.4's bound is about (runner.heterogeneity)."""
        first = next((m for m in self.mapping["methods"] if m["name"] == "fedcp_qq"), {})
        return first.get("planner", "auto"), first.get("dropouts", 0)

    def site_service(self, coordinator: str, workdir: Path | str, *, key_dir: Path | str | None = None,
                     shuffler: str | None = None, builds_world: bool = False, idle_timeout: float | None = None,
                     policy: Mapping | None = None, budget: Mapping | None = None) -> SiteService:
        """What a host serves this run's sites with. builds_world: the host builds the trials'
        data itself (started away from the harness); policy, budget: a site operator's own
        (`run.py site --policy`), else the scenario's."""
        return SiteService(coordinator, str(workdir), str(key_dir) if key_dir else None, shuffler,
                           self.fault_rules, self.seed, self.budget if budget is None else budget,
                           self.policy if policy is None else policy, plugin_paths(self.mapping),
                           self.world if builds_world else None, idle_timeout)
