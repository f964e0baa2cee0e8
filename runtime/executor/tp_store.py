"""How tensor-parallel ranks find and watch each other: through rank 0's TCPStore at
dist_init_addr. Rank 0 publishes its plan (engine options, dtype, the model's config.json) so a
rank on another machine builds exactly rank 0's shard layout and KV pool; every worker bumps the
counter hb/<rank> every HEARTBEAT_S on a connection of its own, and rank 0 notes on its own
clock when each counter last moved (the machines' clocks need not agree). A rank whose counter
stops is dead or hung, wherever it runs; a worker that cannot reach the store exits at once.
The store listens only on dist_init_addr's address, and what rank 0 writes for the workers is
sealed (tp_auth.py).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch.distributed as dist

from ..config import EngineConfig
from .tp_auth import SealedStore

HEARTBEAT_S = 0.5
STALE_S = 4 * HEARTBEAT_S  # a rank silent this long is dead or hung
STORE_TIMEOUT = datetime.timedelta(seconds=300)


def split_addr(addr: str | None) -> tuple[str, int]:
    """'HOST:PORT' (IPv6 as '[::1]:PORT') -> (host, port); None -> loopback, any free port."""
    if addr is None:
        return "127.0.0.1", 0
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"dist_init_addr must be HOST:PORT, got {addr!r}")
    return host.removeprefix("[").removesuffix("]"), int(port)


def listen_store(host: str, port: int, world_size: int) -> dist.TCPStore:
    """Rank 0's TCPStore, listening on host's address only. TCPStore itself binds every
    interface whatever host says (pytorch#173909), so the socket is bound here and torch
    takes over its descriptor (and closes it with the store)."""
    family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(sockaddr)
        sock.listen(1024)
        bound_port = sock.getsockname()[1]
        store = dist.TCPStore(
            host, bound_port, world_size, True, timeout=STORE_TIMEOUT,
            wait_for_workers=False, master_listen_fd=sock.fileno(),
        )  # fmt: skip
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now
    return store


def local_address(host: str, port: int) -> str:
    """This machine's address on the route to host:port, where the other ranks reach this one's
    gloo connections (no packet is sent)."""
    family, kind, _, _, target = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, kind) as s:
        s.connect(target)
        return s.getsockname()[0]


def node_of(rank: int, cfg: EngineConfig) -> int:
    return rank // (cfg.tp_size // cfg.nnodes)


@dataclass(frozen=True, slots=True)
class Plan:
    """What rank 0 decided and every rank must share."""

    engine: dict[str, Any]  # EngineConfig's fields
    dtype: str  # a torch dtype name, e.g. "float64"
    model_config: dict[str, Any]  # the checkpoint's config.json

    def publish(self, store: SealedStore) -> None:
        store.set("plan", json.dumps(asdict(self)).encode())

    @staticmethod
    def read(store: SealedStore) -> Plan:
        """Rank 0's plan; tp_auth.ForgedMessage when this node's secret is not rank 0's."""
        return Plan(**json.loads(store.get("plan")))

    def config_for(self, node: EngineConfig, model_config: dict[str, Any]) -> EngineConfig:
        """Rank 0's options with this node's own model path, cache and place; ValueError when
        this node was started for another group or another model."""
        ours = {k: getattr(node, k) for k in ("tp_size", "nnodes")}
        theirs = {k: self.engine[k] for k in ours}
        if ours != theirs:
            raise ValueError(f"this node was started with {ours}, but rank 0 runs {theirs}")
        if model_config != self.model_config:
            differ = sorted(
                k
                for k in model_config.keys() | self.model_config.keys()
                if model_config.get(k) != self.model_config.get(k)
            )
            raise ValueError(
                f"model {node.model!r} on node {node.node_rank} is not rank 0's model: "
                f"config.json differs in {differ}"
            )
        local = {"model": node.model, "cache_dir": node.cache_dir, "node_rank": node.node_rank,
                 "dist_secret_file": node.dist_secret_file}  # fmt: skip
        return EngineConfig(**(self.engine | local))


def beat(
    store_addr: tuple[str, int], rank: int, parent_pid: int | None, stop: threading.Event
) -> None:
    """A worker's heartbeat thread. It exits the process at once when its parent has gone
    (parent_pid, for spawned ranks) or rank 0's store is unreachable (rank 0 died): no
    process outlives its engine."""
    try:
        store = dist.TCPStore(*store_addr, is_master=False, timeout=datetime.timedelta(seconds=30))
        while not stop.is_set():
            if parent_pid is not None and os.getppid() != parent_pid:
                os._exit(3)
            store.add(f"hb/{rank}", 1)
            stop.wait(HEARTBEAT_S)
    except (RuntimeError, dist.DistError):
        os._exit(3)


class HeartbeatMonitor:
    """Rank 0's view of the workers' heartbeats, polled on a store connection of its own."""

    def __init__(self, store_addr: tuple[str, int], ranks: Iterable[int]):
        self._store = dist.TCPStore(*store_addr, is_master=False, timeout=STORE_TIMEOUT)
        self._counts = dict.fromkeys(ranks, 0)
        self._seen: dict[int, float] = {}  # rank -> time.monotonic() of its last beat
        self._closed = threading.Event()
        threading.Thread(target=self._poll, name="stemma-tp-heartbeats", daemon=True).start()

    def age(self, rank: int) -> float | None:
        """Seconds since rank's last heartbeat; None before its first."""
        seen = self._seen.get(rank)
        return None if seen is None else time.monotonic() - seen

    def close(self) -> None:
        self._closed.set()

    def _poll(self) -> None:
        while not self._closed.wait(HEARTBEAT_S / 5):
            for rank, count in self._counts.items():
                try:
                    now = self._store.add(f"hb/{rank}", 0)
                except (RuntimeError, dist.DistError):
                    return  # the store is gone: the engine is shutting down
                if now != count:
                    self._counts[rank] = now
                    self._seen[rank] = time.monotonic()
