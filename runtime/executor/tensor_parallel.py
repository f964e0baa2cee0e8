"""Rank 0's side of tensor parallelism: it spawns this node's ranks 1..N/nnodes-1
(tp_worker.py; the other nodes start theirs with tp_node.py), meets every rank in a gloo group
through a TCPStore (tp_store.py), and publishes each step's ForwardBatch (step_message.py)
under the store key step/<n> before running it, sealed with the launch secret (tp_auth.py);
every rank runs the same step and rank 0 gets the gathered logits.

Lifecycle. A worker that dies or hangs makes the step's collectives fail (a reset connection at
once, a hung peer after dist_timeout_s); `forward` then raises WorkerLost naming the rank
(a local one: its exit code, or its stale heartbeat; a remote one: its stale heartbeat). A
watchdog notices a death while idle too. Workers exit on a STOP message, when their parent or
rank 0 dies, or when the group breaks, so no process outlives the engine; `shutdown` joins
this node's workers, waits for the other nodes' to confirm STOP, and kills local stragglers.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..config import EngineConfig
from ..models.config import ModelConfig
from ..models.parallel import TPGroup, check_divisible
from ..weight_plan import WeightPlan
from .forward_batch import ForwardBatch
from .step_message import pack_step, pack_stop
from .tp_auth import SealedStore, launch_secret
from .tp_store import (
    STALE_S,
    HeartbeatMonitor,
    Plan,
    listen_store,
    local_address,
    node_of,
    split_addr,
)
from .tp_worker import WorkerSpec, run_worker

log = logging.getLogger("stemma.tp")


class WorkerLost(RuntimeError):
    """A tensor-parallel rank died or stopped answering; the group cannot run another step."""


class TensorParallel:
    def __init__(self, cfg: EngineConfig, ckpt_dir: str, dtype: torch.dtype):
        """Start the store and this node's workers, wait for every rank (the other nodes' up
        to dist_connect_timeout_s) and join the group as rank 0."""
        if cfg.node_rank != 0:
            raise ValueError(
                f"node_rank={cfg.node_rank} runs only worker ranks: start it with `stemma serve "
                f"--node-rank {cfg.node_rank} ...` (runtime/executor/tp_node.py), not an Engine"
            )
        model_config = json.loads((Path(ckpt_dir) / "config.json").read_text())
        check_divisible(ModelConfig.from_hf(model_config), cfg.tp_size)  # before any process
        self.cfg = cfg
        self.size = cfg.tp_size
        self.lost: str | None = None  # why the group broke, once it has
        self.on_lost: Callable[[str], None] | None = None  # the engine's hook (watchdog)
        self._stopping = False
        self._step = 0
        host, port = split_addr(cfg.dist_init_addr)
        secret = launch_secret(cfg)
        self.store = listen_store(host, port, self.size)
        self.sealed = SealedStore(self.store, secret)
        dtype_name = str(dtype).removeprefix("torch.")
        Plan(asdict(cfg), dtype_name, model_config).publish(self.sealed)
        self.beats = HeartbeatMonitor((host, self.store.port), range(1, self.size))
        ctx = mp.get_context("spawn")
        spec = WorkerSpec(cfg, ckpt_dir, dtype_name, host, self.store.port, os.getpid(), secret)
        per_node = self.size // cfg.nnodes
        self.procs = {
            rank: ctx.Process(target=run_worker, args=(rank, spec), daemon=True,
                              name=f"stemma-tp{rank}")
            for rank in range(1, per_node)
        }  # fmt: skip
        self.remote = list(range(per_node, self.size))  # the other nodes' ranks
        for p in self.procs.values():
            p.start()
        try:
            self._wait_keys("up", "connect", time.monotonic() + cfg.dist_connect_timeout_s)
            address = local_address(host, self.store.port)
            self.group = TPGroup.connect(
                self.store, 0, self.size, cfg.dist_timeout_s, address, cfg.dist_connect_timeout_s
            )
        except BaseException:
            self.lost = self.lost or "the group failed to start"  # kill the workers at once
            self.shutdown()
            raise

    @property
    def pids(self) -> dict[int, int]:
        return {rank: p.pid for rank, p in self.procs.items()}

    def wait_ready(self, plan: WeightPlan) -> None:
        """Tell the workers rank 0's weight plan (measured once, so every rank runs the same
        kernels), wait until every rank has built its runner, and start the watchdog."""
        self.sealed.set("weight_plan", plan.to_json())
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
        """Which ranks are gone: dead local ones with their exit code, hung local ones and
        lost remote ones by heartbeat."""
        # A reset connection comes before the exit code, and a remote rank's loss shows only
        # as a heartbeat going stale.
        wait_s = STALE_S + 1.0 if self.remote else 1.0
        deadline = time.monotonic() + wait_s
        ranks = range(1, self.size)
        while time.monotonic() < deadline and not any(self._gone(r) for r in ranks):
            time.sleep(0.05)
        why = [f"rank {r} {gone}" for r in ranks if (gone := self._gone(r))]
        if not why:
            detail = f": {str(error).splitlines()[0][:200]}" if error else ""
            why.append(f"a rank of {self.size} stopped answering{detail}")
        return "tensor-parallel " + "; ".join(why)

    def shutdown(self) -> None:
        """Stop the workers (STOP message), then join this node's and wait for the other
        nodes' to confirm; kill local ones that do not exit."""
        self._stopping = True
        if self.lost is None:
            try:
                self._publish(pack_stop())
            except (RuntimeError, dist.DistError):
                pass  # the store is gone: the workers notice on their own
        deadline = time.monotonic() + (5.0 if self.lost is None else 0.0)  # lost: kill now
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        pending = [f"stopped/{r}" for r in self.remote]
        while pending and time.monotonic() < deadline:
            pending = [key for key in pending if not self.store.check([key])]
            time.sleep(0.02)
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(5.0)
        self.beats.close()

    # ---- internals ------------------------------------------------------------------------
    def _gone(self, rank: int) -> str | None:
        """Why rank is gone, or None while it looks alive (or has not started yet)."""
        p = self.procs.get(rank)
        if p is not None and p.exitcode is not None:
            return f"died (exit code {p.exitcode})"
        age = self.beats.age(rank)
        if age is None or age <= STALE_S:
            return None
        if p is not None:
            return f"hung (no heartbeat for {age:.1f} s)"
        return f"on node {node_of(rank, self.cfg)} died or hung (no heartbeat for {age:.1f} s)"

    def _publish(self, message: bytes) -> None:
        self._step += 1
        self.sealed.set(f"step/{self._step}", message)
        if self._step > 1:  # every rank read it: the last step's collectives completed
            self.store.delete_key(f"step/{self._step - 1}")

    def _mark_lost(self, message: str) -> str:
        if self.lost is None:
            self.lost = message
            log.error("%s; the engine accepts no more requests", message)
        return self.lost

    def _wait_keys(self, prefix: str, what: str, deadline: float | None = None) -> None:
        """Wait for every worker's `prefix/<rank>` key; a worker that dies first, writes
        `error/<rank>`, or (another node's) is missing at the deadline fails the engine's
        start with its message."""
        pending = set(range(1, self.size))
        while pending:
            for rank in sorted(pending):
                if self.store.check([f"error/{rank}"]):
                    error = self.store.get(f"error/{rank}").decode()
                    self._fail(f"tensor-parallel rank {rank} failed to {what}: {error}")
                if self.store.check([f"{prefix}/{rank}"]):
                    pending.discard(rank)
                elif gone := self._gone(rank):
                    self._fail(f"tensor-parallel rank {rank} {gone} before it could {what}")
            missing = sorted(pending & set(self.remote))
            if deadline is not None and missing and time.monotonic() > deadline:
                self._fail(self._missing_message(missing))
            time.sleep(0.02)

    def _missing_message(self, missing: list[int]) -> str:
        cfg = self.cfg
        nodes = sorted({node_of(r, cfg) for r in missing})
        node = nodes[0]
        return (
            f"tensor-parallel rank(s) {missing} (node(s) {nodes}) did not connect to "
            f"{cfg.dist_init_addr} within {cfg.dist_connect_timeout_s:g} s; on node {node} run "
            f"`stemma serve --model {cfg.model} --tp-size {cfg.tp_size} --nnodes {cfg.nnodes} "
            f"--node-rank {node} --dist-init-addr {cfg.dist_init_addr}`"
        )

    def _fail(self, message: str) -> None:
        self.lost = message  # shutdown kills the workers at once
        raise RuntimeError(message)

    def _watch(self) -> None:
        """Report a lost rank while the engine is idle (a step would find it anyway): a local
        worker's exit, or another node's rank silent for longer than dist_timeout_s."""
        idle_stale_s = max(STALE_S, self.cfg.dist_timeout_s)
        while not (self._stopping or self.lost is not None):
            exited = any(p.exitcode is not None for p in self.procs.values())
            silent = any((self.beats.age(r) or 0.0) > idle_stale_s for r in self.remote)
            if exited or silent:
                break
            time.sleep(0.1)
        if self._stopping or self.lost is not None:
            return
        message = self._mark_lost(self.diagnose())
        if self.on_lost is not None:
            self.on_lost(message)
