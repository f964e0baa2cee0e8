"""A step as one flat int64 tensor: what rank 0 sends the other tensor-parallel ranks.

Layout: [op, B, num_tokens, num_kv, num_logits] then input_ids, prefix_lens, extend_lens,
req_pool_idx, out_cache_loc, kv_indices, logits_idx. A receiver rebuilds the ForwardBatch
(positions, seq_lens, indptrs, mode) from these, so every rank runs the same step. op STOP
(and nothing after it) ends a worker.
"""

from __future__ import annotations

import enum

import torch

from .forward_batch import ForwardBatch, ForwardMode

HEADER_LEN = 5


class StepOp(enum.IntEnum):
    FORWARD = 1
    STOP = 2


def pack_step(fb: ForwardBatch) -> bytes:
    parts = [
        fb.input_ids,
        fb.prefix_lens,
        fb.extend_lens,
        fb.req_pool_idx,
        fb.out_cache_loc,
        fb.kv_indices,
        fb.logits_idx,
    ]
    header = [StepOp.FORWARD, fb.batch_size, fb.num_tokens, fb.kv_indices.numel()]
    header.append(fb.logits_idx.numel())
    flat = torch.cat([torch.tensor(header)] + [p.cpu().long() for p in parts])
    return flat.numpy().tobytes()


def pack_stop() -> bytes:
    return torch.tensor([StepOp.STOP, 0, 0, 0, 0]).numpy().tobytes()


def unpack_step(data: bytes, device: torch.device | str = "cpu") -> ForwardBatch | None:
    """The ForwardBatch of a FORWARD message; None for STOP."""
    flat = torch.frombuffer(bytearray(data), dtype=torch.int64)
    op, b, n, num_kv, num_logits = flat[:HEADER_LEN].tolist()
    if op == StepOp.STOP:
        return None
    sizes = [n, b, b, b, n, num_kv, num_logits]
    ids, prefix, extend, rows, out_loc, kv_indices, logits_idx = flat[HEADER_LEN:].split(sizes)
    prefix_cpu, extend_cpu = prefix.tolist(), extend.tolist()
    seq_cpu = [p + e for p, e in zip(prefix_cpu, extend_cpu)]
    positions = torch.cat([torch.arange(p, p + e) for p, e in zip(prefix_cpu, extend_cpu)])
    zero = torch.zeros(1, dtype=torch.int64)
    qo_indptr = torch.cat([zero, extend.cumsum(0)])
    kv_indptr = torch.cat([zero, torch.tensor(seq_cpu).cumsum(0)])
    mode = ForwardMode.of(prefix_cpu, extend_cpu)

    def i32(x: torch.Tensor) -> torch.Tensor:
        return x.to(device=device, dtype=torch.int32)

    return ForwardBatch(
        mode=mode,
        input_ids=ids.to(device),
        positions=positions.to(device),
        req_pool_idx=i32(rows),
        seq_lens=i32(torch.tensor(seq_cpu)),
        prefix_lens=i32(prefix),
        extend_lens=i32(extend),
        out_cache_loc=i32(out_loc),
        qo_indptr=i32(qo_indptr),
        kv_indptr=i32(kv_indptr),
        kv_indices=i32(kv_indices),
        seq_lens_cpu=seq_cpu,
        extend_lens_cpu=extend_cpu,
        logits_idx=logits_idx.to(device),
    )
