"""Convert a GGUF checkpoint (llama / mistral, qwen2, qwen3, gemma2, gemma3, phi3) into a
HF-style directory, streaming tensor by tensor.

The directory holds config.json, model.safetensors (dequantized float32, HF tensor names and
HF q/k row order) and the tokenizer files, so every later load reads one format. The
safetensors header is computed from the GGUF's shapes first; then each tensor is dequantized,
written and dropped, so peak memory is about the largest tensor (bench/load_bench.py measures
it). llama.cpp's changes are undone: llama q/k rows permuted for its interleaved RoPE, Gemma
norms stored as 1 + w. RoPE factor tensors become config: Llama 3's rope_freqs
(rope_type "freq_factors", stemma's own: default frequencies divided by them) and Phi-3's
long/short factors (longrope).

Weights stored as Q4_0 or Q4_1 also keep their 4-bit blocks, in quantized/int4.safetensors:
per tensor its codes (two to a byte), and each block of 32's scale and minimum (w = min +
code * scale), so `--quantization int4` packs the file's own codes instead of re-quantizing
the float32 copy (models/weights/quantized.py, Int4Weight.from_blocks).
"""

from __future__ import annotations

import json
import re
import struct
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
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma's four norms per layer; ffn_norm is the one before the MLP there.
GEMMA_LAYER_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
}
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str:
    if gguf_name in GGUF_TENSOR_NAMES:
        return GGUF_TENSOR_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    names = {**GGUF_LAYER_NAMES, **(GEMMA_LAYER_NAMES if arch.startswith("gemma") else {})}
    if arch == "phi3":  # ffn_up holds gate|up stacked
        names["ffn_up"] = "mlp.gate_up_proj"
    if m is None or m.group(2) not in names:
        raise ValueError(f"unknown GGUF tensor {gguf_name!r} for architecture {arch!r}")
    return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"


def _unpermute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's convert-time permute of q/k rows (weights or biases)."""
    # llama.cpp wrote rows as (head, half, pair) -> (head, pair, half); swap back.
    half = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(t: Any) -> np.ndarray:
    """One GGUF tensor as float32 in HF's [out, in] shape."""
    import gguf

    w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    return w.reshape(tuple(reversed([int(d) for d in t.shape])))


CHUNK_BYTES = 16 << 20  # float32 rows dequantized at once: dequantize's temporaries are ~3x


def _dequantize_rows(t: Any) -> Any:
    """A tensor as float32 blocks of whole rows, in order (t.data: [rows, row bytes or
    values], so a slice of rows dequantizes alone)."""
    import gguf

    if t.data.ndim < 2:
        yield _dequantize(t)
        return
    row_values = int(t.shape[0])
    step = max(1, CHUNK_BYTES // (4 * row_values))
    for start in range(0, t.data.shape[0], step):
        block = gguf.quants.dequantize(t.data[start : start + step], t.tensor_type)
        yield block.reshape(-1, row_values)


INT4_BLOCKS_FILE = "quantized/int4.safetensors"  # not *.safetensors at the top: not weights
TENSOR_TYPES_FILE = "quantized/types.json"  # each tensor's GGUF type ("Q8_0", ...) by HF name
GGUF_INT4_TYPES = ("Q4_0", "Q4_1")  # 32 codes of 4 bits per block, one scale (and minimum)


def int4_blocks(t: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A Q4_0 / Q4_1 tensor's blocks as (codes [rows, cols] uint8 in 0..15, scale and
    minimum [rows, cols / 32] float32) with w = minimum + code * scale; None for other types.

    Q4_0 blocks: float16 d, 16 bytes of codes (w = d * (code - 8)); Q4_1: float16 d and m,
    16 bytes (w = d * code + m). A block's byte j holds code j in its low nibble, code j + 16
    in its high one."""
    import gguf

    kind = gguf.GGMLQuantizationType(t.tensor_type).name
    if kind not in GGUF_INT4_TYPES or t.data.ndim != 2:
        return None
    rows = t.data.shape[0]
    header = 2 if kind == "Q4_0" else 4
    blocks = np.ascontiguousarray(t.data).reshape(rows, -1, header + 16)
    scale = blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q4_0":
        minimum = -8.0 * scale
    else:
        minimum = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = blocks[..., header:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1).reshape(rows, -1)
    return codes, scale, minimum


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """[rows, cols] codes 0..15 -> [rows, cols / 2] bytes, column 2j low, 2j + 1 high
    (quant.unpack_nibbles reads them back)."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def _f32_bytes(w: np.ndarray) -> bytes:
    return np.ascontiguousarray(w, dtype="<f4").tobytes()


def read_gguf_config(reader: Any) -> dict[str, Any]:
    """A HF config.json dict from GGUF metadata (and its RoPE factor tensors)."""

    def field(key: str, default: Any = None) -> Any:
        f = reader.fields.get(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    if arch not in ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(ARCHITECTURES)}"
        )
    hidden = field(f"{arch}.embedding_length")
    num_heads = field(f"{arch}.attention.head_count")
    head_dim = field(f"{arch}.attention.key_length", hidden // num_heads)
    tensors = {t.name: t for t in reader.tensors}
    vocab = field(f"{arch}.vocab_size") or len(field("tokenizer.ggml.tokens"))
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": field(f"{arch}.feed_forward_length"),
        "num_hidden_layers": field(f"{arch}.block_count"),
        "num_attention_heads": num_heads,
        "num_key_value_heads": field(f"{arch}.attention.head_count_kv", num_heads),
        "head_dim": head_dim,
        "rms_norm_eps": field(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        "max_position_embeddings": field(f"{arch}.context_length", 2048),
        "tie_word_embeddings": "output.weight" not in tensors,
        "hidden_act": "gelu_pytorch_tanh" if arch.startswith("gemma") else "silu",
        "sliding_window": field(f"{arch}.attention.sliding_window"),
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": field(f"{arch}.rope.freq_base", 1e4),
    }
    scaling = field(f"{arch}.rope.scaling.type")
    if scaling in ("linear", "yarn"):
        rope.update(rope_type=scaling, factor=field(f"{arch}.rope.scaling.factor"))
        if scaling == "yarn":
            rope["original_max_position_embeddings"] = field(
                f"{arch}.rope.scaling.original_context_length"
            )
    if "rope_freqs.weight" in tensors:  # Llama 3's per-frequency divisors
        factors = _dequantize(tensors["rope_freqs.weight"]).reshape(-1)
        rope.update(rope_type="freq_factors", freq_factors=[float(f) for f in factors])
    if "rope_factors_long.weight" in tensors:  # Phi-3 longrope
        orig = field(f"{arch}.rope.scaling.original_context_length")
        rope.update(
            rope_type="longrope",
            long_factor=[float(f) for f in _dequantize(tensors["rope_factors_long.weight"])],
            short_factor=[float(f) for f in _dequantize(tensors["rope_factors_short.weight"])],
            original_max_position_embeddings=orig,
        )
        cfg["original_max_position_embeddings"] = orig
    rope_dims = field(f"{arch}.rope.dimension_count", head_dim)
    if rope_dims != head_dim:
        rope["partial_rotary_factor"] = rope_dims / head_dim
    cfg["rope_parameters"] = rope
    if arch == "llama" and cfg["sliding_window"]:  # llama.cpp writes Mistral as llama
        cfg["architectures"] = ["MistralForCausalLM"]
    if arch.startswith("gemma"):
        # llama.cpp scales queries by key_length ** -0.5 (query_pre_attn_scalar of 2B/9B/4B).
        cfg["query_pre_attn_scalar"] = head_dim
        cfg["attn_logit_softcapping"] = field(f"{arch}.attn_logit_softcapping")
        cfg["final_logit_softcapping"] = field(f"{arch}.final_logit_softcapping")
    if arch == "gemma3":  # llama.cpp's fixed local base and pattern
        cfg["rope_parameters"] = {
            "full_attention": rope,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        }
        cfg["sliding_window_pattern"] = field(f"{arch}.attention.sliding_window_pattern", 6)
    return cfg


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config.json, model.safetensors and tokenizer files for gguf_path into out_dir."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    cfg = read_gguf_config(reader)
    out_dir.mkdir(parents=True, exist_ok=True)
    arch = cfg["model_type"]
    weights = [t for t in reader.tensors if t.name not in ROPE_TENSORS]
    names = [hf_tensor_name(t.name, arch) for t in weights]
    int4: dict[str, np.ndarray] = {}
    with open(out_dir / "model.safetensors", "wb") as f:
        _write_header(f, names, [tuple(reversed([int(d) for d in t.shape])) for t in weights])
        for t, name in zip(weights, names):
            kind = t.name.split(".")[-2]
            heads = None
            if arch == "llama" and kind in ("attn_q", "attn_k"):
                heads = cfg["num_attention_heads" if kind == "attn_q" else "num_key_value_heads"]
                f.write(_f32_bytes(_unpermute(_dequantize(t), heads)))
            elif arch.startswith("gemma") and kind.endswith("norm"):
                f.write(_f32_bytes(_dequantize(t) - 1.0))  # llama.cpp stores Gemma's 1 + w
            else:
                for rows in _dequantize_rows(t):
                    f.write(_f32_bytes(rows))
            blocks = int4_blocks(t) if name.endswith("proj.weight") else None
            if blocks is not None:  # rows get the same un-permute as the weight's
                codes, scale, minimum = (
                    b if heads is None else _unpermute(b, heads) for b in blocks
                )
                int4[f"{name}.codes"] = pack_nibbles(codes)
                int4[f"{name}.scale"], int4[f"{name}.min"] = scale, minimum
    (out_dir / TENSOR_TYPES_FILE).parent.mkdir(exist_ok=True)
    types = {n: gguf.GGMLQuantizationType(t.tensor_type).name for t, n in zip(weights, names)}
    (out_dir / TENSOR_TYPES_FILE).write_text(json.dumps(types, indent=1))
    if int4:
        from safetensors.numpy import save_file

        save_file(int4, str(out_dir / INT4_BLOCKS_FILE))
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2))
    _convert_tokenizer(gguf_path, reader, out_dir)


def _write_header(f: Any, names: list[str], shapes: list[tuple[int, ...]]) -> None:
    """The safetensors header for float32 tensors written in this order."""
    header: dict[str, Any] = {}
    offset = 0
    for name, shape in zip(names, shapes):
        if name in header:
            raise ValueError(f"GGUF maps two tensors onto {name!r}")
        size = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {
            "dtype": "F32",
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    f.write(struct.pack("<Q", len(raw)) + raw)


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
