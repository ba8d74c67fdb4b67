"""What a run of many sites needs of this machine, checked before anything starts (issue 40).

A run whose sites are processes of this machine holds one ZeroMQ connection per site at the
coordinator (two with a shuffler), one per site in the site hosts, and the memory both ends of
every connection cost. Rather than failing part-way (a coordinator out of descriptors after
20,000 handshakes, a kernel out of loopback ports, a machine out of memory), `check` compares
what the run needs with what the machine allows and refuses the run, before its directory is
written, naming every limit it would hit, what to change, and how many sites fit as things are.

The per-site memory is measured on this machine (bench/scale.py, docs/scale.md): a CurveZMQ
connection costs libzmq 4.3.5 about 28-32 KB at each end whatever is sent (its pipes and stream
buffers; the batch sizes that would shrink them are draft options pyzmq's libzmq leaves out),
and the rest of a site (its agent's objects, ledger and event lines, the coordinator's tables)
about 40 KB; a site host or the coordinator itself costs some tens of MB before its sites.
"""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass


from runner.processes import placement
from sites.host import descriptors_needed
from sites.storage import available_memory
from transport.channel import is_loopback, zeromq_socket_limit

#: memory a site costs the run (both ends of its connection and its share of the processes),
#: measured: 10,000 sites of one float each peaked 0.95 GiB above 1,000 sites' (bench/scale.py)
SITE_MEMORY = 100 * 1024
#: the coordinator, the fork server and their libraries before any site
RUN_MEMORY = 350 * 2**20
#: a site host's own memory before its sites (libraries shared with the fork server)
HOST_MEMORY = 30 * 2**20
PORT_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


class MachineLimits(ValueError):
    """The run needs more of this machine than it has; str(error) says what and what to change."""


@dataclass(frozen=True)
class Limit:
    name: str
    needed: int
    allowed: int
    change: str

    def __str__(self) -> str:
        return f"{self.name}: needs {self.needed:,}, this machine allows {self.allowed:,} ({self.change})"


def limits(sites: int, *, shuffled: bool, sites_per_process, local_sites: bool, bind: str) -> list[Limit]:
    """Every limit a run of `sites` sites would exceed on this machine (empty: it fits).
    local_sites: the run starts its sites here (not by hand, not on Ray)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    found = []
    per_site = 2 if shuffled else 1
    placed = placement(sites, sites_per_process) if local_sites else None
    if hard != resource.RLIM_INFINITY:
        needed = coordinator_descriptors(sites, placed.processes if placed else 0)
        if needed > hard:
            found.append(Limit("open files of the coordinator (one per site)", needed, hard,
                               "raise the hard limit: `ulimit -Hn`, LimitNOFILE in systemd, nofile in "
                               "/etc/security/limits.conf; or split the sites between runs"))
    if placed is None:
        return found
    if hard != resource.RLIM_INFINITY:
        needed = descriptors_needed(placed.sites_per_process * per_site)
        if needed > hard:
            found.append(Limit(f"open files of a site host of {placed.sites_per_process:,} sites", needed, hard,
                               "put fewer sites per process (runtime.placement.sites_per_process) "
                               "or raise the hard limit (`ulimit -Hn`)"))
    socket_limit = zeromq_socket_limit()
    if placed.sites_per_process * per_site + 16 > socket_limit:
        found.append(Limit(f"ZeroMQ sockets in one site host of {placed.sites_per_process:,} sites",
                           placed.sites_per_process * per_site + 16, socket_limit,
                           "put fewer sites per process (runtime.placement.sites_per_process)"))
    ports = loopback_ports()
    if ports is not None and is_loopback(bind) and sites + 1 > ports:
        found.append(Limit("loopback ports (each site's connection leaves 127.0.0.1 from a port of its own)",
                           sites + 1, ports,
                           f"widen net.ipv4.ip_local_port_range ({PORT_RANGE}) or run the coordinator on an "
                           f"address the sites reach from other machines"))
    memory = available_memory()
    if memory is not None:
        needed = RUN_MEMORY + placed.processes * HOST_MEMORY + sites * SITE_MEMORY
        if needed > memory:
            found.append(Limit("memory (bytes, estimated from measured costs per site and per process)", needed,
                               memory, "free memory or run fewer sites"))
    return found


def coordinator_descriptors(sites: int, processes: int) -> int:
    """Open files the coordinator's process needs: one per site's connection (and the shuffler's),
    and the two ends of a pipe to each site host it starts, open while the hosts start."""
    return descriptors_needed(sites + 1, per_socket=1) + 2 * processes


def loopback_ports() -> int | None:
    """How many local ports the kernel hands out to connections from one address (None: unknown)."""
    try:
        low, high = (int(v) for v in open(PORT_RANGE).read().split())
    except (OSError, ValueError):
        return None
    return high - low + 1


def check(sites: int, **run) -> None:
    """MachineLimits naming every limit a run of `sites` sites would hit here (see `limits`)."""
    found = limits(sites, **run)
    if found:
        most = most_sites_here(**run)
        raise MachineLimits(f"{sites:,} sites cannot run on this machine; nothing was started:\n"
                            + "\n".join(f"  - {limit}" for limit in found)
                            + f"\nAs it is, this machine holds at most about {most:,} sites in one run.")


def most_sites_here(**run) -> int:
    """The largest number of sites `limits` lets a run have on this machine (bisection)."""
    low, high = 1, 10**7
    while low < high:
        middle = math.ceil((low + high) / 2)
        if limits(middle, **run):
            high = middle - 1
        else:
            low = middle
    return low
