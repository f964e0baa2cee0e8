"""What the compiled step traces (compiled.py): `decode_graph`, one step's hidden states over
the decode batch's dense K/V copy, from the embedding to the final norm, the K/V writes
included. Each new token attends over its request's row of the copy, masked past its own
position, so one graph serves a decode step and a step that verifies drafts; its shapes
change only with the tokens, the requests and the copy's capacity. `unguarded_model` is the
guard filter that keeps Dynamo from checking the model's thousands of attributes a step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from .attention import masked_attention

if TYPE_CHECKING:
    from ..models.decoder import Attention, DecoderForCausalLM


class DenseAttention:
    """attend() inside the compiled graph: writes this step's K/V into the pool and into the
    dense copy, then attends each token over its request's row of the copy, masked past the
    token's own position (so the drafts a step verifies see those before them)."""

    def __init__(self, pool_k, pool_v, dense_k, dense_v, rows, out_loc, flat_pos, positions):
        self.pool_k, self.pool_v, self.dense_k, self.dense_v = pool_k, pool_v, dense_k, dense_v
        self.rows, self.out_loc, self.flat_pos = rows, out_loc, flat_pos
        col = torch.arange(dense_k[0].shape[1], device=positions.device)
        self.last = positions[:, None]  # each token's query position, [N, 1]
        self.col = col[None, :]
        self.visible = self.col <= self.last  # [N, capacity]

    def __call__(self, q, k, v, a: Attention) -> torch.Tensor:
        i = a.layer_id
        self.pool_k[i].index_copy_(0, self.out_loc, k)
        self.pool_v[i].index_copy_(0, self.out_loc, v)
        kd, vd = self.dense_k[i], self.dense_v[i]  # [B, capacity, Hkv, D]
        kd.view(-1, *kd.shape[2:]).index_copy_(0, self.flat_pos, k)
        vd.view(-1, *vd.shape[2:]).index_copy_(0, self.flat_pos, v)
        plain = a.window is None and a.softcap is None
        if plain and kd.shape[0] == 1 and q.shape[0] > 1:  # one request's drafts
            return draft_attention(q, kd, vd, self.visible, a.sm_scale)
        # each token's request row, [N, capacity, Hkv, D] (Inductor reads it in place)
        kd, vd = kd.index_select(0, self.rows), vd.index_select(0, self.rows)
        if a.window is not None or a.softcap is not None:  # as the eager backend's windowed()
            mask = self.visible
            if a.window is not None:
                mask = mask & (self.col > self.last - a.window)
            o = masked_attention(q[:, None], kd, vd, mask[:, None], a.sm_scale, a.softcap)
            return o[:, 0]
        return decode_attention(q, kd, vd, self.visible, a.sm_scale)


def decode_attention(q, k, v, visible, sm_scale: float) -> torch.Tensor:
    """One query per request over its dense K/V, as sums rather than matmuls: q [B, H, D],
    k / v [B, capacity, Hkv, D], visible [B, capacity] -> [B, H, D]. Inductor fuses each
    sum into one loop over the copy (a matmul or SDPA would be a library call per layer,
    whose dispatch outweighs a single query's work), in float32 at least, as SDPA computes."""
    B, H, D = q.shape
    Hkv, wide = k.shape[2], torch.promote_types(q.dtype, torch.float32)
    qg = q.view(B, 1, Hkv, H // Hkv, D).to(wide)
    s = (qg * k[:, :, :, None].to(wide)).sum(-1) * sm_scale  # [B, capacity, Hkv, G]
    s = s.masked_fill(~visible[:, :, None, None], float("-inf"))
    p = s.softmax(1)
    o = (p[..., None] * v[:, :, :, None].to(wide)).sum(1)  # [B, Hkv, G, D]
    return o.reshape(B, H, D).to(q.dtype)


def draft_attention(q, k, v, visible, sm_scale: float) -> torch.Tensor:
    """One request's N tokens (its drafts) over its dense K/V: q [N, H, D], k / v [1,
    capacity, Hkv, D], visible [N, capacity] -> [N, H, D]. Two batched matmuls over the K/V
    heads, which read the request's row once for all its tokens (the sums above read it once
    a token: at 8 tokens over 640 positions, 3x the time), in float32 at least."""
    N, H, D = q.shape
    Hkv, wide = k.shape[2], torch.promote_types(q.dtype, torch.float32)
    G = H // Hkv
    qg = q.to(wide).view(N, Hkv, G, D).transpose(0, 1).reshape(Hkv, N * G, D)
    s = torch.bmm(qg, k[0].to(wide).permute(1, 2, 0)) * sm_scale  # [Hkv, N * G, capacity]
    s = s.view(Hkv, N, G, -1).masked_fill(~visible[None, :, None, :], float("-inf"))
    p = s.softmax(-1).view(Hkv, N * G, -1)
    o = torch.bmm(p, v[0].to(wide).transpose(0, 1))  # [Hkv, N * G, D]
    return o.view(Hkv, N, G, D).transpose(0, 1).reshape(N, H, D).to(q.dtype)


def decode_graph(
    model: DecoderForCausalLM,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor,
    out_loc: torch.Tensor,
    flat_pos: torch.Tensor,
    pool_k: list[torch.Tensor],
    pool_v: list[torch.Tensor],
    dense_k: list[torch.Tensor],
    dense_v: list[torch.Tensor],
) -> torch.Tensor:
    """One step's final hidden states, [N, hidden], for N new tokens (one per request in a
    decode step, more where drafts are verified) over B requests' dense copies: what the
    compiled function traces. rows [N]: each token's request (its row of the copy). The
    vocabulary projection stays out of it (one call, whose form may not lower)."""
    attend = DenseAttention(pool_k, pool_v, dense_k, dense_v, rows, out_loc, flat_pos, positions)
    return model.hidden(input_ids, positions, None, attend)


def unguarded_model(guards: list) -> list[bool]:
    """Dynamo's guard filter: which guards a call checks. The model's (its modules, forms,
    weights and constants: some 5,000 on SmolLM2, 1.7 ms a step) are dropped, because the
    model never changes once the weight plan is applied, before the warm-up; the inputs'
    stay, and they choose the graph for a row count."""
    return [not g.name.startswith("model") for g in guards]
