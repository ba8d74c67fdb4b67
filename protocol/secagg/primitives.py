"""The cryptographic building blocks of secure aggregation, all from `cryptography`.

Key agreement:   X25519 (RFC 7748). Each site makes two key pairs per session, c (to encrypt
                 the shares it sends through the coordinator) and s (to derive pairwise masks).
Key derivation:  HKDF-SHA256 (RFC 5869) of the X25519 shared secret, bound to the session nonce and a
                 purpose label, so that no key serves two ends; a mask key also to the request
                 digest of the question its site answers (issue 47), so that the pairwise masks
                 of two sites asked different questions never cancel.
Share encryption: AES-256-GCM with a fresh 96-bit nonce; the associated data names sender,
                 receiver and session nonce, so a ciphertext replayed elsewhere does not open.
Mask generator:  the ChaCha20 keystream of a 32-byte seed, read as little-endian uint64 words and
                 reduced mod M = 2^bits (exact: M divides 2^64, so the reduction is uniform).
Bonawitz et al. 2017, section 4 (the PRG, KA, AE and SS primitives of their protocol).
"""

from __future__ import annotations

import os

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

KEY_BYTES = 32
_SHA256 = hashes.SHA256()  # a stateless algorithm descriptor: one for every key derivation
NONCE_BYTES = 12


class DecryptionError(ValueError):
    """A share ciphertext that does not open (wrong key, tampered, or replayed elsewhere)."""


def new_private_key() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def private_from_bytes(data: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(data)


def agree(private: X25519PrivateKey, peer_public: bytes, purpose: bytes, nonce: int, context: bytes = b"") -> bytes:
    """A 32-byte key shared by the two ends: HKDF-SHA256(X25519(private, peer_public)), its info
    naming the purpose, the session nonce and `context` (a mask key's: the request digest of the
    question this end answers; both ends get the same key only when they answer the same one)."""
    if not isinstance(peer_public, bytes) or len(peer_public) != KEY_BYTES:
        raise ValueError("an X25519 public key is 32 bytes")
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    info = b"quorum-secagg/" + purpose + b"/" + str(int(nonce)).encode()
    if context:
        info += b"/" + context
    return HKDF(algorithm=_SHA256, length=KEY_BYTES, salt=None, info=info).derive(shared)


def encrypt(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def decrypt(key: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    if not isinstance(ciphertext, bytes) or len(ciphertext) < NONCE_BYTES + 16:
        raise DecryptionError("ciphertext too short")
    try:
        return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], associated)
    except InvalidTag:
        raise DecryptionError("authentication failed") from None


def mask_vector(seed: bytes, length: int, modulus_bits: int) -> np.ndarray:
    """PRG(seed): `length` uniform elements of Z_M, M = 2^modulus_bits, as uint64."""
    if len(seed) != KEY_BYTES:
        raise ValueError("a mask seed is 32 bytes")
    stream = Cipher(algorithms.ChaCha20(seed, b"\x00" * 16), mode=None).encryptor().update(b"\x00" * (8 * length))
    words = np.frombuffer(stream, dtype="<u8")
    return words & np.uint64((1 << modulus_bits) - 1) if modulus_bits < 64 else words.copy()
