"""The float forms: plain (F.linear, HF's exact operations; for the vocabulary on CPU a
transposed copy from a few rows on), oneDNN-packed (CPU bfloat16), and a bfloat16 copy for
steps of few rows beside float32 weights (CPUs without native bfloat16)."""

from __future__ import annotations

import itertools
import weakref

import torch
import torch.nn.functional as F
from torch import Tensor

from ...weight_plan import WeightPlan
from .base import PLAIN_SPEC, LinearSpec, MaybeTensor, WeightForm, activation, add_bias_residual

# The row count oneDNN lays the weight out for. 32 favours decode: 1-64 rows stream 1.5-1.65x
# faster than from a plain weight; 512-1024-row prefill chunks run ~10% slower than plain.
PACK_BATCH_HINT = 32


class PlainWeight(WeightForm):
    name = "plain"

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    @classmethod
    def from_weight(
        cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
    ) -> PlainWeight:
        if spec.is_vocab and plan.transposed_vocab_rows:
            return TransposedWeight(weight, plan.transposed_vocab_rows)
        return cls(weight)

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        y = F.linear(x, self.weight, bias)
        return y if residual is None else residual + y

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes


class TransposedWeight(PlainWeight):
    """Plain below min_rows rows; from there x @ W^T with W^T a contiguous copy [in, out],
    made at the first such step: on CPU a weight as wide as a vocabulary then streams
    row-major, faster than F.linear's. The vocabulary projection's plain form on CPU."""

    def __init__(self, weight: torch.Tensor, min_rows: int):
        super().__init__(weight)
        self.min_rows = min_rows
        self.transposed: torch.Tensor | None = None

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        if x.shape[0] < self.min_rows:
            return super().matmul(x, bias, residual)
        if self.transposed is None:
            self.transposed = self.weight.t().contiguous()  # [in, out]
        return add_bias_residual(x @ self.transposed, bias, residual)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes + (0 if self.transposed is None else self.transposed.nbytes)


class PackedWeight(WeightForm):
    """oneDNN's blocked layout (CPU bfloat16, an opaque mkldnn tensor): a plain bf16 weight
    is re-laid out inside every CPU matmul, a packed one streams as it is, which is most of a
    decode step's time. The bias, the residual add, silu and the gate * up product run inside
    the matmul; gate|up is packed as two weights so that silu runs inside the gate's and the
    product inside the up's. A compiled step multiplies through the stemma:: ops below, which
    name the weight by a number (Dynamo cannot take an opaque tensor as a graph input)."""

    name = "packed"
    folds_norms = True  # a norm's scale then costs nothing (its linear's weight holds it)

    def __init__(self, packed: torch.Tensor, up: torch.Tensor | None = None):
        self.packed = packed
        self.up = up  # gated: the up half (packed is then the gate)
        self.handle = _hold(self, packed)  # the compiled step's name for each weight
        self.up_handle = None if up is None else _hold(self, up)

    @classmethod
    def from_weight(
        cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
    ) -> PackedWeight:
        w = weight.detach()
        if not spec.is_gated:
            return cls(_pack(w))
        inter = w.shape[0] // 2
        return cls(_pack(w[:inter].contiguous()), _pack(w[inter:].contiguous()))

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        if residual is None:
            return _by_number(x, self.handle, bias, "none")
        return _by_number_binary(x, residual, self.handle, bias, "add")

    def gated(self, x: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
        gate_bias, up_bias = (None, None) if bias is None else bias.chunk(2)
        gate = _by_number(x, self.handle, gate_bias, "swish" if act == "silu" else "none")
        gate = gate if act == "silu" else activation(gate, act)
        return _by_number_binary(x, gate, self.up_handle, up_bias, "mul")

    @property
    def nbytes(self) -> int:
        parts = [self.packed] if self.up is None else [self.packed, self.up]
        return sum(p.numel() * p.element_size() for p in parts)


# The packed weights a compiled step multiplies by, by number; each leaves with its form.
_HELD: dict[int, Tensor] = {}


def _hold(form: PackedWeight, packed: Tensor) -> int:
    """The lowest number no live form holds. A number is a constant of the compiled graph,
    part of Inductor's cache key, so a model's weights take the same numbers at every start
    whatever came before them in the process: a start that first measured the weight plan
    (its trial forms, gone by then, had taken 0-72 from an ever-growing count) cached graphs
    that a start reusing the kept verdicts never asked for, and compiled them again."""
    number = next(n for n in itertools.count() if n not in _HELD)
    _HELD[number] = packed
    weakref.finalize(form, _HELD.pop, number, None)
    return number


# `int weight`, not the SymInt torch would infer: a weight's number is a constant of the graph.
@torch.library.custom_op(
    "stemma::packed_linear",
    mutates_args=(),
    schema="(Tensor x, int weight, Tensor? bias, str act) -> Tensor",
)
def packed_linear(x: Tensor, weight: int, bias: Tensor | None, act: str) -> Tensor:
    """_linear_pointwise by the packed weight held as number `weight`."""
    return _linear_pointwise(x, _HELD[weight], bias, act)


@packed_linear.register_fake
def _(x: Tensor, weight: int, bias: Tensor | None, act: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], _HELD[weight].shape[0]))


@torch.library.custom_op(
    "stemma::packed_linear_binary",
    mutates_args=(),
    schema="(Tensor x, Tensor other, int weight, Tensor? bias, str op) -> Tensor",
)
def packed_linear_binary(
    x: Tensor, other: Tensor, weight: int, bias: Tensor | None, op: str
) -> Tensor:
    """x W^T + b, then `op` ("add" or "mul") with `other`, W the packed weight `weight`."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, _HELD[weight], bias, op)


@packed_linear_binary.register_fake
def _(x: Tensor, other: Tensor, weight: int, bias: Tensor | None, op: str) -> Tensor:
    return x.new_empty((*x.shape[:-1], _HELD[weight].shape[0]))


def _by_number(x: Tensor, weight: int, bias: MaybeTensor, act: str) -> Tensor:
    """packed_linear: through the op inside a compiled step, directly in an eager one."""
    if torch.compiler.is_compiling():
        return torch.ops.stemma.packed_linear(x, weight, bias, act)
    return _linear_pointwise(x, _HELD[weight], bias, act)


def _by_number_binary(x: Tensor, other: Tensor, weight: int, bias: MaybeTensor, op: str) -> Tensor:
    """packed_linear_binary: through the op inside a compiled step, directly in an eager one."""
    if torch.compiler.is_compiling():
        return torch.ops.stemma.packed_linear_binary(x, other, weight, bias, op)
    return torch.ops.mkldnn._linear_pointwise.binary(x, other, _HELD[weight], bias, op)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] re-laid out in oneDNN's blocked format."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_BATCH_HINT)


def _linear_pointwise(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, act: str
) -> torch.Tensor:
    """act(x W^T + b) with W packed; act "none" or "swish" (silu), applied in the matmul."""
    y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]), packed, bias, act, [], "")
    return y.view(*x.shape[:-1], y.shape[-1])


class SmallStepWeight(WeightForm):
    """A float32 weight and a bfloat16 copy for steps of at most max_rows rows, on CPUs whose
    bfloat16 matmul is not native: there torch's bfloat16 matrix-vector kernel streams half
    float32's bytes and wins at few rows, while more rows take the float32 GEMM (the plain
    form, so for the vocabulary its transposed copy)."""

    name = "small_steps"

    def __init__(self, small: torch.Tensor, max_rows: int, large: PlainWeight):
        self.small = small
        self.max_rows = max_rows
        self.large = large
        self.weight = large.weight

    @classmethod
    def from_weight(
        cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
    ) -> SmallStepWeight:
        large = PlainWeight.from_weight(weight, plan, spec)
        return cls(weight.detach().to(torch.bfloat16), plan.small_step_rows, large)

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        if x.shape[0] > self.max_rows:
            return self.large.matmul(x, bias, residual)
        y = F.linear(x.to(torch.bfloat16), self.small).to(x.dtype)
        return add_bias_residual(y, bias, residual)

    @property
    def nbytes(self) -> int:
        return self.small.nbytes + self.large.nbytes
