"""Kernel tests run under the Triton interpreter on CPU; the variable must be set before any
kernel module is imported, hence at conftest import time. With STEMMA_KERNEL_DEVICE=cuda they
run the compiled kernels on the GPU instead (bench/gpu_check.sh). Shared paged-KV builders live
here; inputs are drawn on the CPU from a seeded generator, then moved, so both runs see the same
numbers."""

from __future__ import annotations

import os

DEVICE = os.environ.get("STEMMA_KERNEL_DEVICE", "cpu")
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import functools  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import NamedTuple  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# Per-dtype tolerances: kernel and reference read the same rounded inputs, so what is left is
# the output rounding plus the kernel's rounding of softmax probabilities to the input dtype.
TOLERANCES = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


class PagedKV(NamedTuple):
    k_buffer: torch.Tensor  # [num_slots, num_kv_heads, head_dim]
    v_buffer: torch.Tensor
    kv_indptr: torch.Tensor  # [batch + 1] int32
    kv_indices: torch.Tensor  # [sum(seq_lens)] int32
    slots: list[list[int]]  # each request's slots in position order


def scattered_slots(seq_lens: list[int], page_size: int, gen: torch.Generator) -> list[list[int]]:
    """Each request's slots as whole pages drawn from a random permutation, page 0 (the padding
    slot) never used and a few spare pages left over, so no request's slots are contiguous."""
    pages_per_req = [-(-n // page_size) for n in seq_lens]
    num_pages = sum(pages_per_req) + 3
    order = (torch.randperm(num_pages, generator=gen) + 1).tolist()
    slots, used = [], 0
    for n, num in zip(seq_lens, pages_per_req, strict=True):
        pages = order[used : used + num]
        used += num
        slots.append([p * page_size + j for p in pages for j in range(page_size)][:n])
    return slots


def make_paged_kv(
    seq_lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    device: torch.device | str = "cpu",
) -> PagedKV:
    """Random pools (every slot, used or not, holds random values) and a scattered layout."""
    slots = scattered_slots(seq_lens, page_size, gen)
    num_slots = (max(s for req in slots for s in req) // page_size + 2) * page_size
    shape = (num_slots, num_kv_heads, head_dim)
    k_buffer = torch.randn(shape, generator=gen).to(device, dtype)
    v_buffer = torch.randn(shape, generator=gen).to(device, dtype)
    cumsum = torch.tensor(seq_lens).cumsum(0).tolist()
    kv_indptr = torch.tensor([0, *cumsum], dtype=torch.int32, device=device)
    kv_indices = torch.tensor([s for req in slots for s in req], dtype=torch.int32, device=device)
    return PagedKV(k_buffer, v_buffer, kv_indptr, kv_indices, slots)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def device() -> torch.device:
    if DEVICE != "cpu" and not torch.cuda.is_available():
        pytest.fail(f"STEMMA_KERNEL_DEVICE={DEVICE!r} but torch.cuda.is_available() is False")
    return torch.device(DEVICE)


@pytest.fixture
def paged_kv(device: torch.device) -> Callable[..., PagedKV]:
    return functools.partial(make_paged_kv, device=device)


@pytest.fixture
def slot_layout() -> Callable[..., list[list[int]]]:
    return scattered_slots


@pytest.fixture
def tolerances() -> dict[torch.dtype, dict[str, float]]:
    return TOLERANCES
