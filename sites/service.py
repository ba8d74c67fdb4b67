"""What a site host serves its sites with: one value, whoever starts the host.

The harness (runner.processes.SiteHosts), a Ray actor (runner.ray_hosts) and an operator's own
`run.py site` all hand a host the same `SiteService`, alongside the ids of the sites it serves;
the host needs nothing else. It holds no secret: a site's key pair is in the memory of the host that made it
(`keys_in_memory`), or in an operator's own `key_dir`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:  # a site process imports the world (data, models) only when it builds one
    from world.trial import WorldSpec


@dataclass(frozen=True)
class SiteService:
    coordinator: str  # the coordinator's endpoint, e.g. tcp://127.0.0.1:5555
    workdir: str  # where the sites keep their shards, model copies and privacy accounts
    key_dir: str | None = None  # CurveZMQ key pairs (None: plain TCP, or keys made in memory on Ray)
    shuffler: str | None = None  # the shuffler's endpoint, where shuffled codecs send sealed answers
    fault_rules: tuple = ()  # the scenario's resolved fault rules (transport.faults); each site applies its own
    seed: int = 0  # the scenario seed (faults' draws; privacy noise only under `noise: seeded`)
    budget: Mapping[str, Any] | None = None  # each site's privacy budget (protocol.accounting)
    policy: Mapping[str, Any] | None = None  # what each site serves (protocol.policy); None: the strictest
    plugins: Mapping[str, list[str]] = field(default_factory=dict)  # import paths to load before serving
    world: WorldSpec | None = None  # build each trial's data here (a host away from the harness)
    idle_timeout: float | None = None  # exit after this many seconds without a message
    #: kernel links (transport.kernel_links): the network namespace the host enters before it
    #: connects, and each site's own address there, which its connections leave from
    netns: str | None = None
    sources: Mapping[str, str] | None = None
    #: each host makes its sites' key pairs in memory when it starts and sends the public halves to
    #: its launcher (a run's own hosts); they read only the coordinator's public key from key_dir
    keys_in_memory: bool = False
    start_timeout: float = 300.0  # how long a starting host waits for its launcher's go-ahead
    #: the party registry (transport.registry): the only place a site learns the shuffler's public key
    registry: str | None = None

    def endpoints(self, site_id: str) -> tuple[str, str | None]:
        """Where the site connects: (the coordinator's endpoint, the shuffler's or None), from
        its own address under kernel links."""
        if not self.sources:
            return self.coordinator, self.shuffler
        from transport.kernel_links import from_address

        source = self.sources[site_id]
        return (from_address(self.coordinator, source),
                from_address(self.shuffler, source) if self.shuffler else None)

    def with_shuffler(self, endpoint: str | None) -> "SiteService":
        return replace(self, shuffler=endpoint)

    def in_workdir(self, workdir: str) -> "SiteService":
        return replace(self, workdir=str(workdir))
