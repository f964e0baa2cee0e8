"""Every weight form multiplies as the plain weight does (within its rounding), adds the bias
and the residual, and holds fewer bytes where it is meant to; the plan names exactly the
forms there are and travels to other ranks whole."""

from __future__ import annotations

import pytest
import torch
from stemma.runtime.dtype_policy import can_pack_bf16_weights
from stemma.runtime.models.weights import FORMS, LinearSpec, PlainWeight, build_form
from stemma.runtime.weight_plan import LINEAR_FORMS, VOCAB_FORMS, WeightPlan

# Relative error bound of each form against float32 (bfloat16 inputs or weights: ~2^-8).
TOLERANCE = {"plain": 1e-6, "small_steps": 2e-2, "fp16": 2e-3, "int8": 3e-2, "int4": 2e-1}
TOLERANCE["w8a8_int8"] = 5e-2


def _plan(name: str) -> WeightPlan:
    rows = 4 if name == "small_steps" else 0
    return WeightPlan(name, "plain", small_step_rows=rows, transposed_vocab_rows=8)


@pytest.mark.parametrize("name", [n for n in LINEAR_FORMS if n != "packed"])
@pytest.mark.parametrize("rows", [1, 4, 9])
def test_each_form_adds_bias_and_residual_like_plain(name, rows):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=g) * 0.05
    bias, x = torch.randn(48, generator=g), torch.randn(rows, 64, generator=g)
    residual = torch.randn(rows, 48, generator=g)
    form = build_form(name, w, _plan(name))
    assert form.name == name
    ref = torch.nn.functional.linear(x, w, bias) + residual
    got = form.matmul(x, bias, residual)
    assert got.dtype == torch.float32 and got.shape == (rows, 48)
    tol = TOLERANCE[name] * ref.abs().max().item()
    torch.testing.assert_close(got, ref, atol=tol, rtol=0)
    gate, up = (x @ w.t()).chunk(2, dim=-1)
    gated = form.gated(x, None, "silu")
    torch.testing.assert_close(gated, torch.nn.functional.silu(gate) * up, atol=tol, rtol=0)
    if name in ("fp16", "int8", "int4", "w8a8_int8"):
        assert form.nbytes < w.nbytes
    else:
        assert form.nbytes >= w.nbytes


@pytest.mark.skipif(not can_pack_bf16_weights(), reason="no oneDNN bfloat16 kernels here")
def test_packed_form_fuses_what_plain_computes_apart():
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(64, 32, generator=g) * 0.05).to(torch.bfloat16)
    bias = torch.randn(64, generator=g).to(torch.bfloat16)
    x = torch.randn(5, 32, generator=g).to(torch.bfloat16)
    residual = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    plain = PlainWeight(w)
    packed = FORMS["packed"].from_weight(w, WeightPlan("packed", "packed"))
    gated = FORMS["packed"].from_weight(w, WeightPlan(), LinearSpec(is_gated=True))
    assert packed.weight is None and packed.nbytes == w.nbytes
    for got, ref in [
        (packed.matmul(x, bias, residual), plain.matmul(x, bias, residual)),
        (gated.gated(x, bias, "silu"), plain.gated(x, bias, "silu")),
        (gated.gated(x, None, "gelu"), plain.gated(x, None, "gelu")),
    ]:
        torch.testing.assert_close(got.float(), ref.float(), atol=0.05, rtol=0.02)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,  # oneDNN packs float32 on every x86 CPU
        pytest.param(
            torch.bfloat16,
            marks=pytest.mark.skipif(not can_pack_bf16_weights(), reason="no bf16 packing here"),
        ),
    ],
)
def test_packed_form_compiles_to_the_kernels_it_runs_eager(dtype):
    """Dynamo cannot take a packed (opaque) weight as a graph input: a compiled step
    multiplies by it through stemma:: ops that name it by number, calling the same oneDNN
    kernels, so a compiled matmul, residual add and gate * up give eager's values, at any
    row count (symbolic); the number is dropped with its form."""
    import gc
    import sys

    from stemma.runtime.models.weights import dense

    g = torch.Generator().manual_seed(3)
    w = (torch.randn(64, 32, generator=g) * 0.05).to(dtype)
    bias = torch.randn(64, generator=g).to(dtype)
    forms = [
        FORMS["packed"].from_weight(w, WeightPlan("packed", "packed")),
        FORMS["packed"].from_weight(w, WeightPlan(), LinearSpec(is_gated=True)),
    ]
    numbers = (forms[0].handle, forms[1].handle, forms[1].up_handle)

    def step(x, residual):
        plain, gated = forms
        return (
            plain.matmul(x, bias, residual),
            plain.matmul(x),
            gated.gated(x, None, "silu"),
            gated.gated(x, bias, "gelu"),
        )

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    depth = sys.getrecursionlimit()
    try:
        for rows in (1, 3, 17):
            x = torch.randn(rows, 32, generator=g).to(dtype)
            residual = torch.randn(rows, 64, generator=g).to(dtype)
            want, got = step(x, residual), compiled(x, residual)
            for a, b in zip(got[:3], want[:3]):
                assert torch.equal(a, b)
            torch.testing.assert_close(got[3], want[3])  # gelu: Inductor's, after the kernel
    finally:  # Inductor lifts the limit for good; the server's body bounds in later tests
        sys.setrecursionlimit(depth)  # rely on it (as CompiledDecode.build restores it)
    assert all(n in dense._HELD for n in numbers)
    forms.clear()
    del step, compiled
    torch._dynamo.reset()  # its graphs hold the forms
    gc.collect()
    assert not any(n in dense._HELD for n in numbers)


def test_the_vocabulary_form_transposes_from_its_row_limit_and_fp16_falls_back():
    w = torch.randn(40, 16)
    vocab = LinearSpec(is_vocab=True)
    form = build_form("plain", w, WeightPlan(transposed_vocab_rows=8), vocab)
    form.matmul(torch.randn(7, 16))
    assert form.transposed is None  # below the limit: F.linear on the weight as loaded
    x = torch.randn(8, 16)
    torch.testing.assert_close(form.matmul(x), x @ w.t())
    assert form.transposed.shape == (16, 40) and form.nbytes == 2 * w.nbytes
    assert type(build_form("plain", w, WeightPlan(), vocab)) is PlainWeight
    huge = w.clone()
    huge[0, 0] = 1e6  # beyond float16: the weight stays as it is
    assert build_form("fp16", huge, WeightPlan("fp16", "fp16"), vocab).weight is huge


def test_the_plan_names_every_form_and_round_trips():
    assert tuple(FORMS) == LINEAR_FORMS and set(VOCAB_FORMS) <= set(FORMS)
    plan = WeightPlan("small_steps", "small_steps", 2, 8, "steps of <= 2 rows (measured)")
    assert WeightPlan.from_json(plan.to_json()) == plan
    with pytest.raises(ValueError, match="vocabulary form 'int4'"):
        WeightPlan("int4", "int4")
    with pytest.raises(ValueError, match="small_step_rows=0"):
        WeightPlan("small_steps", "small_steps")


def test_few_rows_form_takes_its_few_form_up_to_the_limit():
    from stemma.runtime.models.weights.few_rows import FewRowsWeight

    torch.manual_seed(0)
    w = torch.randn(64, 32)
    plan = _plan("int4")
    few, many = build_form("int4", w, plan), build_form("plain", w, plan)
    form = FewRowsWeight(few, 2, many)
    for rows, want in ((1, few), (2, few), (3, many), (9, many)):
        x, res = torch.randn(rows, 32), torch.randn(rows, 64)
        assert torch.equal(form.matmul(x, None, res), want.matmul(x, None, res))
        assert torch.equal(form.gated(x, None, "silu"), want.gated(x, None, "silu"))
    assert form.nbytes == few.nbytes + many.nbytes and form.weight is w
    with pytest.raises(TypeError, match="pairs two built forms"):
        FewRowsWeight.from_weight(w, plan)
    # A norm's scale folded into `many` is multiplied into `few`'s input instead.
    scale = torch.rand(32) + 0.5
    scaled = FewRowsWeight(few, 2, many, scale)
    x = torch.randn(2, 32)
    assert torch.equal(scaled.matmul(x), few.matmul(x * scale))
    assert torch.equal(scaled.gated(x, None, "silu"), few.gated(x * scale, None, "silu"))
    x = torch.randn(3, 32)
    assert torch.equal(scaled.matmul(x), many.matmul(x))


def test_a_steps_cost_jumps_at_limits_and_at_the_int_kernels_row_blocks():
    """Where the draft budget prices rows apart (layers.cost_row_limits): torch's int4 / int8
    CPU kernels multiply 4 rows a pass over the weight, so a step of 5 rows costs about one
    of 8; a form's own row limit is an edge too, and the float forms add none."""
    from stemma.runtime.models.layers import Linear, cost_row_limits, form_row_limits
    from stemma.runtime.models.weights.base import BLOCK_EDGE_ROWS
    from stemma.runtime.models.weights.few_rows import FewRowsWeight

    torch.manual_seed(0)
    w = torch.randn(64, 32)
    plan = _plan("int4")
    int4, int8, plain = (build_form(n, w, plan) for n in ("int4", "int8", "plain"))
    assert int4.cost_edges() == int8.cost_edges() == set(range(4, BLOCK_EDGE_ROWS, 4))
    assert plain.cost_edges() == set()
    assert FewRowsWeight(int4, 8, plain).cost_edges() == {4, 8}
    assert FewRowsWeight(int4, 6, plain).cost_edges() == {4, 6}
    assert FewRowsWeight(int4, 2, plain).cost_edges() == {2}
    model = torch.nn.ModuleList([Linear(32, 64, False, torch.float32) for _ in range(2)])
    model[0].hold(FewRowsWeight(int4, 8, plain))
    model[1].hold(FewRowsWeight(int8, 6, plain))
    assert form_row_limits(model) == [6, 8]
    assert cost_row_limits(model) == [4, 6, 8]


def test_own_blocks_rows_stop_at_the_first_loss():
    """The decision from injected timings: the own form wins at 1 and 2 rows, loses at 4; by
    a margin, a win must be that much faster."""
    from stemma.runtime.models.weights.few_rows import MAX_OWN_ROWS, crossover_rows

    asked = []

    def own(rows: int) -> float:
        asked.append(rows)
        return {1: 1.0, 2: 1.5, 4: 3.0, 8: 0.1}[rows]

    assert crossover_rows(own, lambda rows: 2.0, 0.0) == 2
    assert asked == [1, 2, 4]  # 8 is never measured after the loss at 4
    assert crossover_rows(lambda r: 3.0, lambda r: 2.0, 0.0) == 0
    assert crossover_rows(lambda r: 1.0, lambda r: 2.0, 0.0) == MAX_OWN_ROWS
    assert crossover_rows(own, lambda rows: 2.0, 0.3) == 1  # 1.5 is not 30% under 2.0


def test_the_plan_takes_own_blocks_only_where_they_won():
    plan = WeightPlan("packed", "packed")
    lost = plan.with_own_blocks("int4", 0, "the GGUF")
    assert (lost.own_form, lost.own_rows) == ("", 0)
    assert lost.reason == "the GGUF's own int4 blocks measured slower than packed"
    won = plan.with_own_blocks("int4", 4, "the GGUF")
    assert (won.own_form, won.own_rows, won.linear_form) == ("int4", 4, "packed")
    assert "steps of <= 4 rows multiply the GGUF's own int4 blocks" in won.reason
    assert WeightPlan.from_json(won.to_json()) == won
    with pytest.raises(ValueError, match="own form 'int4'"):
        WeightPlan("packed", "packed", own_form="int4")
    with pytest.raises(ValueError, match="own form 'int8'"):
        WeightPlan("packed", "packed", own_form="int8", own_rows=2)
    vocab = won.with_own_blocks("int8", 2, "the GGUF", vocab=True)
    assert (vocab.own_vocab_form, vocab.own_vocab_rows, vocab.own_rows) == ("int8", 2, 4)
    assert "the vocabulary: steps of <= 2 rows multiply the GGUF's own int8 weights" in vocab.reason
    assert WeightPlan.from_json(vocab.to_json()) == vocab
    slower = plan.with_own_blocks("int8", 0, "the GGUF", vocab=True)
    assert slower.own_vocab_form == "" and "measured slower than packed" in slower.reason
    with pytest.raises(ValueError, match="own vocabulary form 'int4'"):
        WeightPlan("packed", "packed", own_vocab_form="int4", own_vocab_rows=2)
