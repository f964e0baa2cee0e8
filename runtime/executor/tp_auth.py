"""What tensor-parallel workers read from rank 0's store is authenticated: each value rank 0
writes for them (the plan, its weight plan, every step message) is sealed with an
HMAC-SHA256 over its store key and bytes under a per-launch secret, so a process that reaches
the store's port can neither forge a step (a STOP included) nor replay one under another key.
Values are authenticated, not encrypted: the ranks must share a private, trusted network.

The secret: --dist-secret-file, else the STEMMA_DIST_SECRET environment variable, else (one
node only) fresh random bytes per launch, handed to spawned ranks in their spawn arguments.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

import torch.distributed as dist

from ..config import EngineConfig

SECRET_ENV = "STEMMA_DIST_SECRET"
MIN_SECRET_BYTES = 16
MAC_LEN = hashlib.sha256().digest_size  # 32


class ForgedMessage(ValueError):
    """A store value without a valid seal: written by someone without the launch secret."""


def launch_secret(cfg: EngineConfig) -> bytes:
    """The group's shared secret; ValueError when several nodes have none to share, or it is
    shorter than MIN_SECRET_BYTES."""
    if cfg.dist_secret_file is not None:
        secret = Path(cfg.dist_secret_file).read_bytes().strip()
        source = f"dist_secret_file {cfg.dist_secret_file!r}"
    elif os.environ.get(SECRET_ENV):
        secret, source = os.environ[SECRET_ENV].encode(), SECRET_ENV
    elif cfg.nnodes == 1:
        return secrets.token_bytes(32)  # this launch's ranks get it at spawn
    else:
        raise ValueError(
            f"nnodes={cfg.nnodes} needs one secret on every node to authenticate the step "
            f"messages: pass --dist-secret-file FILE (or set {SECRET_ENV}) on each node, e.g. "
            f"the output of `python -c 'import secrets; print(secrets.token_hex(32))'`"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the tensor-parallel secret from {source} has {len(secret)} bytes; it needs at "
            f"least {MIN_SECRET_BYTES} (e.g. secrets.token_hex(32))"
        )
    return secret


def seal(secret: bytes, key: str, value: bytes) -> bytes:
    """value prefixed by its MAC, bound to the store key it is written under."""
    return _mac(secret, key, value) + value


def unseal(secret: bytes, key: str, message: bytes) -> bytes:
    """The value of a sealed message; ForgedMessage if its MAC does not verify."""
    mac, value = message[:MAC_LEN], message[MAC_LEN:]
    if len(mac) < MAC_LEN or not hmac.compare_digest(mac, _mac(secret, key, value)):
        raise ForgedMessage(
            f"store key {key!r}: a {len(message)}-byte value failed authentication (written "
            f"without this group's secret)"
        )
    return value


def _mac(secret: bytes, key: str, value: bytes) -> bytes:
    return hmac.new(secret, key.encode() + b"\0" + value, hashlib.sha256).digest()


class SealedStore:
    """A store whose values rank 0 seals and the workers unseal (see the module docstring)."""

    def __init__(self, store: dist.Store, secret: bytes) -> None:
        self.raw, self._secret = store, secret

    def set(self, key: str, value: bytes) -> None:
        self.raw.set(key, seal(self._secret, key, value))

    def get(self, key: str) -> bytes:
        """The value under key (waiting for it); ForgedMessage if it is not sealed."""
        return self.unseal(key, self.raw.get(key))

    def unseal(self, key: str, message: bytes) -> bytes:
        return unseal(self._secret, key, message)
