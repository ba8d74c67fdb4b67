"""Secure aggregation on Z_M (Bonawitz et al. 2017; SecAgg+ of Bell et al. 2020 for sparse graphs).

shamir:      Shamir secret sharing over a prime field (ours).
primitives:  key agreement, key derivation, share encryption and the mask generator, all from
             `cryptography` (X25519, HKDF-SHA256, AES-GCM, ChaCha20).
graph:       who shares with and masks against whom: the full graph or a sparse Harary graph.
protocol:    the sans-I/O server (coordinator) and client (site) state machines.
unmasking:   the server's last step, one job per mask to take off the sum (two cores when large).
"""
