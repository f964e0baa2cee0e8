"""Tensor parallelism's model side: one rank's view of the group and of the Megatron layout.

`TPGroup` wraps a gloo/nccl process group object (no torch.distributed default group, so two
engines can live in one process); `TPLayout` says which heads, MLP columns and vocabulary
rows a rank holds. q/k/v and gate/up are split by output (column-parallel), o and down by
input (row-parallel, one all-reduce each); the vocabulary is split into equal padded shards
(embedding: one all-reduce; lm_head: one gather to rank 0). KV heads are split when they
divide by the group size and replicated (rank r holds head r * num_kv_heads // size) when
fewer than the ranks.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ModelConfig


@dataclass(slots=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    pg: object | None = None  # a torch.distributed ProcessGroup; None when size == 1
    timeout_s: float = 5.0  # a collective that waits longer fails (a dead or hung rank)
    num_all_reduce: int = 0  # counted for bench/ (collectives per step)
    num_gather: int = 0

    @staticmethod
    def connect(
        store: object,
        rank: int,
        size: int,
        timeout_s: float,
        address: str | None = None,
        connect_timeout_s: float | None = None,
    ) -> TPGroup:
        """The compute group over a torch.distributed Store every rank reaches; address: where
        the other ranks reach this one (None: what this machine's hostname resolves to).
        Joining waits up to connect_timeout_s (ranks start at their own pace on a busy
        machine; a rank that gives up early closes its socket and fails the others' mesh);
        each collective then waits up to timeout_s."""
        if size == 1:
            return TPGroup()
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = datetime.timedelta(seconds=max(timeout_s, connect_timeout_s or 0))
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address or "")]
        pg = dist.ProcessGroupGloo(dist.PrefixStore("tp", store), rank, size, opts)
        pg.set_timeout(datetime.timedelta(seconds=timeout_s))
        return TPGroup(rank, size, pg, timeout_s)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over ranks, in place (every rank gets the sum)."""
        if self.size > 1:
            self.pg.allreduce([x]).wait()
            self.num_all_reduce += 1
        return x

    def gather_last_dim(self, x: torch.Tensor) -> torch.Tensor | None:
        """x: [rows, n] on every rank -> [rows, size * n] on rank 0 (None elsewhere)."""
        if self.size == 1:
            return x
        x = x.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        if self.rank == 0:
            parts = [torch.empty_like(x) for _ in range(self.size)]
            self.pg.gather([parts], [x], opts).wait()
        else:
            parts = None
            self.pg.gather([], [x], opts).wait()
        self.num_gather += 1
        return None if parts is None else torch.cat(parts, dim=-1)


@dataclass(frozen=True, slots=True)
class TPLayout:
    """What one rank of `size` holds of a model (all counts are this rank's)."""

    rank: int
    size: int
    num_heads: int
    num_kv_heads: int
    kv_head_start: int  # the first KV head of the checkpoint this rank holds
    intermediate_size: int
    vocab_shard: int  # rows per rank, padded: size * vocab_shard >= vocab_size

    @staticmethod
    def of(cfg: ModelConfig, rank: int = 0, size: int = 1) -> TPLayout:
        check_divisible(cfg, size)
        kv = cfg.num_kv_heads
        kv_local = kv // size if kv >= size else 1
        kv_start = rank * kv_local if kv >= size else rank * kv // size
        return TPLayout(
            rank,
            size,
            cfg.num_heads // size,
            kv_local,
            kv_start,
            cfg.intermediate_size // size,
            -(-cfg.vocab_size // size),
        )

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_shard


def check_divisible(cfg: ModelConfig, size: int) -> None:
    """ValueError naming the first dimension that tp_size = size cannot split."""
    if size < 1:
        raise ValueError(f"tp_size must be >= 1, got {size}")
    kv = cfg.num_kv_heads
    checks = [
        ("num_attention_heads", cfg.num_heads, cfg.num_heads % size == 0),
        ("intermediate_size", cfg.intermediate_size, cfg.intermediate_size % size == 0),
        ("num_key_value_heads", kv, kv % size == 0 if kv >= size else size % kv == 0),
    ]
    for name, value, ok in checks:
        if not ok:
            raise ValueError(
                f"tp_size={size} does not divide {name}={value}; pick a tp_size that divides "
                f"the heads ({cfg.num_heads} query, {kv} KV) and intermediate_size "
                f"({cfg.intermediate_size})"
            )
