"""Building blocks of a decoder, each linear written so tensor parallelism swaps one class.

Linear layers hold the full (tp_size=1) weight today; `load_weight` is the one place a
sharded layer would slice its part. RMSNorm and rotary embedding follow HF Llama exactly
(rotate-half RoPE, inv_freq and angles in float32) so float64 runs match bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The row count oneDNN lays the weight out for. 32 favours decode: 1-64 rows stream 1.5-1.65x
# faster than from a plain weight; 512-1024-row prefill chunks run ~10% slower than plain.
PACK_BATCH_HINT = 32


def can_pack_weights(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether linear weights can be held in oneDNN's blocked layout (CPU bfloat16)."""
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] re-laid out in oneDNN's blocked format (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_BATCH_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None):
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, "none", [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


class Linear(nn.Module):
    """y = x W^T (+ b). Column/row parallel variants override load_weight and forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.is_mkldnn:
            return packed_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def pack(self) -> None:
        """Replace the weight by its oneDNN-blocked form (after loading; see can_pack_weights).
        A plain bf16 weight is re-laid out inside every CPU matmul; a packed one streams as
        is, which is most of a decode step's time."""
        self.weight = nn.Parameter(pack_weight(self.weight), False)


class MergedLinear(Linear):
    """Several linears sharing an input, stored stacked along the output (q|k|v, gate|up)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool, dtype: torch.dtype):
        super().__init__(in_features, sum(out_sizes), bias, dtype)
        self.out_sizes = out_sizes

    def part(self, idx: int, name: str) -> torch.Tensor:
        start = sum(self.out_sizes[:idx])
        return getattr(self, name)[start : start + self.out_sizes[idx]]


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim, dtype=dtype), False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype), False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As HF Llama: normalize in float32 (even for float64 models), scale in the model dtype.
        # F.rms_norm: one call, the same float32 values as the HF expression.
        h = F.rms_norm(x.to(torch.float32), (x.shape[-1],), None, self.eps)
        return self.weight * h.to(x.dtype)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for positions 0..max_position-1, rotate-half layout."""

    def __init__(self, head_dim: int, theta: float, max_position: int, dtype: torch.dtype):
        super().__init__()
        self.head_dim, self.theta, self.max_position = head_dim, theta, max_position
        self.register_buffer("cos", torch.empty(0, dtype=dtype), persistent=False)
        self.register_buffer("sin", torch.empty(0, dtype=dtype), persistent=False)
        self.build_tables()

    def build_tables(self) -> None:
        """(Re)compute cos/sin on the buffers' device and dtype (a model built on the meta
        device calls this once its buffers are real)."""
        device, dtype = self.cos.device, self.cos.dtype
        if device.type == "meta":
            return
        d = self.head_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
        pos = torch.arange(self.max_position, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]  # [max_position, head_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin = emb.sin().to(device=device, dtype=dtype)

    def table(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for these positions, [num_tokens, 1, head_dim]; computed once per forward."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotate x: [num_tokens, heads, head_dim]; q and k heads go through in one call."""
        cos, sin = cos_sin
        return x * cos + _rotate_half(x) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
