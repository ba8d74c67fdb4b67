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
                policy_file: str | Path | None = None, registry: str | Path | None = None,
                accept_study_policy: bool = False):
    """Start site hosts serving `site_ids` for the coordinator at `connect`; return them
    (runner.processes.SiteHosts: `.processes`, `.exit_codes()`). With a scenario the sites build
    their own data from it and apply its faults. What they serve is the operator's decision, never
    the study's (site_policy): `policy_file`, the operator's own policy and budget (YAML), else the
    protective defaults; the scenario's sites.policy and budget only with `accept_study_policy`.
    key_dir None: plain TCP.
    `registry`: the operators' party registry (transport.registry), where the sites find the
    shuffler's public key and endpoint; without one they serve no shuffled method."""
    from dataclasses import replace

    from runner.processes import SiteHosts
    from sites.service import SiteService
    from transport.registry import read_registry

    workdir = Path(workdir)
    (workdir / "logs").mkdir(parents=True, exist_ok=True)
    policy, budget, _ = site_policy(policy_file, scenario, accept_study_policy)
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


def site_policy(policy_file: str | Path | None = None, scenario=None,
                accept_study_policy: bool = False) -> tuple[dict, dict, str]:
    """(policy, budget, where they come from) of sites an operator runs by hand: the operator's
    file, else the protective defaults; a study's sites.policy and budget only when the operator
    accepts them (`accept_study_policy`, which needs a scenario). Each validated and complete."""
    from scenarios.scenario import default_site_policy, load_site_policy

    if policy_file and accept_study_policy:
        raise ValueError("give --policy or --accept-study-policy, not both")
    if policy_file:
        policy, budget = load_site_policy(policy_file)
        return policy, budget, f"the operator's file {policy_file}"
    if accept_study_policy:
        if scenario is None:
            raise ValueError("--accept-study-policy needs the study's --scenario")
        study = as_scenario(scenario).spec()
        return dict(study.policy), dict(study.budget), f"the study's sites.policy and sites.budget, accepted by the operator"
    policy, budget = default_site_policy()
    return policy, budget, "the protective defaults (no --policy given)"


def describe_site_policy(policy: dict, budget: dict) -> list[str]:
    """What a site enforces, in lines for its operator's terminal."""
    from protocol.accounting import Budget
    from protocol.policy import SitePolicy

    p, b = SitePolicy.from_spec(policy), Budget.from_spec(budget)
    total = "unlimited" if b.epsilon is None else f"epsilon {b.epsilon:g} at delta {b.delta:g}"
    scope = "per record" if b.per_record else "per dataset (every release)"
    release = "unlimited" if p.max_epsilon == float("inf") else f"{p.max_epsilon:g}"
    return [f"methods: {', '.join(p.methods)}; trials 0-{p.trials - 1}",
            f"budget: {total} {scope}, {b.composition} composition; at most epsilon {release} per release; "
            f"{b.kanon_releases} K-anonymous table(s) per record set, K >= {p.min_k}",
            f"raw releases: {p.non_private}; at least {p.min_contributors} contributors behind a claim; "
            f"unseen claims: {p.unseen_claims}; noise: {p.noise}"]


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
