"""extend_attention against extend_attention_ref (interpreter on CPU, compiled on CUDA): plain
prefill (prefix 0), cached prefixes, ragged batches mixing long extends with length-1 ones."""

from __future__ import annotations

import pytest
import torch
from stemma.kernels.extend_attn import extend_attention, extend_attention_ref

NUM_KV_HEADS = 2

# (prefix_lens, extend_lens, group, head_dim, page_size, dtype)
CASES = [
    ([0], [7], 1, 64, 1, torch.float32),
    ([0], [300], 3, 128, 16, torch.bfloat16),
    ([64], [1], 3, 64, 16, torch.float16),
    ([0, 7, 64, 1, 200], [7, 1, 64, 1, 100], 3, 64, 16, torch.float32),
    ([64, 0, 236, 7, 0], [1, 64, 64, 7, 1], 1, 128, 1, torch.float16),
    ([1, 0, 6, 57, 0], [6, 300, 1, 7, 64], 3, 128, 16, torch.bfloat16),
    ([5, 0], [70, 33], 3, 80, 1, torch.float32),  # head_dim that is not a power of two
]


def make_inputs(prefix_lens, extend_lens, group, head_dim, page_size, dtype, gen, paged_kv, device):
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    kv = paged_kv(seq_lens, NUM_KV_HEADS, head_dim, page_size, dtype, gen)
    num_tokens = sum(extend_lens)
    q = torch.randn(num_tokens, NUM_KV_HEADS * group, head_dim, generator=gen).to(device, dtype)
    cumsum = torch.tensor(extend_lens).cumsum(0).tolist()
    qo_indptr = torch.tensor([0, *cumsum], dtype=torch.int32, device=device)
    return q, kv.k_buffer, kv.v_buffer, qo_indptr, kv.kv_indptr, kv.kv_indices, head_dim**-0.5


@pytest.mark.parametrize(
    ("prefix_lens", "extend_lens", "group", "head_dim", "page_size", "dtype"), CASES
)
def test_matches_ref(
    prefix_lens, extend_lens, group, head_dim, page_size, dtype, gen, paged_kv, device, tolerances
):
    args = make_inputs(
        prefix_lens, extend_lens, group, head_dim, page_size, dtype, gen, paged_kv, device
    )
    out = torch.full_like(args[0], float("nan"))
    got = extend_attention(*args, out=out)
    assert got.data_ptr() == out.data_ptr()
    torch.testing.assert_close(
        got.float(), extend_attention_ref(*args).float(), **tolerances[dtype]
    )


def test_logit_cap_and_small_blocks(gen, paged_kv, device, tolerances):
    args = make_inputs([3, 0], [40, 17], 3, 64, 16, torch.float32, gen, paged_kv, device)
    got = extend_attention(*args, logit_cap=2.0, block_m=16, block_n=32)
    want = extend_attention_ref(*args, logit_cap=2.0)
    torch.testing.assert_close(got, want, **tolerances[torch.float32])


def test_new_tokens_never_see_later_ones(gen, paged_kv, device):
    # Changing the K/V of a request's last token must leave its earlier tokens' outputs alone.
    q, k_buffer, v_buffer, qo, kv_indptr, kv_indices, scale = make_inputs(
        [4], [9], 3, 64, 1, torch.float32, gen, paged_kv, device
    )
    before = extend_attention(q, k_buffer, v_buffer, qo, kv_indptr, kv_indices, scale)
    last_slot = kv_indices[-1].long()
    k_buffer[last_slot] += 5.0
    v_buffer[last_slot] -= 5.0
    after = extend_attention(q, k_buffer, v_buffer, qo, kv_indptr, kv_indices, scale)
    torch.testing.assert_close(after[:-1], before[:-1], rtol=0, atol=0)
    assert not torch.allclose(after[-1], before[-1])


def test_reads_strided_q(gen, paged_kv, device, tolerances):
    _, k_buffer, v_buffer, qo, kv_indptr, kv_indices, scale = make_inputs(
        [0, 9], [12, 3], 3, 64, 16, torch.float32, gen, paged_kv, device
    )
    qkv = torch.randn(15, 3 * NUM_KV_HEADS * 3, 64, generator=gen).to(device)
    q = qkv[:, NUM_KV_HEADS * 3 : 2 * NUM_KV_HEADS * 3]
    args = (q, k_buffer, v_buffer, qo, kv_indptr, kv_indices, scale)
    torch.testing.assert_close(
        extend_attention(*args), extend_attention_ref(*args), **tolerances[torch.float32]
    )


def test_rejects_bad_inputs(gen, paged_kv, device):
    q, k_buffer, v_buffer, qo, kv_indptr, kv_indices, scale = make_inputs(
        [0, 2], [3, 4], 1, 64, 1, torch.float32, gen, paged_kv, device
    )
    with pytest.raises(ValueError, match="must both be"):
        extend_attention(q, k_buffer, v_buffer, qo[:2], kv_indptr, kv_indices, scale)
    with pytest.raises(ValueError, match="v_buffer"):
        extend_attention(q, k_buffer, v_buffer.half(), qo, kv_indptr, kv_indices, scale)
    with pytest.raises(ValueError, match="block_m"):
        extend_attention(q, k_buffer, v_buffer, qo, kv_indptr, kv_indices, scale, block_m=48)
    with pytest.raises(ValueError, match="logit_cap"):
        extend_attention(q, k_buffer, v_buffer, qo, kv_indptr, kv_indices, scale, logit_cap=-1.0)
