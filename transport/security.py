"""Transport security: CurveZMQ (libzmq's CURVE mechanism, via pyzmq) with an allow-list.

Keys are files in a key directory, in pyzmq's certificate format (zmq.auth.create_certificates):

    coordinator.key, coordinator.key_secret     the coordinator's key pair
    site-007.key, site-007.key_secret           each site's key pair
    shuffler.key, shuffler.key_secret           the shuffler's (a client of the coordinator,
                                                a server for the sites' sealed messages), on the
                                                shuffler's own host only (a local run's shuffler
                                                makes its pair in memory: transport.registry)

The coordinator holds every site's public key and its own secret; a site holds its own secret
and the coordinator's public key. The coordinator's ZAP handler admits a connection only if its
long-term key is on the allow-list and names it by the site id that key belongs to (ZAP
User-Id); the driver then refuses any message whose routing id differs from that name, so a
site cannot speak for another. A process with an unknown key never completes the handshake.

Who makes the key pairs (issue 35): a site's secret key never needs to leave its host. In a
multi-host run each site host makes its own (`run.py keys --site-ids`) and sends only the public
halves (SITE.key) to the coordinator's key directory. A run's own site hosts, local processes
or Ray actors, make their sites' pairs in memory when they start (`client_keys_in_memory`) and
send the public halves back; the coordinator admits them (`allow`) and records them in one
file, `sites.public` (issue 40: 10,000 key files cost seconds of start-up). The harness's key
directory then holds the coordinator's pair only: the shuffler, a party of its own, makes its
pair in its own process, and the sites learn its public key from the party registry
(transport.registry, issue 47), never from the coordinator.

An allow-list maps each public key to one site id, so two sites may never share a key (issue
47): the second would be admitted under whichever name the list kept, and could take the
other's name. Building an allow-list, from key files or from the keys hosts sent, refuses a key
another site already holds with DuplicateKeyError, naming both (`claim_key`).

One key, one live connection (issue 48): behind a RouterChannel the ZAP handler admits a key only
while it is free, and names each admission by a serial number (ZAP metadata, `ADMISSION`) that
every message of that connection carries; a second connection with a busy key waits in its
handshake until the key is free, a third is refused (transport.channel.Connections says why, and
when a key is free again).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.utils import z85

COORDINATOR_KEY = "coordinator"


@dataclass(frozen=True)
class ServerKeys:
    public: bytes
    secret: bytes
    sites: dict[bytes, str]  # allowed site public key (Z85) -> site id


@dataclass(frozen=True)
class ClientKeys:
    server_public: bytes
    public: bytes
    secret: bytes

    def signing_key(self):
        """This party's Ed25519 signing key, derived from its CURVE secret (protocol.secagg.identity):
        what it signs its secure-sum keys and survivor views with (issue 48)."""
        from protocol.secagg.identity import signing_key_from_curve

        return signing_key_from_curve(z85.decode(self.secret))

    @property
    def signing_public(self) -> bytes:
        """The public half of `signing_key()`, Z85: what goes to the party registry beside `public`."""
        from protocol.secagg.identity import signing_public

        return z85.encode(signing_public(self.signing_key()))


class DuplicateKeyError(ValueError):
    """Two site ids with one public key; str(error) names both."""


def claim_key(holders: dict[bytes, str], public: bytes, site: str) -> bytes:
    """Put `public` (Z85) for `site` on an allow-list of raw keys -> site ids (`holders`) and
    return the raw 32-byte key; DuplicateKeyError when another site holds it already (compared
    raw, so that no second spelling of one key passes)."""
    raw = z85.decode(public)
    holder = holders.setdefault(raw, site)
    if holder != site:
        first, second = sorted((holder, site))
        raise DuplicateKeyError(f"sites {first!r} and {second!r} have the same public key "
                                f"({public[:8].decode('ascii', 'replace')}...): either could connect as the other; "
                                f"each site needs a key pair of its own (run.py keys --site-ids ...)")
    return raw


class KeyDirectoryError(PermissionError):
    """A key directory that others could have planted or can read; str(error) says what to do."""


def private_directory(path: str | Path) -> Path:
    """`path`, created (with its parents) when it is new and then closed to other users (mode
    0700: the umask only takes bits away); an existing one is left as it is."""
    path = Path(path)
    if not path.exists():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def private_key_directory(directory: str | Path) -> Path:
    """`directory`, created 0700 if it is new; an existing one must be this user's and closed to
    everyone else (issue 36: a keys directory planted by someone else was reused as it was),
    else KeyDirectoryError names the fix."""
    directory = Path(directory)
    if not directory.exists():
        return private_directory(directory)
    status = directory.stat()
    if status.st_uid != os.getuid():
        raise KeyDirectoryError(f"key directory {directory} belongs to uid {status.st_uid}, not to this user "
                                f"({os.getuid()}): someone else could have planted its keys; use a directory of "
                                f"your own")
    if status.st_mode & 0o077:
        raise KeyDirectoryError(f"key directory {directory} is open to others (mode {status.st_mode & 0o777:o}): "
                                f"run `chmod 700 {directory}` and `chmod 600 {directory}/*.key_secret` if its keys "
                                f"are yours, or make new keys in a new directory")
    for secret in directory.glob("*.key_secret"):
        if secret.stat().st_mode & 0o077 or secret.stat().st_uid != os.getuid():
            raise KeyDirectoryError(f"secret key {secret} is readable by others or not yours: "
                                    f"`chmod 600 {secret}` if it is yours, else make new keys")
    return directory


def generate_keys(directory: str | Path, site_ids) -> Path:
    """Create a key pair for the coordinator and for each of `site_ids` (the shuffler's too, when
    named), secret halves 0600 in a 0700 directory; a name whose public key is already there is
    kept (a coordinator's directory may hold only the public keys the site hosts sent it)."""
    directory = private_key_directory(directory)
    for name in [COORDINATOR_KEY, *site_ids]:
        if not (directory / f"{name}.key").exists():
            make_key_pair(directory, name)
    return directory


def make_key_pair(directory: Path, name: str) -> None:
    """`name`.key (public) and `name`.key_secret (0600) in `directory`; the public file also
    holds the signing key derived from the secret (`signing-key`, read by load_signing_key)."""
    public, secret = zmq.auth.create_certificates(str(directory), name)
    os.chmod(secret, 0o600)
    pair = zmq.auth.load_certificate(secret)
    signing = ClientKeys(b"", pair[0], pair[1]).signing_public
    text = Path(public).read_text()
    Path(public).write_text(text.replace("curve\n", f"curve\n    signing-key = \"{signing.decode('ascii')}\"\n", 1))


def load_signing_key(directory: str | Path, name: str) -> bytes | None:
    """`name`'s signing public key (Z85) from its .key file, or None when the file has none (keys
    made before issue 48)."""
    path = Path(directory) / f"{name}.key"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        key, _, value = line.strip().partition("=")
        if key.strip() == "signing-key":
            return value.strip().strip('"').encode("ascii")
    return None


def new_key_pair() -> tuple[bytes, bytes]:
    """A fresh CurveZMQ key pair (public, secret), Z85, from libzmq's CSPRNG: made where it is used."""
    return zmq.curve_keypair()


def client_keys_in_memory(site_ids, server_public: bytes) -> dict[str, ClientKeys]:
    """A fresh key pair for each of `site_ids`, made and kept in this process's memory (a site
    host, local or on Ray: no file holds a site's secret), for dialling the server whose public
    key is `server_public`. The public halves are what the host sends the coordinator."""
    keys = {}
    for site in site_ids:
        public, secret = new_key_pair()
        keys[site] = ClientKeys(server_public, public, secret)
    return keys


def for_server(keys: dict[str, ClientKeys], server_public: bytes) -> dict[str, ClientKeys]:
    """The same sites' key pairs, for dialling another server (the shuffler)."""
    return {site: ClientKeys(server_public, k.public, k.secret) for site, k in keys.items()}


def write_site_publics(directory: str | Path, publics: dict[str, bytes]) -> Path:
    """The public keys the site hosts made and sent, one line `SITE Z85` each, in one file
    (`sites.public`): who was admitted. One file, not one per site: 10,000 small files cost the
    start of a run seconds."""
    for public in publics.values():
        z85.decode(public)
    path = Path(directory) / "sites.public"
    with open(path, "a") as handle:
        handle.writelines(f"{site} {public.decode('ascii')}\n" for site, public in publics.items())
    return path


def read_site_publics(directory: str | Path) -> dict[str, bytes]:
    """What write_site_publics wrote (site -> Z85 public key; a later line for a site wins)."""
    path = Path(directory) / "sites.public"
    if not path.exists():
        return {}
    return {site: public.encode("ascii") for site, public in
            (line.split() for line in path.read_text().splitlines() if line.strip())}


def write_public_key(directory: str | Path, name: str, public: bytes, signing: bytes | None = None) -> Path:
    """`name`.key holding only a public key (Z85), in the certificate format load_certificate reads:
    what a site host sends the coordinator; its secret half never leaves the host."""
    z85.decode(public)  # a key that does not decode is refused here, not at the handshake
    path = Path(directory) / f"{name}.key"
    signed = f"    signing-key = \"{signing.decode('ascii')}\"\n" if signing else ""
    path.write_text(f"#   ZeroMQ CURVE Public Certificate of {name}: made by its host, whose secret stays there\n\n"
                    f"metadata\ncurve\n{signed}    public-key = \"{public.decode('ascii')}\"\n")
    return path


def load_server_keys(directory: str | Path, site_ids, server: str = COORDINATOR_KEY,
                     publics: dict[str, bytes] | None = None) -> ServerKeys:
    """The key pair of `server` (the coordinator, or the shuffler) and its allow-list: the sites'
    public keys from `publics` (what their hosts sent) or else from the directory's SITE.key files;
    DuplicateKeyError when two sites have the same key."""
    directory = Path(directory)
    public, secret = _load(directory, server, secret=True)
    sites, holders = {}, {}
    for site in site_ids:
        site_public = publics[site] if publics is not None else _load(directory, site, secret=False)[0]
        claim_key(holders, site_public, site)  # two sites with one key: refused, naming both
        sites[site_public] = site
    return ServerKeys(public, secret, sites)


def load_public_key(directory: str | Path, name: str) -> bytes:
    """`name`'s public key (Z85) from the key directory."""
    return _load(Path(directory), name, secret=False)[0]


def load_key_pair(directory: str | Path, name: str) -> tuple[bytes, bytes]:
    """`name`'s own pair (public, secret), Z85, from its private key directory (a party's own,
    e.g. the shuffler's on its host; KeyDirectoryError when others could read or plant it)."""
    return _load(private_key_directory(directory), name, secret=True)


def load_client_keys(directory: str | Path, site_id: str, server: str = COORDINATOR_KEY) -> ClientKeys:
    """`site_id`'s key pair (a site, or the shuffler) and the public key of the `server` it dials."""
    directory = Path(directory)
    server_public, _ = _load(directory, server, secret=False)
    public, secret = _load(directory, site_id, secret=True)
    return ClientKeys(server_public, public, secret)


def _load(directory: Path, name: str, secret: bool) -> tuple[bytes, bytes | None]:
    path = directory / (f"{name}.key_secret" if secret else f"{name}.key")
    if not path.exists():
        hint = ("" if secret or name == COORDINATOR_KEY else
                ": the shuffler's operator makes its pair (run.py keys --dir DIR --shuffler) and sends shuffler.key"
                if name == "shuffler" else
                f": a site host makes its own pair (run.py keys --dir DIR --site-ids ...) and sends {name}.key")
        raise FileNotFoundError(f"no {'secret' if secret else 'public'} key for {name!r} in {directory}{hint}")
    return zmq.auth.load_certificate(str(path))


ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks (RFC 27)
ZAP_DOMAIN = b"quorum"
#: ZAP metadata property on every message of an admitted connection: the admission's serial number
ADMISSION = "Quorum-Admission"
#: how long a handshake with a busy key waits for it (SiteAuthenticator): less than libzmq's
#: handshake limit (transport.channel.HANDSHAKE_S, 30 s), so the handshake ends unanswered, never
#: admitted for a connection libzmq closed meanwhile
DEFER_S = 24.0


def zap_metadata(name: str, value: str) -> bytes:
    """One ZMTP metadata property (RFC 23: name length, name, 4-byte value length, value), as a
    ZAP reply's metadata frame carries it (RFC 27)."""
    key, data = name.encode("ascii"), value.encode("utf-8")
    return bytes([len(key)]) + key + len(data).to_bytes(4, "big") + data


class SiteAuthenticator:
    """ZAP handler (RFC 27) in a thread of its own: admit only allow-listed CURVE keys, naming
    each connection by its site id (the reply's User-Id), refuse everything else.

    Lean on purpose (issue 40): pyzmq's ThreadAuthenticator, which this replaced, spends about
    4 ms of Python per handshake (a loaded event loop, logging, policy checks this handler does
    not need); 10,000 sites waited about 20 s on it. This one answers a request with a dictionary
    lookup: 3,000 CURVE handshakes in 3.5 s against 15-24 s. The ROUTER sets ZAP_ENFORCE_DOMAIN
    (`secure_server`), so a connection made while no handler is bound is refused, not admitted.

    With `connections` set (a RouterChannel sets its transport.channel.Connections), a key is
    admitted only while it is free (issue 48): the reply names the admission (metadata
    `ADMISSION`). A handshake with a busy key (a live connection holds it, or the messages of its
    closed one are not all read) is not answered yet: it waits, and is admitted as soon as the key
    is free, or left unanswered after `defer_s` (libzmq then ends the handshake, HANDSHAKE_IVL,
    and its peer redials: a libzmq client redials after a timeout, never after a refusal). One
    handshake waits per key; another with that key meanwhile is refused (400). So the handler is a
    ROUTER, which may answer out of turn. Without `connections` (the handler alone, as in tests)
    every allow-listed key is admitted at once, as before."""

    def __init__(self, context: zmq.Context, sites: dict[bytes, str], defer_s: float = DEFER_S) -> None:
        self.context = context
        self.sites: dict[bytes, str] = {}  # raw 32-byte key -> site
        for public, site in sites.items():
            self.allow(public, site)
        self.connections = None  # transport.channel.Connections of the ROUTER this handler serves
        self.defer_s = defer_s
        self._thread: threading.Thread | None = None
        self._control = f"inproc://quorum-zap-control-{id(self):x}"
        self._wake_read = self._wake_write = None

    def allow(self, public: bytes, site: str) -> None:
        """Admit `site`'s public key (Z85) from now on (one its host made and sent); a key another
        site holds already is refused (DuplicateKeyError), never given a second name."""
        claim_key(self.sites, public, site)

    def wake(self) -> None:
        """(any thread) A key may be free: answer the handshakes waiting for one."""
        try:
            os.write(self._wake_write, b"x")
        except (BlockingIOError, OSError, TypeError):  # one is pending already; or the handler stopped
            pass

    def start(self) -> None:
        handler = self.context.socket(zmq.ROUTER)
        handler.setsockopt(zmq.LINGER, 0)
        handler.setsockopt(zmq.ROUTER_MANDATORY, 1)  # an answer to a connection gone meanwhile raises
        handler.bind(ZAP_ENDPOINT)  # bound before start returns: no handshake finds no handler
        control = self.context.socket(zmq.PAIR)
        control.setsockopt(zmq.LINGER, 0)
        control.bind(self._control)
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._thread = threading.Thread(target=self._serve, args=(handler, control), name="quorum-zap", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        stopper = self.context.socket(zmq.PAIR)
        stopper.setsockopt(zmq.LINGER, 0)
        stopper.connect(self._control)
        stopper.send(b"stop")
        self._thread.join(timeout=5)
        stopper.close()
        self._thread = None
        wake_read, wake_write, self._wake_read, self._wake_write = self._wake_read, self._wake_write, None, None
        os.close(wake_read)
        os.close(wake_write)

    def _serve(self, handler: zmq.Socket, control: zmq.Socket) -> None:
        poller = zmq.Poller()
        poller.register(handler, zmq.POLLIN)
        poller.register(control, zmq.POLLIN)
        poller.register(self._wake_read, zmq.POLLIN)
        waiting: dict[str, tuple[list[bytes], bytes, float]] = {}  # site -> (envelope, request id, until)
        try:
            while True:
                timeout = None
                if waiting:  # a key can also come free without a wake-up (the monitor is read here too)
                    until = min(entry[2] for entry in waiting.values())
                    timeout = max(0, min(int((until - time.monotonic()) * 1000) + 1, 100))
                ready = dict(poller.poll(timeout))
                if control in ready:
                    return
                if self._wake_read in ready:
                    try:
                        os.read(self._wake_read, 4096)
                    except BlockingIOError:
                        pass
                if handler in ready:
                    frames = handler.recv_multipart()
                    cut = frames.index(b"") if b"" in frames else 0
                    envelope, request = frames[:cut + 1], frames[cut + 1:]
                    answer, site = self._answer(request)
                    if answer is not None:
                        self._send(handler, envelope, answer, site)
                    elif site in waiting:  # one handshake waits for this key already: a third is refused
                        self.connections.refused[site] += 1
                        self._send(handler, envelope, [b"1.0", request[1], b"400",
                                                       b"another connection with this key is live and one waits",
                                                       b"", b""], site)
                    else:
                        self.connections.waited[site] += 1
                        waiting[site] = (envelope, request[1], time.monotonic() + self.defer_s)
                for site, (envelope, request_id, until) in list(waiting.items()):
                    serial = self.connections.admit(site)
                    if serial is not None:
                        del waiting[site]
                        self._send(handler, envelope, self._ok(request_id, site, serial), site, serial)
                    elif time.monotonic() >= until:  # unanswered: libzmq ends the handshake, the peer redials
                        del waiting[site]
        finally:
            handler.close()
            control.close()

    def _send(self, handler: zmq.Socket, envelope: list[bytes], answer: list[bytes], site: str | None,
              serial: int | None = None) -> None:
        try:
            handler.send_multipart(envelope + answer)
        except zmq.ZMQError:  # its connection went meanwhile (ROUTER_MANDATORY): the admission is void
            if serial is not None and self.connections is not None:
                self.connections.cancel(site, serial)

    @staticmethod
    def _ok(request_id: bytes, site: str, serial: int | None) -> list[bytes]:
        metadata = b"" if serial is None else zap_metadata(ADMISSION, str(serial))
        return [b"1.0", request_id, b"200", b"OK", site.encode("utf-8"), metadata]

    def reply(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply to one request (version, request id, domain, address, identity,
        mechanism, credentials...): 200 and the site id for an allow-listed CURVE key (with the
        admission's serial number when `connections` is set), 400 for any other key, and 400 for a
        busy key (the handler's own loop lets such a handshake wait instead)."""
        answer, site = self._answer(request)
        if answer is None:
            return [b"1.0", request[1], b"400", b"another live connection holds this key", b"", b""]
        return answer

    def _answer(self, request: list[bytes]) -> tuple[list[bytes] | None, str | None]:
        """(the reply, the site) for one request; (None, site) while the site's key is busy."""
        if len(request) < 6 or request[0] != b"1.0":
            request_id = request[1] if len(request) > 1 else b""
            return [b"1.0", request_id, b"500", b"malformed ZAP request", b"", b""], None
        request_id, mechanism, credentials = request[1], request[5], request[6:]
        site = self.sites.get(credentials[0]) if mechanism == b"CURVE" and credentials else None
        if site is None:
            return [b"1.0", request_id, b"400", b"key not on the allow-list", b"", b""], None
        connections = self.connections
        if connections is None:
            return self._ok(request_id, site, None), site
        serial = connections.admit(site)
        if serial is None:
            return None, site
        return self._ok(request_id, site, serial), site


def secure_server(socket: zmq.Socket, keys: ServerKeys) -> None:
    # Ask ZAP (SiteAuthenticator) about every connection, and refuse one when no handler is bound.
    # Both settings together: libzmq 4.3.5 with ZAP_ENFORCE_DOMAIN and an empty ZAP_DOMAIN skips
    # ZAP altogether and admits any key (tests/test_security.py checks the handler is asked).
    socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
    socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def secure_client(socket: zmq.Socket, keys: ClientKeys) -> None:
    socket.curve_serverkey = keys.server_public
    socket.curve_publickey = keys.public
    socket.curve_secretkey = keys.secret
