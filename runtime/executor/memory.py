"""KV memory: the per-layer K/V pools, the request-to-token table and the slot allocator.

A slot is one token's place in every layer's K and V pool. Slot 0 is padding and never
handed out. With page_size > 1 slots are handed out in whole, aligned pages
(page p owns slots p*page_size .. p*page_size+page_size-1; page 0 holds the padding slot
and is never used), so a request's slots form whole pages and tree edges can be page-aligned.
"""

from __future__ import annotations

import torch


def cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`t` in `dtype`, without a call where it already is: the K/V writes run twice per layer
    each decode step, and even a conversion to the same type costs a dispatch."""
    return t if t.dtype == dtype else t.to(dtype)


class KVPool:
    """k[layer], v[layer]: [num_slots, num_kv_heads, head_dim]."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ):
        self.num_slots = num_slots
        shape = (num_slots, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    def write(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # loc: [num_tokens] (int64 avoids a copy); k, v: [num_tokens, num_kv_heads, head_dim]
        loc = cast(loc, torch.int64)
        k_pool, v_pool = self.k[layer_id], self.v[layer_id]
        k_pool.index_copy_(0, loc, cast(k, k_pool.dtype))
        v_pool.index_copy_(0, loc, cast(v, v_pool.dtype))

    @staticmethod
    def bytes_per_slot(
        num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8


class ReqToTokenPool:
    """req_to_token[row, position] -> slot, one row per running request."""

    def __init__(self, max_running: int, max_context: int, device: torch.device | str = "cpu"):
        self.req_to_token = torch.zeros(
            (max_running, max_context), dtype=torch.int32, device=device
        )
        self.max_context = max_context
        self._free_rows = list(range(max_running))
        # How many requests each row has been handed to: state kept per row across steps (the
        # decode copy, attention.DecodeKV) belongs to (row, epoch), never to a later holder.
        self.epochs = [0] * max_running

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self.epochs[row] += 1
        return row

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: list[int] | torch.Tensor) -> None:
        t = torch.as_tensor(slots, dtype=torch.int32)
        self.req_to_token[row, start : start + t.numel()] = t.to(self.req_to_token.device)

    def read(self, row: int, end: int, start: int = 0) -> list[int]:
        return self.req_to_token[row, start:end].tolist()


class SlotAllocator:
    """A free list of slots, handed out in whole pages. Pure bookkeeping, no tensors."""

    def __init__(self, num_slots: int, page_size: int = 1):
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if num_slots < 2 * page_size:
            raise ValueError(f"num_slots={num_slots} leaves no usable page of size {page_size}")
        self.page_size = page_size
        # Usable capacity excludes the padding slot (and the rest of page 0 when paged).
        self.num_pages = num_slots // page_size
        self.capacity = (self.num_pages - 1) * page_size if page_size > 1 else num_slots - 1
        self.reset()

    def reset(self) -> None:
        ps = self.page_size
        first = 1
        # Lowest slots first: popping from the end of a reversed list keeps ids ascending.
        self._free_pages = list(range(self.num_pages - 1, first - 1, -1))
        if ps == 1:
            self._free_pages = list(range(self.capacity, 0, -1))

    @property
    def num_free(self) -> int:
        return len(self._free_pages) * self.page_size

    def alloc(self, num_tokens: int) -> list[int] | None:
        """Slots for num_tokens tokens, rounded up to whole pages; None if not enough."""
        num_pages = -(-num_tokens // self.page_size)
        if num_pages > len(self._free_pages):
            return None
        pages = [self._free_pages.pop() for _ in range(num_pages)]
        ps = self.page_size
        return [p * ps + j for p in pages for j in range(ps)]

    def free(self, slots: list[int]) -> None:
        """Return slots; with pages, only whole pages (their first slot stands for the page)."""
        ps = self.page_size
        if ps == 1:
            self._free_pages.extend(slots)
            return
        if len(slots) % ps:
            raise ValueError(f"freeing {len(slots)} slots, not a multiple of page_size={ps}")
        self._free_pages.extend(slots[i] // ps for i in range(0, len(slots), ps))
