"""dtype "auto" resolves by what the device runs natively; explicit slow dtypes warn with a
measured ratio; bad names are refused."""

from __future__ import annotations

import logging

import pytest
import torch
from stemma.runtime.config import EngineConfig
from stemma.runtime.dtype_policy import auto_dtype, cpu_has_native_bf16, resolve_dtype


@pytest.mark.parametrize("native", [True, False])
def test_auto_on_cpu_is_bfloat16_only_where_native(native, monkeypatch):
    """Both CPU kinds on any machine: the capability is faked, the decision is real."""
    import stemma.runtime.dtype_policy as policy

    monkeypatch.setattr(policy, "cpu_has_native_bf16", lambda: native)
    choice = auto_dtype("cpu")
    assert choice.name == ("bfloat16" if native else "float32")
    assert choice.reason.startswith("auto: ")
    assert resolve_dtype("auto", "cpu") == choice


def test_the_capability_probe_answers_a_bool():
    assert cpu_has_native_bf16() in (True, False)


def test_engine_config_defaults_to_auto_and_refuses_unknown_names():
    assert EngineConfig().dtype == "auto"
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(dtype="fp8")
    with pytest.raises(ValueError, match="got 'half'"):
        resolve_dtype("half", "cpu")


def test_explicit_bfloat16_without_native_support_warns_with_a_measured_ratio(caplog, monkeypatch):
    import stemma.runtime.dtype_policy as policy

    monkeypatch.setattr(policy, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(policy, "measured_slowdown", lambda *args, **kw: 9.5)
    with caplog.at_level(logging.WARNING, logger="stemma.dtype"):
        choice = resolve_dtype("bfloat16", "cpu", hidden=256, inter=512)
    assert choice.torch_dtype == torch.bfloat16
    [record] = caplog.records
    assert "measured 9.5x slower than in float32" in record.getMessage()
    assert "dtype='auto'" in record.getMessage()
    assert choice.reason.startswith("explicit; ")


def test_explicit_bfloat16_where_native_is_kept_without_measuring(caplog, monkeypatch):
    import stemma.runtime.dtype_policy as policy

    monkeypatch.setattr(policy, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(policy, "measured_slowdown", lambda *a, **k: pytest.fail("measured"))
    with caplog.at_level(logging.WARNING, logger="stemma.dtype"):
        assert resolve_dtype("bfloat16", "cpu").reason == "explicit"
    assert not caplog.records


def test_the_measurements_run_on_tiny_sizes(real_speed_measurements):
    """The measuring code itself, on a few KB of weights: it returns a verdict, whatever
    the verdict is on this CPU (the decisions are tested with injected verdicts)."""
    from stemma.runtime.dtype_policy import (
        bfloat16_small_step_rows,
        fp16_weights_win,
        measured_slowdown,
    )

    assert measured_slowdown(torch.bfloat16, torch.float32, 32, 64, rows=2) > 0
    assert bfloat16_small_step_rows(32, 64, max_rows=2, weight_bytes=1 << 16) in (0, 1, 2)
    assert fp16_weights_win(32, 64, weight_bytes=1 << 16) in (True, False)


def test_fp16_weights_never_win_without_fbgemm(real_speed_measurements, monkeypatch):
    """Where torch has no fbgemm (ARM builds) the float16-weight plan is out without a
    measurement; the engine list is faked, so this branch runs on x86 too."""
    import stemma.runtime.dtype_policy as policy

    monkeypatch.setattr(
        type(torch.backends.quantized), "supported_engines", property(lambda self: ["qnnpack"])
    )
    monkeypatch.setattr(policy, "best_time", lambda fn: pytest.fail("measured"))
    assert policy.fp16_weights_win(32, 64, weight_bytes=1 << 15) is False


def test_explicit_native_dtype_is_kept_without_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="stemma.dtype"):
        choice = resolve_dtype("float64", "cpu")
    assert choice.name == "float64" and choice.reason == "explicit"
    assert not caplog.records


@pytest.mark.parametrize("plan", ["native", "float32", "small_steps"])
def test_engine_reports_its_resolved_dtype(tiny_llama_dir, plan, monkeypatch):
    """Each way dtype "auto" can resolve on a CPU, on any CPU: the capability is faked and
    the measured verdict injected (bfloat16 without native support runs torch's slower
    path, on a tiny model)."""
    import stemma.runtime.dtype_policy as policy
    from stemma.runtime.engine import Engine

    monkeypatch.setattr(policy, "cpu_has_native_bf16", lambda: plan == "native")
    rows = 2 if plan == "small_steps" else 0
    monkeypatch.setattr(policy, "bfloat16_small_step_rows", lambda hidden, inter: rows)
    monkeypatch.setattr(policy, "available_memory_bytes", lambda: 8 << 30)
    with Engine(str(tiny_llama_dir), max_total_tokens=256) as engine:
        info = engine.get_model_info()
        assert info["dtype"] == auto_dtype("cpu").name
        assert info["dtype"] == ("bfloat16" if plan == "native" else "float32")
        assert info["dtype_reason"].startswith(auto_dtype("cpu").reason)
        assert ("<= 2 rows use a bfloat16 weight copy" in info["dtype_reason"]) == bool(rows)
        assert engine.runner.kv_pool.k[0].dtype == auto_dtype("cpu").torch_dtype
        down = engine.runner.model.layers[0].mlp.down_proj
        assert (down.form.name == "small_steps") == bool(rows)
        params = {"max_new_tokens": 3, "ignore_eos": True}
        out = engine.generate(input_ids=[[5, 9, 13]], sampling_params=params)
        assert len(out[0]["output_ids"]) == 3


def test_small_step_copies_serve_only_steps_of_few_rows(tiny_llama_dir):
    """A float32 model with bfloat16 copies for steps of <= 2 rows: such steps compute close
    to float32 (bfloat16 rounding of weights and inputs); larger steps are float32 exactly."""
    from stemma.runtime.models.loader import load_model
    from stemma.runtime.weight_plan import WeightPlan

    plain = load_model(str(tiny_llama_dir), torch.float32).model
    copied = load_model(str(tiny_llama_dir), torch.float32).model
    copied.apply_plan(WeightPlan("small_steps", "small_steps", small_step_rows=2))
    down = copied.layers[0].mlp.down_proj
    assert down.form.small.dtype == torch.bfloat16 and down.weight.dtype == torch.float32
    for rows in (1, 2, 3, 16):
        x = torch.randn(rows, down.weight.shape[1])
        ref = plain.layers[0].mlp.down_proj(x)
        got = down(x)
        if rows <= 2:
            assert not torch.equal(got, ref)
            torch.testing.assert_close(got, ref, atol=0.05 * ref.abs().max().item(), rtol=0)
        else:
            assert torch.equal(got, ref)
        h = torch.randn(rows, copied.cfg.hidden_size)
        logits, ref_logits = copied.lm_head(h), plain.lm_head(h)
        assert logits.dtype == torch.float32
        torch.testing.assert_close(logits, ref_logits, atol=0.05 * ref_logits.abs().max(), rtol=0)


def test_small_steps_are_planned_only_for_auto_float32_without_native_bf16():
    """With the measurements injected: a measured row limit is planned for auto float32 on
    a CPU without native bfloat16, and only there, and only if the copy fits in memory."""
    from stemma.runtime.weight_plan import Measured, plan_weights

    class NativeCPU:
        """A CPU with native bfloat16, whose speeds must not be measured."""

        can_pack = True

        @property
        def fp16_weights_win(self) -> bool:
            pytest.fail("measured")

        @property
        def small_step_rows(self) -> int:
            pytest.fail("measured")

    machine = Measured(small_step_rows=4, available_bytes=8 << 30)
    plain = plan_weights(None, "float32", "cpu", Measured())
    explicit = plan_weights(None, "float32", "cpu", machine, auto=False, weight_bytes=1 << 20)
    assert explicit == plain  # explicit: untouched
    f64 = plan_weights(None, "float64", "cpu", machine, auto=True, weight_bytes=1 << 20)
    assert f64 == plan_weights(None, "float64", "cpu", Measured())
    no_room = plan_weights(None, "float32", "cpu", machine, auto=True, weight_bytes=1 << 50)
    assert no_room.small_step_rows == 0
    planned = plan_weights(None, "float32", "cpu", machine, auto=True, weight_bytes=1 << 20)
    assert planned.small_step_rows == 4 and "<= 4 rows use a bfloat16 weight copy" in planned.reason
    never_won = Measured(small_step_rows=0, available_bytes=8 << 30)
    assert plan_weights(None, "float32", "cpu", never_won, auto=True) == plain  # bfloat16 never won
    # auto on a CPU with native bfloat16 resolved to bfloat16: nothing is measured
    assert plan_weights(None, "bfloat16", "cpu", NativeCPU(), auto=True).linear_form == "packed"


@pytest.mark.skipif(
    "fbgemm" not in torch.backends.quantized.supported_engines, reason="fbgemm is x86 only"
)
def test_fp16_weights_compute_float32_with_float16_rounded_weights(tiny_llama_dir):
    """The fp16 plan: every linear and the vocabulary projection multiply float32 inputs
    by float16-rounded weights in float32 (11 significant bits: close to float32, closer than
    the bfloat16 copy); a weight beyond float16's range stays float32."""
    from stemma.runtime.models.loader import load_model
    from stemma.runtime.weight_plan import WeightPlan

    plain = load_model(str(tiny_llama_dir), torch.float32).model
    half = load_model(str(tiny_llama_dir), torch.float32).model
    half.layers[1].mlp.down_proj.weight.data[0, 0] = 1e6  # beyond float16
    half.apply_plan(WeightPlan("fp16", "fp16"))
    down = half.layers[0].mlp.down_proj
    assert down.weight is None and down.form.name == "fp16"
    assert half.layers[1].mlp.down_proj.form.name == "plain"  # kept float32
    for rows in (1, 8, 64):
        x = torch.randn(rows, down.form.in_features)
        w = plain.layers[0].mlp.down_proj.weight
        got = down(x)
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, x @ w.half().float().t(), atol=1e-5, rtol=1e-5)
        assert (got - x @ w.t()).abs().max() <= 2e-3 * (x.abs() @ w.abs().t()).max()
        h = torch.randn(rows, half.cfg.hidden_size)
        ref_logits = plain.lm_head(h)
        torch.testing.assert_close(
            half.lm_head(h), ref_logits, atol=2e-3 * ref_logits.abs().max(), rtol=0
        )


def test_fp16_weights_are_planned_when_measured_faster():
    from stemma.runtime.weight_plan import Measured, plan_weights

    machine = Measured(fp16_weights_win=True, small_step_rows=2, available_bytes=8 << 30)
    planned = plan_weights(None, "float32", "cpu", machine, auto=True, weight_bytes=1 << 20)
    assert planned.linear_form == "fp16" and planned.small_step_rows == 0
    assert "float16 weights" in planned.reason
    explicit = plan_weights(None, "float32", "cpu", machine, auto=False, weight_bytes=1 << 20)
    assert explicit == plan_weights(None, "float32", "cpu", Measured())  # explicit
    slower = Measured(fp16_weights_win=False, small_step_rows=2, available_bytes=8 << 30)
    assert plan_weights(None, "float32", "cpu", slower, auto=True).linear_form != "fp16"


def test_the_own_blocks_measurement_runs_on_tiny_sizes(real_speed_measurements, monkeypatch):
    """It times a layer's own linear shapes (q/k/v merged, o, gate/up merged, down), whole
    layers of them: over [inter, hidden] matrices alone the blocks measured a tie at 8 rows
    where the model's step gained 1.36x from them."""
    from stemma.runtime.models.weights import few_rows
    from stemma.runtime.weight_plan import WeightPlan

    shapes = few_rows.layer_shapes(32, 64, 32, 16)
    assert shapes == ((64, 32), (32, 32), (128, 32), (32, 64))
    built: list[tuple[int, ...]] = []
    build = few_rows.Int4Weight.from_weight
    monkeypatch.setattr(
        few_rows.Int4Weight,
        "from_weight",
        staticmethod(lambda w, *rest: built.append(tuple(w.shape)) or build(w, *rest)),
    )
    layer_bytes = 4 * sum(n * k for n, k in shapes)  # in float32, the dtype here
    rows = few_rows.own_int4_rows(WeightPlan(), shapes, torch.float32, weight_bytes=3 * layer_bytes)
    assert rows in (0, 1, 2, 4, 8)
    assert built == list(shapes) * 3
    rows = few_rows.own_int8_vocab_rows(WeightPlan(), 32, 256, torch.float32)
    assert rows in (0, 1, 2, 4, 8)


def test_the_blocks_take_every_row_count_where_they_measure_faster(
    real_speed_measurements, monkeypatch
):
    """Injected timings, as torch's int4 kernel reads on a 2-core AMD EPYC against packed
    bfloat16 (4 rows a pass: dearer from 5 rows, then flat): at 8 rows the blocks measure
    0.91x, which decode steps of 8 rows gained far more from (INT4_WIN_MARGIN). The int4
    limit takes 8 rows; the vocabulary's int8, at the same timings, keeps its 10% margin."""
    from stemma.runtime.models.weights import few_rows
    from stemma.runtime.weight_plan import WeightPlan

    blocks = {1: 2.3, 2: 2.9, 4: 3.8, 8: 6.9}  # ms
    dtype_form = {1: 6.8, 2: 6.5, 4: 6.2, 8: 7.6}

    own = (few_rows.Int4Weight, few_rows.Int8Weight)

    def timer(forms, widths, dtype):
        table = blocks if isinstance(forms[0], own) else dtype_form
        return lambda rows: table[rows]

    monkeypatch.setattr(few_rows, "_timer", timer)
    few_rows.own_int4_rows.cache_clear()
    few_rows.own_int8_vocab_rows.cache_clear()
    shapes = few_rows.layer_shapes(32, 64, 32, 16)
    assert few_rows.own_int4_rows(WeightPlan(), shapes, torch.float32, weight_bytes=1) == 8
    assert few_rows.own_int8_vocab_rows(WeightPlan(), 32, 256, torch.float32) == 4
    blocks[8] = 7.7  # slower at 8 rows: the limit stays at 4
    few_rows.own_int4_rows.cache_clear()
    assert few_rows.own_int4_rows(WeightPlan(), shapes, torch.float32, weight_bytes=1) == 4
    few_rows.own_int4_rows.cache_clear()
    few_rows.own_int8_vocab_rows.cache_clear()
