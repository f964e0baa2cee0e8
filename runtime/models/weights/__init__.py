"""How a linear's weight is held and multiplied: one WeightForm class per form (base.py), the
float ones in dense.py (plain, oneDNN-packed, bfloat16 small-step copy) and the reduced ones
in quantized.py (float16 weights in a float32 matmul, int8, int4, w8a8). The weight plan
(runtime/weight_plan.py) names a form for the linears and one for the vocabulary projection;
DecoderForCausalLM.apply_plan builds them. A new format is one class here and its name there.
"""

from __future__ import annotations

import torch

from ...weight_plan import WeightPlan
from .base import PLAIN_SPEC, LinearSpec, WeightForm
from .dense import PackedWeight, PlainWeight, SmallStepWeight, TransposedWeight
from .quantized import INT4_GROUP_SIZE, Float16Weight, Int4Weight, Int8Weight, W8A8Weight

# One class for each name of weight_plan.LINEAR_FORMS (tests/runtime/test_weight_forms.py).
FORMS: dict[str, type[WeightForm]] = {
    form.name: form
    for form in (
        PlainWeight,
        PackedWeight,
        SmallStepWeight,
        Float16Weight,
        Int8Weight,
        Int4Weight,
        W8A8Weight,
    )
}


def build_form(
    name: str, weight: torch.Tensor, plan: WeightPlan, spec: LinearSpec = PLAIN_SPEC
) -> WeightForm:
    """`weight` held in the form named `name`; one the form cannot hold (beyond float16's
    range) stays plain."""
    form = FORMS[name]
    return (form if form.fits(weight) else PlainWeight).from_weight(weight, plan, spec)


def quantize(weight: torch.Tensor, name: str, input_max: torch.Tensor | None = None) -> WeightForm:
    """A float weight [out, in] (any float dtype) in the form `name` (tests, accuracy tools);
    input_max: a calibrated input range per channel, for forms that smooth by it."""
    if name not in FORMS:
        raise ValueError(f"weight form must be one of {tuple(FORMS)}, got {name!r}")
    return FORMS[name].from_weight(weight, WeightPlan(), LinearSpec(input_max=input_max))


__all__ = [
    "FORMS",
    "INT4_GROUP_SIZE",
    "Float16Weight",
    "Int4Weight",
    "Int8Weight",
    "LinearSpec",
    "PackedWeight",
    "PlainWeight",
    "SmallStepWeight",
    "TransposedWeight",
    "W8A8Weight",
    "WeightForm",
    "build_form",
    "quantize",
]
