"""A site's long-term identity in a secure sum against a coordinator that lies (issue 48).

Bonawitz et al. 2017, section 6 and figure 4 (the malicious-server protocol): every user holds a
long-term signing key d_u, registered with a party the server does not control; it signs the
keys it advertises (sigma_u = SIG.sign(d_u^SK, c_u^PK || s_u^PK)) and, in the consistency round,
the survivor set U3 (sigma'_u = SIG.sign(d_u^SK, U3)); every peer verifies these signatures with
the registered d_v^PK. So the server can neither hand a site keys of its own making (key
substitution: it cannot sign them as the peer) nor show two sites two survivor sets (their
signatures would not agree).

Quorum's signatures are Ed25519 (RFC 8032, from `cryptography`). A site's signing key is derived
from its CurveZMQ secret key by HKDF-SHA256 under a label of its own (`signing_key_from_curve`),
so a site holds one secret, as before; its public half travels beside the CURVE public key to
the party registry (transport.registry), which the coordinator cannot rewrite: the operators'
file in a multi-host run, the launcher's in a local run. What a site verifies against is that
registry's `signing` keys, never keys the coordinator relays.

Every signed message starts with a label naming what it is and the session nonce and request
digest it belongs to, so a signature from one session, phase or question never verifies in
another (replay).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SIGNATURE_BYTES = 64
SIGNING_KEY_BYTES = 32
_LABEL = b"quorum-secagg-signing-key/v1"


def signing_key_from_curve(curve_secret: bytes) -> Ed25519PrivateKey:
    """The Ed25519 signing key of the party whose CurveZMQ secret key (raw, 32 bytes) is
    `curve_secret`: HKDF-SHA256 of it under a label of its own (RFC 5869), so that the two keys
    serve two ends and one secret is all a site keeps."""
    if len(curve_secret) != 32:
        raise ValueError("a CurveZMQ secret key is 32 bytes")
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL).derive(bytes(curve_secret))
    return Ed25519PrivateKey.from_private_bytes(seed)


def signing_public(key: Ed25519PrivateKey) -> bytes:
    """The raw 32-byte public half of a signing key (what the registry holds, in Z85)."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def new_signing_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@dataclass(frozen=True)
class SiteIdentity:
    """What a site brings to an actively secure sum: its own signing key, the registry's signing
    keys of the other sites (`registered()`: site id -> raw public key, read when first needed:
    a local run's launcher writes the registry after the site hosts have made their keys), and
    whether its policy takes part in the semi-honest protocol (`semi_honest`; by default it
    does not: protocol.policy `secagg`)."""

    name: str
    key: Ed25519PrivateKey
    registered: Callable[[], Mapping[str, bytes]]
    semi_honest: bool = False
    #: where the session nonces this site answered are kept (one a line; None: in memory only)
    ledger: Path | None = None
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def first_use(self, nonce: int) -> bool:
        """Record that this site answers session `nonce`; False when it answered it before. Every
        signature a site makes names the nonce, so a coordinator that could reuse one could replay
        a site's signature from an earlier session into a later one, where the site signed
        another view (red team round 4). Kept in the site's own directory across restarts
        (flushed, not fsync'ed: a crash of the machine itself may forget the last few)."""
        used = self._cache.setdefault("nonces", None)
        if used is None:
            used = self._cache["nonces"] = set()
            if self.ledger is not None and self.ledger.exists():
                used.update(int(word) for word in self.ledger.read_text().split())
        if nonce in used:
            return False
        used.add(nonce)
        if self.ledger is not None:
            self.ledger.parent.mkdir(parents=True, exist_ok=True)
            with open(self.ledger, "a") as handle:
                handle.write(f"{int(nonce)}\n")
                handle.flush()
        return True

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(message)

    def verify(self, peer: str, message: bytes, signature) -> str | None:
        """None when `signature` is `peer`'s, by the registry's key, over `message`; else why not."""
        public = self.peers().get(peer)
        if public is None:
            return f"{peer} has no signing key in the party registry (not a registered site)"
        if not isinstance(signature, bytes) or len(signature) != SIGNATURE_BYTES:
            return f"{peer}'s signature is not {SIGNATURE_BYTES} bytes"
        try:
            Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
        except InvalidSignature:
            return f"{peer}'s signature does not verify with its registered key"
        return None

    def peers(self) -> Mapping[str, bytes]:
        if "peers" not in self._cache:  # one mapping for every site of a host, not a copy each (read only)
            self._cache["peers"] = self.registered()
        return self._cache["peers"]

    def with_policy(self, semi_honest: bool, ledger: str | os.PathLike | None = None) -> "SiteIdentity":
        """This identity under the site's policy, its nonces kept in `ledger` (or as before)."""
        return replace(self, semi_honest=semi_honest, ledger=Path(ledger) if ledger is not None else self.ledger,
                       _cache=self._cache)


def identities_in_memory(names, semi_honest: bool = False) -> dict[str, SiteIdentity]:
    """A signing key for each of `names`, made here, and one registry of their public halves
    shared by all: what a launcher playing every operator gives the sites it runs in its own
    process (the in-process backend, tests, benchmarks)."""
    keys = {name: new_signing_key() for name in names}
    registry = {name: signing_public(key) for name, key in keys.items()}
    return {name: SiteIdentity(name, key, lambda: registry, semi_honest) for name, key in keys.items()}
