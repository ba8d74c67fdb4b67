"""The shuffler is another party (issue 47, point 4): it makes its own key pair in its own
process, the sites take its public key from the party registry and from nowhere else, and its
allow-list of sites comes from the same registry (transport.registry). Over real site processes
and a real shuffler process, as tests/test_shuffle_runtime.py runs them; the registry's format
and its refusals, on files."""

from __future__ import annotations

import gc
import json
import re
import socket
import subprocess
import sys
import threading

import pytest
import yaml
import zmq
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from runner import federation
from runner.federation import ProcessFederation
from runner.outputs import RunDirectory
from runner.study import run_study
from scenarios.scenario import validate_scenario
from specs.schema import ScenarioError
from tests.support import TINY
from tests.test_cli import ROOT
from transport.registry import (REGISTRY_FILE, read_registry, shuffler_keys, shuffler_public, write_registry)
from transport.security import ClientKeys, ServerKeys, new_key_pair, write_public_key

BINS = {"count": 16, "lo": 0.0, "hi": "training"}


def scenario(respond=10, dropouts=0) -> dict:
    raw = yaml.safe_load(TINY.read_text())
    # the budget is not what these tests are about: unlimited, so that no release is refused for it
    raw.update(trials=1, methods=[{"name": "fedcp2_qq_shuffle", "epsilon": 3.0, "bins": BINS, "dropouts": dropouts}],
               sites={"count": 6, "sizes": "equal", "policy": {"non_private": "allow"},
                      "budget": {"epsilon": "unlimited"}})
    raw["data"]["n"] = 6000
    raw["runtime"] = {"deadlines": {"hello": 30, "join": 20, "respond": respond},
                      "placement": {"sites_per_process": 3}}
    return validate_scenario(raw)


def events(run) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


Z85_TOKEN = re.compile(rb"[0-9A-Za-z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


def opens(secret_z85: bytes, public: bytes) -> bool:
    """Whether `secret_z85` (40 characters) is the secret half of `public`."""
    try:
        return zmq.curve_public(secret_z85) == public
    except (ValueError, zmq.ZMQError):
        return False


def secrets_in_memory(publics: list[bytes]) -> set[bytes]:
    """Which of `publics` have their secret half somewhere in this process's objects: every str and
    bytes reachable from the objects the collector tracks (through containers it does not track,
    such as a dict of strings), taken as a Z85 (40 characters) or raw (32 bytes) secret key."""
    found = set()
    seen = set()
    waiting = list(gc.get_objects())
    while waiting:
        value = waiting.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, str):
            if len(value) == 40 and value.isascii():
                found.update(p for p in publics if opens(value.encode("ascii"), p))
        elif isinstance(value, (bytes, bytearray)):
            if len(value) in (32, 40):
                candidate = z85.encode(bytes(value)) if len(value) == 32 else bytes(value)
                found.update(p for p in publics if opens(candidate, p))
        else:
            waiting.extend(gc.get_referents(value))
    return found


def test_the_shuffler_makes_and_keeps_its_own_secret(tmp_path, monkeypatch):
    """The coordinator's process (the harness, the driver, the federation's objects) never holds
    the shuffler's secret key: a scan of its objects finds a secret planted for the purpose (the
    scan works) and not the shuffler's; no file of the run holds it either, while the shuffler
    served every site."""
    seen = {}
    close = ProcessFederation.close
    planted_public, planted = new_key_pair()
    holder = {"secret": planted}

    def close_after_looking(self):  # while the shuffler still runs: what does this process hold?
        registry = read_registry(self.service.registry)
        seen.update(registry=registry, shuffler_public=self.shuffler.public, planted=holder,
                    held=secrets_in_memory([planted_public, registry.shuffler.key]))
        close(self)

    monkeypatch.setattr(ProcessFederation, "close", close_after_looking)
    out = tmp_path / "run"
    run_study(scenario(), out)
    (row,) = RunDirectory(out).read_results()
    assert row["status"] == "ok" and int(row["answered"]) == 6, row["reason"]
    registry = seen["registry"]
    shuffler_public_key = registry.shuffler.key
    assert seen["shuffler_public"] == shuffler_public_key  # the key the shuffler sent is the registry's
    assert seen["held"] == {planted_public}  # the planted secret is found, the shuffler's is not
    # the registry: the launcher's, in the run's key directory, listing every party once
    assert registry.source == str(out / "keys" / REGISTRY_FILE)
    assert sorted(p.role for p in registry.parties.values()) == ["coordinator", "shuffler"] + ["site"] * 6
    assert any(e["event"] == "registry" and "launcher" in e["note"] for e in events(out))
    # on disk: the coordinator's secret only, and no 40-character token anywhere opens the shuffler's key
    assert sorted(p.name for p in out.rglob("*.key_secret")) == ["coordinator.key_secret"]
    for path in (p for p in out.rglob("*") if p.is_file()):
        for token in Z85_TOKEN.findall(path.read_bytes()):
            assert not opens(token, shuffler_public_key), path
    log = (out / "logs" / "shuffler.log").read_text()
    assert log.count("sealed message of") == 6


class Impostor(threading.Thread):
    """A "shuffler" the coordinator's side starts with a key of its own: a CURVE server that would
    take any client (no ZAP handler), counting what reaches it and the handshakes its monitor saw."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.public, secret = new_key_pair()
        self.socket.curve_server, self.socket.curve_publickey, self.socket.curve_secretkey = True, self.public, secret
        self.socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.monitor = self.socket.get_monitor_socket()
        self.received, self.handshakes = 0, {"failed": 0, "succeeded": 0}
        self.stopping = threading.Event()

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.socket, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        failed = {zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                  zmq.EVENT_HANDSHAKE_FAILED_AUTH}
        while not self.stopping.is_set():
            ready = dict(poller.poll(100))
            if self.socket in ready:
                self.socket.recv_multipart()
                self.received += 1
            if self.monitor in ready:
                event = recv_monitor_message(self.monitor)["event"]
                if event in failed:
                    self.handshakes["failed"] += 1
                elif event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self.handshakes["succeeded"] += 1

    def close(self) -> None:
        self.stopping.set()
        self.join(timeout=5)
        self.socket.disable_monitor()
        self.monitor.close()
        self.socket.close()
        self.context.term()


def test_a_site_refuses_a_shuffler_whose_key_is_not_the_registrys(tmp_path, monkeypatch):
    """A coordinator that starts its own "shuffler" and hands the sites its endpoint gets no
    sealed message, even with the impostor's public key as shuffler.key in the coordinator's key
    directory (where the sites found the shuffler's key before issue 47): the sites dial with the
    registry's shuffler key, and the CURVE handshake with a server holding another key fails. The
    registry stays the operators' here (in a local run the launcher writes it: docs/shuffling.md);
    the coordinator does what it could do in a multi-host deployment. No bin reaches anyone."""
    impostor = Impostor()
    impostor.start()
    admit = ProcessFederation._admit

    def admit_then_lie(self, publics):
        admit(self, publics)  # the real shuffler starts and the registry names it ...
        write_public_key(self._key_dir, "shuffler", impostor.public)  # ... the coordinator's files name another
        return impostor.endpoint  # ... and the sites are sent to the impostor

    monkeypatch.setattr(ProcessFederation, "_admit", admit_then_lie)
    out = tmp_path / "run"
    try:
        run_study(scenario(respond=3), out)
    finally:
        impostor.close()
    (row,) = RunDirectory(out).read_results()
    assert impostor.received == 0 and impostor.handshakes["succeeded"] == 0
    assert impostor.handshakes["failed"] >= 6, impostor.handshakes  # every site tried, and was refused
    assert row["status"] == "aborted" and int(row["answered"] or 0) == 0
    assert "sealed message of" not in (out / "logs" / "shuffler.log").read_text()


def test_the_shuffler_refuses_a_sender_the_registry_does_not_list(tmp_path, monkeypatch):
    """The shuffler's allow-list is the registry's sites: a registry without site-002 (which the
    coordinator still admits) leaves site-002's sealed message outside, a dropout with the reason,
    while the other five are shuffled."""
    write = federation.write_registry

    def without_site_002(path, *, sites, **parties):
        return write(path, sites={s: k for s, k in sites.items() if s != "site-002"}, **parties)

    monkeypatch.setattr(federation, "write_registry", without_site_002)
    out = tmp_path / "run"
    run_study(scenario(respond=8, dropouts=1), out)  # 8 s: the five honest sites answer in time under load
    (row,) = RunDirectory(out).read_results()
    assert row["status"] == "ok" and int(row["answered"]) == 5, row["reason"]
    log = (out / "logs" / "shuffler.log").read_text()
    assert log.count("sealed message of") == 5 and "from site-002" not in log
    dropouts = {e["site"]: e["reason"] for e in events(out) if e["event"] == "dropout" and e.get("session") == 1}
    assert list(dropouts) == ["site-002"] and "no sealed message by its deadline" in dropouts["site-002"]
    assert any(e["event"] == "hello" and e["site"] == "site-002" for e in events(out))  # the coordinator took it


# -- the registry's format ------------------------------------------------------------------------

def keys(n: int) -> list[str]:
    return [new_key_pair()[0].decode("ascii") for _ in range(n)]


def registry_file(tmp_path, parties, name="parties.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"parties": parties}))
    return path


def parties(k):
    return [{"name": "coordinator", "role": "coordinator", "key": k[0]},
            {"name": "shuffler", "role": "shuffler", "key": k[1], "endpoint": "tcp://10.0.0.3:5600"},
            {"name": "site-000", "role": "site", "key": k[2]},
            {"name": "site-001", "role": "site", "key": k[3]}]


def test_a_registry_lists_each_party_and_key_once(tmp_path):
    k = keys(4)
    registry = read_registry(registry_file(tmp_path, parties(k)))
    assert registry.shuffler.key == k[1].encode() and registry.shuffler.endpoint == "tcp://10.0.0.3:5600"
    assert registry.sites() == {k[2].encode(): "site-000", k[3].encode(): "site-001"}
    assert shuffler_public(registry.source) == k[1].encode()
    # what write_registry writes reads back the same
    again = read_registry(write_registry(tmp_path / "w.json", coordinator=k[0].encode(), shuffler=k[1].encode(),
                                         shuffler_endpoint="tcp://10.0.0.3:5600",
                                         sites={"site-000": k[2].encode(), "site-001": k[3].encode()}))
    assert again.parties == registry.parties
    # with the sites' signing keys (issue 48): what a site checks its peers' signatures with
    signed = read_registry(write_registry(tmp_path / "s.json", coordinator=k[0].encode(),
                                          sites={"site-000": k[2].encode(), "site-001": k[3].encode()},
                                          signing={"site-000": k[1].encode()}))
    assert signed.signing_keys() == {"site-000": z85.decode(k[1])}


@pytest.mark.parametrize("change, field, words", [
    (lambda p, k: p.append({"name": "site-000", "role": "site", "key": keys(1)[0]}), "parties[4].name",
     "a name no other party has"),
    (lambda p, k: p.append({"name": "site-009", "role": "site", "key": k[2]}), "parties[4].key",
     "a key no other party has (site-000 has this one)"),
    (lambda p, k: p.append({"name": "shuffler", "role": "shuffler", "key": keys(1)[0]}), "parties[4].name",
     "a name no other party has"),
    (lambda p, k: p[1].update(name="shuffler-2"), "parties[1].name", "'shuffler' (the shuffler's name)"),
    (lambda p, k: p[2].update(name="coordinator"), "parties[2].name", "a site's own id"),
    (lambda p, k: p[2].update(key="not a key"), "parties[2].key", "40 characters of Z85"),
    (lambda p, k: p[2].update(key="#" * 40), "parties[2].key", "40 characters of Z85"),
    (lambda p, k: p[2].update(role="observer"), "parties[2].role", "one of 'coordinator', 'shuffler', 'site'"),
    (lambda p, k: p[2].update(endpoint="tcp://x:1"), "parties[2].endpoint", "only the shuffler's"),
    (lambda p, k: p[2].update(port=1), "parties[2].port", "no field 'port' here"),
    (lambda p, k: p.pop(0), "parties", "one party with role 'coordinator'"),
    (lambda p, k: (p[2].update(signing=k[0]), p[3].update(signing=k[0])), "parties[3].signing",
     "a signing key no other site has (site-000 has this one)"),
    (lambda p, k: p[1].update(signing=keys(1)[0]), "parties[1].signing", "only sites sign"),
    (lambda p, k: p[2].update(signing="short"), "parties[2].signing", "an Ed25519 public key"),
], ids=["name-twice", "key-twice", "two-shufflers", "shuffler-name", "site-named-coordinator", "bad-key", "overflow-key",
        "unknown-role", "site-endpoint", "unknown-field", "no-coordinator", "signing-key-twice", "shuffler-signs",
        "bad-signing-key"])
def test_a_bad_registry_is_refused_naming_the_file_and_field(tmp_path, change, field, words):
    k = keys(4)
    entries = parties(k)
    change(entries, k)
    path = registry_file(tmp_path, entries)
    with pytest.raises(ScenarioError) as raised:
        read_registry(path)
    problems = raised.value.problems
    assert any(p.field == field and words in p.expectation for p in problems), str(raised.value)
    assert all(p.file == str(path) for p in problems) and str(path) in str(raised.value)


def test_a_field_twice_in_json_or_a_broken_file_is_refused(tmp_path):
    k = keys(4)
    text = json.dumps({"parties": parties(k)})
    twice = tmp_path / "twice.json"
    twice.write_text(text.replace('"role": "site",', '"role": "site", "role": "coordinator",', 1))
    with pytest.raises(ScenarioError, match=r"twice.json: field '\(file\)': expected no field twice in one object: "
                                            r"'role' is"):
        read_registry(twice)
    broken = tmp_path / "broken.json"
    broken.write_text(text[:-3])
    with pytest.raises(ScenarioError, match=r"broken.json: .*valid JSON at line 1"):
        read_registry(broken)
    with pytest.raises(ScenarioError, match="a readable party registry"):
        read_registry(tmp_path / "absent.json")


def test_the_shuffler_refuses_a_registry_that_names_another_key_and_sites_need_one(tmp_path):
    k = keys(4)
    path = registry_file(tmp_path, parties(k))
    public, secret = new_key_pair()
    with pytest.raises(ScenarioError, match="this shuffler's own public key"):
        shuffler_keys(path, public, secret)
    mine = parties(k)
    mine[1]["key"] = public.decode()
    server, client = shuffler_keys(registry_file(tmp_path, mine, "mine.json"), public, secret)
    assert server == ServerKeys(public, secret, {k[2].encode(): "site-000", k[3].encode(): "site-001"})
    assert client == ClientKeys(k[0].encode(), public, secret)  # it dials the registry's coordinator
    with pytest.raises(ScenarioError, match="a site takes the shuffler's public key from the operators' registry"):
        shuffler_public(None)
    no_shuffler = registry_file(tmp_path, [p for p in parties(k) if p["role"] != "shuffler"], "none.json")
    with pytest.raises(ScenarioError, match="a party with role 'shuffler'"):
        shuffler_public(no_shuffler)


# -- several operators: each party its own keys, the registry theirs --------------------------------

def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_py(*args, **kwargs):
    return subprocess.run([sys.executable, "run.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, **kwargs)


def test_operators_run_a_shuffled_study_with_their_own_keys_and_registry(tmp_path):
    """Multi-host, on loopback: the coordinator's, the shuffler's and the site host's operators
    each make their own key pair (`run.py keys`), the registry is written from the public halves
    (`run.py registry`), and the shuffler (`run.py shuffler`) and the sites (`run.py site
    --registry`) are started by their operators: the shuffled method answers with every site, and
    so does an actively secure sum, whose sites check each other's signed keys and survivor views
    against the signing keys in the operators' registry (issue 48)."""
    raw = yaml.safe_load(TINY.read_text())
    raw.update(trials=1, methods=[{"name": "fedcp2_qq_shuffle", "epsilon": 5.0, "bins": BINS},
                                  {"name": "fedcp2_qq_secagg", "epsilon": 5.0, "bins": BINS}])
    raw["sites"]["budget"] = {"epsilon": "unlimited"}
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(raw))
    policy = tmp_path / "policy.yaml"  # the site operator's own (the budget is not what this test is about)
    policy.write_text(yaml.safe_dump({"max_epsilon": 5.0, "budget": {"epsilon": "unlimited"}}))
    coordinator_keys, shuffler_keys_dir, site_keys, publics = (tmp_path / d for d in ("c", "s", "h", "publics"))
    for args in (["--dir", coordinator_keys, "--coordinator"], ["--dir", shuffler_keys_dir, "--shuffler"],
                 ["--dir", site_keys, "--site-ids", "0-3", "--coordinator-key", coordinator_keys / "coordinator.key"]):
        made = run_py("keys", *args)
        assert made.returncode == 0, made.stdout + made.stderr
    publics.mkdir()
    sent = [coordinator_keys / "coordinator.key", shuffler_keys_dir / "shuffler.key",
            *(site_keys / f"site-00{j}.key" for j in range(4))]
    for path in sent:
        (publics / path.name).write_bytes(path.read_bytes())
        if path.name != "coordinator.key":  # what the coordinator's operator admits
            (coordinator_keys / path.name).write_bytes(path.read_bytes())
    coordinator_port, shuffler_port = free_port(), free_port()
    registry = tmp_path / "parties.json"
    written = run_py("registry", "--keys", publics, "--out", registry,
                     "--shuffler-endpoint", f"tcp://127.0.0.1:{shuffler_port}")
    assert written.returncode == 0 and "4 site(s)" in written.stdout, written.stdout + written.stderr
    out = tmp_path / "run"
    coordinator = subprocess.Popen(
        [sys.executable, "run.py", "coordinator", "--scenario", study, "--bind", f"tcp://127.0.0.1:{coordinator_port}",
         "--keys", coordinator_keys, "--out", out, "--hello-timeout", "60"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    shuffler = subprocess.Popen(
        [sys.executable, "run.py", "shuffler", "--connect", f"tcp://127.0.0.1:{coordinator_port}",
         "--bind", f"tcp://127.0.0.1:{shuffler_port}", "--workdir", tmp_path / "shuffler-host",
         "--keys", shuffler_keys_dir, "--registry", registry, "--idle-timeout", "60"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        sites = run_py("site", "--connect", f"tcp://127.0.0.1:{coordinator_port}", "--site-ids", "0-3",
                       "--scenario", study, "--policy", policy, "--keys", site_keys, "--registry", registry,
                       "--workdir", tmp_path / "site-host", "--idle-timeout", "60")
        output, _ = coordinator.communicate(timeout=120)
        shuffled, _ = shuffler.communicate(timeout=30)
    finally:
        for process in (coordinator, shuffler):
            if process.poll() is None:
                process.kill()
    assert coordinator.returncode == 0, output
    assert sites.returncode == 0, sites.stdout + sites.stderr
    assert shuffler.returncode == 0, shuffled
    rows = RunDirectory(out).read_results()
    assert [r["method"] for r in rows] == ["fedcp2_qq_shuffle", "fedcp2_qq_secagg"]
    for row in rows:
        assert row["status"] == "ok" and int(row["answered"]) == 4, row["reason"]
    sites_listed = [p for p in json.loads(registry.read_text())["parties"] if p["role"] == "site"]
    assert len(sites_listed) == 4 and all(p.get("signing") for p in sites_listed)  # from the operators' .key files
    log = (tmp_path / "shuffler-host" / "logs" / "shuffler.log").read_text()
    assert log.count("sealed message of") == 4
    # every secret stayed with its party: none in the run, none sent
    assert sorted(p.name for p in out.rglob("*.key_secret")) == []
    assert not list(publics.glob("*.key_secret"))
    assert (shuffler_keys_dir / "shuffler.key_secret").exists() and not list(coordinator_keys.glob("shuffler*_secret"))


def test_a_stranger_shuffler_key_stops_the_shuffler_before_it_serves(tmp_path):
    """The shuffler's operator given a registry that lists another shuffler key: the command
    stops, naming the registry's field, rather than serve sites that would dial someone else."""
    made = run_py("keys", "--dir", tmp_path / "s", "--shuffler")
    assert made.returncode == 0, made.stderr
    k = keys(4)
    registry = registry_file(tmp_path, parties(k))
    started = run_py("shuffler", "--connect", "tcp://127.0.0.1:1", "--bind", "tcp://127.0.0.1:*",
                     "--workdir", tmp_path / "w", "--keys", tmp_path / "s", "--registry", registry)
    assert started.returncode != 0
    log = (tmp_path / "w" / "logs" / "shuffler.log").read_text()
    assert "this shuffler's own public key" in log and "parties.shuffler.key" in log
