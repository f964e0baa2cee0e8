"""Rotary position embedding: cos/sin tables per position, for every RoPE scaling checkpoints use.

The inverse frequencies come from transformers' own ROPE_INIT_FUNCTIONS (llama3, linear,
dynamic, yarn, longrope) at load time; the forward only indexes the tables. As in HF, angles
and cos/sin are computed in float32, scaled by the variant's attention factor, then cast.

Two variants change frequencies with the sequence length. HF recomputes them from the longest
position in each forward; here each position has its own row: `dynamic` uses the NTK base for
a sequence ending at that position, `longrope` the long factors from
original_max_position_embeddings on. For `dynamic` that equals HF for one sequence whose prompt
fits in the original length and whose decode steps go past it (HF's generate keeps the old
keys), and is the same for every batch and chunking, where HF's depends on what the batch
holds. For `longrope` it equals HF only inside the original length: HF's Phi-3 recomputes the
whole sequence with the long factors when it crosses, which a prefix cache cannot do.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn


def inv_freq(
    params: dict[str, Any], head_dim: int, max_position: int, seq_len: Any = None
) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [rotary_dim / 2] or [..., rotary_dim / 2], attention factor)."""
    rope_type = params.get("rope_type", "default")
    if rope_type in ("default", "freq_factors"):
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        freq = 1.0 / (params["rope_theta"] ** exponent)
        if rope_type == "freq_factors":  # llama.cpp's rope_freqs: theta_i / factor_i
            freq = freq / torch.tensor(params["freq_factors"], dtype=torch.float32)
        return freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # The init functions read a config's rope_parameters, head_dim and max_position_embeddings.
    hf_config = SimpleNamespace(
        rope_parameters=params,
        head_dim=head_dim,
        hidden_size=head_dim,  # read (never used) where head_dim is given
        num_attention_heads=1,
        max_position_embeddings=max_position,
        standardize_rope_params=lambda: None,
    )
    return ROPE_INIT_FUNCTIONS[rope_type](hf_config, torch.device("cpu"), seq_len)


def position_inv_freq(
    params: dict[str, Any], head_dim: int, hf_max_position: int, num_positions: int
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies per position: [num_positions, rotary_dim / 2], and the factor."""
    rope_type = params.get("rope_type", "default")
    base, factor = inv_freq(params, head_dim, hf_max_position)
    table = base[None, :].expand(num_positions, -1).clone()
    if rope_type == "dynamic" and num_positions > hf_max_position:
        # HF's runtime path: seq_len is an int64 tensor (max position + 1), one per row here.
        seq_len = torch.arange(hf_max_position + 1, num_positions + 1, dtype=torch.int64)[:, None]
        table[hf_max_position:] = inv_freq(params, head_dim, hf_max_position, seq_len)[0]
    elif rope_type == "longrope":
        orig = params["original_max_position_embeddings"]
        if num_positions > orig:
            table[orig:] = inv_freq(params, head_dim, hf_max_position, orig + 1)[0]
    return table, factor


class RotaryEmbedding(nn.Module):
    """cos/sin tables for positions 0..num_positions-1, rotate-half layout, rotary_dim wide."""

    def __init__(
        self,
        head_dim: int,
        params: dict[str, Any],
        hf_max_position: int,
        num_positions: int,
        dtype: torch.dtype,
    ):
        super().__init__()
        self.head_dim, self.params = head_dim, params
        self.hf_max_position, self.num_positions = hf_max_position, num_positions
        self.rotary_dim = 2 * (int(head_dim * params.get("partial_rotary_factor", 1.0)) // 2)
        self.register_buffer("cos", torch.empty(0, dtype=dtype), persistent=False)
        # The sin table's first half is stored negated (see apply).
        self.register_buffer("signed_sin", torch.empty(0, dtype=dtype), persistent=False)
        self.build_tables()

    def build_tables(self) -> None:
        """(Re)compute cos/sin on the buffers' device and dtype (a model built on the meta
        device calls this once its buffers are real)."""
        device, dtype = self.cos.device, self.cos.dtype
        if device.type == "meta":
            return
        freq, factor = position_inv_freq(
            self.params, self.head_dim, self.hf_max_position, self.num_positions
        )
        pos = torch.arange(self.num_positions, dtype=torch.float32)
        freqs = pos[:, None] * freq  # [num_positions, rotary_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = (emb.cos() * factor).to(device=device, dtype=dtype)
        sin = freqs.sin() * factor
        self.signed_sin = torch.cat([-sin, sin], dim=-1).to(device, dtype)

    def table(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin for these positions, [num_tokens, 1, rotary_dim]; computed once
        per forward. The sin's first half is negated (see apply)."""
        return self.cos[positions][:, None, :], self.signed_sin[positions][:, None, :]

    @staticmethod
    def apply(x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Rotate x: [num_tokens, heads, head_dim]; q and k heads go through in one call.
        HF's x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2, x1] written as
        roll(x) = [x2, x1] times the signed sin: three calls instead of six. Partial rotary
        (rotary_dim < head_dim) rotates the leading dimensions and passes the rest."""
        cos, signed_sin = cos_sin
        rot = cos.shape[-1]
        if rot == x.shape[-1]:
            return torch.addcmul(x * cos, x.roll(rot // 2, -1), signed_sin)
        x_rot = x[..., :rot]
        out = torch.addcmul(x_rot * cos, x_rot.roll(rot // 2, -1), signed_sin)
        return torch.cat([out, x[..., rot:]], dim=-1)
