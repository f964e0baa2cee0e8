"""apply_token_bitmask against apply_token_bitmask_ref: packing, skipped rows, vocab sizes
that are not a multiple of 32 or of the block, and allowed logits left bit-for-bit alone."""

from __future__ import annotations

import pytest
import torch
from stemma.kernels.token_bitmask import (
    apply_token_bitmask,
    apply_token_bitmask_ref,
    unpack_token_bitmask,
)


def random_bitmask(batch_size: int, vocab_size: int, gen: torch.Generator) -> torch.Tensor:
    num_words = -(-vocab_size // 32)
    return torch.randint(-(2**31), 2**31, (batch_size, num_words), generator=gen).to(torch.int32)


def test_packing_matches_outlines_and_xgrammar(device):
    # Word 1, bit 3 allows token 35; bit 31 (the sign bit) of word 0 allows token 31.
    bitmask = torch.tensor([[-(2**31), 1 << 3]], dtype=torch.int32, device=device)
    allowed = unpack_token_bitmask(bitmask, 40)
    assert allowed[0].nonzero().flatten().tolist() == [31, 35]
    logits = torch.randn(1, 40, device=device)
    apply_token_bitmask(logits, bitmask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [31, 35]


@pytest.mark.parametrize(
    ("batch_size", "vocab_size", "dtype", "rows"),
    [
        (1, 1, torch.float32, None),
        (5, 1000, torch.float32, [0, 2, 4]),
        (5, 2049, torch.bfloat16, None),
        (3, 777, torch.float16, [1]),
        (4, 64, torch.float32, []),
    ],
)
def test_matches_ref(batch_size, vocab_size, dtype, rows, gen, device):
    logits = (torch.randn(batch_size, vocab_size, generator=gen) * 10).to(device, dtype)
    bitmask = random_bitmask(batch_size, vocab_size, gen).to(device)
    row_indices = None if rows is None else torch.tensor(rows, dtype=torch.int32, device=device)
    got, want = logits.clone(), logits.clone()
    apply_token_bitmask(got, bitmask, row_indices, block_v=256)
    apply_token_bitmask_ref(want, bitmask, row_indices)
    assert torch.equal(got, want)
    applied = set(range(batch_size)) if rows is None else set(rows)
    skipped = sorted(set(range(batch_size)) - applied)
    assert torch.equal(got[skipped], logits[skipped])


def test_wider_bitmask_ignores_extra_words(gen, device):
    logits = torch.randn(2, 50, generator=gen).to(device)
    bitmask = random_bitmask(2, 50, gen).to(device)
    wide = torch.cat([bitmask, torch.zeros(2, 3, dtype=torch.int32, device=device)], dim=1)
    got, want = logits.clone(), logits.clone()
    apply_token_bitmask(got, wide)
    apply_token_bitmask_ref(want, bitmask)
    assert torch.equal(got, want)


def test_rejects_bad_inputs(gen, device):
    logits = torch.randn(2, 100, generator=gen).to(device)
    with pytest.raises(ValueError, match="does not cover"):
        apply_token_bitmask(logits, random_bitmask(2, 64, gen).to(device))
    with pytest.raises(ValueError, match="bitmask has dtype"):
        apply_token_bitmask(logits, random_bitmask(2, 100, gen).to(device).long())
    with pytest.raises(ValueError, match="logits must be"):
        apply_token_bitmask(logits[0], random_bitmask(1, 100, gen).to(device))
