"""WeightForm: how one linear's weight [out, in] is held and multiplied. A form is built once
from the float weight (`from_weight`) and then multiplies every step (`matmul`, with the
linear's bias and the residual added where its kernel adds them best)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ...weight_plan import WeightPlan

MaybeTensor = Tensor | None  # an optional bias or residual


class LinearSpec(NamedTuple):
    """What a form may need to know of its linear beside the weight."""

    is_vocab: bool = False  # the vocabulary projection
    is_gated: bool = False  # gate|up stacked: the output's halves become act(gate) * up
    input_max: torch.Tensor | None = None  # calibrated max |input| per channel [in]


# The rows up to which a form used at any count prices its kernel's row blocks apart (past
# them one linear fit per span serves, as the stairs matter less against the rows)
BLOCK_EDGE_ROWS = 16

PLAIN_SPEC = LinearSpec()  # a linear that is neither the vocabulary nor gated, uncalibrated


class WeightForm(ABC):
    name: ClassVar[str]  # the plan's name for it (runtime/weight_plan.py)
    # The norm before the linear may hand it its scale (RMSNorm.fold_into) before it is built.
    folds_norms: ClassVar[bool] = False
    # from_weight wants LinearSpec.input_max (executor/calibrate.py measures it).
    calibrated: ClassVar[bool] = False
    # The float weight, where the form multiplies by it; None where it holds another layout
    # (the linear then drops its own reference, so the float copy is freed).
    weight: torch.Tensor | None = None
    # A form that multiplies steps of at most this many rows by another kernel than larger
    # ones (a compiled step warms up both sides); None for one kernel at every size.
    max_rows: int | None = None
    # The rows its kernel multiplies in one pass over the weight (torch's int4 / int8 CPU
    # kernels take 4): a step's cost climbs in stairs of it, not by a constant per row.
    row_block: ClassVar[int | None] = None
    # Whether Inductor can compile its matmul (executor/compiled.py); steps whose linears
    # would multiply by a form that cannot run eager.
    compiles: ClassVar[bool] = True

    def compiled_rows(self) -> int | None:
        """The most rows whose matmul by this form compiles: None for any, 0 for none."""
        return None if self.compiles else 0

    def cost_edges(self) -> set[int]:
        """The row counts past which a step's matmul by this form costs a jump more: its
        max_rows, and the multiples of its row_block below that (below BLOCK_EDGE_ROWS where
        it takes any rows)."""
        edges = set() if self.max_rows is None else {self.max_rows}
        if self.row_block:
            top = BLOCK_EDGE_ROWS if self.max_rows is None else self.max_rows
            edges |= set(range(self.row_block, top, self.row_block))
        return edges

    @classmethod
    def fits(cls, weight: torch.Tensor) -> bool:
        """Whether this form can hold `weight` (a plan falls back to plain for one it cannot)."""
        return True

    @classmethod
    @abstractmethod
    def from_weight(
        cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
    ) -> WeightForm: ...

    @abstractmethod
    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        """x [rows, in] -> x W^T (+ bias) (+ residual) [rows, out], in x's dtype."""

    def gated(self, x: torch.Tensor, bias: torch.Tensor | None, act: str) -> torch.Tensor:
        """act(x G^T) * (x U^T) for W = [G; U] (act "silu" or "gelu", tanh-approximated)."""
        gate, up = self.matmul(x, bias).chunk(2, dim=-1)
        return activation(gate, act) * up

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes the form holds."""


def activation(gate: torch.Tensor, act: str) -> torch.Tensor:
    return F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")


def add_bias_residual(
    y: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None
) -> torch.Tensor:
    """For kernels that take neither: y + bias, then residual + y."""
    y = y if bias is None else y + bias
    return y if residual is None else residual + y
