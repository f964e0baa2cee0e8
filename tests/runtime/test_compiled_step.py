"""The compiled step (--enable-torch-compile): the layers' work around attention compiled by
Inductor gives what eager gives in float64 (to the float32 rounding of the norms), at batch 1
and in a batch (the symbolic row count), for a Llama and a Gemma-style model (sandwich norms,
q/k norms); a weight form Inductor cannot lower runs eager, and model info says why."""

from __future__ import annotations

import re
import sys

import pytest
from stemma.runtime.config import EngineConfig
from stemma.runtime.engine import Engine

from .families import build_family

PROMPTS = [[5, 9, 23, 7, 11, 40], [3, 3, 8], [17, 2, 90, 61, 4, 4, 12, 30]]


def run(ckpt, compiled: bool, tmp_path) -> tuple[list, list]:
    cfg = {
        "dtype": "float64",
        "kv_cache_mb": 16,
        "enable_torch_compile": compiled,
        "cache_dir": str(tmp_path / "cache"),
        "disable_radix_cache": True,
    }
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=str(ckpt), **cfg) as e:
        assert (e.get_model_info()["torch_compile_s"] is not None) == compiled
        alone = e.generate(input_ids=PROMPTS[0], sampling_params=params, return_logprob=True)
        batch = e.generate(
            input_ids=PROMPTS, sampling_params=[params] * len(PROMPTS), return_logprob=True
        )
    outs = [alone, *batch]
    return [o["output_ids"] for o in outs], [
        [entry[0] for entry in o["meta_info"]["output_token_logprobs"]] for o in outs
    ]


@pytest.mark.parametrize("family", ["llama", "gemma"])
def test_compiled_layers_equal_eager_in_float64(family, tiny_llama_dir, tmp_path_factory):
    if family == "llama":
        ckpt = tiny_llama_dir
    else:
        ckpt = build_family(tmp_path_factory.mktemp("tiny-gemma3"), "gemma3")
    tmp = tmp_path_factory.mktemp("compiled")
    depth = sys.getrecursionlimit()
    ids_eager, lp_eager = run(ckpt, False, tmp)
    ids_compiled, lp_compiled = run(ckpt, True, tmp)
    assert sys.getrecursionlimit() == depth  # Inductor's raise undone (the server relies on it)
    assert ids_compiled == ids_eager
    # The norms normalize in float32 (as HF's do, even in a float64 model); Inductor's fused
    # reduction sums in another order, so values agree to float32 rounding, not bit for bit.
    for a, b in zip(lp_compiled, lp_eager):
        assert a == pytest.approx(b, abs=2e-5)


def test_flags_and_limits():
    cfg = EngineConfig(enable_torch_compile=True, torch_compile_max_bs=16)
    assert cfg.torch_compile_max_bs == 16
    with pytest.raises(ValueError, match="torch_compile_max_bs must be >= 1, got 0"):
        EngineConfig(enable_torch_compile=True, torch_compile_max_bs=0)
    with pytest.raises(ValueError, match="enable_torch_compile with tp_size > 1"):
        EngineConfig(enable_torch_compile=True, tp_size=2)


def test_a_form_that_does_not_compile_runs_eager_and_says_why(tiny_llama_dir, monkeypatch):
    """Inductor refuses some forms (oneDNN-packed bfloat16 wants frozen weights): the engine
    then runs eager, and model info names the form and the error."""
    from stemma.runtime.executor import compiled

    def refuse(self, model):
        raise RuntimeError("LoweringException: the weight must be a constant")

    monkeypatch.setattr(compiled.CompiledLayers, "warm_up", refuse)
    with Engine(model_path=str(tiny_llama_dir), kv_cache_mb=8, enable_torch_compile=True) as e:
        info = e.get_model_info()
        out = e.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 3})
    assert info["torch_compile_s"] is None
    note = info["torch_compile_note"]
    assert re.match(r"off: the '\w+' linears did not compile \(RuntimeError: Lowering", note)
    assert len(out["output_ids"]) == 3


def test_warm_up_reaches_past_each_row_limit_of_a_form(tiny_llama_dir):
    """A linear that changes kernel past N rows (the GGUF's own blocks, weights/few_rows.py)
    is warmed up at N + 1 rows too, so the other side's compile fails, if it does, at start
    (the engine then runs eager and says why) and never inside a step."""
    import torch
    from stemma.runtime.executor.compiled import CompiledLayers
    from stemma.runtime.models.layers import Linear
    from stemma.runtime.models.loader import load_decoder
    from stemma.runtime.models.weights import Int4Weight
    from stemma.runtime.weight_plan import WeightPlan

    net, _ = load_decoder(tiny_llama_dir, torch.float32, "cpu")
    plan = WeightPlan(own_form="int4", own_rows=2)
    linears = [m for m in net.layers.modules() if isinstance(m, Linear)]
    net.apply_plan(plan, {m: Int4Weight.from_weight(m.weight, plan) for m in linears})
    seen: list[int] = []

    def before(layer, x, cos, sin):  # records the rows instead of compiling
        seen.append(x.shape[0])
        return layer.before_attention(x, cos, sin)

    for max_rows, rows in ((64, [1, 2, 3]), (2, [1, 2])):  # 3 rows past what it takes
        compiled = CompiledLayers(type(net.layers[0]), max_rows)
        compiled._before, compiled._after = before, lambda layer, o, x: x
        seen.clear()
        compiled.warm_up(net)
        assert sorted(set(seen)) == rows
