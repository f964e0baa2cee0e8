"""The torch backend's attention pieces against plain masked attention, in float64."""

from __future__ import annotations

import pytest
import torch
from stemma.runtime.executor.attention import (
    CASCADE_MIN_SAVED_POSITIONS,
    cascade_attention,
    cascade_decode,
    decode_sdpa,
    masked_attention,
    shared_prefix_len,
)
from stemma.runtime.models.layers import RMSNorm


def _heads(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


@pytest.mark.parametrize("masked", [False, True])
def test_cascade_decode_is_attention_over_prefix_and_rest(masked):
    torch.manual_seed(0)
    B, H, Hkv, D, P, R = 5, 6, 2, 8, 11, 7
    q = _heads(B, 1, H, D)
    k_shared, v_shared = _heads(P, Hkv, D), _heads(P, Hkv, D)
    k_rest, v_rest = _heads(B, R, Hkv, D), _heads(B, R, Hkv, D)
    rest_mask = torch.ones(B, 1, 1, R, dtype=torch.bool)
    if masked:  # contexts of different lengths: request b sees R - b of its own positions
        for b in range(B):
            rest_mask[b, ..., R - b :] = False
    bias = torch.zeros(rest_mask.shape, dtype=q.dtype).masked_fill_(~rest_mask, float("-inf"))
    got = cascade_decode(q, k_shared, v_shared, k_rest, v_rest, bias if masked else None, 0.3)
    k = torch.cat([k_shared.expand(B, P, Hkv, D), k_rest], dim=1)
    v = torch.cat([v_shared.expand(B, P, Hkv, D), v_rest], dim=1)
    full_mask = torch.cat([torch.ones(B, 1, P, dtype=torch.bool), rest_mask[:, 0]], dim=-1)
    want = masked_attention(q, k, v, full_mask, 0.3, None)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    general = cascade_attention(q, k_shared, v_shared, k_rest, v_rest, rest_mask, 0.3)
    torch.testing.assert_close(got, general, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("heads", [(6, 2), (4, 4), (8, 1)])
def test_decode_sdpa_folds_each_kv_heads_queries_into_rows(masked, heads):
    torch.manual_seed(0)
    (H, Hkv), B, D, C = heads, 5, 8, 9
    q, k, v = _heads(B, H, D), _heads(B, C, Hkv, D), _heads(B, C, Hkv, D)
    mask = torch.ones(B, 1, C, dtype=torch.bool)
    if masked:  # contexts of different lengths: request b sees C - b positions
        for b in range(B):
            mask[b, :, C - b :] = False
    bias = torch.zeros(B, 1, 1, C, dtype=q.dtype).masked_fill_(~mask[:, None], float("-inf"))
    got = decode_sdpa(q, k, v, bias if masked else None, 0.3)
    want = masked_attention(q[:, None], k, v, mask, 0.3, None)[:, 0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _slots(requests: int, shared: int) -> torch.Tensor:
    """[requests, shared + 1] context slots: a common prefix, then one slot of each's own."""
    own = torch.arange(1000, 1000 + requests)[:, None]
    return torch.cat([torch.arange(shared).expand(requests, shared), own], dim=1)


def test_cascade_only_where_it_saves_enough_reads():
    rows = _slots
    long_enough = CASCADE_MIN_SAVED_POSITIONS // 7 + 1  # 8 requests: 7 repeated reads saved
    assert shared_prefix_len(rows(8, long_enough), long_enough) == long_enough
    assert shared_prefix_len(rows(8, long_enough - 1), long_enough - 1) == 0
    assert shared_prefix_len(rows(2, 300), 300) == 0  # one repeat of 300 positions: not worth it
    assert shared_prefix_len(rows(1, 400), 400) == 0


def test_float32_rms_norm_in_one_call_gives_the_two_step_values():
    torch.manual_seed(0)
    norm = RMSNorm(576, 1e-5, torch.float32)
    norm.weight.data.normal_()
    for n in (1, 7, 300):
        x = torch.randn(n, 576) * 3
        two_step = norm.weight * torch.nn.functional.rms_norm(x, (576,), None, 1e-5)
        assert torch.equal(norm(x), two_step)
        hf = norm.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
        torch.testing.assert_close(norm(x), hf, rtol=1e-6, atol=1e-6)
