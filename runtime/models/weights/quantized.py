"""The reduced forms, on torch's own packed CPU kernels (no hand-written GEMM).

fp16: float16 weights widened to float32 inside fbgemm's matmul (`quantized.linear_dynamic_fp16`),
      float32 activations and accumulation (dtype "auto"'s plan on CPUs without native
      bfloat16, runtime/weight_plan.py).
int8: symmetric per output channel, w = q * scale, q in [-127, 127] (`aten._weight_int8pack_mm`).
int4: asymmetric per group of 32 input columns, w = (q - 8) * scale + zero, q in [0, 15]
      (`aten._convert_weight_to_int4pack_for_cpu` / `aten._weight_int4pack_mm_for_cpu`).
      A group's scale and minimum are exactly GGUF Q4_1's block `d` and `m`, so a Q4_1
      checkpoint dequantized to float32 re-quantizes to its own codes.
      Both kernels are vectorized for bfloat16 activations only (float32 activations take a
      scalar loop, 10-50x slower on AVX2), so the input is cast to bfloat16 and back.
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
from typing import Any

import torch
from torch import Tensor

from ...weight_plan import WeightPlan
from .base import PLAIN_SPEC, LinearSpec, MaybeTensor, WeightForm, add_bias_residual

INT4_GROUP_SIZE = 32  # GGUF Q4_0 / Q4_1 block size
FP16_MAX = 65504.0
_COMPUTE = torch.bfloat16  # the int8 / int4 kernels' activations
SMOOTHING_ALPHA = 0.5  # SmoothQuant's split of each channel's range between x and W


class Float16Weight(WeightForm):
    name = "fp16"

    def __init__(self, packed: Any, out_features: int, in_features: int):
        self.packed = packed  # fbgemm's packed parameters (a torch ScriptObject)
        self.out_features, self.in_features = out_features, in_features

    @classmethod
    def fits(cls, weight: torch.Tensor) -> bool:
        """Every value inside float16's range (beyond it a value would pack as inf)."""
        return bool(weight.abs().amax() <= FP16_MAX)

    @classmethod
    def from_weight(
        cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
    ) -> Float16Weight:
        if torch.backends.quantized.engine != "fbgemm":
            torch.backends.quantized.engine = "fbgemm"
        w = weight.detach().to(torch.float32)
        return cls(torch.ops.quantized.linear_prepack_fp16(w, None), *w.shape)

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        xf = x if x.dtype == torch.float32 else x.float()
        y = torch.ops.quantized.linear_dynamic_fp16(xf, self.packed)
        y = y if x.dtype == torch.float32 else y.to(x.dtype)
        return add_bias_residual(y, bias, residual)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] the form computes with (tests, accuracy)."""
        weight, _ = torch.ops.quantized.linear_unpack_fp16(self.packed)
        return weight.float()

    @property
    def nbytes(self) -> int:
        return 2 * self.out_features * self.in_features


class Int8Weight(WeightForm):
    name = "int8"
    row_block = 4  # rows a pass of the kernel takes

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor):
        self.codes = codes  # [out, in] int8
        self.scales = scales  # [out] bf16

    @classmethod
    def from_weight(
        cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
    ) -> Int8Weight:
        w = weight.detach().to(torch.float32)
        # The bf16 scale is what the kernel multiplies by, so codes are rounded against it.
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12).to(_COMPUTE)
        q = torch.round(w / scale.float()[:, None]).clamp_(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scale)

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        y = torch.ops.aten._weight_int8pack_mm(x.to(_COMPUTE), self.codes, self.scales)
        return add_bias_residual(y.to(x.dtype), bias, residual)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] the kernel computes with (tests, accuracy)."""
        return _through_kernel(self, self.codes.shape[1])

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scales.nbytes


class Int4Weight(WeightForm):
    name = "int4"
    # SmolLM2's linears on a 2-core AMD EPYC: 3.5-5.8 ms for 1-4 rows, 10.7 ms for 5-8
    row_block = 4  # rows a pass of the kernel takes

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor, in_features: int):
        self.packed = packed  # torch's opaque CPU int4 packing
        self.scales_and_zeros = scales_and_zeros  # [in / group, out, 2] bf16
        self.in_features = in_features

    @classmethod
    def from_weight(
        cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
    ) -> Int4Weight:
        out_features, in_features = weight.shape
        if in_features % INT4_GROUP_SIZE:
            raise ValueError(
                f"int4 needs in_features divisible by {INT4_GROUP_SIZE}, got {in_features}"
            )
        w = weight.detach().to(torch.float32)
        groups = w.view(out_features, in_features // INT4_GROUP_SIZE, INT4_GROUP_SIZE)
        lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # [out, num_groups]
        scale = ((hi - lo) / 15).clamp_min(1e-12)
        q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp_(0, 15)
        return cls.from_blocks(q.view(out_features, in_features), scale, lo)

    @classmethod
    def from_blocks(
        cls, codes: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor
    ) -> Int4Weight:
        """Given 4-bit blocks (a GGUF Q4_0 / Q4_1 tensor's own, models/gguf_int4.py): codes
        [out, in] in 0..15, w = minimum + code * scale per group of 32 ([out, in / 32] each).
        The kernel holds scale and zero in bfloat16, so a float16 block scale is rounded to
        8 bits of mantissa (as from_weight's are)."""
        in_features = codes.shape[1]
        if in_features != INT4_GROUP_SIZE * scale.shape[1] or scale.shape != minimum.shape:
            raise ValueError(
                f"int4 blocks: codes {tuple(codes.shape)} do not match scales "
                f"{tuple(scale.shape)} in groups of {INT4_GROUP_SIZE}"
            )
        scale, minimum = scale.float(), minimum.float()
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
        zero = minimum + 8 * scale  # the kernel computes (q - 8) * scale + zero
        scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()
        return cls(packed, scales_and_zeros.to(_COMPUTE), in_features)

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        same = x.dtype == _COMPUTE  # a bfloat16 model's decode: no conversion calls at all
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x if same else x.to(_COMPUTE), self.packed, INT4_GROUP_SIZE, self.scales_and_zeros
        )
        return add_bias_residual(y if same else y.to(x.dtype), bias, residual)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] the kernel computes with (tests, accuracy)."""
        return _through_kernel(self, self.in_features)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_and_zeros.nbytes


def _through_kernel(form: Int8Weight | Int4Weight, in_features: int) -> torch.Tensor:
    eye = torch.eye(in_features, dtype=_COMPUTE)
    return form.matmul(eye).to(torch.float32).t().contiguous()


class W8A8Weight(WeightForm):
    name = "w8a8_int8"
    calibrated = True

    def __init__(
        self, packed: Any, scales: torch.Tensor, input_scale: torch.Tensor | None, num_codes: int
    ):
        self.packed = packed  # the quantized engine's packed parameters (a ScriptObject)
        self.scales = scales  # [out] f32
        self.input_scale = input_scale  # 1 / the smoothing scale [in], multiplied in first
        self.num_codes = num_codes  # int8 weights held: out * in

    @classmethod
    def from_weight(
        cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
    ) -> W8A8Weight:
        """spec.input_max: the calibrated largest input magnitude per channel, to smooth by."""
        engine = quantized_engine()
        if engine is None:
            raise ValueError("w8a8_int8 needs torch's fbgemm (x86) or qnnpack (ARM) kernels")
        if torch.backends.quantized.engine != engine:
            torch.backends.quantized.engine = engine
        w = weight.detach().to(torch.float32)
        input_scale = None
        if spec.input_max is not None:
            smooth = smoothing_scale(spec.input_max, w)
            w, input_scale = w * smooth, 1.0 / smooth
        scale = (w.abs().amax(dim=1) / 127).clamp_min(1e-12)
        zero_points = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # torch marks quantized tensors deprecated; still here
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(w, scale.double(), zero_points, 0, torch.qint8)
            packed = torch.ops.quantized.linear_prepack(qweight, None)
        return cls(packed, scale, input_scale, w.numel())

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        xf = x if x.dtype == torch.float32 else x.float()
        if self.input_scale is not None:
            xf = xf * self.input_scale
        if x.shape[0] == 1:
            y = torch.ops.quantized.linear_dynamic(xf, self.packed, True)
        else:  # rows scaled to one range: the kernel's one scale is then per row
            row_max = xf.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-12)
            y = torch.ops.quantized.linear_dynamic(xf / row_max, self.packed, True)
            y.mul_(row_max)
        y = y if x.dtype == torch.float32 else y.to(x.dtype)
        return add_bias_residual(y, bias, residual)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] the form computes with (tests, accuracy)."""
        weight, _ = torch.ops.quantized.linear_unpack(self.packed)
        weight = weight.dequantize()
        return weight if self.input_scale is None else weight * self.input_scale

    @property
    def nbytes(self) -> int:
        return self.num_codes + self.scales.nbytes


def quantized_engine() -> str | None:
    """The quantized-kernel library torch has here for w8a8_int8 (None: none)."""
    engines = torch.backends.quantized.supported_engines
    return next((e for e in ("fbgemm", "qnnpack") if e in engines), None)


def smoothing_scale(input_max: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """s per input channel with max|x_j / s_j| and max|W_j * s_j| balanced (x W^T unchanged).
    On SmolLM2 (dtype_bench accuracy) it lifts w8a8's teacher-forced top-1 agreement with
    float32 from 0.76 to 0.91-0.95, and its perplexity from +13% to float32's (5.00-5.01
    vs 5.06)."""
    x_max = input_max.float().clamp_min(1e-5)
    w_max = w.abs().amax(dim=0).clamp_min(1e-5)
    return (x_max**SMOOTHING_ALPHA / w_max ** (1 - SMOOTHING_ALPHA)).clamp_min(1e-5)
