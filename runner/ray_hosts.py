"""Site hosts as Ray actors, spread over the nodes of a Ray cluster (runtime.launcher.kind: ray).

The harness stays the coordinator, here; only the site hosts move. Each host is one actor
(`SiteHostActor`, one Ray worker process, placed with Ray's SPREAD strategy and the scenario's
`resources`, so hosts asking for GPUs land on nodes that have them). It runs the same host as a
local process does (runner.processes.run_host): one DEALER per site to the coordinator's
address over ZeroMQ, CurveZMQ on. What crosses Ray is the start-up only: the site service (its
world spec: each host rebuilds its sites' data, as `run.py site --scenario` does), its sites' ids, the
coordinator's public key and, with a shuffler, the party registry the launcher wrote
(transport.registry: the shuffler's public key), and back the public halves of the key pairs each host
makes for its own sites (issue 35: a secret key never leaves the host that made it, and the
coordinator holds public keys only), in chunks small enough to stay inline in Ray's task
messages. Protocol messages go over ZeroMQ, never Ray.

A watcher thread waits on every host's `serve` call: one that fails (its worker process died,
or its node) is a lost host: `host_lost` in events.jsonl names the node, its address and Ray's
reason, and its sites are reported lost to the coordinator's channel at once (they become
dropouts of the current phase, whether or not their connections closed). Nothing waits on Ray
without a timeout: placement that cannot happen fails the run with what was asked and what the
cluster has; stopping kills what did not exit.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("quorum.ray")

REPO = Path(__file__).resolve().parents[1]
KEYS_PER_CALL = 100  # about 130 bytes of keys per site: well under Ray's 100 KiB inline limit
#: What Ray uploads to the nodes: the repository, without what is not code.
UPLOAD_EXCLUDES = ["runs/", ".venv/", "bench/results/", ".git/", "**/__pycache__/", ".hypothesis/",
                   ".pytest_cache/"]


def connect(address: str) -> bool:
    """Join the Ray cluster at `address` (auto: the one started on this machine by `ray start`,
    or RAY_ADDRESS; HOST:PORT; ray://HOST:PORT through Ray Client; local: a new one-node
    cluster here, on 127.0.0.1). True when this call made the connection (so the run ends it)."""
    import ray

    if ray.is_initialized():
        return False
    options = dict(log_to_driver=False, configure_logging=False,
                   runtime_env={"working_dir": str(REPO), "excludes": UPLOAD_EXCLUDES})
    if address == "local":
        ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, **options)
        return True
    if _on_loopback(address):
        # Ray rewrites a bootstrap address of 127.0.0.1 to this machine's outward address
        # (ray._private.services.resolve_ip_for_localhost) unless it treats the machine as
        # unable to join clusters; a cluster whose nodes all listen on loopback needs that.
        from ray._private import ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False
    ray.init(address=address, **options)
    return True


def _on_loopback(address: str) -> bool:
    from ray._private import services

    from transport.channel import is_loopback

    if address.startswith("ray://"):
        return False
    resolved = services.get_ray_address_from_environment(address, None) if address == "auto" else address
    return bool(resolved) and is_loopback(f"tcp://{resolved}")


def reachable_bind(bind: str) -> str:
    """Where to bind so that every node reaches us: runtime.bind (or shuffler_bind) as given,
    unless it is the loopback default, which becomes the address by which the Ray cluster knows
    this machine (127.0.0.1 again when the cluster itself runs on loopback)."""
    import ray

    from scenarios.scenario import SCENARIO_FIELDS

    runtime = SCENARIO_FIELDS["runtime"]["fields"]
    if bind not in (runtime["bind"]["default"], runtime["shuffler_bind"]["default"]):
        return bind
    return f"tcp://{ray.util.get_node_ip_address()}:*"


def host_count(sites: int, spec, nodes: int) -> int:
    """launcher.hosts: a number, or auto: one host per alive node, more when a host would serve
    more than runner.processes.SITES_PER_HOST sites; never more hosts than sites."""
    from runner.processes import SITES_PER_HOST

    wanted = int(spec) if spec != "auto" else max(nodes, math.ceil(sites / SITES_PER_HOST))
    return max(1, min(sites, wanted))


def _actor_class():
    import ray

    @ray.remote(max_restarts=0, max_task_retries=0)
    class SiteHostActor:
        """One site host in a Ray worker process."""

        def __init__(self) -> None:
            self.keys: dict = {}

        def where(self) -> dict:
            context = ray.get_runtime_context()
            return {"node": context.get_node_id(), "address": ray.util.get_node_ip_address(), "pid": os.getpid(),
                    "gpus": [str(g) for g in ray.get_gpu_ids()]}

        def make_keys(self, sites: list[str], coordinator_public: bytes) -> dict:
            """A key pair for each of `sites`, made here and kept in this process's memory; the
            public halves go back to the harness (site -> Z85 public key)."""
            from transport.security import client_keys_in_memory

            keys = client_keys_in_memory(sites, coordinator_public)
            self.keys.update(keys)
            return {site: (k.public, k.signing_public) for site, k in keys.items()}

        def serve(self, name: str, site_ids: list[str], service, log_dir: str, registry: str | None = None) -> int:
            """Serve; `registry`: the party registry's text (transport.registry), from which the
            sites take the shuffler's public key."""
            import setproctitle

            from runner.processes import host_title, run_host
            from transport.registry import parse_registry
            from transport.security import for_server

            setproctitle.setproctitle(host_title(name, site_ids))
            if Path(log_dir).is_dir():  # this node sees the run's directory (one machine, a shared file system)
                Path(service.workdir).mkdir(parents=True, exist_ok=True)
            else:  # it does not: a directory of its own on its node
                log_dir = tempfile.mkdtemp(prefix=f"quorum-{name}-")
                service = service.in_workdir(log_dir)
            handler = logging.FileHandler(Path(log_dir) / f"{name}.log")
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logging.getLogger().addHandler(handler)
            logging.getLogger().setLevel(logging.INFO)
            keys, self.keys = self.keys or None, {}
            shuffler_keys = None
            if keys and service.shuffler:
                shuffler_keys = for_server(keys, parse_registry(json.loads(registry), "the run's registry").shuffler.key)
            parsed = parse_registry(json.loads(registry), "the run's registry") if registry else None
            return run_host(name, site_ids, service, keys=keys, shuffler_keys=shuffler_keys,
                            registered=lambda: parsed.signing_keys() if parsed else {})

    return SiteHostActor


class RayHosts:
    """Site hosts on a Ray cluster, with the interface of runner.processes.SiteHosts: each serves
    its sites as `service` says (its world spec: each host builds its sites' data; its key
    directory: the coordinator's and shuffler's public keys). `launcher` is the scenario's
    runtime.launcher; `on_lost(sites, reason)` is called from the watcher thread when a host is
    lost; `events` receives `host_lost`."""

    def __init__(self, site_ids: list[str], service, log_dir: Path, *, launcher: dict, events, on_lost,
                 shuffled: bool = False, start_timeout: float = 120.0) -> None:
        import ray

        self.ray, self.site_ids, self.service, self.log_dir = ray, site_ids, service, log_dir
        self.launcher, self.events, self.on_lost = launcher, events, on_lost
        self.key_dir = Path(service.key_dir) if service.key_dir else None
        self.shuffled, self.start_timeout = shuffled, start_timeout
        nodes = [n for n in ray.nodes() if n["Alive"]]
        k = math.ceil(len(site_ids) / host_count(len(site_ids), launcher["hosts"], len(nodes)))
        groups = [site_ids[i:i + k] for i in range(0, len(site_ids), k)]
        width = max(3, len(str(len(groups) - 1)))
        self.sites = {f"host-{i:0{width}d}": group for i, group in enumerate(groups)}
        resources = launcher["resources"]
        self.why = (f"ray ({launcher['address']}): {len(groups)} hosts of up to {k} sites over {len(nodes)} "
                    f"nodes, each host asking for {resources['num_cpus']:g} CPU and {resources['num_gpus']:g} GPU")
        self.actors: dict = {}
        self.where: dict[str, dict] = {}
        self._serving: dict = {}  # ObjectRef of a host's serve call -> host name
        self.exit: dict[str, int | None] = {name: None for name in self.sites}
        self._stopping = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="ray-hosts", daemon=True)

    def start(self, before_serve=None) -> None:
        """Place the host actors, have each make its sites' key pairs (their public halves go to
        `before_serve(publics)`, which returns the shuffler's endpoint, or None), then serve."""
        ray = self.ray
        actor = _actor_class()
        resources = self.launcher["resources"]
        total = ray.cluster_resources()
        for name, unit in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
            if len(self.sites) * resources[name] > total.get(unit, 0) + 1e-9:
                raise RuntimeError(
                    f"{len(self.sites)} site hosts asking for {resources[name]:g} {unit} each "
                    f"(runtime.launcher.hosts, runtime.launcher.resources.{name}) do not fit the Ray cluster's "
                    f"{total.get(unit, 0):g} {unit}s: lower them, or add nodes")
        for name in self.sites:
            self.actors[name] = actor.options(name=None, num_cpus=resources["num_cpus"], num_gpus=resources["num_gpus"],
                                              scheduling_strategy="SPREAD").remote()
        calls = {self.actors[name].where.remote(): name for name in self.sites}
        ready, pending = ray.wait(list(calls), num_returns=len(calls), timeout=self.start_timeout)
        if pending:
            self.stop()
            total = ray.cluster_resources()
            raise RuntimeError(
                f"Ray started {len(ready)} of {len(calls)} site hosts within {self.start_timeout:g} s (each asks for "
                f"{dict(resources)}; the cluster has {total.get('CPU', 0):g} CPUs and {total.get('GPU', 0):g} GPUs, "
                f"some perhaps held by other jobs): free the cluster, lower runtime.launcher.resources or hosts, "
                f"or raise runtime.deadlines.hello")
        for ref in ready:
            self.where[calls[ref]] = ray.get(ref, timeout=self.start_timeout)
        publics: dict[str, bytes] = {}
        if self.key_dir is not None:
            from transport.security import COORDINATOR_KEY, load_public_key

            coordinator = load_public_key(self.key_dir, COORDINATOR_KEY)
            calls = [self.actors[name].make_keys.remote(group[start:start + KEYS_PER_CALL], coordinator)
                     for name, group in self.sites.items() for start in range(0, len(group), KEYS_PER_CALL)]
            for made in ray.get(calls, timeout=self.start_timeout):
                publics.update(made)
        service = self.service.with_shuffler(before_serve(publics)) if before_serve is not None else self.service
        # a node may not see the run's directory: the registry goes with the code and the scenario,
        # as the launcher (playing the operators' part) hands a host everything it starts with
        registry = Path(service.registry).read_text() if service.registry else None
        for name, group in self.sites.items():
            ref = self.actors[name].serve.remote(name, group, service, str(self.log_dir), registry)
            self._serving[ref] = name
        self._watcher.start()

    def _watch(self) -> None:
        ray = self.ray
        while self._serving and not self._stopping.is_set():
            done, _ = ray.wait(list(self._serving), num_returns=1, timeout=0.5)
            for ref in done:
                name = self._serving.pop(ref)
                try:
                    self.exit[name] = ray.get(ref)
                except Exception as exc:  # the actor or its node died: its sites are gone
                    if self._stopping.is_set():
                        return
                    reason = _why(exc)
                    where = self.where.get(name, {})
                    self.events.write("host_lost", host=name, node=where.get("node"), address=where.get("address"),
                                      pid=where.get("pid"), sites=self.sites[name], reason=reason)
                    self.on_lost(self.sites[name], f"its host {name} on node {where.get('address')} "
                                                   f"({str(where.get('node'))[:12]}) was lost: {reason}")

    def pids(self) -> dict[str, int]:
        return {name: where["pid"] for name, where in self.where.items()}

    def nodes(self) -> dict[str, dict]:
        return {name: {"node": w["node"], "address": w["address"], "gpus": w["gpus"]} for name, w in self.where.items()}

    def exit_codes(self) -> dict[str, int | None]:
        return dict(self.exit)

    def stop(self, timeout: float = 5.0) -> None:
        """Wait for hosts told to shut down; kill the actors that did not end."""
        if self._watcher.is_alive():  # it ends once every host's serve call has returned
            self._watcher.join(timeout=timeout)
        self._stopping.set()
        if self._watcher.is_alive():
            self._watcher.join(timeout=2.0)
        for actor in self.actors.values():
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already gone with its node
                log.debug("actor already gone", exc_info=True)


def _why(exc: Exception) -> str:
    """Ray's reason for a lost actor, on one line, without its traceback."""
    text = " ".join(str(exc).split())
    return text[:400]
