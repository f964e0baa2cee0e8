"""Write a HF checkpoint directory as a float32 GGUF with the gguf package, the way llama.cpp's
converter lays it out: its tensor names, llama q/k rows permuted, Gemma norms as 1 + w, Llama
3's scaling as rope_freqs, Phi-3's as rope_factors_long/short, BPE vocabulary and merges."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

GGUF_ARCH = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Phi3ForCausalLM": "phi3",
}
LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.qkv_proj": "attn_qkv",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf: str, arch: str) -> str:
    top = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    if hf in top:
        return top[hf]
    _, _, i, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    gemma = {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    }
    names = {**LAYER, "post_attention_layernorm": "ffn_norm"}
    if arch.startswith("gemma"):
        names.update(gemma)
    return f"blk.{i}.{names[module]}.{kind}"


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert-time permute of q/k rows."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _llama3_freq_factors(rope: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs for rope_type llama3."""
    base, factor = rope["rope_theta"], rope["factor"]
    low, high = rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_gguf(
    ckpt: Path, out: Path, quant: str | None = None, vocab_quant: str | None = None
) -> Path:
    """quant: "Q4_0" / "Q4_1" stores every linear weight (a 2-D *_proj tensor whose rows
    split into blocks of 32) in that type, quantized by the gguf package as llama.cpp's
    quantizer would; vocab_quant ("Q8_0") the same for the embedding and output tensors;
    everything else stays float32."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((ckpt / "config.json").read_text())
    arch = GGUF_ARCH[cfg["architectures"][0]]
    w = gguf.GGUFWriter(str(out), arch)
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg["rope_parameters"]
    if arch == "gemma3":
        w.add_sliding_window_pattern(2)  # the tiny model's [sliding, full]
        rope = rope["full_attention"]
    w.add_rope_freq_base(rope["rope_theta"])
    rope_dims = int(head_dim * rope.get("partial_rotary_factor", 1.0))
    w.add_rope_dimension_count(rope_dims)
    if cfg.get("sliding_window"):
        w.add_sliding_window(cfg["sliding_window"])
    if rope["rope_type"] in ("linear", "yarn"):
        w.add_rope_scaling_type(getattr(gguf.RopeScalingType, rope["rope_type"].upper()))
        w.add_rope_scaling_factor(rope["factor"])
        if "original_max_position_embeddings" in rope:
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if rope["rope_type"] == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_freq_factors(rope, head_dim))
    if rope["rope_type"] == "longrope":
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    if arch.startswith("gemma"):
        if cfg.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        if cfg.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    _add_tokenizer(w, ckpt)
    for name, t in load_file(str(ckpt / "model.safetensors")).items():
        t = t.astype(np.float32)
        kind = name.split(".")[-2]
        if arch == "llama" and kind in ("q_proj", "k_proj"):
            t = _permute(t, heads if kind == "q_proj" else kv_heads)
        if arch.startswith("gemma") and name.endswith("norm.weight"):
            t = t + 1.0
        t = np.ascontiguousarray(t)
        is_vocab = name in ("model.embed_tokens.weight", "lm_head.weight")
        chosen = vocab_quant if is_vocab else quant if name.endswith("proj.weight") else None
        if chosen is not None and t.ndim == 2 and t.shape[-1] % 32 == 0:
            kind = gguf.GGMLQuantizationType[chosen]
            w.add_tensor(_gguf_name(name, arch), gguf.quants.quantize(t, kind), raw_dtype=kind)
        else:
            w.add_tensor(_gguf_name(name, arch), t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _add_tokenizer(w, ckpt: Path) -> None:
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    tokens = sorted({**vocab, **specials}.items(), key=lambda kv: kv[1])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([t for t, _ in tokens])
    w.add_token_types([3 if t in specials else 1 for t, _ in tokens])
    merges = tok["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_bos_token_id(specials["<|im_start|>"])
    w.add_eos_token_id(specials["<|im_end|>"])
