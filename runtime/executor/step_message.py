"""A step as one flat int64 tensor: what rank 0 sends the other tensor-parallel ranks.

Layout: [op, B, num_tokens, num_kv, num_logits] then input_ids, prefix_lens, extend_lens,
req_pool_idx, row_epochs, out_cache_loc, kv_indices, logits_idx. A receiver rebuilds the
ForwardBatch (positions, seq_lens, indptrs, mode) from these, so every rank runs the same step
(and keeps its decode copy for the same requests). op STOP (and nothing after it) ends a
worker. `unpack_step` checks every size and index against the receiver's StepBounds before it
builds anything: the message came over a socket.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import torch

from .forward_batch import ForwardBatch, ForwardMode

HEADER_LEN = 5


class StepOp(enum.IntEnum):
    FORWARD = 1
    STOP = 2


class StepBounds(NamedTuple):
    """What the receiving rank holds: ids below vocab_size, rows below num_rows, slots below
    num_slots, no sequence longer than max_context."""

    vocab_size: int
    num_rows: int
    num_slots: int
    max_context: int


def pack_step(fb: ForwardBatch) -> bytes:
    parts = [
        fb.input_ids,
        fb.prefix_lens,
        fb.extend_lens,
        fb.req_pool_idx,
        torch.tensor(fb.row_epochs, dtype=torch.int64),
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


def unpack_step(
    data: bytes, device: torch.device | str = "cpu", bounds: StepBounds | None = None
) -> ForwardBatch | None:
    """The ForwardBatch of a FORWARD message; None for STOP. ValueError for a message whose
    sizes or indices do not fit `bounds` (or each other)."""
    if len(data) % 8 or len(data) < 8 * HEADER_LEN:
        raise ValueError(f"a step message has {len(data)} bytes, not 8 x ({HEADER_LEN} + n)")
    flat = torch.frombuffer(bytearray(data), dtype=torch.int64)
    op, b, n, num_kv, num_logits = flat[:HEADER_LEN].tolist()
    if op == StepOp.STOP and flat.numel() == HEADER_LEN:
        return None
    sizes = [n, b, b, b, b, n, num_kv, num_logits]
    if op != StepOp.FORWARD or min(sizes) < 0 or HEADER_LEN + sum(sizes) != flat.numel():
        raise ValueError(
            f"step message header {[op, b, n, num_kv, num_logits]} does not match its "
            f"{flat.numel()} values"
        )
    parts = flat[HEADER_LEN:].split(sizes)
    ids, prefix, extend, rows, epochs, out_loc, kv_indices, logits_idx = parts
    prefix_cpu, extend_cpu = prefix.tolist(), extend.tolist()
    seq_cpu = [p + e for p, e in zip(prefix_cpu, extend_cpu)]
    _check_step(bounds, ids, rows, out_loc, kv_indices, logits_idx, prefix_cpu, extend_cpu)
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
        row_epochs=epochs.tolist(),
    )


def _check_step(
    bounds: StepBounds | None,
    ids: torch.Tensor,
    rows: torch.Tensor,
    out_loc: torch.Tensor,
    kv_indices: torch.Tensor,
    logits_idx: torch.Tensor,
    prefix: list[int],
    extend: list[int],
) -> None:
    """ValueError naming the first field of a FORWARD message out of its range."""
    if not extend or min(prefix) < 0 or min(extend) < 1:
        raise ValueError(f"step message: prefix_lens {prefix[:8]} / extend_lens {extend[:8]}")
    if sum(extend) != ids.numel() or sum(prefix) + sum(extend) != kv_indices.numel():
        raise ValueError(
            f"step message: {ids.numel()} tokens and {kv_indices.numel()} kv indices for "
            f"extend_lens summing to {sum(extend)} over prefixes summing to {sum(prefix)}"
        )
    limits = {"logits_idx": (logits_idx, ids.numel())}
    if bounds is not None:
        limits |= {
            "input_ids": (ids, bounds.vocab_size),
            "req_pool_idx": (rows, bounds.num_rows),
            "out_cache_loc": (out_loc, bounds.num_slots),
            "kv_indices": (kv_indices, bounds.num_slots),
        }
        longest = max(p + e for p, e in zip(prefix, extend))
        if longest > bounds.max_context:
            raise ValueError(f"step message: a {longest}-token sequence over {bounds.max_context}")
    for name, (values, limit) in limits.items():
        if values.numel() and not (0 <= int(values.min()) and int(values.max()) < limit):
            raise ValueError(
                f"step message: {name} spans [{int(values.min())}, {int(values.max())}], "
                f"outside [0, {limit})"
            )
