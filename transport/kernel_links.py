"""Real kernel links (issue 39, point 3): a scenario's network applied by Linux traffic control,
to check the emulation of transport.emulation against the kernel (`network: {mode: kernel}`).

The layout, made when the run starts and removed when it ends:

    this namespace                          quorum-PID-N (a network namespace of the run's)
    coordinator, shuffler                    site hosts (each process enters it before connecting)
      bind 10.P.0.1  ── veth qkPIDa ══ veth qkPIDb ──  site j connects from 10.P.x.y, its own address
      egress: htb, a class per site             egress: htb, a class per site
      at its down rate (filter: dst = site j)   at its up rate (filter: src = site j)
      + netem delay/jitter/loss under it        + netem delay/jitter/loss under it

So every site's traffic is its own flow through the kernel. Where the kernel has netem, a netem
qdisc under the site's class is its link in each direction: netem's `rate` serializes each
packet at the profile's bandwidth, then adds the latency, jitter and loss. Where it has none,
htb's class limits the rate (a token bucket of a tenth of a millisecond's bytes) and
profiles with latency, jitter or loss cannot run. The veth sends one segment per packet, as a
physical link does, never a 64 KB GSO super-packet. The coordinator's link to the shuffler
stays on this namespace's loopback, as it does when emulated.

What differs from the emulation, on purpose (it is what a real link does): the kernel counts
TCP/IP and Ethernet headers (about 4% on full frames, more on small messages) where the
emulation counts ZMTP wire bytes; htb (without netem) shapes a flow rather than serializing
each packet, so a message's first packet leaves at once where the emulation charges it 8B/R: a
message of a few packets arrives up to one frame's time early; `loss` drops packets, which TCP retransmits (late messages),
where the emulation drops whole messages; jitter follows netem's distribution. Availability
(online windows) stays with the coordinator in both modes (a site asked while offline is a
dropout named `offline`); traces that change a link's figures during the run need the
emulation (validation says so).

It needs root (CAP_NET_ADMIN), `ip` and `tc`, network namespaces, veth and htb; netem only for
latency, jitter or loss (CONFIG_NET_SCH_NETEM). `kernel_support()` probes them once and says what
is missing; a run asking for what this kernel cannot do stops before it starts, saying so.
"""

from __future__ import annotations

import atexit
import ctypes
import ipaddress
import itertools
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from transport.links import Network, Profile

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
PREFIX = "quorum-"
MAX_SITES = 65_000  # a /16 of site addresses, and htb's 16-bit class ids
UNLIMITED = "100gbit"  # htb needs a rate: a profile's 0 (unlimited) is this, far above any veth
_numbers = itertools.count()


class KernelLinksUnavailable(ValueError):
    """This machine cannot set up the kernel links a scenario asks for (the message says why)."""


@dataclass(frozen=True)
class KernelSupport:
    namespaces: bool  # network namespaces, veth pairs and htb rate limits work here
    netem: bool  # netem (latency, jitter, loss) works here
    why: str  # what is missing, in words ("" when everything works)


def _run(args: list[str], *, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(args, input=stdin, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise KernelLinksUnavailable(f"`{' '.join(args[:6])}` failed: {(result.stderr or result.stdout).strip()}")
    return result


@lru_cache(maxsize=1)
def kernel_support() -> KernelSupport:
    """Probe once: a namespace, a veth pair into it, htb on it, and netem under htb."""
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return KernelSupport(False, False, f"no {' or '.join(missing)} command on this machine (iproute2)")
    if os.geteuid() != 0:
        return KernelSupport(False, False, "creating network namespaces and qdiscs needs root (CAP_NET_ADMIN)")
    name = f"{PREFIX}probe-{os.getpid()}"
    veth = f"qp{os.getpid() % 10**8}"
    try:
        made = _run(["ip", "netns", "add", name], check=False)
        if made.returncode != 0:
            return KernelSupport(False, False, f"`ip netns add` is not permitted here: {made.stderr.strip()}")
        pair = _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", veth + "b", "netns", name], check=False)
        if pair.returncode != 0:
            return KernelSupport(False, False, f"no veth pairs here: {pair.stderr.strip()}")
        htb = _run(["tc", "qdisc", "add", "dev", veth, "root", "handle", "1:", "htb"], check=False)
        if htb.returncode != 0:
            return KernelSupport(False, False, f"no htb qdisc here: {htb.stderr.strip()}")
        _run(["tc", "class", "add", "dev", veth, "parent", "1:", "classid", "1:2", "htb", "rate", "1mbit"])
        netem = _run(["tc", "qdisc", "add", "dev", veth, "parent", "1:2", "handle", "2:", "netem", "delay", "1ms"],
                     check=False)
        if netem.returncode != 0:
            return KernelSupport(True, False, "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM; `tc` says: "
                                              f"{netem.stderr.strip()}), so kernel links can limit rates "
                                              "but not add latency, jitter or loss")
        return KernelSupport(True, True, "")
    finally:
        _run(["ip", "link", "del", veth], check=False)
        _run(["ip", "netns", "del", name], check=False)


def needs_netem(profile: Profile) -> bool:
    return bool(profile.latency or profile.jitter or profile.loss)


def kernel_problem(network: Network) -> str | None:
    """Why this machine cannot run `network` over kernel links (None: it can)."""
    support = kernel_support()
    if not support.namespaces:
        return support.why
    if not support.netem:
        delayed = sorted({network.profile(site).name for site in network.assigned if needs_netem(network.profile(site))})
        if delayed:
            return f"{support.why}: profile(s) {', '.join(delayed)} have latency, jitter or loss"
    return None


def enter_namespace(name: str) -> None:
    """Move this process's calling thread into network namespace `name` (before it opens any
    socket or starts any thread: threads started after inherit it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_DIR, name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into network namespace {name}")
    finally:
        os.close(fd)


def from_address(endpoint: str, source: str) -> str:
    """A ZeroMQ tcp endpoint that connects from `source` (zmq_tcp: 'tcp://SOURCE:0;HOST:PORT')."""
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"kernel links need a tcp endpoint, got {endpoint}")
    return f"tcp://{source}:0;{endpoint[len('tcp://'):]}"


def _rate(bits_per_second: float) -> str:
    return f"{int(round(bits_per_second))}bit" if bits_per_second > 0 else UNLIMITED


def _burst(bits_per_second: float) -> str:
    """htb's bucket: a tenth of a millisecond of the rate (at least 2 bytes). htb sends a packet
    while its class is not deeper in debt than the bucket, so a small bucket lets only a
    message's first packet leave early (a bucket of a full frame let two: measured here, a 5 KB
    message at 0.5 Mbit/s arrived in 48 ms with 1,600 bytes, 73 ms with 2, where 8B/R is 80)."""
    return f"{max(2, int(bits_per_second / 8 / 1e4)) if bits_per_second > 0 else 2**20}b"


def _netem(profile: Profile, direction: str) -> list[str]:
    """netem's arguments for one direction of a site's link (tc-netem(8)): its rate (netem
    serializes each packet, as a link does), one-way delay, jitter and loss."""
    args = []
    if profile.rate(direction) > 0:
        args += ["rate", _rate(profile.rate(direction))]
    args += ["delay", f"{profile.latency * 1e3:.3f}ms"]
    if profile.jitter:
        args += [f"{profile.jitter * 1e3:.3f}ms"]
    if profile.loss:
        args += ["loss", f"{profile.loss * 100:.4f}%"]
    return args + ["limit", "100000"]


def tc_commands(device: str, direction: str, addresses: dict[str, str], network: Network,
                netem: bool) -> list[str]:
    """`tc -batch` lines for one end's egress: htb with a class per site ("down" on this end,
    filtered by destination; "up" in the namespace, by source). Where the kernel has netem, a
    netem qdisc under each class is the site's link (rate, delay, jitter, loss) and the class
    only sorts; without netem, the class itself limits the rate (htb shapes: a message's first
    packet leaves at once) and a profile with latency, jitter or loss cannot run (kernel_problem)."""
    match = "dst" if direction == "down" else "src"
    lines = [f"qdisc add dev {device} root handle 1: htb default 1",
             f"class add dev {device} parent 1: classid 1:1 htb rate {UNLIMITED} quantum 60000"]
    for number, (site, address) in enumerate(addresses.items(), start=2):
        profile = network.profile(site)
        rate = 0.0 if netem else profile.rate(direction)
        lines.append(f"class add dev {device} parent 1: classid 1:{number:x} htb rate {_rate(rate)} "
                     f"burst {_burst(rate)} cburst {_burst(rate)} quantum 1600")
        if netem and profile.emulated:
            lines.append(f"qdisc add dev {device} parent 1:{number:x} handle {number:x}: netem "
                         f"{' '.join(_netem(profile, direction))}")
        lines.append(f"filter add dev {device} parent 1: protocol ip prio 1 u32 match ip {match} {address}/32 "
                     f"flowid 1:{number:x}")
    return lines


def _subnet_in_use() -> set[int]:
    """Second octets of the 10.x.0.0/16 networks this namespace already has addresses in."""
    shown = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    return {int(m.group(1)) for m in re.finditer(r"inet 10\.(\d+)\.", shown)}


def remove_stale() -> list[str]:
    """Namespaces of runs whose process is gone (a killed harness cannot clean up): removed."""
    removed = []
    for name in os.listdir(NETNS_DIR) if os.path.isdir(NETNS_DIR) else []:
        found = re.fullmatch(rf"{PREFIX}(\d+)-\d+", name)
        if found and not os.path.exists(f"/proc/{found.group(1)}"):
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    return removed


class KernelLinks:
    """The run's namespace, veth pair and qdiscs for `site_ids` on `network`'s profiles. open()
    makes them (KernelLinksUnavailable, saying why, when this machine cannot); close() removes
    them (also at exit, and a later run removes those of a killed one)."""

    def __init__(self, network: Network, site_ids: list[str]) -> None:
        if len(site_ids) > MAX_SITES:
            raise KernelLinksUnavailable(f"kernel links hold at most {MAX_SITES} sites, the run has {len(site_ids)}")
        self.network, self.site_ids = network, list(site_ids)
        number = next(_numbers)
        self.namespace = f"{PREFIX}{os.getpid()}-{number}"
        self.veth = f"qk{os.getpid() % 10**6}{number % 100}"  # at most 15 characters, as Linux requires
        self.addresses: dict[str, str] = {}
        self.host_address = ""
        self.netem = False
        self._open = False

    def open(self) -> "KernelLinks":
        problem = kernel_problem(self.network)
        if problem:
            raise KernelLinksUnavailable(problem)
        self.netem = kernel_support().netem
        remove_stale()
        used = _subnet_in_use()
        second = next((octet for octet in range(200, 255) if octet not in used), None)
        if second is None:
            raise KernelLinksUnavailable("no free 10.200-254.0.0/16 network for the sites' addresses")
        net = ipaddress.IPv4Network(f"10.{second}.0.0/16")
        self.host_address = str(net.network_address + 1)
        self.addresses = {site: str(net.network_address + 2 + j) for j, site in enumerate(self.site_ids)}
        _run(["ip", "netns", "add", self.namespace])
        self._open = True
        atexit.register(self.close)
        inside = self.veth + "b"
        _run(["ip", "link", "add", self.veth, "type", "veth", "peer", "name", inside, "netns", self.namespace])
        _run(["ip", "addr", "add", f"{self.host_address}/16", "dev", self.veth])
        # one segment per packet: a veth otherwise passes 64 KB GSO super-packets, which htb lets
        # through whole on credit, so a message of tens of KB would skip its serialization time
        _run(["ip", "link", "set", self.veth, "gso_max_segs", "1", "up"])
        lines = [f"addr add {address}/16 dev {inside}" for address in self.addresses.values()]
        _run(["ip", "-n", self.namespace, "-batch", "-"], stdin="\n".join([
            "link set lo up", *lines, f"link set {inside} gso_max_segs 1 up"]) + "\n")
        _run(["tc", "-batch", "-"], stdin="\n".join(
            tc_commands(self.veth, "down", self.addresses, self.network, self.netem)) + "\n")
        _run(["ip", "netns", "exec", self.namespace, "tc", "-batch", "-"], stdin="\n".join(
            tc_commands(inside, "up", self.addresses, self.network, self.netem)) + "\n")
        return self

    def bind(self, endpoint: str) -> str:
        """Where to bind instead of `endpoint` so that the sites reach it over their links: this
        end of the veth pair, on `endpoint`'s port (tcp://10.P.0.1:*)."""
        port = endpoint.rsplit(":", 1)[-1] if endpoint.startswith("tcp://") else "*"
        return f"tcp://{self.host_address}:{port}"

    def describe(self) -> dict:
        """summary.json's account of the kernel links."""
        return {"namespace": self.namespace, "veth": self.veth, "coordinator_address": self.host_address,
                "qdiscs": "htb per site" + (" + netem" if self.netem else ""),
                "sites": len(self.addresses)}

    def close(self) -> None:
        if self._open:
            self._open = False
            _run(["ip", "netns", "del", self.namespace], check=False)  # takes the veth pair with it
            _run(["ip", "link", "del", self.veth], check=False)


__all__ = ["KernelLinks", "KernelLinksUnavailable", "KernelSupport", "enter_namespace", "from_address",
           "kernel_problem", "kernel_support", "remove_stale", "tc_commands"]
