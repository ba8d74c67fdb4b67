"""Two interchangeable ways to run a scenario's sessions (FEDERATIONS, by backend name).

ProcessFederation: this process is the coordinator (a ZeroMQ ROUTER) and every site is its own
OS process (a DEALER) -- the real system. InProcessFederation: the same site-side code
(sites.local) called directly -- for tests that compare the two, and for quick studies.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from coordinator.adversary import Adversary
from coordinator.driver import Coordinator
from coordinator.events import EventLog
from protocol.inprocess import drive
from protocol.methods import Method, Outcome
from protocol.engine import Session, join_problem
from protocol.sessions import join_session, method_session
from protocol.wire import SHUFFLER_ID
from runner.outputs import RunDirectory
from runner.limits import coordinator_descriptors
from runner.processes import ShufflerProcess, SiteHosts, placement
from scenarios.spec import RunSpec
from sites.host import descriptors_needed, raise_open_files
from sites.local import SiteLocal
from sites.storage import write_trial
from sites.trials import TrialCache
from stats.randomness import site_rng
from transport.channel import COORDINATOR_ID, RouterChannel
from transport.emulation import LinkEmulator
from transport.kernel_links import KernelLinks
from transport.faults import FaultInjector
from transport.ledger import Ledger
from transport.registry import REGISTRY_FILE, write_registry
from transport.security import COORDINATOR_KEY, generate_keys, load_public_key, load_server_keys, write_site_publics
from protocol.noise import coordinator_rng
from protocol.secagg.identity import identities_in_memory


class ProcessFederation:
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
        self.channel = RouterChannel(bind, keys=keys)
        faults = FaultInjector(list(run.fault_rules), COORDINATOR_ID, run.seed, skip=fired) if run.fault_rules else None
        #: the scenario's network, applied at the coordinator's socket and the shuffler's
        self.links = LinkEmulator(run.network) if run.network.emulated or run.network.kernel else None
        self.coordinator = Coordinator(self.channel, self.events, runtime.deadlines, self.ledger, faults,
                                       adversary=self.adversary, seeded_noise=run.seeded_noise,
                                       max_n=runtime.max_n, links=self.links)
        self.service = replace(self.service, coordinator=self.channel.endpoint)
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
        self.events.write("coordinator_start", pid=os.getpid(), endpoint=self.channel.endpoint,
                          security="curve" if self.channel.curve else "plain")
        if self.kernel is not None:
            self.events.write("kernel_links", **self.kernel.describe())
        on_ray = self._log_dir is not None and self.launcher["kind"] == "ray"
        # sites started by hand: the shuffler is their operators' too (`run.py shuffler`), not started here
        if on_ray:
            from runner.ray_hosts import RayHosts

            self.processes = RayHosts(self.site_ids, self.service, self._log_dir, launcher=self.launcher,
                                      events=self.events, on_lost=self.channel.report_lost,
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
            self.channel.allow(public, site)
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
        self.shuffler = ShufflerProcess(self._shuffler_bind, self.channel.endpoint, self._logs,
                                        secure=self._key_dir is not None, site_count=len(self.site_ids),
                                        links=self.links)
        endpoint = self.shuffler.start(self._register)
        self.events.write("shuffler_start", pid=self.shuffler.process.pid, endpoint=endpoint)
        if self.adversary is not None:  # the sybil attack dials the shuffler as the sites do
            self.coordinator.shuffler_dial = (endpoint, self._shuffler_public)
        return endpoint

    def _register(self, shuffler_public: bytes) -> Path:
        """This launcher playing the operators' part (transport.registry), as only a local run
        can: admit the public key the shuffler made on the coordinator's allow-list, and write the
        party registry (the coordinator's, the shuffler's and the sites' public keys) that the
        shuffler takes its allow-list from and the sites the shuffler's key."""
        self.channel.allow(shuffler_public, SHUFFLER_ID)
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

    def attack_rows(self) -> list[dict] | None:
        """attacks.csv's rows (what every attacked site did, what each attack found), or None."""
        return None if self.adversary is None else [record.row() for record in self.adversary.records]

    @property
    def devices(self) -> dict[str, str]:
        return getattr(self.coordinator, "devices", {})

    def run_method(self, trial: int, index: int, method: Method, sizes: dict[str, int], label: str) -> Outcome:
        return self.coordinator.run_method(trial, index, method, sizes, label)

    @property
    def transcripts(self) -> list | None:
        """(trial, label, transcript) of every session the coordinator ran, when kept."""
        return self.coordinator.transcripts

    @transcripts.setter
    def transcripts(self, kept: list | None) -> None:
        self.coordinator.transcripts = kept

    def close(self) -> None:
        self.coordinator.shutdown()
        if self.processes is not None:
            self.processes.stop()
            self.events.write("sites_stopped", exit_codes=self.processes.exit_codes())
        if self.shuffler is not None:
            self.shuffler.stop()
            self.events.write("shuffler_stopped", exit_code=self.shuffler.process.exitcode)
        self.channel.close()
        if self.kernel is not None:
            self.kernel.close()
        if self._ray_connected:
            import ray

            ray.shutdown()


class InProcessFederation:
    """No sockets, hence no wire and an empty ledger."""

    def __init__(self, run: RunSpec, rundir: RunDirectory, *, fired=frozenset(), external_sites: bool = False) -> None:
        """`fired` and `external_sites` concern site processes; in-process there are none."""
        self.events = EventLog(rundir.events)  # the run's event log (coordinator.events)
        self.work = rundir.work
        trials = TrialCache(rundir.work, run.site_ids)  # the model loaded once per trial for all sites
        # this process plays every operator: one signing key per site, one registry of them
        identities = identities_in_memory(run.site_ids)
        self.sites = {site: SiteLocal(site, rundir.work, budget=run.budget, trials=trials, policy=run.policy,
                                      identity=identities[site]) for site in run.site_ids}
        self.seeded_noise = run.seeded_noise
        self.ledger = Ledger()
        self.seed = run.seed
        self.max_n = run.runtime.max_n  # the largest n_j a site may join with (runtime.max_n)
        self.devices: dict[str, str] = {}
        self.transcripts: list | None = None  # (trial, label, transcript) of every session, when kept

    def start(self) -> list[str]:
        return list(self.sites)

    def open_trial(self, trial: int, world) -> dict[str, int]:
        """Place each site's shard on its storage, then the join phase, by the rule the socket
        driver applies (protocol.engine.join_problem)."""
        write_trial(self.work, trial, world.model, world.shards, world.record_ids)
        sizes = {}
        for site, local in self.sites.items():
            n = local.open_trial(trial, self.seed)
            problem = join_problem(n, self.max_n)
            if problem:
                self.events.write("dropout", site=site, session=join_session(trial), phase="join", reason=problem)
            else:
                sizes[site] = n
        self.devices = {site: local.device for site, local in self.sites.items()}
        return sizes

    def attack_rows(self) -> None:
        """No attacks in-process (they need site processes)."""
        return None

    def run_method(self, trial: int, index: int, method: Method, sizes: dict[str, int], label: str) -> Outcome:
        session_id = method_session(trial, index)

        def ask(site, phase, body):
            return self.sites[site].answer(session_id, method.name, phase, body)

        session = Session(method, sizes, coordinator_rng(site_rng(self.seed, trial, session_id, COORDINATOR_ID),
                                                         self.seeded_noise))
        self.events.write("session_start", **session.opening(trial, session_id, label))
        outcome = drive(method, sizes, ask, session.rng, session=session)
        for record in session.transcript:
            for site, reason in record.dropped.items():
                self.events.write("dropout", site=site, session=session_id, phase=record.phase, reason=reason)
        if self.transcripts is not None:
            self.transcripts.append((trial, label, session.transcript))
        self.events.write("session_end", **session.closing(trial, session_id, label))
        return outcome

    def close(self) -> None:
        """Nothing to release: the in-process sites hold no processes or sockets."""


#: the backends: how a run's sites are reached, by name (run.py run --backend, quorum.run(backend=...))
FEDERATIONS = {"processes": ProcessFederation, "inprocess": InProcessFederation}
