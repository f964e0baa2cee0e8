"""Bounds on CPU memory that grows with the traffic's shapes, so a long-running server's RSS
levels off: oneDNN's per-shape caches, and the heap's freed pages (HeapTrimmer, below).

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

import ctypes
import os
from collections.abc import Callable

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


# ---- the heap ---------------------------------------------------------------------------------
# A step's large temporaries (a long prefill's activations, a batch's logits) are freed into
# glibc's heap, which keeps the pages for reuse; with steps of ever-changing sizes the heap's
# free space is scattered and RSS climbs to the peak of every past step and stays there.
# malloc_trim hands free pages back to the OS: about 10 ms when there is something to return,
# a tenth of a millisecond when not, so the engine calls it every TRIM_EVERY_STEPS steps and
# whenever it goes idle.
TRIM_EVERY_STEPS = 256


def load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS, Windows)."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


class HeapTrimmer:
    """Calls malloc_trim every `every` steps and on release(); a no-op without glibc."""

    def __init__(self, every: int = TRIM_EVERY_STEPS, trim: Callable[[int], int] | None = None):
        if every < 1:
            raise ValueError(f"HeapTrimmer every={every}: expected 1 or more steps")
        self.every, self._trim = every, trim if trim is not None else load_malloc_trim()
        self.steps_since_trim = 0
        self.num_trims = 0

    def after_step(self) -> None:
        self.steps_since_trim += 1
        if self.steps_since_trim >= self.every:
            self.release()

    def release(self) -> None:
        """Trim now (the engine calls this when it goes idle after some steps)."""
        self.steps_since_trim = 0
        if self._trim is not None:
            self._trim(0)
            self.num_trims += 1
