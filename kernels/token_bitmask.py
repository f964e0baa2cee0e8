"""Apply a packed token bitmask to logits in place: disallowed tokens become -inf.

Packing (as in outlines-core and xgrammar): bit j of int32 word w of a row allows token
w * 32 + j. Only the rows listed in row_indices are touched (all rows when it is None), so
requests without a constraint share the batch at no cost; allowed logits are never written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, check_device, check_dim, check_dtype


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr,  # [batch, vocab_size]
    bitmask_ptr,  # [batch, num_words] int32
    row_indices_ptr,  # [num_rows] rows to apply; unused when not HAS_ROW_INDICES
    vocab_size,
    stride_logits_b,
    stride_bitmask_b,
    HAS_ROW_INDICES: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    if HAS_ROW_INDICES:
        row = tl.load(row_indices_ptr + tl.program_id(0)).to(tl.int64)
    else:
        row = tl.program_id(0).to(tl.int64)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mask_v = offs_v < vocab_size
    words = tl.load(bitmask_ptr + row * stride_bitmask_b + offs_v // 32, mask=mask_v, other=-1)
    is_allowed = ((words >> (offs_v % 32)) & 1) != 0
    tl.store(
        logits_ptr + row * stride_logits_b + offs_v,
        tl.full([BLOCK_V], float("-inf"), dtype=logits_ptr.dtype.element_ty),
        mask=mask_v & ~is_allowed,
    )


def apply_token_bitmask(
    logits: torch.Tensor,  # [batch, vocab_size] float, modified in place
    bitmask: torch.Tensor,  # [batch, >= ceil(vocab_size / 32)] int32
    row_indices: torch.Tensor | None = None,  # [num_rows] int, the rows to apply
    *,
    block_v: int = 1024,
) -> None:
    """Set logits[r, t] = -inf wherever bit t of bitmask[r] is 0, for each r in row_indices."""
    check_dim("logits", logits, 2, "[batch, vocab_size]")
    check_dim("bitmask", bitmask, 2, "[batch, num_words]")
    check_dtype("logits", logits, FLOAT_DTYPES)
    check_dtype("bitmask", bitmask, (torch.int32,))
    batch_size, vocab_size = logits.shape
    if bitmask.shape[0] != batch_size or bitmask.shape[1] * 32 < vocab_size:
        raise ValueError(
            f"bitmask {tuple(bitmask.shape)} does not cover logits {tuple(logits.shape)}; "
            f"expected [{batch_size}, >= {triton.cdiv(vocab_size, 32)}]"
        )
    for name, t in (("logits", logits), ("bitmask", bitmask)):
        if t.shape[1] > 1 and t.stride(1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dim, got strides {t.stride()}")
    if block_v < 32 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two >= 32, got {block_v}")
    tensors = {"logits": logits, "bitmask": bitmask}
    if row_indices is not None:
        check_dim("row_indices", row_indices, 1, "[num_rows]")
        check_dtype("row_indices", row_indices, (torch.int32, torch.int64))
        tensors["row_indices"] = row_indices
    check_device(_apply_token_bitmask_kernel, tensors)
    num_rows = batch_size if row_indices is None else row_indices.numel()
    if num_rows == 0 or vocab_size == 0:
        return
    if row_indices is not None:
        row_indices = row_indices.contiguous()
    _apply_token_bitmask_kernel[(num_rows, triton.cdiv(vocab_size, block_v))](
        logits,
        bitmask,
        row_indices if row_indices is not None else bitmask,
        vocab_size,
        logits.stride(0),
        bitmask.stride(0),
        HAS_ROW_INDICES=row_indices is not None,
        BLOCK_V=block_v,
        num_warps=4,
    )


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[batch, num_words] int32 -> [batch, vocab_size] bool, True where the token is allowed."""
    bits = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    allowed = (bitmask[:, :, None] >> bits) & 1  # [batch, num_words, 32]
    return allowed.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask_ref(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor | None = None
) -> None:
    """The specification, in place like the kernel."""
    rows = torch.arange(logits.shape[0]) if row_indices is None else row_indices.long().cpu()
    is_allowed = unpack_token_bitmask(bitmask, logits.shape[1])
    for r in rows.tolist():
        logits[r].masked_fill_(~is_allowed[r], float("-inf"))
