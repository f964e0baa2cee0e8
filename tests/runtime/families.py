"""Tiny random checkpoints of every supported family, built with transformers' own config and
model classes in a temp dir (no download). Sizes are chosen so each family's switch acts on
the test prompts: windows of 8-12 positions, RoPE scalings whose original length the
prompts' decode steps cross, soft caps small enough to bend random scores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..fixtures import build_tiny_checkpoint

GEMMA: dict[str, Any] = dict(
    head_dim=16,
    sliding_window=8,
    layer_types=["sliding_attention", "full_attention"],
    query_pre_attn_scalar=24,  # not head_dim: the scale must come from it
    pad_token_id=0,
)

# family -> (transformers config class name, its arguments beyond TINY_CONFIG)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": (
        "LlamaConfig",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            "tie_word_embeddings": True,  # as Llama 3.2 1B/3B
        },
    ),
    "llama-linear": (
        "LlamaConfig",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    ),
    "llama-dynamic": (
        "LlamaConfig",
        {
            "max_position_embeddings": 32,  # decode steps past it rescale
            "rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
        },
    ),
    "qwen2.5-yarn": (
        "Qwen2Config",
        {
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True}),
    "mistral": ("MistralConfig", {"sliding_window": 8}),
    "gemma2": (
        "Gemma2Config",
        {**GEMMA, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0},
    ),
    "gemma3": (
        "Gemma3TextConfig",
        {
            **GEMMA,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 2.0},
            },
        },
    ),
    "phi3": (
        "Phi3Config",
        {
            # HF's Phi-3 recomputes a whole sequence with the long factors once it grows past
            # the original length; stemma switches per position, so the tests stay inside it.
            "max_position_embeddings": 128,
            "original_max_position_embeddings": 48,
            "sliding_window": 12,
            "pad_token_id": 0,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,  # as Phi-4-mini: 8 of 16 dims rotate
                "short_factor": [1.0, 1.1, 1.3, 1.6],
                "long_factor": [1.0, 2.0, 4.0, 9.0],
                "original_max_position_embeddings": 48,
            },
        },
    ),
}


def build_family(out: Path, family: str, seed: int = 0) -> Path:
    """A tiny random `family` checkpoint with the tiny BPE tokenizer, saved into out."""
    config_name, extra = FAMILIES[family]
    return build_tiny_checkpoint(out, config_name, seed, **extra)


def hf_attention(config: dict[str, Any]) -> str:
    """The attention HF runs a family's reference on: its default (SDPA), or eager where
    soft-capping needs it."""
    return "eager" if "attn_logit_softcapping" in config else "sdpa"
