"""ModelConfig: the switches of the one decoder, read from a HF config.json dict.

Each supported architecture is a row of ARCHITECTURES (which switches it turns on); every
config field that would change the computation and that the decoder does not implement is
refused at load with its name, never ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# Implemented RoPE types: "default", transformers' ROPE_INIT_FUNCTIONS (linear ... llama3), and
# "freq_factors" (per-frequency divisors, how GGUF stores Llama 3's scaling; models/rope.py).
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "freq_factors")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass(frozen=True, slots=True)
class ArchSpec:
    """What an architecture turns on in the decoder."""

    activations: tuple[str, ...] = ("silu",)
    qkv_bias: bool = False  # q/k/v biases always (Qwen2), whatever attention_bias says
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3, Gemma3)
    gemma: bool = False  # norms scale by 1 + w, embeddings by sqrt(hidden), sandwich norms
    fused_checkpoint: bool = False  # qkv_proj / gate_up_proj stored fused (Phi-3)


ARCHITECTURES: dict[str, ArchSpec] = {
    "LlamaForCausalLM": ArchSpec(),
    "MistralForCausalLM": ArchSpec(),
    "Qwen2ForCausalLM": ArchSpec(qkv_bias=True),
    "Qwen3ForCausalLM": ArchSpec(qk_norm=True),
    "Gemma2ForCausalLM": ArchSpec(activations=("gelu_pytorch_tanh",), gemma=True),
    "Gemma3ForCausalLM": ArchSpec(activations=("gelu_pytorch_tanh",), gemma=True, qk_norm=True),
    "Phi3ForCausalLM": ArchSpec(fused_checkpoint=True),
}

# Fields whose presence (with a value other than these) changes the model in ways the decoder
# does not implement.
UNSUPPORTED_UNLESS = {
    "quantization_config": (None,),
    "use_bidirectional_attention": (None, False),
    "attention_chunk_size": (None,),
    "num_experts": (None, 0),
    "num_local_experts": (None, 0),
}


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
    max_position: int  # the longest context (past HF's max_position_embeddings for dynamic)
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    arch: str = "LlamaForCausalLM"
    hidden_act: str = "silu"
    # layer type -> HF rope parameters (rope_type, rope_theta, factor, ...), one per type used.
    rope_parameters: dict[str, dict[str, Any]] | None = None
    layer_types: tuple[str, ...] = ()  # per layer, "full_attention" | "sliding_attention"
    sliding_window: int | None = None  # keys within this many positions (the query's own too)
    qk_norm: bool = False
    gemma_norms: bool = False
    embed_scale: float | None = None
    attn_scale: float | None = None  # softmax scale; None: head_dim ** -0.5
    attn_softcap: float | None = None  # tanh soft-capping of attention scores (Gemma 2)
    final_softcap: float | None = None  # ... and of the final logits
    fused_checkpoint: bool = False
    rope_max_position: int = 0  # HF's max_position_embeddings, which RoPE scalings read

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )

    def layer_window(self, layer_id: int) -> int | None:
        """The sliding window of this layer, None where it attends to the whole context."""
        if not self.layer_types or self.layer_types[layer_id] != "sliding_attention":
            return None
        return self.sliding_window

    def layer_rope(self, layer_id: int) -> str:
        """The key of this layer's RoPE in rope_parameters."""
        rope = self.rope_parameters or {"full_attention": {}}
        lt = self.layer_types[layer_id] if self.layer_types else "full_attention"
        return lt if lt in rope else next(iter(rope))

    @staticmethod
    def from_hf(cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if archs[0] not in ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {archs[0]!r}; supported: {', '.join(ARCHITECTURES)}"
            )
        arch, spec = archs[0], ARCHITECTURES[archs[0]]
        for key, allowed in UNSUPPORTED_UNLESS.items():
            if cfg.get(key) not in allowed:
                raise ValueError(
                    f"unsupported config field {key}={cfg[key]!r} ({arch}); supported "
                    f"architectures: {', '.join(ARCHITECTURES)} without {key}"
                )
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or spec.activations[0]
        if act == "gelu_tanh":
            act = "gelu_pytorch_tanh"
        if act not in spec.activations:
            raise ValueError(
                f"unsupported hidden_act {act!r} for {arch}; supported: {spec.activations}"
            )
        num_heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
        num_layers = cfg["num_hidden_layers"]
        layer_types = _layer_types(arch, cfg, num_layers)
        rope = _rope_parameters(arch, cfg, set(layer_types))
        max_position = cfg.get("max_position_embeddings", 2048)
        for params in rope.values():
            if params["rope_type"] == "dynamic":  # scales positions past max_position
                max_position = max(max_position, int(max_position * params["factor"]))
        attention_bias = bool(cfg.get("attention_bias", False))
        hidden = cfg["hidden_size"]
        return ModelConfig(
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=num_layers,
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope[next(iter(rope))]["rope_theta"]),
            max_position=max_position,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", spec.gemma)),
            qkv_bias=spec.qkv_bias or attention_bias,
            o_bias=attention_bias and not spec.qkv_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            arch=arch,
            hidden_act=act,
            rope_parameters=rope,
            layer_types=tuple(layer_types),
            sliding_window=cfg.get("sliding_window")
            if "sliding_attention" in layer_types
            else None,
            qk_norm=spec.qk_norm,
            gemma_norms=spec.gemma,
            # As HF: sqrt(hidden) held as a float32 scalar, widened to the model's dtype.
            embed_scale=_float32(math.sqrt(hidden)) if spec.gemma else None,
            attn_scale=cfg["query_pre_attn_scalar"] ** -0.5 if spec.gemma else None,
            attn_softcap=cfg.get("attn_logit_softcapping") if spec.gemma else None,
            final_softcap=cfg.get("final_logit_softcapping") if spec.gemma else None,
            fused_checkpoint=spec.fused_checkpoint,
            rope_max_position=cfg.get("max_position_embeddings", 2048),
        )


def _float32(x: float) -> float:
    import struct

    return struct.unpack("f", struct.pack("f", x))[0]


def _layer_types(arch: str, cfg: dict[str, Any], num_layers: int) -> list[str]:
    """Per layer, full or sliding attention; derived as transformers does when absent."""
    window = cfg.get("sliding_window")
    if cfg.get("layer_types"):
        types = list(cfg["layer_types"])
    elif arch in ("MistralForCausalLM", "Phi3ForCausalLM"):
        types = ["sliding_attention" if window else "full_attention"] * num_layers
    elif arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        first = cfg.get("max_window_layers", num_layers) if cfg.get("use_sliding_window") else None
        types = [
            "sliding_attention" if first is not None and i >= first else "full_attention"
            for i in range(num_layers)
        ]
    elif arch == "Gemma2ForCausalLM":
        types = [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)
        ]
    elif arch == "Gemma3ForCausalLM":
        pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6
        types = [
            "sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(num_layers)
        ]
    else:
        types = ["full_attention"] * num_layers
    bad = sorted(set(types) - set(LAYER_TYPES))
    if bad or len(types) != num_layers:
        raise ValueError(f"unsupported layer_types {bad or types}; supported: {LAYER_TYPES}")
    if "sliding_attention" in types and not window:
        raise ValueError("layer_types names sliding_attention but sliding_window is not set")
    return types


def _rope_parameters(arch: str, cfg: dict[str, Any], used: set[str]) -> dict[str, dict]:
    """Layer type -> HF rope parameters, from transformers 5's rope_parameters or the older
    rope_theta / rope_scaling / rope_local_base_freq fields."""
    params = cfg.get("rope_parameters")
    if params and set(params) <= set(LAYER_TYPES):  # per layer type already (Gemma 3)
        per_type = {lt: dict(p) for lt, p in params.items()}
    else:
        base = dict(params or cfg.get("rope_scaling") or {})
        if "type" in base and "rope_type" not in base:
            base["rope_type"] = base.pop("type")
        base.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
        base.setdefault("rope_type", "default")
        per_type = {"full_attention": base}
        if arch == "Gemma3ForCausalLM":
            local = cfg.get("rope_local_base_freq", 10000.0)
            per_type["sliding_attention"] = {"rope_type": "default", "rope_theta": local}
    out = {}
    for lt, p in per_type.items():
        if lt not in used and len(per_type) > 1:
            continue
        if p.get("rope_type", "default") not in ROPE_TYPES:
            raise ValueError(
                f"unsupported rope_type {p.get('rope_type')!r} ({arch}); supported: {ROPE_TYPES}"
            )
        if "mrope_section" in p:
            raise ValueError(f"unsupported rope field mrope_section ({arch}); text RoPE only")
        p.setdefault("rope_type", "default")
        p.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
        if "partial_rotary_factor" in cfg:
            p.setdefault("partial_rotary_factor", cfg["partial_rotary_factor"])
        if "original_max_position_embeddings" in cfg:
            p.setdefault(
                "original_max_position_embeddings", cfg["original_max_position_embeddings"]
            )
        out[lt] = p
    return out
