"""Rank 0's side of tensor parallelism: it spawns ranks 1..N-1 (tp_worker.py), meets them in a
gloo group through a TCPStore, and publishes each step's ForwardBatch (step_message.py) under
the store key step/<n> before running it; every rank runs the same step and rank 0 gets the
gathered logits.

Lifecycle. A worker that dies or hangs makes the step's collectives fail (a reset connection at
once, a hung peer after dist_timeout_s); `forward` then raises WorkerLost naming the rank
(dead: its exit code; hung: its heartbeat is stale). A watchdog thread notices a death while
idle too. Workers exit on a STOP message, when their parent dies, or when the group breaks,
so no process outlives the engine; `shutdown` joins them and kills stragglers.
"""

from __future__ import annotations

import json
import logging
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..config import EngineConfig
from ..models.config import ModelConfig
from ..models.parallel import TPGroup, check_divisible
from .forward_batch import ForwardBatch
from .step_message import pack_step, pack_stop
from .tp_worker import HEARTBEAT_S, STORE_TIMEOUT, WorkerSpec, run_worker

log = logging.getLogger("stemma.tp")


class WorkerLost(RuntimeError):
    """A tensor-parallel rank died or stopped answering; the group cannot run another step."""


def split_addr(addr: str | None) -> tuple[str, int]:
    if addr is None:
        return "127.0.0.1", 0  # loopback, any free port
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"dist_init_addr must be HOST:PORT, got {addr!r}")
    return host, int(port)


class TensorParallel:
    def __init__(self, cfg: EngineConfig, ckpt_dir: str, dtype: torch.dtype):
        """Start the store and this node's workers, and join the group as rank 0."""
        mc = ModelConfig.from_hf(json.loads((Path(ckpt_dir) / "config.json").read_text()))
        check_divisible(mc, cfg.tp_size)  # before any process starts
        self.size = cfg.tp_size
        self.lost: str | None = None  # why the group broke, once it has
        self.on_lost: Callable[[str], None] | None = None  # the engine's hook (watchdog)
        self._stopping = False
        self._step = 0
        host, port = split_addr(cfg.dist_init_addr)
        self.store = dist.TCPStore(
            host, port, self.size, True, timeout=STORE_TIMEOUT, wait_for_workers=False
        )
        ctx = mp.get_context("spawn")
        self.heartbeats = ctx.Array("d", self.size, lock=False)
        dtype_name = str(dtype).removeprefix("torch.")
        spec = WorkerSpec(cfg, ckpt_dir, dtype_name, host, self.store.port, os.getpid())
        per_node = self.size // cfg.nnodes
        self.procs = {
            rank: ctx.Process(
                target=run_worker,
                args=(rank, spec, self.heartbeats),
                daemon=True,
                name=f"stemma-tp{rank}",
            )  # fmt: skip
            for rank in range(1, per_node)
        }
        for p in self.procs.values():
            p.start()
        self._wait_keys("up", "connect")
        self.group = TPGroup.connect(self.store, 0, self.size, cfg.dist_timeout_s)

    @property
    def pids(self) -> dict[int, int]:
        return {rank: p.pid for rank, p in self.procs.items()}

    def wait_ready(self, small_step_rows: int) -> None:
        """Tell the workers rank 0's weight plan (dtype_policy.plan_small_steps, measured
        once, so every rank runs the same kernels), wait until every rank has built its
        runner, and start the watchdog."""
        self.store.set("small_step_rows", str(small_step_rows).encode())
        self._wait_keys("ready", "load its shard")
        threading.Thread(target=self._watch, name="stemma-tp-watchdog", daemon=True).start()

    def forward(self, fb: ForwardBatch, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Publish the step, run rank 0's part (run) and return its logits."""
        if self.lost is not None:
            raise WorkerLost(self.lost)
        try:
            self._publish(pack_step(fb))
            return run()
        except (RuntimeError, dist.DistError) as e:
            raise WorkerLost(self._mark_lost(self.diagnose(e))) from e

    def diagnose(self, error: BaseException | None = None) -> str:
        """Which ranks are gone: dead ones with their exit code, hung ones by heartbeat."""
        deadline = time.monotonic() + 1.0  # a reset connection can come before the exit code
        while time.monotonic() < deadline and all(p.is_alive() for p in self.procs.values()):
            if any(time.monotonic() - self.heartbeats[r] > 4 * HEARTBEAT_S for r in self.procs):
                break
            time.sleep(0.05)
        now, why = time.monotonic(), []
        for rank, p in self.procs.items():
            if p.exitcode is not None:
                why.append(f"rank {rank} died (exit code {p.exitcode})")
            elif now - self.heartbeats[rank] > 4 * HEARTBEAT_S:
                why.append(
                    f"rank {rank} hung (no heartbeat for {now - self.heartbeats[rank]:.1f} s)"
                )
        if not why:
            detail = f": {str(error).splitlines()[0][:200]}" if error else ""
            why.append(f"a rank of {self.size} stopped answering{detail}")
        return "tensor-parallel " + "; ".join(why)

    def shutdown(self) -> None:
        """Stop the workers (STOP message), then join; kill any that do not exit."""
        self._stopping = True
        if self.lost is None:
            try:
                self._publish(pack_stop())
            except (RuntimeError, dist.DistError):
                pass  # the store is gone: the workers notice on their own
        deadline = time.monotonic() + (5.0 if self.lost is None else 0.0)  # lost: kill now
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(5.0)

    # ---- internals ------------------------------------------------------------------------
    def _publish(self, message: bytes) -> None:
        self._step += 1
        self.store.set(f"step/{self._step}", message)
        if self._step > 1:  # every rank read it: the last step's collectives completed
            self.store.delete_key(f"step/{self._step - 1}")

    def _mark_lost(self, message: str) -> str:
        if self.lost is None:
            self.lost = message
            log.error("%s; the engine accepts no more requests", message)
        return self.lost

    def _wait_keys(self, prefix: str, what: str) -> None:
        """Wait for every local worker's `prefix/<rank>` key; a worker that dies first or
        writes `error/<rank>` fails the engine's start with its message."""
        pending = set(self.procs)
        while pending:
            for rank in sorted(pending):
                if self.store.check([f"error/{rank}"]):
                    error = self.store.get(f"error/{rank}").decode()
                    raise RuntimeError(f"tensor-parallel rank {rank} failed to {what}: {error}")
                if self.store.check([f"{prefix}/{rank}"]):
                    pending.discard(rank)
                elif (code := self.procs[rank].exitcode) is not None:
                    raise RuntimeError(
                        f"tensor-parallel rank {rank} exited with code {code} before it "
                        f"could {what}"
                    )
            time.sleep(0.02)

    def _watch(self) -> None:
        """Report a worker's death while the engine is idle (a step would find it anyway)."""
        sentinels = {p.sentinel: rank for rank, p in self.procs.items()}
        multiprocessing.connection.wait(list(sentinels))
        if self._stopping or self.lost is not None:
            return
        message = self._mark_lost(self.diagnose())
        if self.on_lost is not None:
            self.on_lost(message)
