"""Building blocks of a decoder, each linear written so tensor parallelism swaps one class.

Under tensor parallelism (models/parallel.py) a column-parallel linear is a plain Linear
holding its rank's rows; `RowParallelLinear` and `VocabParallelEmbedding` are the two classes
that talk to the group (one all-reduce each). The decoder's load_weights slices each rank's
part out of the checkpoint. RMSNorm follows HF Llama (normalized in float32) or HF
Gemma (scaled by 1 + w in float32), so float64 runs match HF's to rounding. RoPE is rope.py.

A linear multiplies through its weight form (models/weights/): plain once loaded, then the
form the weight plan chose (DecoderForCausalLM.apply_plan), e.g. oneDNN-packed on CPU
bfloat16, where a norm's scale is folded into the linear it feeds and the work around a
matmul (the residual add, silu, the gate * up product) runs inside it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .parallel import TPGroup

if TYPE_CHECKING:
    from .weights import WeightForm


class Linear(nn.Module):
    """y = x W^T (+ b) (+ residual), multiplied by its weight form. The row-parallel variant
    overrides forward."""

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        # The float weight as loaded; None once a form holds it in another layout.
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), False)
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype), False) if bias else None
        self.form: WeightForm | None = None  # set by the decoder's apply_plan once loaded

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x W^T (+ b), plus residual when given (x: [tokens, in]; residual: [tokens, out])."""
        return self.form.matmul(x, self.bias, residual)

    def hold(self, form: WeightForm) -> None:
        """Multiply by `form` from now on; drop the float weight unless the form keeps it."""
        self.form = form
        if form.weight is None:
            self.weight = None

    def scale_inputs(self, scale: torch.Tensor) -> None:
        """W <- W diag(scale), computed in float32: x W'^T == (x * scale) W^T. Float weights."""
        w = self.weight.data
        w.copy_(w.float().mul_(scale.float()).to(w.dtype))


def form_row_limits(module: nn.Module) -> list[int]:
    """The row counts past which some linear under `module` multiplies by another kernel
    (WeightForm.max_rows), ascending: where a step's cost jumps."""
    limits = {m.form.max_rows for m in module.modules() if isinstance(m, Linear) and m.form}
    return sorted(n for n in limits if n is not None)


def cost_row_limits(module: nn.Module) -> list[int]:
    """The row counts past which a step's cost jumps, ascending: form_row_limits and the
    stairs of the kernels' row blocks below them (WeightForm.cost_edges), for the draft
    budget's fit (scheduler/speculative.py)."""
    edges = set()
    for m in module.modules():
        if isinstance(m, Linear) and m.form:
            edges |= m.form.cost_edges()
    return sorted(edges)


def compiled_row_limit(module: nn.Module) -> int | None:
    """The most rows for which every linear under `module` multiplies by a form Inductor
    compiles (WeightForm.compiled_rows): None for any count, 0 for none."""
    limits = [m.form.compiled_rows() for m in module.modules() if isinstance(m, Linear) and m.form]
    known = [n for n in limits if n is not None]
    return min(known) if known else None


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
    (SwiGLU) or gelu_pytorch_tanh (GeGLU, Gemma). The form computes it (packed: silu inside
    the gate's matmul, the product inside the up's)."""

    def __init__(
        self, in_features: int, inter: int, bias: bool, dtype: torch.dtype, act: str = "silu"
    ):
        super().__init__(in_features, [inter, inter], bias, dtype)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.form.gated(x, self.bias, self.act)


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

    def fold_into(self, linear: Linear) -> torch.Tensor:
        """Move the scale into the linear this norm feeds (before packing); the norm then
        only normalizes. For reduced-precision models, where F.rms_norm of the model dtype
        computes in float32 (float64 would lose HF's float32 normalization). Returns the
        scale, for a form that also holds weights it could not go into."""
        assert self.weight is not None
        scale = self.weight.detach()
        linear.scale_inputs(scale)
        self.weight = None
        return scale


class GemmaRMSNorm(RMSNorm):
    """Gemma's norm: normalized and scaled by (1 + w) in float32, then cast (HF Gemma2/3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x.to(torch.float32), (x.shape[-1],), None, self.eps)
        return (h * (1.0 + self.weight.to(torch.float32))).to(x.dtype)

    def fold_into(self, linear: Linear) -> torch.Tensor:
        raise NotImplementedError("a Gemma norm keeps its scale (its output is cast after it)")


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap), HF's three operations (Gemma 2's logit soft-capping)."""
    return torch.tanh(x / cap) * cap
