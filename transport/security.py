"""Transport security: CurveZMQ (libzmq's CURVE mechanism, via pyzmq) with an allow-list.

Keys are files in a key directory, in pyzmq's certificate format (zmq.auth.create_certificates):

    coordinator.key, coordinator.key_secret     the coordinator's key pair
    site-007.key, site-007.key_secret           each site's key pair
    shuffler.key, shuffler.key_secret           the shuffler's (a client of the coordinator,
                                                a server for the sites' sealed messages)

The coordinator holds every site's public key and its own secret; a site holds its own secret
and the coordinator's public key. The coordinator's ZAP handler admits a connection only if its
long-term key is on the allow-list and names it by the site id that key belongs to (ZAP
User-Id); the driver then refuses any message whose routing id differs from that name, so a
site cannot speak for another. A process with an unknown key never completes the handshake.

Who makes the key pairs (issue 35): a site's secret key never needs to leave its host. In a
multi-host run each site host makes its own (`run.py keys --site-ids`) and sends only the public
halves (SITE.key) to the coordinator's key directory; on Ray each host actor makes its sites'
pairs in memory and returns the public halves (`write_public_key`, `allow`). Only a local run,
whose sites are processes of this machine anyway, has the harness make every pair in the run's
directory, for convenience, and its events say so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
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
    """`name`.key (public) and `name`.key_secret (0600) in `directory`."""
    public, secret = zmq.auth.create_certificates(str(directory), name)
    os.chmod(secret, 0o600)


def new_key_pair() -> tuple[bytes, bytes]:
    """A fresh CurveZMQ key pair (public, secret), Z85, from libzmq's CSPRNG: made where it is used."""
    return zmq.curve_keypair()


def write_public_key(directory: str | Path, name: str, public: bytes) -> Path:
    """`name`.key holding only a public key (Z85), in the certificate format load_certificate reads:
    what a site host sends the coordinator; its secret half never leaves the host."""
    z85.decode(public)  # a key that does not decode is refused here, not at the handshake
    path = Path(directory) / f"{name}.key"
    path.write_text(f"#   ZeroMQ CURVE Public Certificate of {name}: made by its host, whose secret stays there\n\n"
                    f"metadata\ncurve\n    public-key = \"{public.decode('ascii')}\"\n")
    return path


def load_server_keys(directory: str | Path, site_ids, server: str = COORDINATOR_KEY) -> ServerKeys:
    """The key pair of `server` (the coordinator, or the shuffler) and its allow-list."""
    directory = Path(directory)
    public, secret = _load(directory, server, secret=True)
    sites = {}
    for site in site_ids:
        site_public, _ = _load(directory, site, secret=False)
        sites[site_public] = site
    return ServerKeys(public, secret, sites)


def load_public_key(directory: str | Path, name: str) -> bytes:
    """`name`'s public key (Z85) from the key directory."""
    return _load(Path(directory), name, secret=False)[0]


def load_client_keys(directory: str | Path, site_id: str, server: str = COORDINATOR_KEY) -> ClientKeys:
    """`site_id`'s key pair (a site, or the shuffler) and the public key of the `server` it dials."""
    directory = Path(directory)
    server_public, _ = _load(directory, server, secret=False)
    public, secret = _load(directory, site_id, secret=True)
    return ClientKeys(server_public, public, secret)


def _load(directory: Path, name: str, secret: bool) -> tuple[bytes, bytes | None]:
    path = directory / (f"{name}.key_secret" if secret else f"{name}.key")
    if not path.exists():
        hint = ("" if secret or name in (COORDINATOR_KEY, "shuffler") else
                f": a site host makes its own pair (run.py keys --dir DIR --site-ids ...) and sends {name}.key")
        raise FileNotFoundError(f"no {'secret' if secret else 'public'} key for {name!r} in {directory}{hint}")
    return zmq.auth.load_certificate(str(path))


class SiteAuthenticator(ThreadAuthenticator):
    """ZAP handler: admit only allow-listed CURVE keys, naming each by its site id."""

    def __init__(self, context: zmq.Context, sites: dict[bytes, str]) -> None:
        super().__init__(context)
        self.sites = sites

    def callback(self, domain: str, key: bytes) -> bool:  # credentials provider (Z85 key)
        return key in self.sites

    def allow(self, public: bytes, site: str) -> None:
        """Admit `site`'s public key (Z85) from now on (one its host made and sent)."""
        self.sites[public] = site

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.sites[z85.encode(client_public_key)]

    def start(self) -> None:
        super().start()
        self.configure_curve_callback(domain="*", credentials_provider=self)


def secure_server(socket: zmq.Socket, keys: ServerKeys) -> None:
    socket.curve_secretkey = keys.secret
    socket.curve_publickey = keys.public
    socket.curve_server = True


def secure_client(socket: zmq.Socket, keys: ClientKeys) -> None:
    socket.curve_serverkey = keys.server_public
    socket.curve_publickey = keys.public
    socket.curve_secretkey = keys.secret
