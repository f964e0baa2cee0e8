"""What the kernels share: launcher-side validation (shapes, dtypes, devices, checked on the host
so a bad call is a ValueError naming the tensor, not a fault) and the matmul helper.
A compiled kernel needs a GPU tensor; under TRITON_INTERPRET=1 (set before import) any device.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
INDEX_DTYPES = (torch.int32, torch.int64)
CAPTURING_LAUNCHES = False  # kernels/aot.py: launches are recorded for compiling, never run


def check_device(kernel: object, tensors: dict[str, torch.Tensor]) -> None:
    """All tensors on one device, and a GPU one unless the kernel runs in the interpreter."""
    devices = {name: t.device for name, t in tensors.items()}
    first_name, first = next(iter(devices.items()))
    for name, device in devices.items():
        if device != first:
            raise ValueError(f"{name} is on {device} but {first_name} is on {first}")
    compiled = isinstance(kernel, triton.runtime.JITFunction)
    if compiled and first.type != "cuda" and not CAPTURING_LAUNCHES:
        raise ValueError(
            f"tensors are on {first}; compiled Triton kernels need a CUDA device "
            "(set TRITON_INTERPRET=1 before importing stemma.kernels to run on CPU)"
        )


def check_dtype(name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if t.dtype not in allowed:
        raise ValueError(f"{name} has dtype {t.dtype}; expected one of {allowed}")


def check_dim(name: str, t: torch.Tensor, ndim: int, layout: str) -> None:
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {layout}, got shape {tuple(t.shape)}")


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")


def check_out(out: torch.Tensor, shape: tuple[int, ...], like: torch.Tensor) -> None:
    """A caller-given output buffer must match what the kernel would allocate."""
    if tuple(out.shape) != shape or out.dtype != like.dtype or out.device != like.device:
        raise ValueError(
            f"out is {tuple(out.shape)} {out.dtype} on {out.device}; "
            f"expected {shape} {like.dtype} on {like.device}"
        )
    check_last_dim_contiguous("out", out)


def dot_config(kernel: object, dtype: torch.dtype) -> tuple[str, bool]:
    """(DOT_PRECISION, UPCAST) for `mma` on operands of `dtype`: fp32 gets exact fp32 dots (no
    silent TF32); bf16 is upcast only in the interpreter, which cannot multiply bf16."""
    is_interpreted = not isinstance(kernel, triton.runtime.JITFunction)
    upcast = is_interpreted and dtype == torch.bfloat16
    return ("ieee" if dtype == torch.float32 or upcast else "tf32"), upcast


@triton.jit
def mma(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """a @ b accumulated in fp32. With UPCAST the operands (already rounded to their storage
    type) enter as fp32: products of two bf16 values are exact in fp32, so this matches a GPU
    bf16 MMA up to summation order."""
    if UPCAST:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=DOT_PRECISION)
    return c


def check_paged_kv(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> int:
    """Validate q against the per-layer pools; returns the GQA group size."""
    check_dim("q", q, 3, "[num_tokens, num_heads, head_dim]")
    check_dim("k_buffer", k_buffer, 3, "[num_slots, num_kv_heads, head_dim]")
    if v_buffer.shape != k_buffer.shape:
        raise ValueError(f"v_buffer {tuple(v_buffer.shape)} != k_buffer {tuple(k_buffer.shape)}")
    check_dtype("q", q, FLOAT_DTYPES)
    check_dtype("k_buffer", k_buffer, FLOAT_DTYPES)
    if v_buffer.dtype != k_buffer.dtype:
        raise ValueError(f"v_buffer is {v_buffer.dtype} but k_buffer is {k_buffer.dtype}")
    for name, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        check_dim(name, t, 1, "1-D")
        check_dtype(name, t, INDEX_DTYPES)
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_buffer.shape[1]
    if k_buffer.shape[2] != head_dim:
        raise ValueError(f"q head_dim {head_dim} != k_buffer head_dim {k_buffer.shape[2]}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
    for name, t in (("q", q), ("k_buffer", k_buffer), ("v_buffer", v_buffer)):
        check_last_dim_contiguous(name, t)
    for name, t in (("kv_indptr", kv_indptr), ("kv_indices", kv_indices)):
        if t.numel() and t.stride(0) != 1:
            raise ValueError(f"{name} must be contiguous")
    return num_heads // num_kv_heads
