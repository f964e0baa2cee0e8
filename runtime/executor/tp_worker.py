"""A tensor-parallel worker process (rank >= 1): load this rank's shard, then run every step
rank 0 publishes (step_message.py) until STOP. A step that fails authentication (tp_auth.py)
is logged, counted under rejected/<rank> and skipped: the worker waits for rank 0's sealed
one under the same key. One torch thread unless num_threads says otherwise. It exits when
its parent or rank 0 dies or the group breaks (tp_store.beat), so it never outlives the
engine; after STOP it says so under stopped/<rank> and exits 0.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..config import EngineConfig
from ..models.loader import load_model
from ..models.parallel import TPGroup
from ..weight_plan import WeightPlan
from .model_runner import ModelRunner
from .step_message import StepBounds, unpack_step
from .tp_auth import ForgedMessage, SealedStore
from .tp_store import STORE_TIMEOUT, beat, local_address

log = logging.getLogger("stemma.tp")
IDLE_WAIT = datetime.timedelta(days=365)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker process needs to build its shard (picklable, sent once at spawn)."""

    cfg: EngineConfig
    ckpt_dir: str
    dtype: str  # a torch dtype name, e.g. "float64"
    host: str  # rank 0's store
    port: int
    parent_pid: int | None  # exit when this process is no longer the parent; None: no parent
    secret: bytes  # the launch's HMAC key (tp_auth.py); never written to the store


def run_worker(rank: int, spec: WorkerSpec) -> None:
    """The worker's main function (torch.multiprocessing spawn target, or a node's own rank)."""
    torch.set_num_threads(spec.cfg.num_threads or 1)
    stop_beating = threading.Event()
    heartbeat = threading.Thread(
        target=beat,
        args=((spec.host, spec.port), rank, spec.parent_pid, stop_beating),
        name="stemma-tp-heartbeat",
        daemon=True,
    )
    heartbeat.start()
    raw = dist.TCPStore(spec.host, spec.port, spec.cfg.tp_size, False, timeout=STORE_TIMEOUT)
    store = SealedStore(raw, spec.secret)
    raw.set(f"up/{rank}", b"1")
    try:
        address = local_address(spec.host, spec.port)
        cfg = spec.cfg
        group = TPGroup.connect(
            raw, rank, cfg.tp_size, cfg.dist_timeout_s, address, cfg.dist_connect_timeout_s
        )
        dtype = getattr(torch, spec.dtype)
        loaded = load_model(spec.ckpt_dir, dtype, spec.cfg.device, tp=group)
        plan = WeightPlan.from_json(_authentic(store, rank, "weight_plan"))  # rank 0's
        runner = ModelRunner(spec.cfg, loaded, plan)
    except Exception as e:  # noqa: BLE001 - reported to rank 0, which fails the engine's start
        raw.set(f"error/{rank}", f"{type(e).__name__}: {e}".encode())
        raise
    raw.set(f"ready/{rank}", b"1")
    _serve(store, rank, runner)
    stop_beating.set()  # before rank 0 may close the store: a failed beat would exit(3)
    heartbeat.join()
    raw.set(f"stopped/{rank}", b"1")


def _serve(store: SealedStore, rank: int, runner: ModelRunner) -> None:
    bounds = StepBounds(
        runner.model.cfg.vocab_size,
        runner.req_to_token_pool.req_to_token.shape[0],
        runner.num_slots,
        runner.req_to_token_pool.max_context,
    )
    step = 1
    while True:
        key = f"step/{step}"
        # Idle may last forever; a lost rank 0 closes the store's socket, which ends the wait.
        store.raw.wait([key], IDLE_WAIT)
        fb = unpack_step(_authentic(store, rank, key), runner.device, bounds)
        if fb is None:
            return
        runner.forward(fb)
        step += 1


def _authentic(store: SealedStore, rank: int, key: str) -> bytes:
    """The sealed value under key. A forged one is logged and counted, and the key read again
    until rank 0's own value replaces it (rank 0 writes every step it runs)."""
    rejected, pause_s = None, 0.001
    while True:
        message = store.raw.get(key)
        try:
            return store.unseal(key, message)
        except ForgedMessage as e:
            if message != rejected:
                log.error("tensor-parallel rank %d rejected a step: %s", rank, e)
                store.raw.add(f"rejected/{rank}", 1)
                rejected = message
        time.sleep(pause_s)
        pause_s = min(2 * pause_s, 0.05)
