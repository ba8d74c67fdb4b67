"""Starting and stopping site processes on this machine: one OS process per site, and the
shuffler's process when a run has shuffled methods.

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

from protocol.wire import SHUFFLER_ID

PRELOAD = ["numpy", "scipy.special", "zmq", "msgpack", "sklearn.linear_model", "quantile_forest",
           "sites.driver", "shuffler.driver"]


def site_main(site_id: str, endpoint: str, workdir: str, log_path: str, watch_parent: bool,
              key_dir: str | None, fault_rules: list, seed: int, scenario: dict | None,
              idle_timeout: float | None, shuffler: str | None = None, budget: dict | None = None) -> None:
    import setproctitle

    setproctitle.setproctitle(f"quorum-site {site_id}")
    os.environ["QUORUM_SITE"] = "1"   # models.base: one torch thread per site process
    _log_to(log_path)
    from sites.driver import serve
    from transport.faults import FaultInjector
    from transport.security import load_client_keys

    keys = load_client_keys(key_dir, site_id) if key_dir else None
    shuffler_keys = load_client_keys(key_dir, site_id, server=SHUFFLER_ID) if key_dir and shuffler else None
    faults = FaultInjector(fault_rules, site_id, seed) if fault_rules else None
    # The parent sentinel is a pipe the kernel closes when the launcher exits, even while it is
    # an unreaped zombie (a pid check would still find it "alive").
    parent = multiprocessing.parent_process() if watch_parent else None
    sys.exit(serve(site_id, endpoint, workdir, parent_alive=parent.is_alive if parent else None, keys=keys,
                   faults=faults, scenario=scenario, idle_timeout=idle_timeout, shuffler=shuffler,
                   shuffler_keys=shuffler_keys, budget=budget))


def _log_to(log_path: str) -> None:
    log_file = open(log_path, "a", buffering=1)
    os.dup2(log_file.fileno(), sys.stdout.fileno())
    os.dup2(log_file.fileno(), sys.stderr.fileno())
    logging.basicConfig(level=logging.INFO, stream=log_file,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def shuffler_main(bind: str, coordinator_endpoint: str, log_path: str, key_dir: str | None,
                  site_ids: list[str], pipe) -> None:
    import setproctitle

    setproctitle.setproctitle("quorum-shuffler")
    _log_to(log_path)
    from shuffler.driver import serve
    from transport.security import load_client_keys, load_server_keys

    server_keys = load_server_keys(key_dir, site_ids, server=SHUFFLER_ID) if key_dir else None
    client_keys = load_client_keys(key_dir, SHUFFLER_ID) if key_dir else None
    parent = multiprocessing.parent_process()
    sys.exit(serve(bind, coordinator_endpoint, on_bound=pipe.send, server_keys=server_keys,
                   client_keys=client_keys, parent_alive=parent.is_alive if parent else None))


class ShufflerProcess:
    """The shuffler (shuffler.driver) in its own OS process, `quorum-shuffler`, logging to
    LOGDIR/shuffler.log. start() returns the endpoint where sites send sealed messages."""

    def __init__(self, bind: str, coordinator_endpoint: str, log_dir: Path, *, key_dir: Path | None = None,
                 site_ids=()) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        self._pipe, child = context.Pipe(duplex=False)
        self.process = context.Process(target=shuffler_main, name=SHUFFLER_ID, daemon=True,
                                       args=(bind, coordinator_endpoint, str(log_dir / "shuffler.log"),
                                             str(key_dir) if key_dir else None, list(site_ids), child))

    def start(self, timeout: float = 60.0) -> str:
        self.process.start()
        if not self._pipe.poll(timeout):
            self.stop()
            raise RuntimeError(f"the shuffler process did not bind its socket within {timeout:g} s "
                               f"(exit code {self.process.exitcode})")
        return self._pipe.recv()

    def stop(self, timeout: float = 5.0) -> None:
        self.process.join(timeout=timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=2.0)


class SiteProcesses:
    """One process per site. key_dir enables CURVE; fault_rules are the scenario's resolved
    rules (each site applies those that concern it); scenario lets sites build their own
    data (sites started away from the harness); budget: each site's privacy budget (the
    scenario's sites.budget); watch_parent: exit when the launcher dies."""

    def __init__(self, site_ids: list[str], endpoint: str, workdir: Path, log_dir: Path, *,
                 key_dir: Path | None = None, fault_rules=(), seed: int = 0, scenario: dict | None = None,
                 watch_parent: bool = True, idle_timeout: float | None = None,
                 shuffler: str | None = None, budget: dict | None = None) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        self.processes = {
            site: context.Process(
                target=site_main, name=site, daemon=watch_parent,
                args=(site, endpoint, str(workdir), str(log_dir / f"{site}.log"), watch_parent,
                      str(key_dir) if key_dir else None, list(fault_rules), seed, scenario, idle_timeout,
                      shuffler, budget))
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
