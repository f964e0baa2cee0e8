"""Attention backends: one interface, two implementations (torch here, triton in attn_triton).

A backend is told about a batch once per forward (`init_forward_metadata`), then called per
layer with this step's q/k/v. It writes the new K/V into the pool at fb.out_cache_loc and
attends each new token causally over its request's whole context (fb.kv_indices), or, for a
sliding-window layer, over the keys less than `window` positions behind it: the pool and the
radix tree keep every position's K/V and the window is a mask, so a cached prefix of any
length serves any layer. `softcap` caps the scores (Gemma 2) before the mask and softmax.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from .forward_batch import ForwardBatch, ForwardMode
from .memory import KVPool, cast


class AttentionBackend(Protocol):
    def init_forward_metadata(self, fb: ForwardBatch) -> None: ...

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        layer_id: int,
        fb: ForwardBatch,
        pool: KVPool,
        sm_scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...


class TorchAttnBackend:
    """Pads the batch to [B, max_new, max_ctx] and runs one scaled_dot_product_attention.

    Decode steps read K/V from a dense copy of the batch's contexts (DecodeKV) that is carried
    from step to step while the batch stays the same, instead of gathering every context from
    the pool again in every layer.
    """

    def __init__(self) -> None:
        self.decode_kv = DecodeKV()
        # whether steps of several tokens per request keep the dense copy's run (set where
        # the compiled step, which verifies drafts in the copy, takes them: compiled.py)
        self.verify_in_copy = False

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        device = fb.input_ids.device
        self.out_loc = fb.out_cache_loc.long()
        # Decode: one query per request, so q needs no padding and every row is real.
        self.is_decode = fb.mode is ForwardMode.DECODE
        max_new, max_ctx = max(fb.extend_lens_cpu), max(fb.seq_lens_cpu)
        seq_lens, prefix_lens = fb.seq_lens.long(), fb.prefix_lens.long()
        ctx_col = torch.arange(max_ctx, device=device)
        new_col = torch.arange(max_new, device=device)
        is_ctx = ctx_col[None, :] < seq_lens[:, None]  # [B, max_ctx]
        self.is_new = new_col[None, :] < fb.extend_lens.long()[:, None]  # [B, max_new]
        # kv_indices is the row-major concatenation of each request's context; padding reads
        # slot 0. Flat, so each layer gathers with index_select (far faster than x[idx]).
        kv_slots = torch.zeros(is_ctx.shape, dtype=torch.long, device=device)
        kv_slots[is_ctx] = fb.kv_indices.long()
        q_pos = prefix_lens[:, None] + new_col[None, :]  # [B, max_new]
        mask = (ctx_col[None, None, :] <= q_pos[:, :, None]) & is_ctx[:, None, :]
        # Padding query rows see slot 0 so softmax stays finite; their output is dropped.
        mask[:, :, 0] |= ~self.is_new
        self.q_pos, self.ctx_col, self.full_mask = q_pos, ctx_col, mask  # for windowed layers
        self.window_masks: dict[int | None, torch.Tensor] = {}
        self.shared_len = shared_prefix_len(kv_slots, min(fb.prefix_lens.tolist()))
        if self.shared_len:  # cascade: the shared prefix is read once, not once per request
            self.shared_slots = kv_slots[0, : self.shared_len]
            kv_slots, mask = kv_slots[:, self.shared_len :], mask[:, :, self.shared_len :]
        self.kv_slots = kv_slots.flatten()
        self.ctx_shape = tuple(kv_slots.shape)
        self.mask = mask[:, None]  # [B, 1, max_new, ctx]
        self.additive_mask: torch.Tensor | None = None  # 0 / -inf, built by the first layer
        # Decode over contexts of one length (one request, a fork's branches): no padding,
        # so no mask, and SDPA skips reading one.
        self.unmasked = self.is_decode and min(fb.seq_lens_cpu) == max_ctx
        # A step of several tokens per request (drafts to verify) may go on with the copy
        # where the compiled step takes it (it writes and reads the copy; eager steps do not)
        eligible = (self.is_decode or self.verify_in_copy) and not self.shared_len
        self.dense = self.decode_kv.begin(fb, eligible, kv_slots)

    def forward(self, q, k, v, layer_id, fb, pool, sm_scale, window=None, softcap=None):
        pool.write(layer_id, self.out_loc, k, v)
        if self.is_decode:
            q_pad = q.unsqueeze(1)  # [B, 1, num_heads, head_dim]
        else:
            B, max_new = self.is_new.shape
            q_pad = q.new_zeros((B, max_new, q.shape[1], q.shape[2]))
            q_pad[self.is_new] = q
        # k_ctx, v_ctx: [B, ctx, num_kv_heads, head_dim] (the part after a shared prefix)
        dense = None
        if self.is_decode and self.dense == "append":
            dense = self.decode_kv.append(layer_id, k, v)
        elif self.is_decode and self.dense == "start":
            dense = self.decode_kv.start(layer_id, pool, q.dtype)
        if dense is not None:
            k_ctx, v_ctx = dense
        else:
            kv_shape = (*self.ctx_shape, *pool.k[layer_id].shape[1:])
            k_ctx = pool.k[layer_id].index_select(0, self.kv_slots).view(kv_shape).to(q.dtype)
            v_ctx = pool.v[layer_id].index_select(0, self.kv_slots).view(kv_shape).to(q.dtype)
        if window is not None or softcap is not None:
            o = self.windowed(q_pad, k_ctx, v_ctx, layer_id, pool, sm_scale, window, softcap)
            return o[:, 0] if self.is_decode else o[self.is_new]
        if self.shared_len:
            k_shared = pool.k[layer_id].index_select(0, self.shared_slots).to(q.dtype)
            v_shared = pool.v[layer_id].index_select(0, self.shared_slots).to(q.dtype)
            if not self.is_decode:
                o = cascade_attention(q_pad, k_shared, v_shared, k_ctx, v_ctx, self.mask, sm_scale)
                return o[self.is_new]
            o = cascade_decode(q_pad, k_shared, v_shared, k_ctx, v_ctx, self.bias(q), sm_scale)
            return o[:, 0]
        if self.is_decode:
            return decode_sdpa(q, k_ctx, v_ctx, self.bias(q), sm_scale)
        o = F.scaled_dot_product_attention(
            q_pad.transpose(1, 2),
            k_ctx.transpose(1, 2),
            v_ctx.transpose(1, 2),
            attn_mask=self.bias(q),
            scale=sm_scale,
            enable_gqa=True,
        )  # [B, num_heads, max_new, head_dim]
        return o.transpose(1, 2)[self.is_new]

    def bias(self, q: torch.Tensor) -> torch.Tensor | None:
        """self.mask as an additive 0 / -inf mask in q's dtype, built by the first layer that
        needs it (None where nothing is masked)."""
        if self.additive_mask is None and not self.unmasked:  # once per forward, not per layer
            self.additive_mask = torch.zeros(self.mask.shape, dtype=q.dtype, device=q.device)
            self.additive_mask.masked_fill_(~self.mask, float("-inf"))
        return self.additive_mask

    def windowed(self, q_pad, k_ctx, v_ctx, layer_id, pool, sm_scale, window, softcap):
        """Attention of a sliding-window or soft-capped layer over whole contexts (a shared
        prefix joins each request's rest again). Returns [B, max_new, num_heads, head_dim]."""
        if self.shared_len:
            B = k_ctx.shape[0]
            k_shared = pool.k[layer_id].index_select(0, self.shared_slots).to(q_pad.dtype)
            v_shared = pool.v[layer_id].index_select(0, self.shared_slots).to(q_pad.dtype)
            k_ctx = torch.cat([k_shared.expand(B, *k_shared.shape), k_ctx], dim=1)
            v_ctx = torch.cat([v_shared.expand(B, *v_shared.shape), v_ctx], dim=1)
        if window not in self.window_masks:
            mask = self.full_mask
            if window is not None:  # padding rows keep their one column (slot 0)
                near = self.ctx_col[None, None, :] > self.q_pos[:, :, None] - window
                mask = mask & (near | ~self.is_new[:, :, None])
            self.window_masks[window] = mask[:, :, : k_ctx.shape[1]]
        return masked_attention(q_pad, k_ctx, v_ctx, self.window_masks[window], sm_scale, softcap)


def decode_sdpa(q, k, v, bias, sm_scale: float) -> torch.Tensor:
    """One query per request: q [B, H, D] over k / v [B, ctx, Hkv, D], bias [B, 1, 1, ctx]
    (additive) or None -> [B, H, D]. Each K/V head's H / Hkv query heads go in as that many
    query rows of one SDPA over [B, Hkv, H / Hkv, D]: the same sums, but torch's CPU SDPA
    takes a single bfloat16 query row with `enable_gqa` 3.5-4x slower (SmolLM2's 9 over 3
    heads, 30 layers: 8 requests over 256 positions 1,234 against 342 us a layer, 32 over
    512 9.9 against 2.4 ms, one over 512 342 against 97 us; AMD EPYC; in float32 both
    measure the same). Steps of several tokens a request measure the same either way, and
    keep `enable_gqa`."""
    B, H, D = q.shape
    Hkv = k.shape[2]
    o = F.scaled_dot_product_attention(
        q.reshape(B, Hkv, H // Hkv, D),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=bias,
        scale=sm_scale,
    )  # [B, Hkv, H / Hkv, D]
    return o.reshape(B, H, D)


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    sm_scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """softmax(cap(q k^T * scale) masked) v as HF's eager attention computes it.

    q: [B, new, H, D]; k, v: [B, ctx, Hkv, D]; mask: [B, new, ctx] bool. Returns [B, new, H, D].
    """
    B, new, H, D = q.shape
    Hkv = k.shape[2]
    qg = q.view(B, new, Hkv, H // Hkv, D)
    s = torch.einsum("bnhgd,bchd->bhgnc", qg, k) * sm_scale  # [B, Hkv, G, new, ctx]
    if softcap is not None:
        s = torch.tanh(s / softcap) * softcap
    s = s.masked_fill(~mask[:, None, None], float("-inf"))
    wide = torch.promote_types(q.dtype, torch.float32)
    p = s.to(wide).softmax(-1).to(q.dtype)
    return torch.einsum("bhgnc,bchd->bnhgd", p, v).reshape(B, new, H, D)


class DecodeKV:
    """Every layer's K/V for the running decode batch, dense [B, capacity, num_kv_heads,
    head_dim], carried across steps.

    A decode step whose requests are the previous step's, in the same order, each going on
    from within what the copy holds (one token past the last step's context, or fewer after
    a draft was cut), writes this step's K/V into it (one small write per layer) rather than
    gathering all contexts from the pool; positions past a request's context are masked, and
    written over as it grows. A step that verifies drafts (several tokens per request) goes
    on the same way where the compiled step takes it. Any other step ends the run; the next
    decode step starts a new one with the gather it would do anyway, only HEADROOM positions
    wider. The pool stays the source of truth (written every step as before), and the copy
    holds what the pool holds, so reading it changes no result. A request is its row and the
    row's epoch: a row handed to a new request is another request, even where the new one's
    first step is a decode step (a prompt cached but for its last token) at a position the
    copy holds for the row's former request.
    """

    BUDGET_BYTES = 256 << 20  # larger batches x contexts gather from the pool every step
    HEADROOM = 16  # positions gathered past the longest context; a run regrows when full

    def __init__(self) -> None:
        self.k: list[torch.Tensor] = []  # per layer, [B, capacity, num_kv_heads, head_dim]
        self.v: list[torch.Tensor] = []
        # the run's requests, as (req_pool_idx, row epoch) (None: no run)
        self.rows: list[tuple[int, int]] | None = None
        self.seq_lens: list[int] = []  # its context lengths at the last step
        self.capacity = 0
        self.max_ctx = 0  # this step's longest context
        self.slots = torch.empty(0, dtype=torch.long)  # start: [B * capacity] slots to gather
        self.token_rows = torch.empty(0, dtype=torch.long)  # each new token's request row
        self.flat_pos = torch.empty(0, dtype=torch.long)  # append: this step's write rows

    def begin(self, fb: ForwardBatch, eligible: bool, kv_slots: torch.Tensor) -> str | None:
        """How this step uses the copy: "append" (the run goes on), "start" (a new run) or
        None (no copy). kv_slots: [B, max_ctx] each request's context slots, 0 past its end."""
        rows = list(zip(fb.req_pool_idx.tolist(), fb.row_epochs))
        seq_lens = fb.seq_lens_cpu
        self.max_ctx = max(seq_lens)
        prefix_lens = [s - e for s, e in zip(seq_lens, fb.extend_lens_cpu)]
        continues = (
            eligible
            and rows == self.rows
            and all(0 < p <= held for p, held in zip(prefix_lens, self.seq_lens))
            and self.max_ctx <= self.capacity
        )
        self.rows, self.seq_lens = (rows, seq_lens) if eligible else (None, [])
        if not continues:
            self.k, self.v = [], []
            if not eligible:
                return None
            self.capacity = self.max_ctx + self.HEADROOM
            self.slots = F.pad(kv_slots, (0, self.HEADROOM)).flatten()  # slot 0: zeros
        # Each new token: its request's row, at its position, in the flattened buffer.
        batch = torch.arange(len(rows), device=fb.seq_lens.device)
        self.token_rows = batch  # a decode step: one token each
        if fb.num_tokens != len(rows):  # drafts: several tokens per request
            per_request = fb.extend_lens.long()
            self.token_rows = batch.repeat_interleave(per_request, output_size=fb.num_tokens)
        self.flat_pos = self.token_rows * self.capacity + fb.positions
        return "append" if continues else "start"

    def drop(self) -> None:
        """End the run (a step that began one will not write the copy)."""
        self.rows, self.seq_lens, self.k, self.v = None, [], [], []

    def start(self, layer_id: int, pool: KVPool, dtype: torch.dtype):
        """This layer's dense K/V, gathered from the pool (this step's tokens included); the
        first layer ends the run instead when the buffers would exceed the budget. Returns
        [B, max_ctx, Hkv, D] views, or None without a run."""
        k_pool, v_pool = pool.k[layer_id], pool.v[layer_id]
        if layer_id == 0:
            need = 2 * len(pool.k) * self.slots.numel() * k_pool[0].numel() * k_pool.itemsize
            if need > self.BUDGET_BYTES or k_pool.dtype != dtype:
                self.rows = None
        if self.rows is None:
            return None
        shape = (len(self.rows), self.capacity, *k_pool.shape[1:])
        k = k_pool.index_select(0, self.slots).view(shape)
        v = v_pool.index_select(0, self.slots).view(shape)
        self.k.append(k)
        self.v.append(v)
        return k[:, : self.max_ctx], v[:, : self.max_ctx]

    def start_all(self, pool: KVPool, dtype: torch.dtype) -> bool:
        """For a step that writes its own K/V into the copy (the compiled step): gather every
        layer's contexts now, this step's positions not yet written. False where the run
        ends instead (over the budget, or the pool in another dtype)."""
        for layer_id in range(len(pool.k)):
            if self.start(layer_id, pool, dtype) is None:
                return False
        return True

    def append(self, layer_id: int, k_new: torch.Tensor, v_new: torch.Tensor):
        """Write this step's K/V ([B, Hkv, D], one token per request) at each request's
        position; return the dense contexts [B, max_ctx, Hkv, D]."""
        k, v = self.k[layer_id], self.v[layer_id]
        flat = (-1, *k.shape[2:])
        k.view(flat).index_copy_(0, self.flat_pos, cast(k_new, k.dtype))
        v.view(flat).index_copy_(0, self.flat_pos, cast(v_new, v.dtype))
        return k[:, : self.max_ctx], v[:, : self.max_ctx]


# Cascade pays a second attention pass to read a shared prefix once instead of once per
# request: worth it when that saves at least this many K/V positions ((requests - 1) x
# prefix). One decode step, SmolLM2's heads, on a 2-core AVX2 CPU (bench/attention_bench;
# one SDPA against cascade): 8 requests over a 40-token prefix 85 / 228 us, over 300 tokens
# (2100 saved) 295 / 333 us, over 500 tokens 500 / 388 us; 16 over 200 (3000 saved) 415 /
# 450 us; 32 over 200 (6200 saved) 1491 / 824 us; 32 over 1000 tokens 7399 / 1850 us.
CASCADE_MIN_SAVED_POSITIONS = 3072


def shared_prefix_len(kv_slots: torch.Tensor, limit: int) -> int:
    """Leading context positions holding the same slots in every request ([B, ctx] slots),
    at most `limit` (the shortest cached prefix, so no causal mask applies inside it); 0
    where reading them once would not save CASCADE_MIN_SAVED_POSITIONS."""
    others = kv_slots.shape[0] - 1
    if others < 1 or others * limit < CASCADE_MIN_SAVED_POSITIONS:
        return 0
    head = kv_slots[:, :limit]
    same = (head == head[:1]).all(dim=0)  # [limit]
    n = int(same.int().cumprod(0).sum())
    return n if others * n >= CASCADE_MIN_SAVED_POSITIONS else 0


def cascade_decode(q, k_shared, v_shared, k_rest, v_rest, rest_bias, sm_scale):
    """cascade_attention for one query per request, as batched matrix products (no einsum:
    its permuted copies cost more than the products here): 35-40% faster at 8 requests.

    q: [B, 1, H, D]; k/v_shared: [P, Hkv, D]; k/v_rest: [B, R, Hkv, D]; rest_bias:
    [B, 1, 1, R] additive (0 / -inf) or None. Returns [B, 1, H, D]."""
    B, _, H, D = q.shape
    P, Hkv = k_shared.shape[0], k_shared.shape[1]
    G = H // Hkv
    qh = q.view(B, Hkv, G, D)
    q_by_head = qh.transpose(0, 1).reshape(Hkv, B * G, D)  # every request's queries per KV head
    s_shared = torch.bmm(q_by_head, k_shared.permute(1, 2, 0))  # [Hkv, B * G, P]
    s_shared = s_shared.view(Hkv, B, G, P).transpose(0, 1)  # [B, Hkv, G, P]
    s_rest = torch.matmul(qh, k_rest.permute(0, 2, 3, 1))  # [B, Hkv, G, R]
    if rest_bias is not None:
        s_rest = s_rest + rest_bias
    wide = torch.promote_types(q.dtype, torch.float32)
    p = (torch.cat([s_shared, s_rest], dim=-1).to(wide) * sm_scale).softmax(-1).to(q.dtype)
    p_shared = p[..., :P].transpose(0, 1).reshape(Hkv, B * G, P)
    o = torch.bmm(p_shared, v_shared.transpose(0, 1)).view(Hkv, B, G, D).transpose(0, 1)
    o = o + torch.matmul(p[..., P:], v_rest.transpose(1, 2))  # [B, Hkv, G, D]
    return o.reshape(B, 1, H, D)


def cascade_attention(q, k_shared, v_shared, k_rest, v_rest, rest_mask, sm_scale):
    """Attention over [shared prefix | each request's rest] as one softmax.

    q: [B, new, H, D]; k/v_shared: [P, Hkv, D] (the same for every request, read once);
    k/v_rest: [B, R, Hkv, D]; rest_mask: [B, 1, new, R]. Returns [B, new, H, D].
    """
    B, new, H, D = q.shape
    Hkv = k_shared.shape[1]
    qg = q.view(B, new, Hkv, H // Hkv, D)
    s_shared = torch.einsum("bnhgd,phd->bhgnp", qg, k_shared)  # [B, Hkv, G, new, P]
    s_rest = torch.einsum("bnhgd,brhd->bhgnr", qg, k_rest)  # [B, Hkv, G, new, R]
    s_rest = s_rest.masked_fill(~rest_mask[:, :, None], float("-inf"))
    wide = torch.promote_types(q.dtype, torch.float32)
    p = (torch.cat([s_shared, s_rest], dim=-1).to(wide) * sm_scale).softmax(-1).to(q.dtype)
    P = k_shared.shape[0]
    o = torch.einsum("bhgnp,phd->bnhgd", p[..., :P], v_shared)
    o = o + torch.einsum("bhgnr,brhd->bnhgd", p[..., P:], v_rest)
    return o.reshape(B, new, H, D)


def make_attention_backend(name: str) -> AttentionBackend:
    if name == "torch":
        return TorchAttnBackend()
    if name == "triton":
        from .attn_triton import TritonAttnBackend

        return TritonAttnBackend()
    raise ValueError(f"unknown attention_backend {name!r}; expected 'torch' or 'triton'")
