"""The on-disk cache of compiled indexes: one file per (pattern, vocabulary, outlines-core
version), written atomically with a checksum, evicted least-recently-used by total size.
A corrupt file is deleted; any disk error costs only the cache entry, never the request.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)
_DISK_MAGIC = b"stemma-grammar-1\n"


def disk_load(path: Path) -> bytes | None:
    """The cached index bytes, or None (a corrupt file is deleted; disk errors are a miss)."""
    try:
        blob = path.read_bytes()
        n = len(_DISK_MAGIC)
        head, digest, data = blob[:n], blob[n : n + 32], blob[n + 32 :]
        if head != _DISK_MAGIC or hashlib.sha256(data).digest() != digest:
            path.unlink(missing_ok=True)
            return None
        os.utime(path)  # recency for eviction
        return data
    except FileNotFoundError:
        return None
    except OSError as err:
        logger.warning("grammar disk cache: cannot read %s: %s", path, err)
        return None


def disk_store(path: Path, data: bytes, max_total_bytes: int) -> None:
    """Atomic write, then evict least recently used files until under `max_total_bytes`.

    A full or read-only disk only costs the cache entry, never the request.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as f:
            f.write(_DISK_MAGIC + hashlib.sha256(data).digest() + data)
        os.replace(f.name, path)
        sizes = {p: p.stat() for p in path.parent.glob("*.idx")}
        total = sum(s.st_size for s in sizes.values())
        for old in sorted(sizes, key=lambda p: sizes[p].st_mtime):
            if total <= max_total_bytes:
                break
            if old != path:
                total -= sizes[old].st_size
                old.unlink(missing_ok=True)
    except OSError as err:
        logger.warning("grammar disk cache: cannot write %s: %s", path, err)
