"""Paged decode attention: one query token per request against its whole cached context.

Request b's context is the slots kv_indices[kv_indptr[b]:kv_indptr[b+1]] of the per-layer
pools k_buffer/v_buffer [num_slots, num_kv_heads, head_dim]. Flash-decoding: the context is
cut into num_kv_splits pieces, each program computes a partial softmax (output + log-sum-exp)
for all query heads of one KV head (GQA: each K/V row is read once), then a reduce merges them.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ._common import check_device, check_out, check_paged_kv, dot_config, mma

LOG2E = tl.constexpr(1.4426950408889634)  # a jit function reads only constexpr globals
MAX_KV_SPLITS = 64


@triton.jit
def _decode_split_kernel(
    q_ptr,  # [batch, num_heads, head_dim]
    k_ptr,  # [num_slots, num_kv_heads, head_dim]
    v_ptr,
    kv_indptr_ptr,  # [batch + 1]
    kv_indices_ptr,  # [sum(seq_lens)]
    mid_o_ptr,  # [batch, num_heads, num_kv_splits, head_dim] fp32, normalized per split
    mid_lse_ptr,  # [batch, num_heads, num_kv_splits] fp32, log2-sum-exp2 of the split
    sm_scale,
    logit_cap,
    num_kv_splits,
    stride_q_b,
    stride_q_h,
    stride_k_slot,
    stride_k_h,
    stride_v_slot,
    stride_v_h,
    stride_mid_o_b,
    stride_mid_o_h,
    stride_mid_o_s,
    stride_mid_lse_b,
    stride_mid_lse_h,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_CAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    offs_g = tl.arange(0, BLOCK_H)
    mask_h = offs_g < GROUP
    offs_h = kv_head * GROUP + offs_g  # the query heads that share this KV head
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    kv_start = tl.load(kv_indptr_ptr + b).to(tl.int64)
    seq_len = (tl.load(kv_indptr_ptr + b + 1) - kv_start).to(tl.int32)
    # Whole blocks per split keep every split but the last free of partial tiles.
    split_len = tl.cdiv(tl.cdiv(seq_len, num_kv_splits), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_len)

    q = tl.load(
        q_ptr + b.to(tl.int64) * stride_q_b + offs_h[:, None] * stride_q_h + offs_d[None, :],
        mask=mask_h[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_H, BLOCK_D]

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_N):
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
        qk = tl.where(mask_n[None, :], qk * LOG2E, float("-inf"))  # [BLOCK_H, BLOCK_N]

        # Column `start` is always valid, so m_new is finite and alpha never NaN.
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

    # A non-empty split has l_i >= 1 (its max term is exp2(0)); an empty one stores lse=-inf.
    l_safe = tl.maximum(l_i, 1.0)
    mid_o = acc / l_safe[:, None]
    lse = m_i + tl.log2(l_safe)
    b64 = b.to(tl.int64)
    tl.store(
        mid_o_ptr
        + b64 * stride_mid_o_b
        + offs_h[:, None] * stride_mid_o_h
        + split * stride_mid_o_s
        + offs_d[None, :],
        mid_o,
        mask=mask_h[:, None] & mask_d[None, :],
    )
    tl.store(
        mid_lse_ptr + b64 * stride_mid_lse_b + offs_h * stride_mid_lse_h + split, lse, mask=mask_h
    )


@triton.jit
def _decode_reduce_kernel(
    mid_o_ptr,  # [batch, num_heads, num_kv_splits, head_dim] fp32
    mid_lse_ptr,  # [batch, num_heads, num_kv_splits] fp32
    o_ptr,  # [batch, num_heads, head_dim]
    num_kv_splits,
    stride_mid_o_b,
    stride_mid_o_h,
    stride_mid_o_s,
    stride_mid_lse_b,
    stride_mid_lse_h,
    stride_o_b,
    stride_o_h,
    HEAD_DIM: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < num_kv_splits
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < HEAD_DIM

    lse = tl.load(
        mid_lse_ptr + b * stride_mid_lse_b + h * stride_mid_lse_h + offs_s,
        mask=mask_s,
        other=float("-inf"),
    )  # [BLOCK_S]
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # empty context: all weights 0, output 0
    w = tl.exp2(lse - m)
    mid_o = tl.load(
        mid_o_ptr
        + b * stride_mid_o_b
        + h * stride_mid_o_h
        + offs_s[:, None] * stride_mid_o_s
        + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_S, BLOCK_D]
    o = tl.sum(w[:, None] * mid_o, 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    tl.store(
        o_ptr + b * stride_o_b + h * stride_o_h + offs_d, o.to(o_ptr.dtype.element_ty), mask=mask_d
    )


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: few programs run fastest


def pick_num_kv_splits(
    batch_size: int, num_kv_heads: int, max_seq_len: int, block_n: int, device: torch.device
) -> int:
    """Enough (batch, kv_head, split) programs to fill the GPU ~4 times over, each split at
    least one block long. A power of two where possible, so that the reduce kernel (which is
    specialized on the next power of two) recompiles only a handful of times."""
    target = 4 * _num_sms(device)
    splits = triton.next_power_of_2(max(1, -(-target // max(1, batch_size * num_kv_heads))))
    return max(1, min(splits, MAX_KV_SPLITS, -(-max_seq_len // block_n)))


def decode_attention(
    q: torch.Tensor,  # [batch, num_heads, head_dim]
    k_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    kv_indptr: torch.Tensor,  # [batch + 1]
    kv_indices: torch.Tensor,  # [sum(seq_lens)]
    sm_scale: float,
    logit_cap: float = 0.0,
    *,
    out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
    num_kv_splits: int | None = None,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:  # [batch, num_heads, head_dim], q's dtype
    """Attention of each request's single query token over its paged context.

    logit_cap > 0 soft-caps the scaled logits to cap * tanh(logit / cap). max_seq_len is a
    host-side bound used to size the split count (read from kv_indptr, a device sync, if not
    given). Every context must hold at least one token; an empty one yields zeros.
    """
    group = check_paged_kv(q, k_buffer, v_buffer, kv_indptr, kv_indices)
    batch_size, num_heads, head_dim = q.shape
    num_kv_heads = k_buffer.shape[1]
    if kv_indptr.numel() != batch_size + 1:
        raise ValueError(f"kv_indptr has {kv_indptr.numel()} entries; expected {batch_size + 1}")
    if logit_cap < 0 or not math.isfinite(logit_cap):
        raise ValueError(f"logit_cap must be a finite value >= 0, got {logit_cap}")
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    check_device(
        _decode_split_kernel,
        {"q": q, "k_buffer": k_buffer, "v_buffer": v_buffer, "kv_indptr": kv_indptr,
         "kv_indices": kv_indices},
    )  # fmt: skip
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    check_out(out, (batch_size, num_heads, head_dim), q)
    if batch_size == 0:
        return out
    if num_kv_splits is None:
        if max_seq_len is None:
            max_seq_len = int((kv_indptr[1:] - kv_indptr[:-1]).max())
        num_kv_splits = pick_num_kv_splits(batch_size, num_kv_heads, max_seq_len, block_n, q.device)
    if not 1 <= num_kv_splits <= MAX_KV_SPLITS:
        raise ValueError(f"num_kv_splits must be in [1, {MAX_KV_SPLITS}], got {num_kv_splits}")

    mid_o = torch.empty(
        (batch_size, num_heads, num_kv_splits, head_dim), dtype=torch.float32, device=q.device
    )
    mid_lse = torch.empty(
        (batch_size, num_heads, num_kv_splits), dtype=torch.float32, device=q.device
    )
    block_d = triton.next_power_of_2(head_dim)
    precision, upcast = dot_config(_decode_split_kernel, q.dtype)
    _decode_split_kernel[(batch_size, num_kv_heads, num_kv_splits)](
        q, k_buffer, v_buffer, kv_indptr, kv_indices, mid_o, mid_lse,
        sm_scale, logit_cap, num_kv_splits,
        q.stride(0), q.stride(1),
        k_buffer.stride(0), k_buffer.stride(1),
        v_buffer.stride(0), v_buffer.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        HAS_CAP=logit_cap > 0,
        DOT_PRECISION=precision,
        UPCAST=upcast,
        num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    _decode_reduce_kernel[(batch_size, num_heads)](
        mid_o, mid_lse, out, num_kv_splits,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_S=triton.next_power_of_2(num_kv_splits),
        BLOCK_D=block_d,
        num_warps=4,
    )  # fmt: skip
    return out


def decode_attention_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
) -> torch.Tensor:
    """The specification: per request, gather its context and run softmax attention in fp32."""
    num_heads = q.shape[1]
    group = num_heads // k_buffer.shape[1]
    out = torch.empty_like(q)
    indptr = kv_indptr.tolist()
    for b in range(q.shape[0]):
        slots = kv_indices[indptr[b] : indptr[b + 1]].long()
        k = k_buffer[slots].float().repeat_interleave(group, dim=1)  # [seq_len, num_heads, d]
        v = v_buffer[slots].float().repeat_interleave(group, dim=1)
        logits = torch.einsum("hd,nhd->hn", q[b].float(), k) * sm_scale  # [num_heads, seq_len]
        if logit_cap > 0:
            logits = logit_cap * torch.tanh(logits / logit_cap)
        out[b] = torch.einsum("hn,nhd->hd", logits.softmax(-1), v).to(q.dtype)
    return out
