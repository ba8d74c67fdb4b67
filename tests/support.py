"""Shared machinery for the runtime tests: the small test scenario, its trial data on disk,
fake sites speaking the protocol from threads, and a byte-counting TCP proxy."""

from __future__ import annotations

import os
import socket
import threading
from collections import defaultdict
from pathlib import Path

import numpy as np
import zmq

from runner.processes import SiteHosts
from sites.service import SiteService
from world.trial import WorldSpec, build_trial
from quorum import load_scenario
from sites.storage import write_trial
from transport.channel import RouterChannel, DealerChannel

TINY = Path(__file__).parent / "scenarios" / "tiny.yaml"


def trial_zero(workdir: Path):
    """The tiny scenario and its trial 0, with every site's shard and the model on disk."""
    scenario = load_scenario(TINY).to_dict()
    world = build_trial(WorldSpec.of(scenario), 0)
    write_trial(workdir, 0, world.model, world.shards, world.record_ids)
    return scenario, world


def one_live_site(workdir: Path, host_mates: int = 0):
    """Trial 0 of the tiny scenario on disk, a coordinator channel, and site-000 as a real,
    started site process (with `host_mates` more sites in the same host process):
    (scenario, world, channel, processes)."""
    scenario, world = trial_zero(workdir)
    channel = RouterChannel("tcp://127.0.0.1:*")
    sites = [f"site-{i:03d}" for i in range(1 + host_mates)]
    # the tests' site operator allows raw answers
    processes = SiteHosts(sites, SiteService(channel.endpoint, str(workdir), policy={"non_private": "allow"}), workdir,
                          sites_per_process=len(sites))
    processes.start()
    return scenario, world, channel, processes


class FakeSite(threading.Thread):
    """A site speaking the protocol from a thread; `mute` sites join but never answer requests."""

    def __init__(self, endpoint, site_id, scores, mute=False, announce=None):
        super().__init__(daemon=True)
        self.endpoint, self.site_id, self.scores, self.mute = endpoint, site_id, scores, mute
        self.announce = announce  # the n it claims at join (default: its true size)
        self.stop = threading.Event()

    def run(self):
        channel = DealerChannel(self.endpoint, self.site_id, context=zmq.Context.instance())
        channel.send("hello", 0, {"pid": os.getpid()})
        while not self.stop.is_set():
            incoming = channel.receive(0.05)
            if incoming is None or incoming.envelope is None:
                continue
            env = incoming.envelope
            if env.type == "open":
                channel.send("join", env.session, {"n": len(self.scores) if self.announce is None else self.announce,
                                                   "device": "cpu"})
            elif env.type == "request" and not self.mute:
                ell = env.payload["body"]["ell"]
                channel.send("response", env.session,
                             {"phase": env.payload["phase"], "body": float(np.sort(self.scores)[ell - 1])})
            elif env.type == "shutdown":
                break
        channel.close()


def start_fakes(endpoint, m, n, mute=()):
    """m fake sites with n scores each (n may be a list of per-site sizes)."""
    rng = np.random.default_rng(0)
    sizes = n if isinstance(n, list) else [n] * m
    fakes = [FakeSite(endpoint, f"site-{j:03d}", rng.standard_normal(sizes[j]), mute=f"site-{j:03d}" in mute)
             for j in range(m)]
    for fake in fakes:
        fake.start()
    return fakes


def stop_fakes(fakes) -> None:
    """Stop fake sites and wait until their sockets are closed, so that none can reconnect to a
    later test's coordinator should its port be reused."""
    for fake in fakes:
        fake.stop.set()
    for fake in fakes:
        fake.join(timeout=5)


class CountingProxy(threading.Thread):
    """A TCP relay in front of the coordinator that counts the bytes of each connection."""

    def __init__(self, target_port):
        super().__init__(daemon=True)
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.port = self.server.getsockname()[1]
        self.target = target_port
        self.counts = []  # one [up, down] per accepted connection, in order
        self.lock = threading.Lock()

    def run(self):
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            counter = [0, 0]
            with self.lock:
                self.counts.append(counter)
            for src, dst, index in ((client, upstream, 0), (upstream, client, 1)):
                threading.Thread(target=self._pump, args=(src, dst, counter, index), daemon=True).start()

    def _pump(self, src, dst, counter, index):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                break
            if not data:
                break
            with self.lock:
                counter[index] += len(data)
            try:
                dst.sendall(data)
            except OSError:
                break
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def compare(self, ledger) -> tuple[list, list]:
        """(per-site [up, down] totals from the ledger, per-connection [up, down] relayed), sorted."""
        totals = defaultdict(lambda: [0, 0])
        for row in ledger.rows:
            totals[row["site"]][0 if row["direction"] == "up" else 1] += row["bytes"]
        with self.lock:
            relayed = sorted(tuple(c) for c in self.counts)
        return sorted(tuple(c) for c in totals.values()), relayed
