"""A GGUF's own 4-bit blocks as the int4 weights of a decoder's linears.

The conversion keeps every Q4_0 / Q4_1 linear's codes, scales and minimums beside the float32
weights (gguf_convert.int4_blocks, INT4_BLOCKS_FILE); `--quantization int4` holds those
(weights.Int4Weight.from_blocks) instead of re-quantizing the float32 copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .decoder import DecoderForCausalLM
from .gguf_convert import INT4_BLOCKS_FILE, TENSOR_TYPES_FILE
from .layers import Linear
from .weights import Int4Weight

# Each linear's checkpoint tensors: merged (Phi-3), or the parts stacked in it.
GGUF_INT4_SOURCES = {
    "self_attn.qkv_proj": [
        ["self_attn.qkv_proj"],
        ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    ],
    "self_attn.o_proj": [["self_attn.o_proj"]],
    "mlp.gate_up_proj": [["mlp.gate_up_proj"], ["mlp.gate_proj", "mlp.up_proj"]],
    "mlp.down_proj": [["mlp.down_proj"]],
}


def has_gguf_int4_blocks(ckpt: Path) -> bool:
    """Whether a GGUF conversion kept 4-bit blocks (its file had Q4_0 / Q4_1 linears)."""
    return (ckpt / INT4_BLOCKS_FILE).exists()


def gguf_vocab_type(ckpt: Path) -> str | None:
    """The GGUF type the vocabulary projection was stored in (its own output tensor, else the
    embedding it is tied to: "Q8_0", "F16", ...); None for other checkpoints."""
    try:
        types = json.loads((ckpt / TENSOR_TYPES_FILE).read_text())
    except (OSError, ValueError):
        return None
    return types.get("lm_head.weight", types.get("model.embed_tokens.weight"))


def gguf_int4_blocks(ckpt: Path) -> dict[str, torch.Tensor]:
    """The 4-bit blocks a GGUF conversion kept, by HF tensor name plus ".codes" ([out, in / 2]
    two codes a byte), ".scale" and ".min" ([out, in / 32]); empty for other checkpoints."""
    from safetensors.torch import load_file

    return load_file(str(ckpt / INT4_BLOCKS_FILE)) if has_gguf_int4_blocks(ckpt) else {}


def int4_from_gguf_blocks(
    model: DecoderForCausalLM, blocks: dict[str, torch.Tensor]
) -> dict[Linear, Int4Weight]:
    """The int4 weights of the model's linears whose checkpoint tensors all have blocks; a
    merged linear stacks its parts' blocks. One process only: a tensor-parallel rank would
    need its slice of the blocks."""
    if not blocks:
        return {}
    if model.tp.size > 1:
        raise ValueError("GGUF int4 blocks load without tensor parallelism only")
    out: dict[Linear, Int4Weight] = {}
    for i, layer in enumerate(model.layers):
        for linear_name, sources in GGUF_INT4_SOURCES.items():
            parent, attr = linear_name.split(".")
            for parts in sources:
                keys = [f"model.layers.{i}.{name}.weight" for name in parts]
                if all(f"{k}.codes" in blocks for k in keys):
                    codes, scale, minimum = (
                        torch.cat([blocks[f"{k}.{field}"] for k in keys])
                        for field in ("codes", "scale", "min")
                    )
                    linear = getattr(getattr(layer, parent), attr)
                    out[linear] = Int4Weight.from_blocks(unpack_nibbles(codes), scale, minimum)
                    break
    return out


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[rows, cols / 2] bytes -> [rows, cols] codes 0..15: column 2j from the low nibble,
    2j + 1 from the high one (gguf_convert.pack_nibbles' layout)."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(packed.shape[0], -1)
