"""ModelConfig: the shape of a Llama-family decoder, read from a HF config.json dict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if archs[0] not in SUPPORTED_ARCHS:
            raise ValueError(f"unsupported architecture {archs[0]!r}; supported: {SUPPORTED_ARCHS}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {cfg['hidden_act']!r}; only 'silu'")
        scaling = cfg.get("rope_scaling") or {}
        rope_params = cfg.get("rope_parameters") or {}
        rope_type = scaling.get("rope_type", scaling.get("type")) or rope_params.get("rope_type")
        if rope_type not in (None, "default"):
            raise ValueError(f"unsupported rope scaling {rope_type!r}")
        num_heads = cfg["num_attention_heads"]
        is_qwen2 = archs[0] == "Qwen2ForCausalLM"
        attention_bias = bool(cfg.get("attention_bias", False))
        return ModelConfig(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // num_heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            # transformers 5 keeps theta in rope_parameters; older configs at the top level.
            rope_theta=float(rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            max_position=cfg.get("max_position_embeddings", 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
        )
