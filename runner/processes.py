"""Starting and stopping site processes on this machine: one OS process per site.

Processes are forked from a multiprocessing fork server that has already imported the heavy
libraries, so fifty sites start in well under a second and share those pages. Each process
renames itself `quorum-site SITE_ID` (visible in ps/top), writes its log to LOGDIR/SITE_ID.log
and exits on its own if this launcher process disappears.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from pathlib import Path

PRELOAD = ["numpy", "scipy.special", "zmq", "msgpack", "sklearn.linear_model", "quantile_forest",
           "sites.driver"]


def site_main(site_id: str, endpoint: str, workdir: str, log_path: str, watch_parent: bool,
              key_dir: str | None, fault_rules: list, seed: int, scenario: dict | None,
              idle_timeout: float | None) -> None:
    import setproctitle

    setproctitle.setproctitle(f"quorum-site {site_id}")
    os.environ["QUORUM_SITE"] = "1"   # models.base: one torch thread per site process
    log_file = open(log_path, "a", buffering=1)
    os.dup2(log_file.fileno(), sys.stdout.fileno())
    os.dup2(log_file.fileno(), sys.stderr.fileno())
    logging.basicConfig(level=logging.INFO, stream=log_file,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sites.driver import serve
    from transport.faults import FaultInjector
    from transport.security import load_client_keys

    keys = load_client_keys(key_dir, site_id) if key_dir else None
    faults = FaultInjector(fault_rules, site_id, seed) if fault_rules else None
    # The parent sentinel is a pipe the kernel closes when the launcher exits, even while it is
    # an unreaped zombie (a pid check would still find it "alive").
    parent = multiprocessing.parent_process() if watch_parent else None
    sys.exit(serve(site_id, endpoint, workdir, parent_alive=parent.is_alive if parent else None, keys=keys,
                   faults=faults, scenario=scenario, idle_timeout=idle_timeout))


class SiteProcesses:
    """One process per site. key_dir enables CURVE; fault_rules are the scenario's resolved
    rules (each site applies those that concern it); scenario lets sites build their own
    data (sites started away from the harness); watch_parent: exit when the launcher dies."""

    def __init__(self, site_ids: list[str], endpoint: str, workdir: Path, log_dir: Path, *,
                 key_dir: Path | None = None, fault_rules=(), seed: int = 0, scenario: dict | None = None,
                 watch_parent: bool = True, idle_timeout: float | None = None) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        self.processes = {
            site: context.Process(
                target=site_main, name=site, daemon=watch_parent,
                args=(site, endpoint, str(workdir), str(log_dir / f"{site}.log"), watch_parent,
                      str(key_dir) if key_dir else None, list(fault_rules), seed, scenario, idle_timeout))
            for site in site_ids
        }

    def start(self) -> None:
        for process in self.processes.values():
            process.start()

    def pids(self) -> dict[str, int]:
        return {site: p.pid for site, p in self.processes.items() if p.pid is not None}

    def exit_codes(self) -> dict[str, int | None]:
        return {site: p.exitcode for site, p in self.processes.items()}

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
