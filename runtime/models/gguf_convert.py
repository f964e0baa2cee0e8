"""Convert a GGUF checkpoint (llama / qwen2 architectures) into a HF-style directory.

The directory holds config.json, model.safetensors (dequantized float32, HF tensor names
and HF q/k row order) and the tokenizer files, so every later load reads one format.
llama.cpp stores q/k rows of llama models permuted for its interleaved RoPE; we undo that.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

GGUF_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_tensor_name(gguf_name: str) -> str:
    if gguf_name in GGUF_TENSOR_NAMES:
        return GGUF_TENSOR_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if m is None or m.group(2) not in GGUF_LAYER_NAMES:
        raise ValueError(f"unknown GGUF tensor {gguf_name!r}")
    return f"model.layers.{m.group(1)}.{GGUF_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def _unpermute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's convert-time permute of q/k rows (weights or biases)."""
    # llama.cpp wrote rows as (head, half, pair) -> (head, pair, half); swap back.
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf_config(reader: Any) -> dict[str, Any]:
    """A HF config.json dict from GGUF metadata."""

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {list(ARCHITECTURES)}"
        )
    hidden = field(f"{arch}.embedding_length")
    num_heads = field(f"{arch}.attention.head_count")
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    vocab = field(f"{arch}.vocab_size") or len(field("tokenizer.ggml.tokens"))
    return {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": field(f"{arch}.feed_forward_length"),
        "num_hidden_layers": field(f"{arch}.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv", num_heads),
        "head_dim": field(f"{arch}.attention.key_length", hidden // num_heads),
        "rms_norm_eps": field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": field(f"{arch}.rope.freq_base", 10000.0),
        "max_position_embeddings": field(f"{arch}.context_length", 2048),
        "tie_word_embeddings": not has_output,
        "hidden_act": "silu",
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config.json, model.safetensors and tokenizer files for gguf_path into out_dir."""
    import gguf
    import torch
    from safetensors.torch import save_file

    reader = gguf.GGUFReader(str(gguf_path))
    cfg = read_gguf_config(reader)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        name = hf_tensor_name(t.name)
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape(tuple(reversed([int(d) for d in t.shape])))
        if cfg["model_type"] == "llama" and t.name.split(".")[-2] in ("attn_q", "attn_k"):
            is_q = t.name.split(".")[-2] == "attn_q"
            w = _unpermute(w, cfg["num_attention_heads"] if is_q else cfg["num_key_value_heads"])
        tensors[name] = torch.from_numpy(np.ascontiguousarray(w))
    save_file(tensors, str(out_dir / "model.safetensors"))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    _convert_tokenizer(gguf_path, reader, out_dir)


def _convert_tokenizer(gguf_path: Path, reader: Any, out_dir: Path) -> None:
    # transformers knows how to rebuild a fast BPE tokenizer from GGUF vocab + merges.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    template = reader.fields.get("tokenizer.chat_template")
    token_types = reader.fields["tokenizer.ggml.token_type"].contents()
    meta = {
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "chat_template": template.contents() if template is not None else None,
        # GGUF token type 3 = control token (never part of ordinary text).
        "control_token_ids": [i for i, kind in enumerate(token_types) if kind == 3],
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(meta, indent=2))
