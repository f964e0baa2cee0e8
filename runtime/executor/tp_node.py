"""A node other than node 0 of a multi-node tensor-parallel group (`stemma serve --nnodes N
--node-rank R --dist-init-addr HOST:PORT`): no HTTP server and no scheduler, only this node's
tp_size / nnodes worker ranks. This process is the node's first rank and spawns the rest; all
of them take rank 0's plan from the store (tp_store.Plan) and load their shards from this
node's copy of the model. It returns 0 once the engine has shut down and every rank has
stopped; it fails when rank 0 dies or the group breaks.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

from ..config import EngineConfig
from ..models.loader import resolve_checkpoint
from .tp_auth import ForgedMessage, SealedStore, launch_secret
from .tp_store import Plan, split_addr
from .tp_worker import WorkerSpec, run_worker

log = logging.getLogger("stemma.tp")


def serve_node(node: EngineConfig) -> int:
    """Run this node's ranks until the engine stops them; the exit status."""
    assert node.node_rank > 0 and node.dist_init_addr is not None  # EngineConfig checked
    ckpt = resolve_checkpoint(node.model, Path(node.cache_dir) if node.cache_dir else None)
    host, port = split_addr(node.dist_init_addr)
    per_node = node.tp_size // node.nnodes
    ranks = range(node.node_rank * per_node, (node.node_rank + 1) * per_node)
    log.info("node %d: ranks %s wait for rank 0 at %s", node.node_rank, list(ranks), host)
    secret = launch_secret(node)  # before waiting: a node without one fails at once
    timeout = datetime.timedelta(seconds=node.dist_connect_timeout_s)
    store = dist.TCPStore(host, port, node.tp_size, False, timeout=timeout)
    try:
        plan = Plan.read(SealedStore(store, secret))
        cfg = plan.config_for(node, json.loads((ckpt / "config.json").read_text()))
    except ValueError as e:
        if isinstance(e, ForgedMessage):
            e = ValueError(f"node {node.node_rank}'s secret is not node 0's ({e})")
        for rank in ranks:  # rank 0 fails its start with this instead of waiting it out
            store.set(f"error/{rank}", str(e).encode())
        raise e from None
    spec = WorkerSpec(cfg, str(ckpt), plan.dtype, host, port, os.getpid(), secret)
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=run_worker, args=(rank, spec), daemon=True, name=f"stemma-tp{rank}")
        for rank in ranks[1:]
    ]
    for p in procs:
        p.start()
    try:
        run_worker(ranks[0], replace(spec, parent_pid=None))
    finally:
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(5.0)
    failed = {rank: p.exitcode for rank, p in zip(ranks[1:], procs) if p.exitcode}
    if failed:
        log.error("node %d: ranks exited with codes %s", node.node_rank, failed)
        return 1
    log.info("node %d: the engine shut down; ranks %s stopped", node.node_rank, list(ranks))
    return 0
