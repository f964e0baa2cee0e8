"""Building blocks of a decoder, each linear written so tensor parallelism swaps one class.

Linear layers hold the full (tp_size=1) weight today; `load_weight` is the one place a
sharded layer would slice its part. RMSNorm and rotary embedding follow HF Llama exactly
(rotate-half RoPE, inv_freq and angles in float32) so float64 runs match bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x W^T (+ b). Column/row parallel variants override load_weight and forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


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
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


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
    def apply(
        q: torch.Tensor, k: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # q: [num_tokens, num_heads, head_dim]; k: [num_tokens, num_kv_heads, head_dim]
        cos, sin = cos_sin
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
