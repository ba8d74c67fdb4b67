"""Sites and keys from Python, for operators who run sites on their own machines (`run.py site`,
`run.py keys` are thin layers over these).

    hosts = quorum.serve_sites("tcp://HOST:PORT", ["site-000", "site-001"], "work", scenario="s.yaml",
                               key_dir="keys")          # started; hosts.processes to join
    quorum.make_keys("keys", sites=10)                  # every pair in one directory
    quorum.make_keys("keys", coordinator_only=True)     # the coordinator's host
    quorum.make_keys("keys", site_ids=["site-003"])     # a site host's own pairs
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
                policy_file: str | Path | None = None):
    """Start site hosts serving `site_ids` for the coordinator at `connect`; return them
    (runner.processes.SiteHosts: `.processes`, `.exit_codes()`). With a scenario the sites build
    their own data from it and apply its faults; `policy_file`: the operator's own policy and
    budget (YAML), else the scenario's, else the most protective. key_dir None: plain TCP."""
    from runner.processes import SiteHosts
    from scenarios.scenario import load_site_policy
    from sites.service import SiteService

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
    hosts = SiteHosts(list(site_ids), service, workdir / "logs", sites_per_process=sites_per_process or len(site_ids),
                      watch_parent=False)
    hosts.start()
    return hosts


def make_keys(directory: str | Path, *, sites: int | None = None, coordinator_only: bool = False,
              site_ids: list[str] | None = None, coordinator_key: str | Path | None = None) -> str:
    """CurveZMQ key pairs in `directory`; returns what was made and what to hand to whom. Split
    across hosts (no party holds another's secret key): the coordinator's host makes its own
    (`coordinator_only`), each site host its sites' (`site_ids`, with the coordinator's public
    key copied in); `sites` makes every pair in one directory (one machine, or tests).
    transport.security.KeyDirectoryError for a directory that is not private."""
    from protocol.wire import SHUFFLER_ID
    from transport.security import COORDINATOR_KEY, generate_keys, make_key_pair, private_key_directory
    from world.trial import site_ids as numbered

    directory = Path(directory)
    if coordinator_only:
        generate_keys(directory, [SHUFFLER_ID])
        return (f"coordinator and shuffler key pairs in {directory}: give each site host {COORDINATOR_KEY}.key "
                f"and {SHUFFLER_ID}.key (public); put the SITE.key files the site hosts send you here")
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
