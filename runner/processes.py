"""Starting and stopping site processes on this machine, and the shuffler's process when a run
has shuffled methods.

Sites run in site hosts (sites.host): one OS process serving one site while that is cheap,
many sites per process beyond (`runtime.placement.sites_per_process`, see `placement`). Each
process is forked from a multiprocessing fork server that has already imported the heavy
libraries, so processes start in well under a second and share those pages. A process renames
itself `quorum-site SITE_ID` (one site) or `quorum-host N FIRST..LAST` (a host), writes its log
to LOGDIR/SITE_ID.log or LOGDIR/host-N.log, and exits on its own if the launcher disappears.
"""

from __future__ import annotations

import faulthandler
import gc
import logging
import math
import multiprocessing
import os
import signal
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from protocol.codecs import CODECS
from protocol.methods import METHODS
from protocol.wire import SHUFFLER_ID
from sites.service import SiteService

HOUSE_PREFIX = __name__.removesuffix("runner.processes")  # "" in a checkout, "quorum." in an install
#: imported once by the fork server, before it forks any host: each host used to import the method and
#: codec a session names on its first request (0.1-0.25 s of every host's CPU inside the first phase,
#: with scipy.stats and the crypto among them; issue 40). Quorum's own modules only: an installed
#: plugin is imported where it is used, so one that does not load cannot stop every run.
PRELOAD = ["numpy", "scipy.special", "zmq", "msgpack", "sklearn.linear_model", "quantile_forest",
           f"{HOUSE_PREFIX}sites.host", f"{HOUSE_PREFIX}shuffler.driver",
           *METHODS.builtin_modules(), *CODECS.builtin_modules()]  # named as the registries import them
# Set as this module loads, before anything in the process can start the fork server: the secure
# sum's unmasking worker (protocol.secagg.unmasking) starts it too, and a preload set after it
# started is ignored, so each site process forked later imported every module itself, seconds
# each, past a join deadline ("0 joined")
multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)

PROCESS_MEMORY = 64 * 2**20  # what one site process costs with a small model loaded (measured ~34 MB), with room
PER_SITE_LIMIT = 64  # at most this many one-site processes, however large the machine
SITES_PER_HOST = 2000  # fewer, larger hosts: each costs ~40 MB of its own; 5 hosts of 2,000 held a 10,000-site
#: secure sum in 0.13 GiB less than 10 of 1,000, in the same time (issue 40)


@dataclass(frozen=True)
class Placement:
    sites_per_process: int
    processes: int
    why: str


def placement(count: int, spec, cores: int | None = None, available: int | None = None) -> Placement:
    """How many sites each process serves: `spec` is runtime.placement.sites_per_process, a
    number or 'auto'. auto: one process per site while they fit cheaply (at most PER_SITE_LIMIT,
    and a quarter of the available memory at PROCESS_MEMORY each), else hosts: twice as many as
    cores (so the machine stays busy while a host waits), more when that would exceed
    SITES_PER_HOST sites each."""
    if spec != "auto":
        k = max(1, min(int(spec), count))
        return Placement(k, math.ceil(count / k), f"sites_per_process: {spec} (scenario)")
    cores = cores or os.cpu_count() or 1
    if available is None:
        from sites.storage import available_memory

        available = available_memory() or 2**34
    cheap = int(min(PER_SITE_LIMIT, available // 4 // PROCESS_MEMORY))
    if count <= cheap:
        return Placement(1, count, f"auto: one process per site (up to {cheap} on this machine)")
    hosts = min(count, max(2 * cores, math.ceil(count / SITES_PER_HOST)))
    k = math.ceil(count / hosts)
    processes = math.ceil(count / k)
    return Placement(k, processes, f"auto: {count} sites > {cheap} one-site processes on this machine; "
                                   f"{processes} hosts of {k} (two per core for {cores} cores, "
                                   f"at most {SITES_PER_HOST} sites each)")


@contextmanager
def caller_not_reimported():
    """Start processes without their re-running the caller's script (issue 37): multiprocessing
    re-imports `__main__` in every child (as `__mp_main__`, from its file or module name), so an
    unguarded script or notebook export calling `quorum.run` started a coordinator per site.
    Our children's targets live in this package and need nothing from the caller: while they
    start, the main module shows no file and no spec, and multiprocessing imports nothing."""
    main = sys.modules.get("__main__")
    saved = {key: main.__dict__[key] for key in ("__file__", "__spec__") if main is not None and key in main.__dict__}
    try:
        if "__file__" in saved:
            del main.__file__
        if "__spec__" in saved:
            main.__spec__ = None
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


def host_main(name: str, site_ids: list[str], service: SiteService, log_path: str, watch_parent: bool,
              pipe) -> None:
    """A site host process: make or load its sites' keys, tell the launcher the public halves
    (over `pipe`), learn the shuffler's endpoint from it, then serve; the shuffler's public key
    comes from the party registry (service.registry), which the launcher has written by then."""
    gc.freeze()  # what the fork server imported stays shared: a collection would copy its pages (40 MB a host)
    import setproctitle

    setproctitle.setproctitle(host_title(name, site_ids))
    _log_to(log_path)
    from transport.security import COORDINATOR_KEY, client_keys_in_memory, for_server, load_client_keys, load_public_key

    key_dir = service.key_dir
    if key_dir and service.keys_in_memory:  # made here, now: no file holds a site's secret
        keys = client_keys_in_memory(site_ids, load_public_key(key_dir, COORDINATOR_KEY))
    else:  # an operator's own hosts: the pairs they made (run.py keys)
        keys = {site: load_client_keys(key_dir, site) for site in site_ids} if key_dir else None
    pipe.send({site: (k.public, k.signing_public) for site, k in keys.items()} if keys and service.keys_in_memory
              else {})
    if not pipe.poll(service.start_timeout):
        raise SystemExit(f"{name}: the launcher sent no go-ahead within {service.start_timeout:g} s")
    service = service.with_shuffler(pipe.recv())
    pipe.close()
    shuffler_keys = None
    if keys and service.shuffler:  # the shuffler's key from the parties' registry, never from the launcher
        from transport.registry import shuffler_public

        shuffler_keys = for_server(keys, shuffler_public(service.registry))
    # The parent sentinel is a pipe the kernel closes when the launcher exits, even while it is
    # an unreaped zombie (a pid check would still find it "alive").
    parent = multiprocessing.parent_process() if watch_parent else None
    from transport.registry import signing_keys_of

    sys.exit(run_host(name, site_ids, service, keys=keys, shuffler_keys=shuffler_keys,
                      parent_alive=parent.is_alive if parent else None,
                      registered=lambda: signing_keys_of(service.registry)))


def host_identities(keys: dict | None, registered) -> dict:
    """Each site's identity for secure sums (protocol.secagg.identity): its signing key, derived
    from its CURVE secret, and the registry's signing keys, read once for the whole host when
    first needed. No keys (plain TCP): no identities, and no actively secure sums."""
    from functools import cache

    from protocol.secagg.identity import SiteIdentity

    once = cache(registered)
    return {site: SiteIdentity(site, k.signing_key(), once) for site, k in (keys or {}).items()}


def host_title(name: str, site_ids: list[str]) -> str:
    return f"quorum-site {site_ids[0]}" if len(site_ids) == 1 else f"quorum-host {name} {site_ids[0]}..{site_ids[-1]}"


def run_host(name: str, site_ids: list[str], service: SiteService, *, keys: dict | None,
             shuffler_keys: dict | None, parent_alive=None, registered=dict) -> int:
    """Serve `site_ids` from this process as `service` says until they finish (sites.host.serve's
    exit code). keys: site id -> its CurveZMQ key pair (None: plain TCP); shuffler_keys likewise
    for the shuffler; registered(): the party registry's signing keys of the sites (read once,
    when a secure sum first needs them), against which each site checks its peers (issue 48).
    The service's plugins are loaded first, so that the sites know them by name."""
    os.environ["QUORUM_SITE"] = "1"   # models.base: one torch thread per site process
    os.umask(0o077)  # a site's shards, model copies, account and log: its own user's only
    from sites.agent import SiteAgent
    from sites.host import crash_policy, descriptors_needed, host_context, raise_open_files, serve
    from sites.storage import GroupCommit
    from sites.trials import TrialCache
    from scenarios.scenario import load_plugins
    from transport.faults import FaultInjector

    title = host_title(name, site_ids)
    if service.netns:  # kernel links: every connection of this host leaves from the run's namespace
        from transport.kernel_links import enter_namespace

        enter_namespace(service.netns)
    load_plugins(service.plugins)
    raise_open_files(descriptors_needed(len(site_ids) * (2 if service.shuffler else 1)), title)
    context = host_context(len(site_ids), service.shuffler is not None)
    trials = TrialCache(service.workdir, site_ids, world=service.world)
    commit = GroupCommit()  # one sync makes all the host's new account records durable
    identities = host_identities(keys, registered)
    agents: list = []
    on_crash = crash_policy(agents)
    for site_id in site_ids:
        coordinator, shuffler = service.endpoints(site_id)
        agents.append(SiteAgent(
            site_id, coordinator, service.workdir, trials, context=context,
            keys=keys[site_id] if keys else None,
            faults=FaultInjector(list(service.fault_rules), site_id, service.seed) if service.fault_rules else None,
            shuffler=shuffler, budget=service.budget, policy=service.policy, on_crash=on_crash,
            shuffler_keys=shuffler_keys[site_id] if shuffler_keys else None, commit=commit,
            identity=identities.get(site_id)))
    if len(site_ids) > 1:
        logging.getLogger("quorum.host").info("%s (pid %d): %d sites", title, os.getpid(), len(site_ids))
    code = serve(agents, parent_alive=parent_alive, idle_timeout=service.idle_timeout, commit=commit)
    context.term()
    return code


def _log_to(log_path: str) -> None:
    log_file = open(log_path, "a", buffering=1)
    os.dup2(log_file.fileno(), sys.stdout.fileno())
    os.dup2(log_file.fileno(), sys.stderr.fileno())
    logging.basicConfig(level=logging.INFO, stream=log_file,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A process the launcher has to terminate (it did not exit on shutdown) leaves its stack here.
    faulthandler.register(signal.SIGTERM, file=log_file, all_threads=True, chain=True)


def shuffler_main(bind: str, coordinator_endpoint: str, log_path: str, pipe, *, secure: bool, site_count: int,
                  links=None, key_dir: str | None = None, registry: str | None = None,
                  idle_timeout: float | None = None, watch_parent: bool = True) -> None:
    """The shuffler's process. With CURVE (`secure`) it holds its own key pair, which no other
    process ever sees (issue 47): loaded from its own private key directory (`key_dir`, a
    multi-host run's shuffler) or made here, in memory. Its allow-list and the coordinator's key
    come from the party registry (transport.registry): the file `registry`, or, in a local run,
    the one the launcher writes once this process has sent it the public half (over `pipe`).
    Then it binds and sends its endpoint."""
    gc.freeze()
    import setproctitle

    setproctitle.setproctitle("quorum-shuffler")
    os.umask(0o077)
    _log_to(log_path)
    from shuffler.driver import serve
    from sites.host import descriptors_needed, raise_open_files
    from transport.registry import shuffler_keys
    from transport.security import load_key_pair, new_key_pair

    server_keys = client_keys = None
    if secure:
        public, secret = load_key_pair(key_dir, SHUFFLER_ID) if key_dir else new_key_pair()
        if registry is None:  # a local run: the launcher, playing the operators, registers this key
            pipe.send(public)
            registry = pipe.recv()
        server_keys, client_keys = shuffler_keys(registry, public, secret)
        site_count = len(server_keys.sites)
    raise_open_files(descriptors_needed(site_count + 1, per_socket=1), "the shuffler")
    parent = multiprocessing.parent_process() if watch_parent else None
    sys.exit(serve(bind, coordinator_endpoint, on_bound=pipe.send, server_keys=server_keys,
                   client_keys=client_keys, parent_alive=parent.is_alive if parent else None, links=links,
                   idle_timeout=idle_timeout))


class ShufflerProcess:
    """The shuffler (shuffler.driver) in its own OS process, `quorum-shuffler`, logging to
    LOGDIR/shuffler.log. start() returns the endpoint where sites send sealed messages. `links`:
    the run's network (transport.emulation.LinkEmulator), applied to the sites' sealed messages.
    `secure`: CURVE, with the process's own key pair (shuffler_main) and the party registry
    `registry`, or the one start's `register` writes; `site_count`: the sites it serves without."""

    def __init__(self, bind: str, coordinator_endpoint: str, log_dir: Path, *, secure: bool = False,
                 site_count: int = 0, links=None, key_dir: str | Path | None = None,
                 registry: str | Path | None = None, idle_timeout: float | None = None,
                 watch_parent: bool = True) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        self.secure, self.registry = secure, registry
        self.public: bytes | None = None  # the shuffler's public key, once it sent it (never its secret)
        self.endpoint: str | None = None  # where the sites reach it, once it serves
        self._pipe, self._child = context.Pipe()
        self.process = context.Process(
            target=shuffler_main, name=SHUFFLER_ID, daemon=watch_parent,
            args=(bind, coordinator_endpoint, str(Path(log_dir) / "shuffler.log"), self._child),
            kwargs=dict(secure=secure, site_count=site_count, links=links, key_dir=str(key_dir) if key_dir else None,
                        registry=str(registry) if registry else None, idle_timeout=idle_timeout,
                        watch_parent=watch_parent))

    def start(self, register=None, timeout: float = 60.0) -> str:
        """Start it; its endpoint. Without a registry file, `register(public)` is the launcher's
        part: it is handed the public key the shuffler made and returns the registry's path."""
        with caller_not_reimported():
            self.process.start()
        self._child.close()  # the process's end is its own now: its exit shows here as the pipe's end
        if self.secure and self.registry is None:
            self.public = self._receive(timeout, "send its public key")
            self._pipe.send(str(register(self.public)))
        self.endpoint = self._receive(timeout, "bind its socket")
        return self.endpoint

    def _receive(self, timeout: float, what: str):
        if not self._pipe.poll(timeout):
            self.stop(timeout=0.1)
            raise RuntimeError(f"the shuffler process did not {what} within {timeout:g} s "
                               f"(exit code {self.process.exitcode}): see its log, shuffler.log")
        try:
            return self._pipe.recv()
        except EOFError:
            self.stop(timeout=0.1)
            raise RuntimeError(f"the shuffler process exited (code {self.process.exitcode}) before it could {what}: "
                               f"see its log, shuffler.log") from None

    def stop(self, timeout: float = 5.0) -> None:
        self.process.join(timeout=timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=2.0)


class SiteHosts:
    """The processes serving `site_ids` as `service` says (sites.service.SiteService),
    `sites_per_process` sites each, logging to LOG_DIR/NAME.log; watch_parent: exit when the
    launcher dies."""

    def __init__(self, site_ids: list[str], service: SiteService, log_dir: Path, *, sites_per_process: int = 1,
                 watch_parent: bool = True) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        k = max(1, sites_per_process)
        groups = [site_ids[i:i + k] for i in range(0, len(site_ids), k)]
        self.service = service
        self.sites: dict[str, list[str]] = {}  # process name -> its sites
        self.processes: dict[str, multiprocessing.Process] = {}
        self._pipes: dict[str, tuple] = {}  # process name -> (our end, its end) until it serves
        for number, group in enumerate(groups):
            name = group[0] if len(group) == 1 else f"host-{number:0{max(3, len(str(len(groups) - 1)))}d}"
            self.sites[name] = group
            self._pipes[name] = context.Pipe()
            self.processes[name] = context.Process(
                target=host_main, name=name, daemon=watch_parent,
                args=(name, group, service, str(Path(log_dir) / f"{name}.log"), watch_parent, self._pipes[name][1]))

    def start(self, before_serve=None) -> None:
        """Start the hosts; each makes (or loads) its sites' key pairs and sends the public halves.
        `before_serve(publics)` (site -> (Z85 public key, Z85 signing key), empty without in-memory keys) admits them
        and returns the shuffler's endpoint or None, which the hosts then serve with; without it
        they serve with the service's. RuntimeError when a host dies or stays silent first."""
        with caller_not_reimported():
            for process in self.processes.values():
                process.start()
        for ours, theirs in self._pipes.values():
            theirs.close()
        publics: dict[str, bytes] = {}
        deadline = time.monotonic() + self.service.start_timeout
        for name, (ours, _) in self._pipes.items():
            process = self.processes[name]
            while not ours.poll(0.1):
                if not process.is_alive() or time.monotonic() > deadline:
                    self.stop(timeout=0.1)
                    raise RuntimeError(f"site host {name} ({self.sites[name][0]}..) "
                                       f"{'exited with code ' + str(process.exitcode) if not process.is_alive() else 'sent no keys within ' + format(self.service.start_timeout, 'g') + ' s'} "
                                       f"before serving: see its log")
            publics.update(ours.recv())
        endpoint = before_serve(publics) if before_serve is not None else self.service.shuffler
        for ours, _ in self._pipes.values():
            ours.send(endpoint)
            ours.close()
        self._pipes = {}

    def pids(self) -> dict[str, int]:
        """Process name -> pid."""
        return {name: p.pid for name, p in self.processes.items() if p.pid is not None}

    def exit_codes(self) -> dict[str, int | None]:
        return {name: p.exitcode for name, p in self.processes.items()}

    def stop(self, timeout: float = 5.0) -> None:
        """Wait for processes that were told to shut down; terminate the rest."""
        for process in self.processes.values():
            process.join(timeout=timeout)
            timeout = 0.1  # the first wait covers all of them
        for process in self.processes.values():
            if process.is_alive():
                process.terminate()
                process.join(timeout=2.0)
            if process.is_alive():
                process.kill()
                process.join()
