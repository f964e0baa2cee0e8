"""The compile threads allocate from glibc's main malloc arena.

glibc gives each new thread an arena of its own (up to 8 per core). A compile thread's arena
holds little but the compiled grammars the service caches, and each compile's temporaries then
land in memory that has never been touched: on the sample's large schemas about 140 page faults
and 0.2-0.5 ms of system time per compile, llguidance's compile 12-15% slower on the compile
thread than the same compile on the main thread (bench/schema_coverage.py, AMD EPYC; with the
cache held to one grammar, 15-20 faults). In the main arena a compile reuses the pages the
process's earlier work freed: the same compile on the compile thread takes what it takes on the
main thread, and stemma's compile p90 over the sample fell by 0.7 ms.

`share_main_arena` sets glibc's M_ARENA_MAX to 1 before the compile threads start, which holds
for every thread the process starts from then on. Decode steps measured the same with it (CPU
engine, batches 1 and 8). A process whose MALLOC_ARENA_MAX is set keeps its own setting; one
that has already made more than 8 arenas keeps its limit (glibc fixes it then); without glibc
(musl, macOS) nothing is done.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_ARENA_MAX = -8  # glibc's mallopt parameter (malloc.h)


def share_main_arena() -> bool:
    """Threads started from now on allocate from the main arena; whether glibc took it."""
    if "MALLOC_ARENA_MAX" in os.environ or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_ARENA_MAX, 1) == 1
