"""Speed measurements kept across starts. The weight plan is decided from timings taken at
start (dtype_policy, models/weights/few_rows.py): up to which row count the GGUF's own int4
blocks beat the dtype's kernel, whether its int8 vocabulary does, whether bfloat16 copies or
float16 weights win. Near a tie on a busy machine those timings fall either way, so two
starts of one engine on one machine could hold the weights in different forms: different
kernels, different roundings, different compiled graphs, and speeds 10% apart.

Each verdict is measured once per machine and kept in the cache dir's `measured/`, in one
JSON file per machine: CPU model, vector ISA, torch's version and its thread count name it.
Later starts, and engines started beside each other (a file lock orders them), read it
instead of timing again, so they decide alike and start faster. Delete the file to measure
again (after changing the machine's load, say); a file that cannot be read is measured over.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("stemma.dtype")

# Whether verdicts are kept at all: the tests fix every verdict instead (tests/conftest.py),
# and a test's injected verdict must not be kept for a real engine to read later.
KEEP = True


def machine_identity() -> dict[str, Any]:
    """What a timing depends on besides the load: the CPU, its vector ISA, torch and the
    threads its kernels use."""
    return {
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform says."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


class KeptMeasurements:
    """Verdicts by name and key, read from and written to one file per machine under
    `directory` (None: nothing kept, every verdict measured)."""

    def __init__(self, directory: Path | None) -> None:
        self.path: Path | None = None
        self.identity = machine_identity()
        if directory is not None and KEEP:
            identity = json.dumps(self.identity, sort_keys=True)
            name = hashlib.sha256(identity.encode()).hexdigest()[:16]
            self.path = directory / f"{name}.json"
        self.kept: list[str] = []  # verdicts read from the file rather than measured now
        self.measured: list[str] = []  # verdicts measured now

    def value(self, name: str, key: tuple, measure: Callable[[], Any]) -> Any:
        """The kept verdict for (name, key), else measure() kept for next time. Verdicts are
        JSON values (row counts, booleans)."""
        slot = f"{name}{key!r}"
        if self.path is None:
            self.measured.append(slot)
            return measure()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # a start beside this one waits for the verdict
            values = self._read()
            if slot in values:
                self.kept.append(slot)
                return values[slot]
            values[slot] = verdict = measure()
            self._write(values)
            self.measured.append(slot)
            return verdict

    def _read(self) -> dict[str, Any]:
        assert self.path is not None
        try:
            data = json.loads(self.path.read_text())
            values = data["values"]
            if not isinstance(values, dict):
                raise TypeError(f"values is a {type(values).__name__}")
            return values
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("measuring again: %s could not be read (%s)", self.path, e)
            return {}

    def _write(self, values: dict[str, Any]) -> None:
        assert self.path is not None
        text = json.dumps({"machine": self.identity, "values": values}, indent=1)
        fd, partial = tempfile.mkstemp(dir=self.path.parent, suffix=".partial")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(partial, self.path)  # a reader sees the old file or the new, whole
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise

    def summary(self) -> dict[str, Any] | None:
        """For /get_model_info: where the verdicts are kept, which were read from there and
        which were measured at this start (None where nothing is kept)."""
        if self.path is None:
            return None
        return {"path": str(self.path), "kept": self.kept, "measured": self.measured}
