"""ModelConfig.from_hf: each family's switches, and one-line refusals of what is not built."""

from __future__ import annotations

import pytest
from stemma.runtime.config import EngineConfig
from stemma.runtime.executor.model_runner import ModelRunner
from stemma.runtime.models.config import ARCHITECTURES, ModelConfig
from stemma.runtime.models.loader import load_model

from ..fixtures import MODEL_CLASSES, TINY_CONFIG
from .families import FAMILIES, build_family


def hf_dict(family: str) -> dict:
    import transformers

    config_name, extra = FAMILIES[family]
    cfg = getattr(transformers, config_name)(**{**TINY_CONFIG, "vocab_size": 384, **extra})
    return {**cfg.to_dict(), "architectures": [MODEL_CLASSES[config_name]]}


def test_family_switches():
    gemma2 = ModelConfig.from_hf(hf_dict("gemma2"))
    assert (gemma2.gemma_norms, gemma2.hidden_act, gemma2.attn_softcap) == (
        True,
        "gelu_pytorch_tanh",
        2.0,
    )
    assert gemma2.attn_scale == 24**-0.5 and gemma2.tie_word_embeddings
    assert [gemma2.layer_window(i) for i in range(2)] == [8, None]
    gemma3 = ModelConfig.from_hf(hf_dict("gemma3"))
    assert gemma3.qk_norm and [gemma3.layer_rope(i) for i in range(2)] == [
        "sliding_attention",
        "full_attention",
    ]
    qwen3 = ModelConfig.from_hf(hf_dict("qwen3"))
    assert (qwen3.head_dim, qwen3.qk_norm, qwen3.qkv_bias) == (32, True, False)
    mistral = ModelConfig.from_hf(hf_dict("mistral"))
    assert [mistral.layer_window(i) for i in range(2)] == [8, 8]
    assert ModelConfig.from_hf(hf_dict("phi3")).fused_checkpoint
    dynamic = ModelConfig.from_hf(hf_dict("llama-dynamic"))
    assert (dynamic.rope_max_position, dynamic.max_position) == (32, 64)


def test_old_style_rope_scaling_and_gemma3_local_base():
    """Checkpoints written before transformers 5 keep rope_theta / rope_scaling at the top."""
    cfg = {**hf_dict("llama3"), "rope_theta": 500000.0}
    cfg["rope_scaling"] = cfg.pop("rope_parameters")
    cfg["rope_scaling"]["type"] = cfg["rope_scaling"].pop("rope_type")
    assert ModelConfig.from_hf(cfg).rope_parameters["full_attention"]["rope_type"] == "llama3"
    g3 = hf_dict("gemma3")
    del g3["rope_parameters"], g3["layer_types"]
    g3.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2)
    mc = ModelConfig.from_hf(g3)
    assert mc.layer_types == ("sliding_attention", "full_attention")
    assert mc.rope_parameters["sliding_attention"]["rope_theta"] == 1e4


@pytest.mark.parametrize(
    "change, named",
    [
        ({"architectures": ["MixtralForCausalLM"]}, "'MixtralForCausalLM'"),
        ({"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}}, "'mrope'"),
        ({"hidden_act": "relu"}, "'relu'"),
        ({"quantization_config": {"quant_method": "awq"}}, "quantization_config"),
        ({"layer_types": ["chunked_attention"] * 2}, "chunked_attention"),
    ],
)
def test_unsupported_fails_in_one_line_naming_it(change, named):
    with pytest.raises(ValueError) as err:
        ModelConfig.from_hf({**hf_dict("llama3"), **change})
    message = str(err.value)
    assert named in message and "\n" not in message and "supported" in message


def test_every_architecture_is_listed_when_refusing():
    with pytest.raises(ValueError, match=", ".join(ARCHITECTURES)):
        ModelConfig.from_hf({**hf_dict("llama3"), "architectures": ["GPT2LMHeadModel"]})


def test_triton_backend_refuses_a_sliding_window_model(tmp_path):
    ckpt = build_family(tmp_path, "mistral")
    cfg = EngineConfig(model=str(ckpt), dtype="float32", attention_backend="triton")
    with pytest.raises(ValueError, match="sliding_window"):
        ModelRunner(cfg, load_model(str(ckpt)))
