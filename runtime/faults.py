"""Test-only fault switches: make the engine fail the way production failures look, on demand.

Off unless the engine was started with `enable_fault_injection=True`
(`stemma serve --enable-fault-injection`); then `Engine.inject_fault(kind, count)` or
`POST /debug/inject_fault` arms a switch, and the next `count` times the engine passes the
switch's place it fails there:

  forward_error  the model forward raises (the batch's requests fail, the engine goes on)
  compile_kill   the constraint compile worker is killed mid-compile (SIGKILL)
  compile_hang   the compile worker stops answering (SIGSTOP) until the compile timeout

The soak harness (bench/soak.py) drives these while the server is under load. A disarmed
switch costs one dict lookup.
"""

from __future__ import annotations

import threading
from collections import Counter

FAULT_KINDS = ("forward_error", "compile_kill", "compile_hang")


class InjectedFault(RuntimeError):
    """Raised where an armed switch fires (only with fault injection enabled)."""


class Faults:
    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.fired: Counter[str] = Counter()
        self._armed: Counter[str] = Counter()
        self._lock = threading.Lock()

    def arm(self, kind: str, count: int = 1) -> None:
        if not self.enabled:
            raise RuntimeError(
                "fault injection is off; start the engine with enable_fault_injection=True "
                "(stemma serve --enable-fault-injection)"
            )
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        with self._lock:
            self._armed[kind] += count

    def take(self, kind: str) -> bool:
        """Whether the switch fires here (and uses up one of its arms)."""
        if not self._armed:
            return False
        with self._lock:
            if self._armed[kind] <= 0:
                return False
            self._armed[kind] -= 1
            if not self._armed[kind]:
                del self._armed[kind]
            self.fired[kind] += 1
            return True

    def state(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {"armed": dict(self._armed), "fired": dict(self.fired)}
