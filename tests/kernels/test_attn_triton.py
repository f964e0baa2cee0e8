"""TritonAttnBackend against TorchAttnBackend on ForwardBatches built the way the scheduler
builds them: decode, extend with cached prefixes, and mixed batches, with paged slot layouts."""

from __future__ import annotations

import pytest
import torch
from stemma.runtime.executor.attention import TorchAttnBackend, make_attention_backend
from stemma.runtime.executor.attn_triton import TritonAttnBackend
from stemma.runtime.executor.forward_batch import ForwardBatch, ForwardMode
from stemma.runtime.executor.memory import KVPool, ReqToTokenPool

NUM_LAYERS, NUM_KV_HEADS, GROUP, HEAD_DIM = 2, 2, 3, 64


def build_step(prefix_lens, extend_lens, page_size, dtype, gen, slot_layout, device):
    """A filled pool holding every request's prefix, and the ForwardBatch of the next step."""
    seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
    slots = slot_layout(seq_lens, page_size, gen)
    num_slots = (max(s for req in slots for s in req) // page_size + 2) * page_size
    pool = KVPool(num_slots, NUM_LAYERS, NUM_KV_HEADS, HEAD_DIM, dtype, device)
    for layer in range(NUM_LAYERS):
        pool.k[layer].copy_(torch.randn(pool.k[layer].shape, generator=gen))
        pool.v[layer].copy_(torch.randn(pool.v[layer].shape, generator=gen))
    req_to_token = ReqToTokenPool(len(seq_lens) + 2, max(seq_lens) + 4, device)
    rows = [len(seq_lens) - i for i in range(len(seq_lens))]  # not 0..B-1, as in a real run
    for row, req_slots in zip(rows, slots, strict=True):
        req_to_token.write(row, 0, req_slots)
    out_cache_loc = torch.tensor(
        [s for req, p in zip(slots, prefix_lens, strict=True) for s in req[p:]], dtype=torch.int32
    )
    input_ids = [torch.randint(0, 100, (e,), generator=gen).tolist() for e in extend_lens]
    fb = ForwardBatch.build(
        req_to_token.req_to_token, rows, prefix_lens, input_ids, out_cache_loc, device=device
    )
    return fb, pool


def clone_pool(pool: KVPool) -> KVPool:
    k0 = pool.k[0]
    twin = KVPool(pool.num_slots, len(pool.k), k0.shape[1], k0.shape[2], k0.dtype, k0.device)
    for layer in range(len(pool.k)):
        twin.k[layer].copy_(pool.k[layer])
        twin.v[layer].copy_(pool.v[layer])
    return twin


@pytest.mark.parametrize(
    ("prefix_lens", "extend_lens", "mode", "page_size", "dtype"),
    [
        ([5, 0, 40, 299], [1, 1, 1, 1], ForwardMode.DECODE, 16, torch.float32),
        ([64], [1], ForwardMode.DECODE, 1, torch.bfloat16),
        ([0, 12, 33], [9, 20, 4], ForwardMode.EXTEND, 16, torch.float32),
        ([0], [70], ForwardMode.EXTEND, 1, torch.float16),
        ([0, 17, 6, 0], [11, 1, 1, 3], ForwardMode.MIXED, 1, torch.float32),
    ],
)
def test_matches_torch_backend(
    prefix_lens, extend_lens, mode, page_size, dtype, gen, slot_layout, device, tolerances
):
    fb, pool = build_step(prefix_lens, extend_lens, page_size, dtype, gen, slot_layout, device)
    assert fb.mode == mode
    torch_pool = clone_pool(pool)
    num_heads = NUM_KV_HEADS * GROUP
    triton_backend, torch_backend = TritonAttnBackend(), TorchAttnBackend()
    triton_backend.init_forward_metadata(fb)
    torch_backend.init_forward_metadata(fb)
    for layer in range(NUM_LAYERS):
        q = torch.randn(fb.num_tokens, num_heads, HEAD_DIM, generator=gen).to(device, dtype)
        k = torch.randn(fb.num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
        v = torch.randn(fb.num_tokens, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(device, dtype)
        got = triton_backend.forward(q, k, v, layer, fb, pool, HEAD_DIM**-0.5)
        want = torch_backend.forward(q, k, v, layer, fb, torch_pool, HEAD_DIM**-0.5)
        assert got.shape == (fb.num_tokens, num_heads, HEAD_DIM)
        torch.testing.assert_close(got.float(), want.float(), **tolerances[dtype])
        assert torch.equal(pool.k[layer], torch_pool.k[layer])
        assert torch.equal(pool.v[layer], torch_pool.v[layer])


def test_factory_builds_the_triton_backend():
    assert isinstance(make_attention_backend("triton"), TritonAttnBackend)
