"""share_main_arena: threads started after it allocate from glibc's main arena (counted by
glibc's own malloc_stats, in a fresh process), and a MALLOC_ARENA_MAX the user set stands."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest
from stemma.runtime.constrained import malloc_arena

GLIBC = platform.libc_ver()[0] == "glibc"

# Four threads that each keep a block while the others allocate, then glibc's count of arenas.
PROGRAM = textwrap.dedent(
    """
    import ctypes, sys, threading
    from stemma.runtime.constrained.malloc_arena import share_main_arena
    if sys.argv[1] == "share":
        assert share_main_arena()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    barrier = threading.Barrier(4)

    def work():
        block = libc.malloc(1 << 16)
        barrier.wait()
        libc.free(block)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    libc.malloc_stats()
    """
)


def _arenas(mode: str, env: dict[str, str] | None = None) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        timeout=60,
    )
    return out.stderr.count("Arena ")


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc arenas")
def test_threads_started_after_it_share_the_main_arena() -> None:
    assert _arenas("own") > 1  # by default the threads get arenas of their own
    assert _arenas("share") == 1


def test_a_limit_the_user_set_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    called = []
    monkeypatch.setattr(malloc_arena.ctypes, "CDLL", lambda _: called.append(1))
    assert malloc_arena.share_main_arena() is False and not called
