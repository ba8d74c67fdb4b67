"""Two interchangeable ways to run a scenario's sessions (FEDERATIONS, by backend name), both
the one pump of coordinator.driver over a transport and a clock (transport.base, transport.clock).

ProcessFederation: this process is the coordinator (a ZeroMQ ROUTER, real time) and every site
is its own OS process (a DEALER) -- the real system. InProcessFederation: the same pump over the
in-memory transport (transport.memory) on a virtual clock, with the same site (sites.memory over
sites.reply) and shuffler (shuffler.memory over shuffler.core) code as the processes run -- so
the same events, faults, attacks and network, in milliseconds and in network time.

To add a backend: subclass `Federation`, build a `Coordinator` over your transport and clock in
`__init__`, and implement `start`, `open_trial` and `close`; what the harness reads is declared
on the base class.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path

from coordinator.adversary import Adversary
from coordinator.driver import Coordinator
from coordinator.events import EventLog
from protocol.methods import Method, Outcome
from protocol.wire import SHUFFLER_ID
from runner.outputs import RunDirectory
from runner.limits import coordinator_descriptors
from runner.processes import ShufflerProcess, SiteHosts, placement
from scenarios.spec import RunSpec
from sites.host import descriptors_needed, raise_open_files
from sites.local import SiteLocal
from sites.memory import MemorySite
from shuffler.memory import MemoryShuffler
from sites.storage import GroupCommit, write_trial
from sites.trials import TrialCache
from transport.channel import COORDINATOR_ID, RouterChannel, send_as_strangers
from transport.emulation import LinkEmulator
from transport.kernel_links import KernelLinks
from transport.faults import FaultInjector
from transport.base import Transport
from transport.clock import RealClock, VirtualClock
from transport.ledger import Ledger
from transport.memory import MemoryTransport, Packer
from transport.registry import REGISTRY_FILE, write_registry
from transport.security import COORDINATOR_KEY, generate_keys, load_public_key, load_server_keys, write_site_publics
from protocol.secagg.identity import identities_in_memory


class Federation(ABC):
    """What the harness (runner.study) reads of a backend; a backend implements the three
    abstract methods and builds its `coordinator` (the pump) in `__init__`."""

    events: EventLog  # the run's event log
    ledger: Ledger  # the run's communication ledger
    coordinator: Coordinator  # the pump
    adversary: Adversary | None = None  # the scenario's attacks, when it has any
    placed: dict | None = None  # how the sites were placed (summary.json), once started
    kernel = None  # the run's kernel links (transport.kernel_links), when it has them

    @abstractmethod
    def start(self) -> list[str]:
        """Bring the sites up; the ones present."""

    @abstractmethod
    def open_trial(self, trial: int, world) -> dict[str, int]:
        """Place each site's shard, then the join: {site: n_j} of those that joined."""

    @abstractmethod
    def close(self) -> None:
        """Release the sites, the transport and whatever the backend started."""

    @property
    def channel(self) -> Transport:
        return self.coordinator.transport

    @property
    def devices(self) -> dict[str, str]:
        """Where each site that joined scored (its join's device)."""
        return self.coordinator.devices

    @property
    def transcripts(self) -> list | None:
        """(trial, label, transcript) of every session the coordinator ran, when kept."""
        return self.coordinator.transcripts

    @transcripts.setter
    def transcripts(self, kept: list | None) -> None:
        self.coordinator.transcripts = kept

    def run_method(self, trial: int, index: int, method: Method, sizes: dict[str, int], label: str) -> Outcome:
        return self.coordinator.run_method(trial, index, method, sizes, label)

    def attack_rows(self) -> list[dict] | None:
        """attacks.csv's rows (what every attacked site did, what each attack found), or None."""
        return None if self.adversary is None else [record.row() for record in self.adversary.records]


class ProcessFederation(Federation):
    """The coordinator's driver here; the sites in their own processes, started by us (site hosts
    on this machine or Ray actors, as the run's launcher says) or, with `external_sites`, by hand
    on other hosts (`run.py site`). `fired`: coordinator-kill faults already carried out (a
    resumed run)."""

    def __init__(self, run: RunSpec, rundir: RunDirectory, *, fired=frozenset(), external_sites: bool = False) -> None:
        # what the run says, first; then the machinery, from the top of the house down
        runtime = run.runtime
        self.site_ids, self.seed, self.shuffled = run.site_ids, run.seed, run.shuffled
        self.launcher = None if external_sites else runtime.launcher
        on_ray = self.launcher is not None and self.launcher["kind"] == "ray"
        self.placement = placement(len(self.site_ids), runtime.sites_per_process)
        self._ray_connected = False
        bind, self._shuffler_bind = runtime.bind, runtime.shuffler_bind
        if on_ray:
            from runner import ray_hosts

            self._ray_connected = ray_hosts.connect(self.launcher["address"])
            bind, self._shuffler_bind = (ray_hosts.reachable_bind(b) for b in (bind, self._shuffler_bind))
        #: network.mode: kernel: the run's namespace, veth pair and qdiscs (transport.kernel_links); the
        #: coordinator and the shuffler bind this end of the veth pair, the sites connect from theirs
        self.kernel = KernelLinks(run.network, self.site_ids).open() if run.network.kernel else None
        if self.kernel is not None:
            bind, self._shuffler_bind = self.kernel.bind(bind), self.kernel.bind(self._shuffler_bind)
        key_dir = (Path(runtime.keys) if runtime.keys else rundir.path / "keys") if runtime.security == "curve" else None
        #: what every site host serves with (the coordinator's and the shuffler's endpoints are set
        #: once bound); a Ray host builds its sites' data itself, as a host away from the harness does
        self.service = run.site_service("", rundir.work, key_dir=key_dir, builds_world=on_ray)
        # a run's own hosts make their sites' key pairs in memory and send the public halves; with a
        # shuffler they read its key from the registry this launcher writes for them (_register)
        self.service = replace(self.service, keys_in_memory=key_dir is not None and not external_sites,
                               start_timeout=runtime.deadlines.hello,
                               registry=str(key_dir / REGISTRY_FILE) if key_dir and not external_sites else None)
        if self.kernel is not None:
            self.service = replace(self.service, netns=self.kernel.namespace, sources=self.kernel.addresses)
        #: the scenario's attacks of the coordinator on its own sites (coordinator.adversary)
        self.adversary = Adversary(list(run.attacks), run.labels, run.seed) if run.attacks else None
        self.events = EventLog(rundir.events)  # the run's event log (coordinator.events)
        # Before anything starts: can this machine hold the connections? (else: what to change)
        raise_open_files(coordinator_descriptors(len(self.site_ids), 0 if external_sites or on_ray else
                                                 self.placement.processes), "the coordinator")
        if not external_sites and not on_ray:
            raise_open_files(descriptors_needed(self.placement.sites_per_process * (2 if run.shuffled else 1)),
                             f"a site host of {self.placement.sites_per_process} sites", check_only=True)
        keys = None
        if key_dir is not None:
            # The harness makes the coordinator's key pair only: the run's own hosts (local or on
            # Ray) make their sites' in memory and send the public halves (transport.security), the
            # shuffler its own (_register); hosts and a shuffler started by hand by their operators
            # send SITE.key and shuffler.key, which the coordinator's operator puts in key_dir
            generate_keys(key_dir, [])
            keys = load_server_keys(key_dir, [*self.site_ids, *([SHUFFLER_ID] if run.shuffled else [])]
                                    if external_sites else [])
        self._key_dir = key_dir
        self.ledger = Ledger(rundir.ledger, keep_rows=False)  # in ledger.csv, not in memory (summed as flushed)
        self._channel = RouterChannel(bind, keys=keys)
        faults = FaultInjector(list(run.fault_rules), COORDINATOR_ID, run.seed, skip=fired) if run.fault_rules else None
        #: the scenario's network, applied at the coordinator's socket and the shuffler's
        self.links = LinkEmulator(run.network) if run.network.emulated or run.network.kernel else None
        self.coordinator = Coordinator(self._channel, self.events, runtime.deadlines, self.ledger, faults,
                                       adversary=self.adversary, seeded_noise=run.seeded_noise,
                                       max_n=runtime.max_n, links=self.links, forge=self._forge)
        self.service = replace(self.service, coordinator=self._channel.endpoint)
        self._shuffler_dial: tuple[str, bytes | None] | None = None  # its endpoint and public key
        self.shuffler = None  # the shuffler's process (runner.processes.ShufflerProcess), once started
        self._site_publics: dict | None = None  # the public keys our hosts made and sent (_admit)
        self._signing: dict[str, bytes] = {}  # and their signing keys (Z85), for the registry
        self._shuffler_public: bytes | None = None  # the key the shuffler made (_register; None: plain)
        self._hello_timeout = runtime.deadlines.hello
        self._logs, self._work = rundir.logs, rundir.work
        self._log_dir = None if external_sites else rundir.logs  # where the sites we start log
        self.processes = None
        self.placed: dict | None = None  # how the sites were placed (summary.json), once started
        self.present: list[str] = []

    def start(self) -> list[str]:
        self.events.write("coordinator_start", pid=os.getpid(), endpoint=self._channel.endpoint,
                          security="curve" if self._channel.curve else "plain")
        if self.kernel is not None:
            self.events.write("kernel_links", **self.kernel.describe())
        on_ray = self._log_dir is not None and self.launcher["kind"] == "ray"
        # sites started by hand: the shuffler is their operators' too (`run.py shuffler`), not started here
        if on_ray:
            from runner.ray_hosts import RayHosts

            self.processes = RayHosts(self.site_ids, self.service, self._log_dir, launcher=self.launcher,
                                      events=self.events, on_lost=self._channel.report_lost,
                                      shuffled=self.shuffled, start_timeout=self._hello_timeout)
            self.processes.start(self._admit)
            self.placed = {"processes": len(self.processes.sites),
                           "sites_per_process": max(map(len, self.processes.sites.values())), "why": self.processes.why}
            self.events.write("placement", sites=len(self.site_ids), **self.placed, pids=self.processes.pids(),
                              nodes=self.processes.nodes())
        elif self._log_dir is not None:
            self.processes = SiteHosts(self.site_ids, self.service, self._log_dir,
                                       sites_per_process=self.placement.sites_per_process)
            self.processes.start(self._admit)
            self.placed = {"processes": len(self.processes.processes),
                           "sites_per_process": self.placement.sites_per_process, "why": self.placement.why}
            self.events.write("placement", sites=len(self.site_ids), **self.placed, pids=self.processes.pids())
        self.present = self.coordinator.await_members(self.site_ids, shuffler=self.shuffled)
        return self.present

    def _admit(self, publics: dict[str, bytes]) -> str | None:
        """The hosts made their sites' key pairs: admit the public halves and record them
        (KEY_DIR/sites.public), then start the shuffler, whose allow-list they become through the
        registry (_register); its endpoint, or None."""
        signing = {site: pair[1] for site, pair in publics.items()}
        publics = {site: pair[0] for site, pair in publics.items()}
        for site, public in publics.items():
            self._channel.allow(public, site)
        self._signing = signing
        if publics:
            write_site_publics(self._key_dir, publics)
            made_by = "ray hosts" if self.launcher["kind"] == "ray" else "site hosts (local processes)"
            self.events.write("keys", made_by=made_by, sites=len(publics), directory=str(self._key_dir),
                              note="each host made its sites' key pairs in memory; the coordinator holds the "
                                   "public halves only (sites.public)")
        self._site_publics = publics or None
        if self.shuffled:
            return self._start_shuffler()
        if self.service.registry:  # the sites' signing keys, for their secure sums (issue 48)
            self._write_registry(None)
        return None

    def _start_shuffler(self) -> str:
        """The shuffler's process, which makes its own key pair (runner.processes.shuffler_main);
        its endpoint once it serves under the registry `_register` wrote."""
        self.shuffler = ShufflerProcess(self._shuffler_bind, self._channel.endpoint, self._logs,
                                        secure=self._key_dir is not None, site_count=len(self.site_ids),
                                        links=self.links)
        endpoint = self.shuffler.start(self._register)
        self.events.write("shuffler_start", pid=self.shuffler.process.pid, endpoint=endpoint)
        self._shuffler_dial = (endpoint, self._shuffler_public)  # the sybil attack dials it as sites do
        return endpoint

    def _forge(self, sealed: dict[str, dict], session: int) -> None:
        """The sybil attack's senders: each dials the shuffler under a key pair of the
        coordinator's own making and sends its sealed message (transport.channel)."""
        if self._shuffler_dial is not None:
            send_as_strangers(*self._shuffler_dial, "sealed", session, sealed)

    def _register(self, shuffler_public: bytes) -> Path:
        """This launcher playing the operators' part (transport.registry), as only a local run
        can: admit the public key the shuffler made on the coordinator's allow-list, and write the
        party registry (the coordinator's, the shuffler's and the sites' public keys) that the
        shuffler takes its allow-list from and the sites the shuffler's key."""
        self._channel.allow(shuffler_public, SHUFFLER_ID)
        self._shuffler_public = shuffler_public
        return self._write_registry(shuffler_public)

    def _write_registry(self, shuffler_public: bytes | None) -> Path:
        path = write_registry(self.service.registry, coordinator=load_public_key(self._key_dir, COORDINATOR_KEY),
                              shuffler=shuffler_public, sites=self._site_publics or {}, signing=self._signing)
        self.events.write("registry", path=str(path), parties=1 + (shuffler_public is not None)
                          + len(self._site_publics or {}),
                          note="written by the launcher, playing the operators' part on this one machine; the "
                               "sites made their key pairs (and signing keys) in their own processes"
                               + (", the shuffler its own" if shuffler_public is not None else ""))
        return path

    def open_trial(self, trial: int, world) -> dict[str, int]:
        """Place each site's shard on its storage (sites we started), then the join phase: each
        present site's n_j (dropouts are logged)."""
        if self._log_dir is not None:  # sites started by hand build their own data
            write_trial(self._work, trial, world.model, world.shards, world.record_ids)
        if self.adversary is not None:  # what the scenario made: the attacks test releases against it
            self.adversary.truth = world.site_scores
        return self.coordinator.open_trial(trial, self.seed, self.present)[0]

    def close(self) -> None:
        self.coordinator.shutdown()
        if self.processes is not None:
            self.processes.stop()
            self.events.write("sites_stopped", exit_codes=self.processes.exit_codes())
        if self.shuffler is not None:
            self.shuffler.stop()
            self.events.write("shuffler_stopped", exit_code=self.shuffler.process.exitcode)
        self._channel.close()
        if self.kernel is not None:
            self.kernel.close()
        if self._ray_connected:
            import ray

            ray.shutdown()


class InProcessFederation(Federation):
    """The same pump over the in-memory transport, on a virtual clock (`runtime.clock: real`: in
    real time): no processes, no sockets; the same messages (packed, sized, checked), events,
    faults, attacks and network as the processes backend. Sites' answers leave at once (same
    events, same order, every run), or, under an emulated network, after the time each took to
    compute (network time)."""

    def __init__(self, run: RunSpec, rundir: RunDirectory, *, fired=frozenset(), external_sites: bool = False) -> None:
        """`fired` and `external_sites` concern processes; in-process there are none."""
        if any(rule.action == "kill_coordinator" for rule in run.fault_rules):
            raise ValueError("a kill_coordinator fault ends the coordinator's process: use the processes backend")
        if run.network.kernel:
            raise ValueError("network.mode kernel puts site processes behind the kernel's links: use the processes "
                             "backend (an emulated network runs in-process, in network time)")
        self.events = EventLog(rundir.events)  # the run's event log (coordinator.events)
        self.work = rundir.work
        self.site_ids, self.seed, self.shuffled = run.site_ids, run.seed, run.shuffled
        trials = TrialCache(rundir.work, run.site_ids)  # the model loaded once per trial for all sites
        # this process plays every operator: one signing key per site, one registry of them (none
        # under runtime.security plain, as over processes: no registry, no active secure sum)
        curve = run.runtime.security == "curve"
        identities = identities_in_memory(run.site_ids) if curve else {site: None for site in run.site_ids}
        self.clock = RealClock() if run.runtime.clock == "real" else VirtualClock()
        emulated = run.network.emulated
        # under links (or in real time) an answer leaves when its site has computed it
        self.commit = commit = GroupCommit()  # the sites' accounts made durable together, before any answer is seen
        self.transport = MemoryTransport(self.clock, service_time=emulated or not self.clock.virtual, curve=curve,
                                         durable=commit.flush)
        rules = list(run.fault_rules)
        self.sites = {}
        for site in run.site_ids:
            local = SiteLocal(site, rundir.work, budget=run.budget, trials=trials, policy=run.policy,
                              identity=identities[site], commit=commit)
            peer = MemorySite(local, FaultInjector(rules, site, run.seed) if rules else None, shuffler=run.shuffled)
            self.sites[site] = local
            self.transport.attach(peer, peer.hello(self.clock.now()))
        if run.shuffled:
            # runtime.security plain: no registry, so no allow-list at the shuffler (debugging only)
            admitted = None if run.runtime.security == "plain" else frozenset(run.site_ids)
            self.shuffler = MemoryShuffler(admitted,
                                           LinkEmulator(run.network, started=0.0) if emulated else None, curve=curve)
            self.transport.attach(self.shuffler, self.shuffler.hello(self.clock.now()))
        self.adversary = Adversary(list(run.attacks), run.labels, run.seed) if run.attacks else None
        self.ledger = Ledger(rundir.ledger, keep_rows=False)
        self.coordinator = Coordinator(self.transport, self.events, run.runtime.deadlines, self.ledger,
                                       FaultInjector(rules, COORDINATOR_ID, run.seed) if rules else None,
                                       adversary=self.adversary, seeded_noise=run.seeded_noise,
                                       max_n=run.runtime.max_n,
                                       links=LinkEmulator(run.network, started=0.0) if emulated else None,
                                       clock=self.clock, forge=self._forge)

    def start(self) -> list[str]:
        self.events.write("coordinator_start", pid=os.getpid(), endpoint=self.transport.endpoint,
                          security="memory", clock="virtual" if self.clock.virtual else "real")
        return self.coordinator.await_members(self.site_ids, shuffler=self.shuffled)

    def open_trial(self, trial: int, world) -> dict[str, int]:
        """Place each site's shard on its storage, then the join."""
        write_trial(self.work, trial, world.model, world.shards, world.record_ids)
        if self.adversary is not None:  # what the scenario made: the attacks test releases against it
            self.adversary.truth = world.site_scores
        return self.coordinator.open_trial(trial, self.seed, self.site_ids)[0]

    def _forge(self, sealed: dict[str, dict], session: int) -> None:
        """The sybil attack's senders, in memory: parties the registry does not hold."""
        for name, payload in sealed.items():
            self.transport.inject(name, SHUFFLER_ID, Packer(name).pack("sealed", session, payload))

    def close(self) -> None:
        self.coordinator.shutdown()
        self.commit.flush()
        self.transport.close()


#: the backends: how a run's sites are reached, by name (run.py run --backend, quorum.run(backend=...))
FEDERATIONS = {"processes": ProcessFederation, "inprocess": InProcessFederation}
