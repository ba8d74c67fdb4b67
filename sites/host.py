"""A site host: one OS process serving many site agents (sites.agent) from one event loop.

Every agent keeps its own ZeroMQ connection; the host waits on all of them at once with the
operating system's selector (epoll) over each socket's signalling descriptor, so a message
costs the host O(1) whatever the number of agents (polling every socket per wake-up would cost
O(N) per message, and with N CURVE handshakes in flight O(N^2) in all). ZeroMQ's descriptor is
edge-triggered: it signals a change, not a message, so an agent reads until its socket says
nothing is left, and is read again after anything it sends (SiteAgent.drain). Even so, a
wake-up can be missed (seen at 3,000 agents in one host: a burst of shutdowns, a tail of agents
never woken), so the host also sweeps every live agent's socket state each SWEEP_S seconds;
a missed wake-up costs at most that. The sweep is one zmq_poll over the live sockets (about
0.9 us per agent, in C); asking each socket for its state from Python cost 3.7 us per agent
idle and more under load: ten hosts of 1,000 sites sweeping that way spent 0.45 of this
machine's two cores doing nothing (measured during a 10,000-site secure sum).

The host exits when all its agents have finished (shutdown, or a scripted crash), when its
launcher disappears, or after `idle_timeout` seconds without a message. A host serving a
single site is the plain site process: a scripted crash then kills the process itself.
"""

from __future__ import annotations

import logging
import resource
import selectors
import time

import zmq

from sites.agent import SiteAgent
from sites.storage import GroupCommit
from transport.channel import orphaned
from transport.faults import kill_self

log = logging.getLogger("quorum.host")

SWEEP_S = 0.1
FDS_SPARE = 256  # the process's own files, libraries, the log, the launcher's pipe


def descriptors_needed(sockets: int, per_socket: int = 2) -> int:
    """Open files a process needs for `sockets` ZeroMQ connections (measured on Linux: a
    connected DEALER costs about two, its mailbox and its TCP connection; a ROUTER costs one
    per connected peer)."""
    return sockets * per_socket + FDS_SPARE


def raise_open_files(needed: int, who: str, check_only: bool = False) -> int:
    """Raise this process's soft open-file limit to `needed` (within the hard limit), or raise
    OSError saying what to change; `check_only`: only check (a launcher, before it starts
    anything). Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if needed <= soft:
        return soft
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise OSError(f"{who} needs {needed} open files but this machine allows at most {hard} per process "
                      f"(hard limit, `ulimit -Hn`): raise it (e.g. LimitNOFILE in systemd, nofile in "
                      f"/etc/security/limits.conf) or put fewer sites per process "
                      f"(runtime.placement.sites_per_process)")
    if check_only:
        return soft
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed


def host_context(agents: int, shuffler: bool) -> zmq.Context:
    """A ZeroMQ context that may hold every agent's sockets (the default allows 1,023)."""
    context = zmq.Context()
    context.set(zmq.MAX_SOCKETS, max(1024, agents * (2 if shuffler else 1) + 16))
    return context


def serve(agents: list[SiteAgent], *, parent_alive=None, idle_timeout: float | None = None,
          commit: GroupCommit | None = None) -> int:
    """Serve until every agent finished; 1 when the host gave up waiting (orphaned), else 0.
    `commit`: the agents' group commit, flushed once per turn of the loop (after every agent with
    a message has handled it), which releases their answers."""
    selector = selectors.DefaultSelector()
    descriptors = {agent: agent.fd for agent in agents}
    for agent, fd in descriptors.items():
        selector.register(fd, selectors.EVENT_READ, agent)
    for agent in agents:
        agent.hello()
        agent.drain()
    live = {agent for agent in agents if agent.running}
    sweep = Sweep(live)
    timed = {agent for agent in live if agent.next_due() is not None}
    last_heard = last_check = last_sweep = time.monotonic()
    try:
        while live:
            now = time.monotonic()
            due = min((agent.next_due() for agent in timed), default=None)
            wait = SWEEP_S if due is None else max(0.0, min(SWEEP_S, due - now))
            touched = set()
            for key, _ in selector.select(wait):
                agent = key.data
                if agent.running and agent.drain():
                    last_heard = time.monotonic()
                touched.add(agent)
            now = time.monotonic()
            if now - last_sweep >= SWEEP_S:
                last_sweep = now
                touched.update(agent for agent in live if not agent.running)
                sweep.discard(touched)  # closed sockets leave the poll before it runs
                for agent in sweep.ready():
                    if agent.drain():
                        last_heard = now
                    touched.add(agent)
            while commit is not None and commit.pending:
                for agent in commit.flush():  # the answers leave; each agent reads what came meanwhile
                    agent.drain()
                    touched.add(agent)
            for agent in [a for a in timed if a.running and (a.next_due() or now) <= now]:
                agent.flush()
                agent.drain()
                touched.add(agent)
            sweep.discard(touched)
            for agent in touched:
                if not agent.running:
                    live.discard(agent)
                    timed.discard(agent)
                    _unregister(selector, descriptors[agent])
                elif agent.next_due() is not None:
                    timed.add(agent)
                else:
                    timed.discard(agent)
            if now - last_check >= 1.0:
                last_check = now
                reason = orphaned(parent_alive, last_heard, idle_timeout)
                if reason:
                    log.warning(reason)
                    return 1
        return 0
    finally:
        for agent in agents:
            if agent.running:
                agent.close()
        selector.close()


class Sweep:
    """The live agents' sockets in one zmq.Poller: `ready()` is one zmq_poll with no wait, the
    agents whose socket holds a message (whatever their descriptor signalled). Agents that stop
    are dropped from the poll by rebuilding it at the next sweep (pyzmq's Poller.unregister is
    O(sockets), so 2,000 agents shutting down one by one would cost O(sockets^2))."""

    def __init__(self, agents) -> None:
        self.agent_of = {agent.channel.socket: agent for agent in agents}
        self.poller: zmq.Poller | None = None

    def discard(self, agents) -> None:
        """Take out the agents that stopped running (their sockets are, or are about to be, closed)."""
        for agent in agents:
            if not agent.running and self.agent_of.pop(agent.channel.socket, None) is not None:
                self.poller = None

    def ready(self) -> list:
        if self.poller is None:
            self.poller = zmq.Poller()
            for socket in self.agent_of:
                self.poller.register(socket, zmq.POLLIN)
        return [self.agent_of[socket] for socket, _ in self.poller.poll(0) if self.agent_of[socket].running]


def crash_policy(agents: list[SiteAgent]):
    """What a scripted crash of one agent does: the whole process when it serves that site
    alone (a real crash, as a one-site process would have), else only that agent."""
    def on_crash(agent: SiteAgent) -> None:
        if len(agents) == 1:
            logging.shutdown()
            kill_self()
    return on_crash


def _unregister(selector, fd: int) -> None:
    try:
        selector.unregister(fd)
    except (KeyError, ValueError, OSError):
        pass
