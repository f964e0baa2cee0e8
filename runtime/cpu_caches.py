"""A bound on oneDNN's per-shape caches, so a long-running server's memory levels off.

torch runs bfloat16 (and packed) matmuls on CPU through oneDNN. oneDNN keeps a compiled
primitive for every input shape it meets (ONEDNN_PRIMITIVE_CACHE_CAPACITY, default 1024) and
torch's ideep layer keeps its own computation per shape (LRU_CACHE_CAPACITY, default 1024).
A serving engine meets a new row count at nearly every step, so both caches fill for hours:
on SmolLM2 in bfloat16 RSS grew by about 450 MiB over 160 prompt lengths, and a 30-minute
soak grew 60%. A decode step needs a few entries per shape it repeats, so a small capacity
costs nothing measurable (bench/shape_cache.py holds the numbers) and bounds that memory.

Both caches read their capacity once, at the process's first oneDNN call, so the bound is set
before the engine measures or loads anything; a process that already ran oneDNN keeps what it
had. A capacity the user set in either variable wins.
"""

from __future__ import annotations

import os

CAPACITY_ENV = "STEMMA_ONEDNN_CACHE_CAPACITY"
DEFAULT_CAPACITY = 64
CACHE_ENVS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")


def bound_onednn_caches() -> int:
    """Give both caches the capacity of $STEMMA_ONEDNN_CACHE_CAPACITY (default 64 shapes)
    unless their own variables are set; returns the capacity asked for."""
    raw = os.environ.get(CAPACITY_ENV, str(DEFAULT_CAPACITY))
    try:
        capacity = int(raw)
    except ValueError:
        capacity = -1
    if capacity < 0:
        raise ValueError(f"{CAPACITY_ENV}={raw!r}: expected a whole number of shapes, 0 or more")
    for name in CACHE_ENVS:
        os.environ.setdefault(name, str(capacity))
    return capacity
