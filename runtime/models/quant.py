"""Weight-only quantization on CPU with torch's own packed kernels (no hand-written GEMM).

int8: symmetric per output channel, w = q * scale, q in [-127, 127]
      (`aten._weight_int8pack_mm`).
int4: asymmetric per group of 32 input columns, w = (q - 8) * scale + zero, q in [0, 15]
      (`aten._convert_weight_to_int4pack_for_cpu` / `aten._weight_int4pack_mm_for_cpu`).
      A group's scale and minimum are exactly GGUF Q4_1's block `d` and `m`, so a Q4_1
      checkpoint dequantized to float32 re-quantizes to its own codes.

Both kernels are vectorized for bfloat16 activations only (float32 activations take a scalar
loop, 10-50x slower on AVX2), so a linear casts its input to bfloat16 and its output back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import QUANTIZATION_METHODS

INT4_GROUP_SIZE = 32  # GGUF Q4_0 / Q4_1 block size
_COMPUTE = torch.bfloat16


@dataclass(slots=True)
class QuantizedWeight:
    """A linear weight [out, in] in one of torch's packed weight-only formats."""

    method: str  # "int8" | "int4"
    packed: torch.Tensor  # int8: [out, in] int8; int4: torch's opaque CPU int4 packing
    scales: torch.Tensor  # int8: [out] bf16; int4: scales and zeros [in / group, out, 2] bf16
    out_features: int
    in_features: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> x W^T [rows, out] in x's dtype."""
        xb = x.to(_COMPUTE)
        if self.method == "int8":
            y = torch.ops.aten._weight_int8pack_mm(xb, self.packed, self.scales)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                xb, self.packed, INT4_GROUP_SIZE, self.scales
            )
        return y.to(x.dtype)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + self.scales.nbytes


def quantize(weight: torch.Tensor, method: str) -> QuantizedWeight:
    """Quantize a float weight [out, in] (any float dtype; computed in float32)."""
    out_features, in_features = weight.shape
    w = weight.detach().to(torch.float32)
    if method == "int8":
        packed, scales = _quantize_int8(w)
    elif method == "int4":
        if in_features % INT4_GROUP_SIZE:
            raise ValueError(
                f"int4 needs in_features divisible by {INT4_GROUP_SIZE}, got {in_features}"
            )
        packed, scales = _quantize_int4(w)
    else:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS}, got {method!r}")
    return QuantizedWeight(method, packed, scales, out_features, in_features)


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """The float32 weight [out, in] the packed form computes with (for tests and accuracy)."""
    eye = torch.eye(qw.in_features, dtype=_COMPUTE)
    return qw.matmul(eye).to(torch.float32).t().contiguous()


def _quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The bf16 scale is what the kernel multiplies by, so codes are rounded against it.
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(_COMPUTE)
    q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.contiguous(), scale


def _quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out_features, in_features = w.shape
    groups = w.view(out_features, in_features // INT4_GROUP_SIZE, INT4_GROUP_SIZE)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # [out, num_groups]
    scale = ((hi - lo) / 15).clamp_min(1e-12)
    q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp_(0, 15)
    q = q.to(torch.int32).view(out_features, in_features)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
    return packed, scales_and_zeros.to(_COMPUTE)
