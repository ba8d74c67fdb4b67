"""Sites, the shuffler and keys from Python, for operators who run parties on their own machines
(`run.py site`, `run.py shuffler`, `run.py keys`, `run.py registry` are thin layers over these).

    hosts = quorum.serve_sites("tcp://HOST:PORT", ["site-000", "site-001"], "work", scenario="s.yaml",
                               key_dir="keys", registry="parties.json")   # started; hosts.processes to join
    quorum.make_keys("keys", sites=10)                  # every pair in one directory
    quorum.make_keys("keys", coordinator_only=True)     # the coordinator's host
    quorum.make_keys("keys", shuffler_only=True)        # the shuffler's host
    quorum.make_keys("keys", site_ids=["site-003"])     # a site host's own pairs
    quorum.make_registry("publics", "parties.json", shuffler_endpoint="tcp://HOST:5600")  # the operators'
    shuffler = quorum.serve_shuffler("tcp://HOST:PORT", "tcp://0.0.0.0:5600", "work", key_dir="keys",
                                     registry="parties.json")   # started; shuffler.process to join
"""

from __future__ import annotations

import shutil
from pathlib import Path

from quorum.scenario import Scenario, as_scenario


def site_ids_of(text: str | None, count: int | None = None) -> list[str]:
    """Site ids from `0-9` (a range of numbers, named as a scenario of `count` sites names them)
    or `site-001,site-004`."""
    from world.trial import site_ids

    if not text:
        return []
    if "-" in text and "," not in text and not text.startswith("site"):
        low, high = (int(v) for v in text.split("-"))
        return site_ids(max(count or 0, high + 1))[low:high + 1]
    return [part.strip() for part in text.split(",") if part.strip()]


def serve_sites(connect: str, site_ids: list[str], workdir: str | Path, *,
                scenario: "Scenario | dict | str | Path | None" = None, key_dir: str | Path | None = None,
                idle_timeout: float | None = 3600.0, sites_per_process: int | None = None,
                policy_file: str | Path | None = None, registry: str | Path | None = None):
    """Start site hosts serving `site_ids` for the coordinator at `connect`; return them
    (runner.processes.SiteHosts: `.processes`, `.exit_codes()`). With a scenario the sites build
    their own data from it and apply its faults; `policy_file`: the operator's own policy and
    budget (YAML), else the scenario's, else the most protective. key_dir None: plain TCP.
    `registry`: the operators' party registry (transport.registry), where the sites find the
    shuffler's public key and endpoint; without one they serve no shuffled method."""
    from dataclasses import replace

    from runner.processes import SiteHosts
    from scenarios.scenario import load_site_policy
    from sites.service import SiteService
    from transport.registry import read_registry

    workdir = Path(workdir)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    policy = budget = None
    if policy_file:
        policy, budget = load_site_policy(policy_file)
    if scenario is not None:
        service = as_scenario(scenario).spec().site_service(connect, workdir, key_dir=key_dir, builds_world=True,
                                                            idle_timeout=idle_timeout, policy=policy, budget=budget)
    else:
        service = SiteService(connect, str(workdir), str(key_dir) if key_dir else None, idle_timeout=idle_timeout,
                              policy=policy, budget=budget)
    if registry is not None:  # read here first: a bad file stops this command, naming the field
        parties = read_registry(registry)
        shuffler = next((p for p in parties.parties.values() if p.role == "shuffler"), None)
        service = replace(service, registry=str(registry), shuffler=shuffler.endpoint if shuffler else None)
    hosts = SiteHosts(list(site_ids), service, workdir / "logs", sites_per_process=sites_per_process or len(site_ids),
                      watch_parent=False)
    hosts.start()
    return hosts


def make_keys(directory: str | Path, *, sites: int | None = None, coordinator_only: bool = False,
              site_ids: list[str] | None = None, coordinator_key: str | Path | None = None,
              shuffler_only: bool = False) -> str:
    """CurveZMQ key pairs in `directory`; returns what was made and what to hand to whom. Split
    across hosts (no party holds another's secret key): the coordinator's host makes its own
    (`coordinator_only`), the shuffler's host its own (`shuffler_only`), each site host its
    sites' (`site_ids`, with the coordinator's public key copied in); `sites` makes every pair in
    one directory (one machine, or tests). transport.security.KeyDirectoryError for a directory
    that is not private."""
    from protocol.wire import SHUFFLER_ID
    from transport.security import COORDINATOR_KEY, generate_keys, make_key_pair, private_key_directory
    from world.trial import site_ids as numbered

    directory = Path(directory)
    if coordinator_only:
        generate_keys(directory, [])
        return (f"coordinator key pair in {directory}: give each site host {COORDINATOR_KEY}.key (public) and "
                f"send it to the operators' registry; put the SITE.key files the site hosts send you here, and "
                f"{SHUFFLER_ID}.key from the shuffler's operator")
    if shuffler_only:
        private_key_directory(directory)
        if (directory / f"{SHUFFLER_ID}.key").exists() and not (directory / f"{SHUFFLER_ID}.key_secret").exists():
            raise ValueError(f"{directory / SHUFFLER_ID}.key holds a public key only: not this host's shuffler")
        if not (directory / f"{SHUFFLER_ID}.key_secret").exists():
            make_key_pair(directory, SHUFFLER_ID)
        return (f"shuffler key pair in {directory}: send {SHUFFLER_ID}.key (public) to the coordinator's operator "
                f"and the operators' registry; {SHUFFLER_ID}.key_secret stays on this host")
    if site_ids:
        private_key_directory(directory)
        for site in site_ids:
            if (directory / f"{site}.key").exists() and not (directory / f"{site}.key_secret").exists():
                raise ValueError(f"{directory / site}.key holds a public key only: not this host's site")
        for site in site_ids:
            if not (directory / f"{site}.key_secret").exists():
                make_key_pair(directory, site)
        if coordinator_key:
            shutil.copyfile(coordinator_key, directory / f"{COORDINATOR_KEY}.key")
        return (f"key pairs for {len(site_ids)} site(s) in {directory}: send the coordinator "
                f"{', '.join(f'{s}.key' for s in site_ids[:3])}{' ...' if len(site_ids) > 3 else ''} (public halves); "
                f"the .key_secret files stay on this host")
    if not sites:
        raise ValueError("give sites (every pair here), coordinator_only or site_ids")
    generate_keys(directory, numbered(sites))
    return (f"keys for the coordinator and {sites} sites in {directory}: give each site host "
            f"coordinator.key and its own SITE.key and SITE.key_secret; keep coordinator.key_secret "
            f"on the coordinator's host (one directory holds every secret: split it with --coordinator "
            f"and --site-ids when the hosts belong to different parties)")


def make_registry(key_dir: str | Path, path: str | Path, *, shuffler_endpoint: str | None = None) -> str:
    """The operators' party registry (transport.registry) written to `path` from the public keys
    the parties sent, collected in `key_dir` (coordinator.key, shuffler.key, SITE.key); returns
    what it lists. Every party is then given the same file."""
    from transport.registry import read_registry, registry_from_keys

    roles = [p.role for p in read_registry(registry_from_keys(key_dir, path, shuffler_endpoint)).parties.values()]
    shuffler = "no shuffler" if "shuffler" not in roles else f"the shuffler (at {shuffler_endpoint or 'no endpoint'})"
    return f"registry {path}: the coordinator, {shuffler}, {roles.count('site')} site(s); give every party this file"


def serve_shuffler(connect: str, bind: str, workdir: str | Path, *, key_dir: str | Path | None = None,
                   registry: str | Path | None = None, idle_timeout: float | None = 3600.0):
    """Start the shuffler for the coordinator at `connect`, taking sealed messages at `bind`;
    return it (runner.processes.ShufflerProcess: `.process` to join) once it serves. Its own key
    pair from `key_dir` (made there by make_keys(shuffler_only=True); None: plain TCP), its
    allow-list of sites and the coordinator's key from the operators' `registry`, which must list
    this shuffler's key. Its log: WORKDIR/logs/shuffler.log."""
    from runner.processes import ShufflerProcess
    from transport.registry import read_registry

    if key_dir is not None and registry is None:
        raise ValueError("a shuffler with keys needs the operators' registry: its allow-list of sites")
    sites = len(read_registry(registry).sites()) if registry else 0  # read here first: a bad file stops here
    logs = Path(workdir) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    shuffler = ShufflerProcess(bind, connect, logs, secure=key_dir is not None, key_dir=key_dir, registry=registry,
                               site_count=sites, idle_timeout=idle_timeout, watch_parent=False)
    shuffler.start()
    return shuffler
