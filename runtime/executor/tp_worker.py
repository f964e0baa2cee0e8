"""A tensor-parallel worker process (rank >= 1): load this rank's shard, then run every step
rank 0 publishes (step_message.py) until STOP. One torch thread unless num_threads says
otherwise. It exits when its parent dies or the group breaks, so it never outlives the engine.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import EngineConfig
from ..models.loader import load_decoder
from ..models.parallel import TPGroup
from .model_runner import ModelRunner
from .step_message import unpack_step

log = logging.getLogger("stemma.tp")
IDLE_WAIT = datetime.timedelta(days=365)
STORE_TIMEOUT = datetime.timedelta(seconds=300)
HEARTBEAT_S = 0.5


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker process needs to build its shard (picklable, sent once at spawn)."""

    cfg: EngineConfig
    ckpt_dir: str
    dtype: str  # a torch dtype name, e.g. "float64"
    host: str
    port: int
    parent_pid: int


def run_worker(rank: int, spec: WorkerSpec, heartbeats) -> None:
    """The worker's main function (torch.multiprocessing spawn target)."""
    torch.set_num_threads(spec.cfg.num_threads or 1)
    threading.Thread(
        target=_heartbeat, args=(rank, spec.parent_pid, heartbeats), daemon=True
    ).start()
    store = dist.TCPStore(spec.host, spec.port, spec.cfg.tp_size, False, timeout=STORE_TIMEOUT)
    store.set(f"up/{rank}", b"1")
    try:
        group = TPGroup.connect(store, rank, spec.cfg.tp_size, spec.cfg.dist_timeout_s)
        dtype = getattr(torch, spec.dtype)
        model, _ = load_decoder(Path(spec.ckpt_dir), dtype, spec.cfg.device, group)
        small_step_rows = int(store.get("small_step_rows"))  # rank 0's measured plan
        runner = ModelRunner(spec.cfg, model, small_step_rows)
    except Exception as e:  # noqa: BLE001 - reported to rank 0, which fails the engine's start
        store.set(f"error/{rank}", f"{type(e).__name__}: {e}".encode())
        raise
    store.set(f"ready/{rank}", b"1")
    _serve(store, runner)


def _serve(store: dist.Store, runner: ModelRunner) -> None:
    step = 1
    while True:
        key = f"step/{step}"
        # Idle may last forever; a lost rank 0 closes the store's socket, which ends the wait.
        store.wait([key], IDLE_WAIT)
        fb = unpack_step(store.get(key), runner.device)
        if fb is None:
            return
        runner.forward(fb)
        step += 1


def _heartbeat(rank: int, parent_pid: int, heartbeats) -> None:
    """Tell rank 0 this process runs; exit at once when the parent has gone (no orphans)."""
    while True:
        heartbeats[rank] = time.monotonic()
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(HEARTBEAT_S)
