"""Building blocks of a decoder, each linear written so tensor parallelism swaps one class.

Under tensor parallelism (models/parallel.py) a column-parallel linear is a plain Linear
holding its rank's rows; `RowParallelLinear` and `VocabParallelEmbedding` are the two classes
that talk to the group (one all-reduce each). The decoder's load_weights slices each rank's
part out of the checkpoint. RMSNorm follows HF Llama (normalized in float32) or HF
Gemma (scaled by 1 + w in float32), so float64 runs match HF's to rounding. RoPE is rope.py.

On CPU in bfloat16 the model packs its weights once (`DecoderForCausalLM.pack_weights`): each
linear is re-laid out for oneDNN, a norm's scale is folded into the linear it feeds, and the
work around a matmul (the residual add, silu, the gate * up product) runs inside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .parallel import TPGroup
from .quant import QuantizedWeight, quantize

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


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None, act: str = "none"
) -> torch.Tensor:
    """act(x W^T + b) with W packed; act is "none" or "swish" (silu), applied in the matmul."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, act, [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


def packed_linear_then(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, op: str, other: torch.Tensor
) -> torch.Tensor:
    """(x W^T + b) op other, op "add" or "mul", in one oneDNN call; x and other are 2-D."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, bias, op)


def bfloat16_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T with W a bfloat16 copy (add_small_step_copy), returned in x's dtype."""
    return F.linear(x.to(torch.bfloat16), weight).to(x.dtype)


class Linear(nn.Module):
    """y = x W^T (+ b). Column/row parallel variants override load_weight and forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), False) if bias else None
        self.quant: QuantizedWeight | None = None  # set by quantize(); weight is then None
        # A bfloat16 copy for steps of at most small_rows rows (add_small_step_copy).
        self.small_weight: torch.Tensor | None = None
        self.small_rows = 0

    @property
    def is_packed(self) -> bool:
        return self.weight is not None and self.weight.is_mkldnn

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T (+ b), plus residual when given (x: [tokens, in]; residual: [tokens, out])."""
        if self.is_packed:
            if residual is None:
                return packed_linear(x, self.weight, self.bias)
            return packed_linear_then(x, self.weight, self.bias, "add", residual)
        if self.quant is None and x.shape[0] > self.small_rows:
            y = F.linear(x, self.weight, self.bias)  # the plain path: HF's exact operations
        else:
            if self.quant is not None:
                y = self.quant.matmul(x)
            else:
                y = bfloat16_matmul(x, self.small_weight)
            y = y if self.bias is None else y + self.bias
        return y if residual is None else residual + y

    def pack(self) -> None:
        """Replace the weight by its oneDNN-blocked form (after loading; see can_pack_weights).
        A plain bf16 weight is re-laid out inside every CPU matmul; a packed one streams as
        is, which is most of a decode step's time."""
        self.weight = nn.Parameter(pack_weight(self.weight), False)

    def quantize(self, method: str, input_max: torch.Tensor | None = None) -> None:
        """Replace the weight by a quantized copy (after loading; models/quant.py); input_max:
        w8a8_int8's calibrated input range per channel."""
        self.quant = quantize(self.weight, method, input_max)
        self.weight = None

    def add_small_step_copy(self, max_rows: int) -> None:
        """Keep a bfloat16 copy of the weight for steps of at most max_rows rows, on CPUs whose
        bfloat16 matmul is not native: there torch's bfloat16 matrix-vector kernel streams
        half float32's bytes and wins at few rows, while more rows take the float32 GEMM."""
        self.small_weight = self.weight.detach().to(torch.bfloat16)
        self.small_rows = max_rows

    def scale_inputs(self, scale: torch.Tensor) -> None:
        """W <- W diag(scale), computed in float32: x W'^T == (x * scale) W^T. Plain weights."""
        w = self.weight.data
        w.copy_(w.float().mul_(scale.float()).to(w.dtype))


class RowParallelLinear(Linear):
    """Holds the input columns of its rank: y = all_reduce(x_r W_r^T) (+ b + residual, added
    by rank 0 only, so both are counted once). Without a group it is a plain Linear."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype, tp: TPGroup):
        super().__init__(in_features, out_features, bias, dtype)
        self.tp = tp

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(x, residual)
        # A rank > 0 holds a zero bias (decoder.load_weights), so the sum adds b once.
        y = super().forward(x, residual if self.tp.rank == 0 else None)
        return self.tp.all_reduce(y)


class MergedLinear(Linear):
    """Several linears sharing an input, stored stacked along the output (q|k|v, gate|up)."""

    def __init__(self, in_features: int, out_sizes: list[int], bias: bool, dtype: torch.dtype):
        super().__init__(in_features, sum(out_sizes), bias, dtype)
        self.out_sizes = out_sizes

    def part(self, idx: int, name: str) -> torch.Tensor:
        start = sum(self.out_sizes[:idx])
        return getattr(self, name)[start : start + self.out_sizes[idx]]


class GateUpLinear(MergedLinear):
    """gate|up stacked; forward gives the gated activation act(x G^T) * (x U^T), act silu
    (SwiGLU) or gelu_pytorch_tanh (GeGLU, Gemma).

    Packed, the two halves are separate oneDNN weights (`weight` the gate, `up_weight` the
    up), so the silu runs inside the gate matmul and the product inside the up matmul.
    """

    def __init__(
        self, in_features: int, inter: int, bias: bool, dtype: torch.dtype, act: str = "silu"
    ):
        super().__init__(in_features, [inter, inter], bias, dtype)
        self.up_weight: nn.Parameter | None = None
        self.up_bias: nn.Parameter | None = None
        self.act = act

    def activation(self, gate: torch.Tensor) -> torch.Tensor:
        return F.silu(gate) if self.act == "silu" else F.gelu(gate, approximate="tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        if self.is_packed:
            if self.act == "silu":
                gate = packed_linear(x, self.weight, self.bias, "swish")
            else:
                gate = self.activation(packed_linear(x, self.weight, self.bias))
            return packed_linear_then(x, self.up_weight, self.up_bias, "mul", gate)
        gate, up = super().forward(x).chunk(2, dim=-1)
        return self.activation(gate) * up

    def pack(self) -> None:
        inter = self.out_sizes[0]
        w = self.weight.detach()
        self.weight = nn.Parameter(pack_weight(w[:inter].contiguous()), False)
        self.up_weight = nn.Parameter(pack_weight(w[inter:].contiguous()), False)
        if self.bias is not None:
            b = self.bias.detach()
            self.bias = nn.Parameter(b[:inter].clone(), False)
            self.up_bias = nn.Parameter(b[inter:].clone(), False)


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, dim: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim, dtype=dtype), False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)


class VocabParallelEmbedding(Embedding):
    """Rows vocab_start .. vocab_start + shard of the table (zero-padded past the vocabulary);
    an id outside them looks up zeros, and one all-reduce sums the ranks' rows."""

    def __init__(self, shard: int, dim: int, dtype: torch.dtype, tp: TPGroup, vocab_start: int):
        super().__init__(shard, dim, dtype)
        self.tp, self.vocab_start = tp, vocab_start

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(ids)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill_(outside[:, None], 0))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(dim, dtype=dtype), False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # As HF Llama: normalize in float32 (even for float64 models), scale in the model dtype.
        # F.rms_norm: one call, the same float32 values as the HF expression.
        if self.weight is None:  # folded into the next linear; bf16 in, float32 inside
            return F.rms_norm(x, (x.shape[-1],), None, self.eps)
        if x.dtype == torch.float32:  # one call; the same values as the two below (tested)
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        h = F.rms_norm(x.to(torch.float32), (x.shape[-1],), None, self.eps)
        return self.weight * h.to(x.dtype)

    def fold_into(self, linear: Linear) -> None:
        """Move the scale into the linear this norm feeds (before packing); the norm then
        only normalizes. For reduced-precision models, where F.rms_norm of the model dtype
        computes in float32 (float64 would lose HF's float32 normalization)."""
        assert self.weight is not None
        linear.scale_inputs(self.weight.detach())
        self.weight = None


class GemmaRMSNorm(RMSNorm):
    """Gemma's norm: normalized and scaled by (1 + w) in float32, then cast (HF Gemma2/3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.to(torch.float32), (x.shape[-1],), None, self.eps)
        return (h * (1.0 + self.weight.to(torch.float32))).to(x.dtype)

    def fold_into(self, linear: Linear) -> None:
        raise NotImplementedError("a Gemma norm keeps its scale (its output is cast after it)")


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap), HF's three operations (Gemma 2's logit soft-capping)."""
    return torch.tanh(x / cap) * cap
