"""Weight-only quantization on CPU with torch's own packed kernels (no hand-written GEMM).

int8: symmetric per output channel, w = q * scale, q in [-127, 127]
      (`aten._weight_int8pack_mm`).
int4: asymmetric per group of 32 input columns, w = (q - 8) * scale + zero, q in [0, 15]
      (`aten._convert_weight_to_int4pack_for_cpu` / `aten._weight_int4pack_mm_for_cpu`).
      A group's scale and minimum are exactly GGUF Q4_1's block `d` and `m`, so a Q4_1
      checkpoint dequantized to float32 re-quantizes to its own codes.

Both kernels are vectorized for bfloat16 activations only (float32 activations take a scalar
loop, 10-50x slower on AVX2), so a linear casts its input to bfloat16 and its output back.

fp16 (not a --quantization method: dtype "auto"'s weight plan on CPUs without native
      bfloat16, see dtype_policy.py): float16 weights widened to float32 inside fbgemm's
      matmul (`quantized.linear_dynamic_fp16`), float32 activations and accumulation.
w8a8_int8: int8 weights (symmetric per output channel) and int8 activations quantized per
      row (the kernel takes one asymmetric scale per call, so each row is first divided by
      its largest magnitude and the output multiplied back; 7-bit, so AVX2's u8 x s8 pair
      sums cannot saturate), multiplied as integers by fbgemm on x86 and qnnpack on ARM
      (`quantized.linear_dynamic`; float32 in and out). SGLang's name for the scheme; here
      it is computed at load from any float checkpoint. On a 2-core AVX2 EPYC it multiplies
      SmolLM2's 120 linears at 1 row 1.2x faster than int4 and at 8 rows 2x faster, and
      prefill rows 1.8x faster than float32; the price is rounding of the activations too.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ..config import QUANTIZATION_METHODS

INT4_GROUP_SIZE = 32  # GGUF Q4_0 / Q4_1 block size
_COMPUTE = torch.bfloat16


@dataclass(slots=True)
class QuantizedWeight:
    """A linear weight [out, in] in one of torch's packed weight-only formats."""

    method: str  # "int8" | "int4" | "w8a8_int8" | "fp16"
    # int8: [out, in] int8; int4: torch's opaque CPU int4 packing; w8a8_int8: the quantized
    # engine's packed parameters (a torch ScriptObject)
    packed: Any
    # int8: [out] bf16; int4: scales and zeros [in / group, out, 2] bf16; w8a8_int8: [out] f32
    scales: torch.Tensor
    out_features: int
    in_features: int
    # w8a8_int8 with calibration: 1 / the smoothing scale, multiplied into the input first
    input_scale: torch.Tensor | None = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in] -> x W^T [rows, out] in x's dtype."""
        if self.method == "fp16":
            xf = x if x.dtype == torch.float32 else x.float()
            y = torch.ops.quantized.linear_dynamic_fp16(xf, self.packed)
            return y if x.dtype == torch.float32 else y.to(x.dtype)
        if self.method == "w8a8_int8":
            xf = x if x.dtype == torch.float32 else x.float()
            if self.input_scale is not None:
                xf = xf * self.input_scale
            if x.shape[0] == 1:
                y = torch.ops.quantized.linear_dynamic(xf, self.packed, True)
            else:  # rows scaled to one range: the kernel's one scale is then per row
                row_max = xf.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-12)
                y = torch.ops.quantized.linear_dynamic(xf / row_max, self.packed, True)
                y.mul_(row_max)
            return y if x.dtype == torch.float32 else y.to(x.dtype)
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
        if self.method == "w8a8_int8":
            return self.out_features * self.in_features + self.scales.nbytes
        if self.method == "fp16":
            return 2 * self.out_features * self.in_features
        return self.packed.numel() * self.packed.element_size() + self.scales.nbytes


def quantize(
    weight: torch.Tensor, method: str, input_max: torch.Tensor | None = None
) -> QuantizedWeight:
    """Quantize a float weight [out, in] (any float dtype; computed in float32). input_max
    ([in], w8a8_int8 only): the calibrated largest input magnitude per channel, to smooth by."""
    out_features, in_features = weight.shape
    w = weight.detach().to(torch.float32)
    input_scale = None
    if method == "int8":
        packed, scales = _quantize_int8(w)
    elif method == "fp16":
        packed, scales = _pack_fp16(w), torch.empty(0)
    elif method == "w8a8_int8":
        if input_max is not None:
            smooth = smoothing_scale(input_max, w)
            w, input_scale = w * smooth, 1.0 / smooth
        packed, scales = _quantize_w8a8(w)
    elif method == "int4":
        if in_features % INT4_GROUP_SIZE:
            raise ValueError(
                f"int4 needs in_features divisible by {INT4_GROUP_SIZE}, got {in_features}"
            )
        packed, scales = _quantize_int4(w)
    else:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS}, got {method!r}")
    return QuantizedWeight(method, packed, scales, out_features, in_features, input_scale)


SMOOTHING_ALPHA = 0.5  # SmoothQuant's split of each channel's range between x and W


def smoothing_scale(input_max: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """s per input channel with max|x_j / s_j| and max|W_j * s_j| balanced (x W^T unchanged).
    On SmolLM2 (dtype_bench accuracy) it lifts w8a8's teacher-forced top-1 agreement with
    float32 from 0.76 to 0.91-0.95, and its perplexity from +13% to float32's (5.00-5.01
    vs 5.06)."""
    x_max = input_max.float().clamp_min(1e-5)
    w_max = w.abs().amax(dim=0).clamp_min(1e-5)
    return (x_max**SMOOTHING_ALPHA / w_max ** (1 - SMOOTHING_ALPHA)).clamp_min(1e-5)


def dequantize(qw: QuantizedWeight) -> torch.Tensor:
    """The float32 weight [out, in] the packed form computes with (for tests and accuracy)."""
    if qw.method == "fp16":
        weight, _ = torch.ops.quantized.linear_unpack_fp16(qw.packed)
        return weight.float()
    if qw.method == "w8a8_int8":
        weight, _ = torch.ops.quantized.linear_unpack(qw.packed)
        weight = weight.dequantize()
        return weight if qw.input_scale is None else weight * qw.input_scale
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
    return _pack_int4(q.view(out_features, in_features), scale, lo)


def _pack_int4(
    codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """codes [out, in] in 0..15 with w = minimum + code * scale per group of 32 ([out,
    in / 32] each) in the kernel's packing and (scale, zero) layout."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    zero = minimum + 8 * scale  # the kernel computes (q - 8) * scale + zero
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
    return packed, scales_and_zeros.to(_COMPUTE)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[rows, cols / 2] bytes -> [rows, cols] codes 0..15: column 2j from the low nibble,
    2j + 1 from the high one (gguf_convert.pack_nibbles' layout)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def int4_from_blocks(
    codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor
) -> QuantizedWeight:
    """The int4 weight of given 4-bit blocks (a GGUF Q4_0 / Q4_1 tensor's own, see
    gguf_convert.int4_blocks): codes [out, in] in 0..15, w = minimum + code * scale per group
    of 32 ([out, in / 32] each). The kernel holds scale and zero in bfloat16, so a float16
    block scale is rounded to 8 bits of mantissa (as quantize's are)."""
    out_features, in_features = codes.shape
    if in_features != INT4_GROUP_SIZE * scale.shape[1] or scale.shape != minimum.shape:
        raise ValueError(
            f"int4 blocks: codes {tuple(codes.shape)} do not match scales "
            f"{tuple(scale.shape)} in groups of {INT4_GROUP_SIZE}"
        )
    packed, scales = _pack_int4(codes, scale.float(), minimum.float())
    return QuantizedWeight("int4", packed, scales, out_features, in_features)


def quantized_engine() -> str | None:
    """The quantized-kernel library torch has here for w8a8_int8 (None: none)."""
    engines = torch.backends.quantized.supported_engines
    return next((e for e in ("fbgemm", "qnnpack") if e in engines), None)


def _quantize_w8a8(w: torch.Tensor) -> tuple[Any, torch.Tensor]:
    engine = quantized_engine()
    if engine is None:
        raise ValueError("w8a8_int8 needs torch's fbgemm (x86) or qnnpack (ARM) kernels")
    if torch.backends.quantized.engine != engine:
        torch.backends.quantized.engine = engine
    scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
    zero_points = torch.zeros(w.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # torch marks quantized tensors deprecated; still here
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch.quantize_per_channel(w, scale.double(), zero_points, 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qweight, None)
    return packed, scale


FP16_MAX = 65504.0


def fp16_weights_available() -> bool:
    """Whether torch has fbgemm's float16-weight matmul here (x86 builds)."""
    return "fbgemm" in torch.backends.quantized.supported_engines


def fits_fp16(w: torch.Tensor) -> bool:
    """Whether every value of w is inside float16's range (method "fp16" needs it)."""
    return bool(w.abs().amax() <= FP16_MAX)


def vocab_quantization(method: str) -> str:
    """The vocabulary projection's method under `method`. int8 weight-only under int4, as
    llama.cpp's 4-bit files keep it at 8 bits: its error reaches every logit. Under
    w8a8_int8, float16 weight-only where fbgemm has it (else int8): int8 activations there
    moved top-1 tokens of SmolLM2 (agreement 0.84 with float32)."""
    if method == "w8a8_int8" and fp16_weights_available():
        return "fp16"
    return "int8" if method in ("int4", "w8a8_int8") else method


def _pack_fp16(w: torch.Tensor) -> Any:
    """fbgemm's float16 packing of w (the caller checks fits_fp16: values beyond it pack as
    inf)."""
    if torch.backends.quantized.engine != "fbgemm":
        torch.backends.quantized.engine = "fbgemm"
    return torch.ops.quantized.linear_prepack_fp16(w, None)
