"""Paged extend (prefill) attention: each request's new tokens attend causally to its context.

The whole context, cached prefix AND this step's tokens, is read through kv_indices: the
backend writes the new K/V into the pool before calling, so request b's context is
kv_indices[kv_indptr[b]:kv_indptr[b+1]], its new tokens are its last extend_len positions
(q rows qo_indptr[b]:qo_indptr[b+1]), and new token i sits at position prefix_len + i.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import check_device, check_dtype, check_out, check_paged_kv, dot_config, mma

LOG2E = tl.constexpr(1.4426950408889634)  # a jit function reads only constexpr globals


@triton.jit
def _extend_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_ptr,
    o_ptr,  # [num_tokens, num_heads, head_dim]
    qo_indptr_ptr,  # [batch + 1]
    kv_indptr_ptr,  # [batch + 1]
    kv_indices_ptr,  # [sum(seq_lens)]
    sm_scale,
    logit_cap,
    stride_q_t,
    stride_q_h,
    stride_k_slot,
    stride_k_h,
    stride_v_slot,
    stride_v_h,
    stride_o_t,
    stride_o_h,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_CAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    m_block = tl.program_id(2)
    kv_head = h // GROUP

    q_start = tl.load(qo_indptr_ptr + b).to(tl.int64)
    extend_len = (tl.load(qo_indptr_ptr + b + 1) - q_start).to(tl.int32)
    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    seq_len = (tl.load(kv_indptr_ptr + b + 1) - kv_start).to(tl.int32)
    prefix_len = seq_len - extend_len

    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < extend_len
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM
    q_pos = prefix_len + offs_m  # [BLOCK_M] absolute positions of these queries
    q = tl.load(
        q_ptr + (q_start + offs_m)[:, None] * stride_q_t + h * stride_q_h + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]

    # Causality bounds the context this query block needs; a block past extend_len needs none.
    last_q = tl.minimum(m_block * BLOCK_M + BLOCK_M, extend_len)
    hi = tl.where(m_block * BLOCK_M < extend_len, prefix_len + last_q, 0)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start in range(0, hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < hi
        slot = tl.load(kv_indices_ptr + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
        k = tl.load(
            k_ptr + slot[:, None] * stride_k_slot + kv_head * stride_k_h + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_D]
        qk = mma(q, tl.trans(k.to(q.dtype)), DOT_PRECISION, UPCAST) * sm_scale
        if HAS_CAP:
            qk = logit_cap * (2.0 * tl.sigmoid(2.0 * qk / logit_cap) - 1.0)  # cap * tanh(qk/cap)
        is_visible = (offs_n[None, :] <= q_pos[:, None]) & mask_n[None, :]
        qk = tl.where(is_visible, qk * LOG2E, float("-inf"))  # [BLOCK_M, BLOCK_N]

        # Position 0 is visible to every row in the first block, so m_new stays finite.
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(qk - m_new[:, None])
        v = tl.load(
            v_ptr + slot[:, None] * stride_v_slot + kv_head * stride_v_h + offs_d[None, :],
            mask=mask_n[:, None] & mask_d[None, :],
            other=0.0,
        )
        acc = acc * alpha[:, None] + mma(p.to(q.dtype), v.to(q.dtype), DOT_PRECISION, UPCAST)
        l_i = l_i * alpha + tl.sum(p, 1)
        m_i = m_new

    o = acc / tl.maximum(l_i, 1.0)[:, None]  # l_i >= 1 on every stored row
    tl.store(
        o_ptr + (q_start + offs_m)[:, None] * stride_o_t + h * stride_o_h + offs_d[None, :],
        o.to(o_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def extend_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim], new K already written
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim], new V already written
    qo_indptr: torch.Tensor,  # [batch + 1]
    kv_indptr: torch.Tensor,  # [batch + 1]
    kv_indices: torch.Tensor,  # [sum(seq_lens)]
    sm_scale: float,
    logit_cap: float = 0.0,
    *,
    out: torch.Tensor | None = None,
    max_extend_len: int | None = None,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim], q's dtype
    """Causal attention of every new token over its request's paged context.

    Needs 1 <= extend_len <= seq_len per request. max_extend_len is a host-side bound that
    sizes the grid (read from qo_indptr, a device sync, if not given).
    """
    group = check_paged_kv(q, k_buffer, v_buffer, kv_indptr, kv_indices)
    num_tokens, num_heads, head_dim = q.shape
    check_dtype("qo_indptr", qo_indptr, (torch.int32, torch.int64))
    batch_size = qo_indptr.numel() - 1
    if qo_indptr.dim() != 1 or batch_size < 0 or kv_indptr.numel() != batch_size + 1:
        raise ValueError(
            f"qo_indptr {tuple(qo_indptr.shape)} and kv_indptr {tuple(kv_indptr.shape)} "
            "must both be [batch + 1]"
        )
    if logit_cap < 0 or not math.isfinite(logit_cap):
        raise ValueError(f"logit_cap must be a finite value >= 0, got {logit_cap}")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block < 16 or block & (block - 1):
            raise ValueError(f"{name} must be a power of two >= 16, got {block}")
    check_device(
        _extend_kernel,
        {"q": q, "k_buffer": k_buffer, "v_buffer": v_buffer, "qo_indptr": qo_indptr,
         "kv_indptr": kv_indptr, "kv_indices": kv_indices},
    )  # fmt: skip
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    check_out(out, (num_tokens, num_heads, head_dim), q)
    if batch_size == 0 or num_tokens == 0:
        return out
    if max_extend_len is None:
        max_extend_len = int((qo_indptr[1:] - qo_indptr[:-1]).max())

    precision, upcast = dot_config(_extend_kernel, q.dtype)
    grid = (batch_size, num_heads, triton.cdiv(max_extend_len, block_m))
    _extend_kernel[grid](
        q, k_buffer, v_buffer, out, qo_indptr, kv_indptr, kv_indices,
        sm_scale, logit_cap,
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        out.stride(0), out.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=triton.next_power_of_2(head_dim),
        HAS_CAP=logit_cap > 0,
        DOT_PRECISION=precision,
        UPCAST=upcast,
        num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    return out


def extend_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
) -> torch.Tensor:
    """The specification: per request, gather its context and run causal attention in fp32."""
    group = q.shape[1] // k_buffer.shape[1]
    out = torch.empty_like(q)
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        slots = kv_indices[kv[b] : kv[b + 1]].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [seq_len, num_heads, d]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        qb = q[qo[b] : qo[b + 1]].float()  # [extend_len, num_heads, d]
        logits = torch.einsum("thd,nhd->htn", qb, k) * sm_scale
        if logit_cap > 0:
            logits = logit_cap * torch.tanh(logits / logit_cap)
        seq_len, extend_len = slots.numel(), qb.shape[0]
        q_pos = torch.arange(seq_len - extend_len, seq_len, device=q.device)[:, None]
        k_pos = torch.arange(seq_len, device=q.device)[None, :]
        logits = logits.masked_fill(k_pos > q_pos, float("-inf"))
        o = torch.einsum("htn,nhd->thd", logits.softmax(-1), v)
        out[qo[b] : qo[b + 1]] = o.to(q.dtype)
    return out
