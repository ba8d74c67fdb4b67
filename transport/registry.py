"""The party registry: who takes part in a federation, each party's CurveZMQ public key and each
site's signing key.

The shuffler is a party of its own (issue 47): a site must learn the shuffler's key from someone
other than the coordinator, or a coordinator could start a "shuffler" of its own, holding its
key, and read which site sent which bin. The registry is a file the operators agree on and give
every party; a party takes its peers' public keys from it and from nowhere else:

    {"parties": [
      {"name": "coordinator", "role": "coordinator", "key": "<Z85 public key, 40 characters>"},
      {"name": "shuffler", "role": "shuffler", "key": "...", "endpoint": "tcp://10.0.0.3:5600"},
      {"name": "site-000", "role": "site", "key": "...", "signing": "<Z85 Ed25519 public key>"},
      ...
    ]}

- a site dials the shuffler with the registry's shuffler key (the CURVE handshake fails with a
  server holding any other), at the shuffler's `endpoint` when the registry gives one (where to
  connect, not whom to trust: a wrong endpoint meets a failed handshake too);
- the shuffler admits the registry's sites and no one else (its allow-list), dials the
  registry's coordinator, and refuses to serve under a registry that names another key for it;
- a site checks the keys its peers advertise in a secure sum, and the survivor views they sign,
  against the registry's `signing` keys (protocol.secagg.identity, issue 48): the coordinator
  relays those messages but cannot sign them, so it can neither substitute a peer's keys nor
  show two sites two survivor sets.

Exactly one coordinator, named `coordinator`, and at most one shuffler, named `shuffler` (the ids
the protocol routes by); no name, no key and no JSON field twice (one key under two names would
let one party count as two). JSON rather than YAML: every site host reads the registry, and
10,000 sites' entries parse in milliseconds (YAML took 0.35 to 1.4 s).

Who writes it: in a multi-host deployment, the operators: each party makes its own key pair
(`run.py keys`), sends the public half, and the registry made of them (`run.py registry`) is
given to every party (`run.py site --registry FILE`, `run.py shuffler --registry FILE`). In a
local run one launcher plays every operator: it collects the public halves the site hosts and
the shuffler made in their own processes and writes KEY_DIR/parties.json before any of them
serves. That launcher is also the coordinator's process, so a local run simulates the separation
of the parties; it cannot give it.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from zmq.utils import z85

from specs.schema import ScenarioError, ScenarioErrors, validate
from transport.security import COORDINATOR_KEY, ClientKeys, ServerKeys

REGISTRY_FILE = "parties.json"  # a local run's registry, in its key directory
SHUFFLER = "shuffler"  # protocol.wire.SHUFFLER_ID: the name the shuffler's entry must have
NAMED = {"coordinator": COORDINATOR_KEY, "shuffler": SHUFFLER}  # role -> the one name it may have

_PARTY = {"type": "map", "fields": {
    "name": {"type": "str"},
    "role": {"type": "str", "choices": ["coordinator", "shuffler", "site"]},
    "key": {"type": "str"},
    "endpoint": {"type": "str", "default": None},
    "signing": {"type": "str", "default": None},
}}
_REGISTRY = {"type": "map", "fields": {"parties": {"type": "list", "of": _PARTY, "min_len": 1}}}


@dataclass(frozen=True)
class Party:
    name: str
    role: str
    key: bytes  # Z85 public key
    endpoint: str | None = None
    signing: bytes | None = None  # a site's Ed25519 public key (raw 32 bytes), when the registry has it


@dataclass(frozen=True)
class Registry:
    source: str  # the file it was read from (named in every error)
    parties: dict[str, Party]  # by name, in the file's order

    def of_role(self, role: str) -> Party:
        """The coordinator's or the shuffler's entry; ScenarioError naming the file when absent."""
        for party in self.parties.values():
            if party.role == role:
                return party
        raise ScenarioError("parties", f"a party with role '{role}'", file=self.source)

    @property
    def coordinator(self) -> Party:
        return self.of_role("coordinator")

    @property
    def shuffler(self) -> Party:
        return self.of_role("shuffler")

    def signing_keys(self) -> dict[str, bytes]:
        """site id -> its signing public key (raw): what a site checks its peers' signatures with."""
        return {p.name: p.signing for p in self.parties.values() if p.role == "site" and p.signing is not None}

    def sites(self) -> dict[bytes, str]:
        """The sites' allow-list (public key -> site id), as transport.security.ServerKeys holds it."""
        return {party.key: party.name for party in self.parties.values() if party.role == "site"}


def read_registry(path: str | Path) -> Registry:
    """The registry in `path`, validated; ScenarioError (every problem, each naming the file
    and field) when it is not a registry."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError("(file)", f"a readable party registry ({exc.strerror})", file=str(path)) from None
    try:
        raw = json.loads(text, object_pairs_hook=_no_field_twice)
    except json.JSONDecodeError as exc:
        raise ScenarioError("(file)", f"valid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}",
                            file=str(path)) from None
    except _Twice as twice:
        raise ScenarioError("(file)", f"no field twice in one object: {twice.args[0]!r} is", file=str(path)) from None
    try:
        return parse_registry(raw, str(path))
    except ScenarioError as exc:
        raise exc.in_file(str(path)) from None


def parse_registry(raw, source: str) -> Registry:
    """A registry from its decoded JSON (see the module docstring); ScenarioError names the field."""
    spec = validate(_REGISTRY, raw, "")
    parties: dict[str, Party] = {}
    keys: dict[bytes, str] = {}  # raw 32-byte key -> the first party with it
    signings: dict[bytes, str] = {}  # likewise for the sites' signing keys
    roles: dict[str, str] = {}
    problems = []
    for index, entry in enumerate(spec["parties"]):
        field = f"parties[{index}]"
        name, role, key = entry["name"], entry["role"], entry["key"]
        if role in NAMED and name != NAMED[role]:
            problems.append(ScenarioError(f"{field}.name", f"'{NAMED[role]}' (the {role}'s name)", name))
        elif role == "site" and (not name or name in NAMED.values()):
            problems.append(ScenarioError(f"{field}.name", "a site's own id, not '' or a name the coordinator or "
                                                           "shuffler goes by", name))
        if name in parties:
            problems.append(ScenarioError(f"{field}.name", "a name no other party has", name))
        if role in NAMED and role in roles:
            problems.append(ScenarioError(f"{field}.role", f"one {role} only ({roles[role]} is one)", role))
        if not _is_public_key(key):
            problems.append(ScenarioError(f"{field}.key", "a CurveZMQ public key: 40 characters of Z85, as in "
                                                          "the `public-key` line of a .key file", key))
        elif z85.decode(key) in keys:
            problems.append(ScenarioError(f"{field}.key", f"a key no other party has ({keys[z85.decode(key)]} "
                                                          f"has this one)", key))
        if entry["endpoint"] is not None and role != "shuffler":
            problems.append(ScenarioError(f"{field}.endpoint", "no endpoint here: only the shuffler's is read "
                                                               "(a site is told the coordinator's by --connect)"))
        signing = entry["signing"]
        if signing is not None and role != "site":
            problems.append(ScenarioError(f"{field}.signing", "no signing key here: only sites sign in a secure sum"))
        elif signing is not None and not _is_public_key(signing):
            problems.append(ScenarioError(f"{field}.signing", "an Ed25519 public key: 40 characters of Z85, as in the "
                                                              "`signing-key` line of a site's .key file", signing))
        elif signing is not None and z85.decode(signing) in signings:
            problems.append(ScenarioError(f"{field}.signing", f"a signing key no other site has "
                                                              f"({signings[z85.decode(signing)]} has this one)", signing))
        if signing is not None and _is_public_key(signing):
            signings.setdefault(z85.decode(signing), name)
        if _is_public_key(key):
            keys.setdefault(z85.decode(key), name)
        roles.setdefault(role, field)
        parties.setdefault(name, Party(name, role, key.encode("ascii"), entry["endpoint"],
                                       z85.decode(signing) if signing is not None and _is_public_key(signing) else None))
    if "coordinator" not in roles:
        problems.append(ScenarioError("parties", "one party with role 'coordinator'"))
    if len(problems) == 1:
        raise problems[0]
    if problems:
        raise ScenarioErrors(problems)
    return Registry(source, parties)


def write_registry(path: str | Path, *, coordinator: bytes, sites: dict[str, bytes], shuffler: bytes | None = None,
                   shuffler_endpoint: str | None = None, signing: dict[str, bytes] | None = None) -> Path:
    """The registry of these parties' public keys (Z85) in `path`, with the sites' signing keys
    (Z85) that `signing` has, checked as it will be read (ScenarioError otherwise) and replaced
    whole (a reader never sees half a file)."""
    signing = signing or {}
    parties = [{"name": COORDINATOR_KEY, "role": "coordinator", "key": coordinator.decode("ascii")}]
    if shuffler is not None:
        parties.append({"name": SHUFFLER, "role": "shuffler", "key": shuffler.decode("ascii"),
                        **({"endpoint": shuffler_endpoint} if shuffler_endpoint else {})})
    parties += [{"name": site, "role": "site", "key": key.decode("ascii"),
                 **({"signing": signing[site].decode("ascii")} if site in signing else {})} for site, key in sites.items()]
    raw = {"parties": parties}
    path = Path(path)
    parse_registry(raw, str(path))
    partial = path.with_name(path.name + ".partial")
    # one party a line: a registry of 10,000 sites stays a file to read, diff and grep
    partial.write_text('{"parties": [\n' + ",\n".join(" " + json.dumps(p) for p in parties) + "\n]}\n")
    os.replace(partial, path)
    return path


def registry_from_keys(directory: str | Path, path: str | Path, shuffler_endpoint: str | None = None) -> Path:
    """The registry of the public keys the parties sent, collected in `directory` (coordinator.key,
    shuffler.key when there is one, every other NAME.key a site's), written to `path`: what the
    operators of a multi-host deployment give every party. Secret halves there are ignored."""
    from transport.security import load_public_key, load_signing_key

    directory = Path(directory)
    names = sorted(p.name.removesuffix(".key") for p in directory.glob("*.key"))
    if COORDINATOR_KEY not in names:
        raise FileNotFoundError(f"no {COORDINATOR_KEY}.key in {directory}: the coordinator's operator sends it "
                                f"(run.py keys --dir DIR --coordinator)")
    shuffler = load_public_key(directory, SHUFFLER) if SHUFFLER in names else None
    sites = {name: load_public_key(directory, name) for name in names if name not in (COORDINATOR_KEY, SHUFFLER)}
    signing = {name: key for name in sites if (key := load_signing_key(directory, name)) is not None}
    return write_registry(path, coordinator=load_public_key(directory, COORDINATOR_KEY), sites=sites,
                          shuffler=shuffler, shuffler_endpoint=shuffler_endpoint, signing=signing)


def shuffler_public(path: str | Path | None) -> bytes:
    """The shuffler's public key as the registry in `path` gives it: what a site dials the shuffler
    with. A site host given no registry cannot know it (the coordinator's word is not enough)."""
    if path is None:
        raise ScenarioError("registry", "a party registry: this run has a shuffler, and a site takes the shuffler's "
                                        "public key from the operators' registry only (run.py site --registry FILE)")
    return read_registry(path).shuffler.key


def shuffler_keys(path: str | Path, public: bytes, secret: bytes) -> tuple[ServerKeys, ClientKeys]:
    """The shuffler's keys under the registry in `path`: its own pair (made or kept by the
    shuffler alone), the registry's sites as its allow-list, the registry's coordinator as the
    server it dials. ScenarioError when the registry names another key for the shuffler: the
    sites would not be talking to this process."""
    registry = read_registry(path)
    if z85.decode(registry.shuffler.key) != z85.decode(public):
        raise ScenarioError("parties.shuffler.key", f"this shuffler's own public key {public.decode('ascii')!r} "
                                                    f"(the sites would dial another shuffler)",
                            registry.shuffler.key.decode("ascii"), file=registry.source)
    return ServerKeys(public, secret, registry.sites()), ClientKeys(registry.coordinator.key, public, secret)


class _Twice(ValueError):
    pass


def _no_field_twice(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise _Twice(key)
        seen[key] = value
    return seen


def _is_public_key(text: str) -> bool:
    if len(text) != 40:
        return False
    try:
        return len(z85.decode(text)) == 32
    except (ValueError, KeyError, TypeError, struct.error):  # not ASCII, not Z85, a group above 2^32
        return False


def signing_keys_of(path: str | Path | None) -> dict[str, bytes]:
    """The sites' signing keys in the registry at `path` ({} when there is none: a site given no
    registry can verify no peer, and refuses an actively secure sum naming the first)."""
    return {} if path is None else read_registry(path).signing_keys()
