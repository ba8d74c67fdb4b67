"""Two interchangeable ways to run a scenario's sessions.

ProcessFederation: this process is the coordinator (a ZeroMQ ROUTER) and every site is its own
OS process (a DEALER) -- the real system. InProcessFederation: the same site-side code
(sites.local) called directly -- for tests that compare the two, and for quick studies.
"""

from __future__ import annotations

import os
from pathlib import Path

from coordinator.driver import Coordinator, Deadlines
from coordinator.events import EventLog
from protocol.inprocess import drive
from protocol.methods import Method, Outcome
from protocol.engine import Session, join_problem
from protocol.sessions import join_session, method_session
from protocol.wire import SHUFFLER_ID
from runner.processes import ShufflerProcess, SiteHosts, placement
from scenarios.scenario import plugin_paths
from sites.host import descriptors_needed, raise_open_files
from sites.local import SiteLocal
from sites.trials import TrialCache
from stats.randomness import site_rng
from transport.channel import COORDINATOR_ID, RouterChannel
from transport.faults import FaultInjector
from transport.ledger import Ledger
from transport.security import load_server_keys, write_public_key
from protocol.noise import coordinator_rng
from protocol.policy import SitePolicy


class ProcessFederation:
    """The coordinator's driver here; the sites in their own processes, started by us
    (`local_sites`) or by hand on other hosts (`run.py site`)."""

    def __init__(self, site_ids: list[str], workdir: Path, log_dir: Path, events: EventLog,
                 runtime: dict, ledger: Ledger, *, key_dir: Path | None = None, fault_rules=(),
                 seed: int = 0, fired=frozenset(), local_sites: bool = True, shuffler: bool = False,
                 budget: dict | None = None, scenario: dict | None = None, policy: dict | None = None,
                 adversary=None) -> None:
        self.site_ids, self.events, self.ledger = site_ids, events, ledger
        self.placement = placement(len(site_ids), runtime["placement"]["sites_per_process"])
        self.launcher = runtime["launcher"] if local_sites else None
        on_ray = self.launcher is not None and self.launcher["kind"] == "ray"
        # Before anything starts: can this machine hold the connections? (else: what to change)
        raise_open_files(descriptors_needed(len(site_ids) + 1, per_socket=1), "the coordinator")
        if local_sites and not on_ray:
            raise_open_files(descriptors_needed(self.placement.sites_per_process * (2 if shuffler else 1)),
                             f"a site host of {self.placement.sites_per_process} sites", check_only=True)
        self._ray_connected = False
        bind, shuffler_bind = runtime["bind"], runtime["shuffler_bind"]
        if on_ray:
            from runner import ray_hosts

            self._ray_connected = ray_hosts.connect(self.launcher["address"])
            bind, shuffler_bind = (ray_hosts.reachable_bind(b) for b in (bind, shuffler_bind))
        # Ray hosts make their sites' key pairs when they start (allowed then, in start())
        keys = load_server_keys(key_dir, [SHUFFLER_ID] if on_ray else [*site_ids, SHUFFLER_ID]) if key_dir else None
        self._key_dir = key_dir
        self.channel = RouterChannel(bind, keys=keys)
        faults = FaultInjector(list(fault_rules), COORDINATOR_ID, seed, skip=fired) if fault_rules else None
        self.coordinator = Coordinator(self.channel, events, Deadlines(**runtime["deadlines"]), ledger, faults,
                                       adversary=adversary,
                                       seeded_noise=SitePolicy.from_spec(policy).seeded if policy else False,
                                       max_n=runtime["max_n"])
        self.shuffler = (ShufflerProcess(shuffler_bind, self.channel.endpoint, log_dir, key_dir=key_dir,
                                         site_ids=site_ids) if shuffler else None)
        self._site_args = dict(key_dir=key_dir, fault_rules=fault_rules, seed=seed, budget=budget, policy=policy,
                               plugins=plugin_paths(scenario) if scenario is not None else None)
        self._scenario, self._hello_timeout = scenario, runtime["deadlines"]["hello"]
        self._site_dirs = (workdir, log_dir) if local_sites else None
        self.processes = None
        self.placed: dict | None = None  # how the sites were placed (summary.json), once started
        self.present: list[str] = []

    def start(self) -> list[str]:
        self.events.write("coordinator_start", pid=os.getpid(), endpoint=self.channel.endpoint,
                          security="curve" if self.channel.curve else "plain")
        endpoint = None
        on_ray = self._site_dirs is not None and self.launcher["kind"] == "ray"
        if self.shuffler is not None and not on_ray:
            endpoint = self._start_shuffler()
        if on_ray:
            from runner.ray_hosts import RayHosts

            def before_serve(publics: dict[str, bytes]) -> str | None:
                """The hosts made their sites' key pairs: admit the public halves, then start the
                shuffler (which reads them from the key directory)."""
                for site, public in publics.items():
                    write_public_key(self._key_dir, site, public)
                    self.channel.allow(public, site)
                if publics:
                    self.events.write("keys", made_by="ray hosts", sites=len(publics),
                                      note="each host made its sites' key pairs; the coordinator holds public keys only")
                return self._start_shuffler() if self.shuffler is not None else None

            self.processes = RayHosts(self.site_ids, self.channel.endpoint, *self._site_dirs, launcher=self.launcher,
                                      events=self.events, on_lost=self.channel.report_lost,
                                      shuffler=self.shuffler is not None, scenario=self._scenario,
                                      start_timeout=self._hello_timeout, **self._site_args)
            self.processes.start(before_serve)
            self.placed = {"processes": len(self.processes.sites),
                           "sites_per_process": max(map(len, self.processes.sites.values())), "why": self.processes.why}
            self.events.write("placement", sites=len(self.site_ids), **self.placed, pids=self.processes.pids(),
                              nodes=self.processes.nodes())
        elif self._site_dirs is not None:
            if self._key_dir is not None:
                self.events.write("keys", made_by="this harness (a local run)", directory=str(self._key_dir),
                                  note="every site's key pair was made here, for convenience: the sites are "
                                       "processes of this machine; site hosts of other parties make their own "
                                       "(run.py keys --site-ids) and on Ray each host makes its sites'")
            self.processes = SiteHosts(self.site_ids, self.channel.endpoint, *self._site_dirs, shuffler=endpoint,
                                       sites_per_process=self.placement.sites_per_process, **self._site_args)
            self.processes.start()
            self.placed = {"processes": len(self.processes.processes),
                           "sites_per_process": self.placement.sites_per_process, "why": self.placement.why}
            self.events.write("placement", sites=len(self.site_ids), **self.placed, pids=self.processes.pids())
        self.present = self.coordinator.await_members(self.site_ids, shuffler=self.shuffler is not None)
        return self.present

    def _start_shuffler(self) -> str:
        endpoint = self.shuffler.start()
        self.events.write("shuffler_start", pid=self.shuffler.process.pid, endpoint=endpoint)
        return endpoint

    def open_trial(self, trial: int, seed: int):
        return self.coordinator.open_trial(trial, seed, self.present)

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
        if self._ray_connected:
            import ray

            ray.shutdown()


class InProcessFederation:
    """No sockets, hence no wire and an empty ledger."""

    def __init__(self, site_ids: list[str], workdir: Path, events: EventLog, budget: dict | None = None,
                 policy: dict | None = None, max_n: int = 10**8) -> None:
        trials = TrialCache(workdir, site_ids)  # the model loaded once per trial for all sites
        self.sites = {site: SiteLocal(site, workdir, budget=budget, trials=trials, policy=policy) for site in site_ids}
        self.seeded_noise = SitePolicy.from_spec(policy).seeded if policy else False
        self.events = events
        self.ledger = Ledger()
        self.seed = 0
        self.max_n = max_n  # the largest n_j a site may join with (runtime.max_n)
        self.transcripts: list | None = None  # (trial, label, transcript) of every session, when kept

    def start(self) -> list[str]:
        return list(self.sites)

    def open_trial(self, trial: int, seed: int):
        """The join phase, by the rule the socket driver applies (protocol.engine.join_problem)."""
        self.seed = seed
        sizes, dropped = {}, {}
        for site, local in self.sites.items():
            n = local.open_trial(trial, seed)
            problem = join_problem(n, self.max_n)
            if problem:
                dropped[site] = problem
                self.events.write("dropout", site=site, session=join_session(trial), phase="join", reason=problem)
            else:
                sizes[site] = n
        self.devices = {site: local.device for site, local in self.sites.items()}
        return sizes, dropped

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

