"""decode_attention against decode_attention_ref (interpreter on CPU, compiled on CUDA): ragged
contexts of length 1, 7, 64, 300 (not multiples of the block), GQA groups 1 and 3, paged
layouts."""

from __future__ import annotations

import pytest
import torch
from stemma.kernels.decode_attn import (
    decode_attention,
    decode_attention_ref,
    pick_num_kv_splits,
)

NUM_KV_HEADS = 2

# (seq_lens, group, head_dim, page_size, dtype): a representative slice of the cross product.
CASES = [
    ([1], 1, 64, 1, torch.float32),
    ([300], 3, 128, 16, torch.bfloat16),
    ([7], 3, 64, 16, torch.float16),
    ([1, 7, 64, 300, 33], 3, 64, 16, torch.float32),
    ([7, 64, 1, 300, 65], 1, 128, 1, torch.float16),
    ([64, 300, 7, 1, 129], 3, 128, 16, torch.bfloat16),
    ([300, 1, 7, 64, 2], 1, 64, 1, torch.bfloat16),
    ([5, 70, 1], 3, 80, 16, torch.float32),  # head_dim that is not a power of two
]


def run_case(seq_lens, group, head_dim, page_size, dtype, gen, paged_kv, device, **kwargs):
    kv = paged_kv(seq_lens, NUM_KV_HEADS, head_dim, page_size, dtype, gen)
    q = torch.randn(len(seq_lens), NUM_KV_HEADS * group, head_dim, generator=gen).to(device, dtype)
    out = torch.full_like(q, float("nan"))
    args = (q, kv.k_buffer, kv.v_buffer, kv.kv_indptr, kv.kv_indices, head_dim**-0.5)
    got = decode_attention(*args, out=out, **kwargs)
    want = decode_attention_ref(*args, logit_cap=kwargs.get("logit_cap", 0.0))
    return got, want, out


@pytest.mark.parametrize(("seq_lens", "group", "head_dim", "page_size", "dtype"), CASES)
def test_matches_ref(
    seq_lens, group, head_dim, page_size, dtype, gen, paged_kv, device, tolerances
):
    got, want, out = run_case(seq_lens, group, head_dim, page_size, dtype, gen, paged_kv, device)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(got.float(), want.float(), **tolerances[dtype])


@pytest.mark.parametrize("num_kv_splits", [1, 3, 8, 64])
def test_any_split_count_gives_the_same_result(num_kv_splits, gen, paged_kv, device, tolerances):
    # 64 splits leave most of them empty for every request here; they must not contribute.
    got, want, _ = run_case(
        [1, 300, 64, 7], 3, 64, 16, torch.float32, gen, paged_kv, device,
        num_kv_splits=num_kv_splits,
    )  # fmt: skip
    torch.testing.assert_close(got, want, **tolerances[torch.float32])


def test_logit_cap(gen, paged_kv, device, tolerances):
    got, want, _ = run_case(
        [7, 300], 3, 64, 1, torch.float32, gen, paged_kv, device, logit_cap=1.5, block_n=32
    )
    torch.testing.assert_close(got, want, **tolerances[torch.float32])


def test_reads_strided_q(gen, paged_kv, device, tolerances):
    # q as the engine produces it: a view into a fused qkv projection, not contiguous.
    kv = paged_kv([7, 64], NUM_KV_HEADS, 64, 16, torch.float32, gen)
    qkv = torch.randn(2, 3 * NUM_KV_HEADS * 3, 64, generator=gen).to(device)
    q = qkv[:, : NUM_KV_HEADS * 3]
    args = (q, kv.k_buffer, kv.v_buffer, kv.kv_indptr, kv.kv_indices, 0.125)
    torch.testing.assert_close(
        decode_attention(*args), decode_attention_ref(*args), **tolerances[torch.float32]
    )


def test_split_count_fills_the_device_but_never_exceeds_the_blocks():
    cpu = torch.device("cpu")
    assert pick_num_kv_splits(1, 2, 300, 64, cpu) == 5  # bounded by ceil(300 / 64) blocks
    assert pick_num_kv_splits(1, 2, 1, 64, cpu) == 1
    assert pick_num_kv_splits(32, 8, 4096, 64, cpu) == 1  # 256 programs already fill it


def test_rejects_bad_inputs(gen, paged_kv, device):
    kv = paged_kv([7, 3], NUM_KV_HEADS, 64, 1, torch.float32, gen)
    q = torch.randn(2, 3, 64, generator=gen).to(device)  # 3 heads over 2 KV heads
    with pytest.raises(ValueError, match="num_kv_heads"):
        decode_attention(q, kv.k_buffer, kv.v_buffer, kv.kv_indptr, kv.kv_indices, 0.1)
    q = torch.randn(2, 4, 64, generator=gen).to(device)
    with pytest.raises(ValueError, match="kv_indptr"):
        decode_attention(q, kv.k_buffer, kv.v_buffer, kv.kv_indptr[:2], kv.kv_indices, 0.1)
    with pytest.raises(ValueError, match="kv_indices has dtype"):
        decode_attention(q, kv.k_buffer, kv.v_buffer, kv.kv_indptr, kv.kv_indices.float(), 0.1)
    with pytest.raises(ValueError, match="out is"):
        decode_attention(
            q, kv.k_buffer, kv.v_buffer, kv.kv_indptr, kv.kv_indices, 0.1, out=q.half()
        )
    with pytest.raises(ValueError, match="head_dim"):
        decode_attention(q[..., :32], kv.k_buffer, kv.v_buffer, kv.kv_indptr, kv.kv_indices, 0.1)
