"""Two forms of one weight, chosen per step by its rows: a checkpoint's own quantized blocks
for steps of few rows (decode, where a step streams every weight once and fewer bytes win),
the dtype's form for the rest (prefill, large batches, where the matmul's arithmetic wins).
`own_int4_rows` measures where the first stops winning on this machine, `own_int8_vocab_rows`
the same for a vocabulary projection held per-row int8 (a GGUF's Q8_0 output).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from ... import dtype_policy
from ...weight_plan import WeightPlan
from . import build_form
from .base import PLAIN_SPEC, LinearSpec, MaybeTensor, WeightForm
from .quantized import Int4Weight, Int8Weight

MAX_OWN_ROWS = 8  # the most rows measured: past 8 the dtype's GEMM won on both CPU kinds
# How much faster the own form must measure, over its matmuls alone, to be chosen. For the
# int4 blocks that timing understates what whole steps gain: the dtype's form streams 4x
# their bytes, and the rest of a step pays for that too. On a 2-core AMD EPYC (AVX512-BF16),
# over SmolLM2's layer shapes, the blocks took 0.89-0.93x packed bfloat16's time at 8 rows
# and 1.02-1.11x at 5, while decode steps with the blocks up to 8 rows against up to 4 took
# 0.91x (batch 8) and 0.93x (batch 5) eager, 0.69x and 0.68x compiled (bench/config_ab.py),
# 0.85-0.88x and 0.86-0.96x compiled in one process. A margin of 10% kept them to 4 rows
# there. So they are chosen wherever they measure faster at all; starts on one machine still
# decide alike near a tie, since the verdict is kept (measured.py).
INT4_WIN_MARGIN = 0.0
# The vocabulary's per-row int8 against its form: what whole steps gain beyond the timing is
# not measured there, so a near tie keeps the vocabulary's form.
VOCAB_WIN_MARGIN = 0.1


class FewRowsWeight(WeightForm):
    """`few` multiplies steps of at most max_rows rows, `many` the others. input_scale: the
    scale of a norm folded into `many` (RMSNorm.fold_into), which `few`'s blocks could not
    take: its steps multiply their input by it first, as the norm would have."""

    name = "few_rows"

    def __init__(
        self,
        few: WeightForm,
        max_rows: int,
        many: WeightForm,
        input_scale: torch.Tensor | None = None,
    ):
        self.few, self.max_rows, self.many = few, max_rows, many
        self.input_scale = input_scale
        self.weight = many.weight

    @classmethod
    def from_weight(cls, weight: Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC):
        raise TypeError("FewRowsWeight pairs two built forms (DecoderForCausalLM.apply_plan)")

    def matmul(self, x: Tensor, bias: MaybeTensor = None, residual: MaybeTensor = None) -> Tensor:
        if x.shape[0] > self.max_rows:
            return self.many.matmul(x, bias, residual)
        return self.few.matmul(self._scaled(x), bias, residual)

    def gated(self, x: Tensor, bias: MaybeTensor, act: str) -> Tensor:
        if x.shape[0] > self.max_rows:
            return self.many.gated(x, bias, act)
        return self.few.gated(self._scaled(x), bias, act)

    def compiled_rows(self) -> int | None:
        if self.many.compiled_rows() is None:
            return self.few.compiled_rows()
        return self.max_rows if self.few.compiled_rows() is None else 0

    def cost_edges(self) -> set[int]:
        few = {n for n in self.few.cost_edges() if n < self.max_rows}
        return few | {self.max_rows} | {n for n in self.many.cost_edges() if n > self.max_rows}

    def _scaled(self, x: Tensor) -> Tensor:
        return x if self.input_scale is None else x * self.input_scale

    @property
    def nbytes(self) -> int:
        return self.few.nbytes + self.many.nbytes


def crossover_rows(
    few_time: Callable[[int], float], many_time: Callable[[int], float], margin: float
) -> int:
    """dtype_policy.crossover_rows up to MAX_OWN_ROWS, winning by `margin`."""
    return dtype_policy.crossover_rows(few_time, many_time, MAX_OWN_ROWS, margin)


def layer_shapes(hidden: int, inter: int, q_size: int, kv_size: int) -> tuple[tuple[int, int], ...]:
    """The [out, in] shapes of one decoder layer's linears as the model holds them: q, k and
    v merged, the output projection, gate and up merged, down."""
    return ((q_size + 2 * kv_size, hidden), (hidden, q_size), (2 * inter, hidden), (hidden, inter))


@functools.cache  # a property of this machine, shape and plan: measured once per process
def own_int4_rows(
    plan: WeightPlan,
    shapes: tuple[tuple[int, int], ...],
    dtype: torch.dtype,
    weight_bytes: int = 128 << 20,
) -> int:
    """crossover_rows of int4 blocks against the plan's linear form in `dtype`, over random
    weights of a layer's linear shapes (`shapes`, layer_shapes), as many layers as make
    `weight_bytes` in `dtype` (at least one), so that every timed pass streams them from
    memory as a model's step does, with no margin (INT4_WIN_MARGIN says why). Both matter, on
    a 2-core AMD EPYC (AVX512-BF16, a 32 MB L3) at 8 rows: over [inter, hidden] matrices
    alone the blocks took 0.94x packed bfloat16's time, over SmolLM2-135M's four shapes
    0.77-0.93x (over 32 MB of bfloat16, whose passes run back to back can partly hit the
    cache, a median of 0.92x; over 128 MB with the best of 5, 0.84x; about a second). On a
    2-core Xeon with AMX, over [inter, hidden] matrices: 0.78 / 0.90 / 1.25 / 2.33 ms at 1 / 2
    / 4 / 8 rows against 1.88 / 1.84 / 1.82 / 1.89 ms (8 rows won in another start there)."""
    layer_bytes = dtype.itemsize * sum(n * k for n, k in shapes)
    own: list[WeightForm] = []
    many: list[WeightForm] = []
    copies = max(1, weight_bytes // layer_bytes)
    widths = [k for _, k in shapes] * copies
    for shape in shapes * copies:
        w = torch.empty(shape).uniform_(-0.05, 0.05)  # one at a time: the forms are held
        own.append(Int4Weight.from_weight(w, plan))
        many.append(build_form(plan.linear_form, w.to(dtype), plan))
    return crossover_rows(_timer(own, widths, dtype), _timer(many, widths, dtype), INT4_WIN_MARGIN)


@functools.cache
def own_int8_vocab_rows(plan: WeightPlan, hidden: int, vocab: int, dtype: torch.dtype) -> int:
    """crossover_rows of a per-row int8 vocabulary projection against the plan's vocabulary
    form in `dtype`, at the model's shape (random weights)."""
    spec = LinearSpec(is_vocab=True)
    weight = torch.randn(vocab, hidden) * 0.02
    own = [Int8Weight.from_weight(weight, plan, spec)]
    many = [build_form(plan.vocab_form, weight.to(dtype), plan, spec)]
    return crossover_rows(
        _timer(own, [hidden], dtype), _timer(many, [hidden], dtype), VOCAB_WIN_MARGIN
    )


def _timer(
    forms: list[WeightForm], widths: list[int], dtype: torch.dtype
) -> Callable[[int], float]:
    """Seconds for `rows` rows through every form, each given an input of its width."""

    def time_rows(rows: int) -> float:
        inputs = [torch.randn(rows, width, dtype=dtype) for width in widths]
        return dtype_policy.best_time(lambda: [f.matmul(x) for f, x in zip(forms, inputs)], 5)

    return time_rows
