"""Llama-family decoder (Llama, SmolLM2, Mistral, Qwen2-style qkv bias) over a ForwardBatch.

Parameter names follow HF checkpoints except the merged q|k|v and gate|up projections;
`load_weights` maps checkpoint tensors onto them strictly (each exactly once, none unknown).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig
from .layers import (
    Embedding,
    GateUpLinear,
    Linear,
    MergedLinear,
    RMSNorm,
    RotaryEmbedding,
    bfloat16_matmul,
    pack_weight,
    packed_linear,
)
from .quant import QuantizedWeight, quantize

if TYPE_CHECKING:  # the executor passes these in; the model names them only as types
    from ..executor.attention import AttentionBackend
    from ..executor.forward_batch import ForwardBatch
    from ..executor.memory import KVPool


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, [q_size, kv_size, kv_size], cfg.qkv_bias, dtype
        )
        self.o_proj = Linear(q_size, cfg.hidden_size, cfg.o_bias, dtype)
        self.sm_scale = cfg.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        fb: ForwardBatch,
        pool: KVPool,
        attn: AttentionBackend,
        residual: torch.Tensor,
    ) -> torch.Tensor:
        """residual + attention(x); x, residual: [num_tokens, hidden]."""
        n, num_q, num_qk = x.shape[0], self.num_heads, self.num_heads + self.num_kv_heads
        # q|k|v as heads: [n, num_heads + 2 * num_kv_heads, head_dim]; q and k rotate together.
        qkv = self.qkv_proj(x).view(n, num_qk + self.num_kv_heads, self.head_dim)
        qk = RotaryEmbedding.apply(qkv[:, :num_qk], cos_sin)
        q, k, v = qk[:, :num_q], qk[:, num_q:], qkv[:, num_qk:]
        o = attn.forward(q, k, v, self.layer_id, fb, pool, self.sm_scale)
        return self.o_proj(o.reshape(n, num_q * self.head_dim), residual)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = GateUpLinear(cfg.hidden_size, inter, cfg.mlp_bias, dtype)
        self.down_proj = Linear(inter, cfg.hidden_size, cfg.mlp_bias, dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + mlp(x)."""
        return self.down_proj(self.gate_up_proj(x), residual)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.self_attn = Attention(cfg, layer_id, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(self, x, cos_sin, fb, pool, attn):
        x = self.self_attn(self.input_layernorm(x), cos_sin, fb, pool, attn, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.rope = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.max_position, dtype)
        self._vocab_t: torch.Tensor | None = None  # lm_head weight transposed, lazily
        self._vocab_packed: torch.Tensor | None = None  # oneDNN-blocked copy (pack_weights)
        self._vocab_quant: QuantizedWeight | None = None  # weight-only copy (quantize_weights)
        self._vocab_small: torch.Tensor | None = None  # bf16 copy (add_small_step_copies)
        self._small_rows = 0
        self.lm_head = (
            None
            if cfg.tie_word_embeddings
            else Linear(cfg.hidden_size, cfg.vocab_size, False, dtype)
        )

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, pool: KVPool, attn: AttentionBackend) -> torch.Tensor:
        """Logits for the rows fb.logits_idx: [num_logit_rows, vocab_size], in the model's
        dtype (the output processor widens reduced-precision logits where it needs to)."""
        attn.init_forward_metadata(fb)
        x = self.embed_tokens(fb.input_ids)
        cos_sin = self.rope.table(fb.positions)
        for layer in self.layers:
            x = layer(x, cos_sin, fb, pool, attn)
        x = self.norm(x[fb.logits_idx])
        return self.project_vocab(x)

    def project_vocab(self, x: torch.Tensor) -> torch.Tensor:
        """lm_head: [rows, hidden] -> [rows, vocab]. Packed weights (pack_weights) go
        through oneDNN; otherwise, from 8 rows on, a pre-transposed copy of the weight
        multiplies faster on CPU (the weight streams row-major)."""
        if self._vocab_quant is not None:
            return self._vocab_quant.matmul(x)
        if self._vocab_small is not None and x.shape[0] <= self._small_rows:
            return bfloat16_matmul(x, self._vocab_small)
        if self._vocab_packed is not None:
            return packed_linear(x, self._vocab_packed)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        if x.shape[0] < 8 or x.device.type != "cpu" or x.dtype == torch.float64:
            return F.linear(x, w)
        if self._vocab_t is None:
            self._vocab_t = w.t().contiguous()  # [hidden, vocab]
        return x @ self._vocab_t

    def pack_weights(self) -> None:
        """Hold every linear weight and the vocabulary projection in oneDNN's blocked layout
        (CPU bfloat16, after load_weights; see layers.can_pack_weights). Each layer's norms
        hand their scale to the linear they feed first. A tied embedding keeps its plain
        table for lookups beside the packed projection. One-way: load weights before."""
        for layer in self.layers:
            layer.input_layernorm.fold_into(layer.self_attn.qkv_proj)
            layer.post_attention_layernorm.fold_into(layer.mlp.gate_up_proj)
        for module in self.modules():
            if isinstance(module, Linear):
                module.pack()
        if self.lm_head is None:
            self._vocab_packed = pack_weight(self.embed_tokens.weight)
        else:
            self._vocab_packed = self.lm_head.weight

    def add_small_step_copies(self, max_rows: int) -> None:
        """Give every linear and the vocabulary projection a bfloat16 copy used by steps of at
        most max_rows rows (layers.Linear.add_small_step_copy): float32 models on CPUs
        without native bfloat16, where those steps are bound by streaming weights."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.add_small_step_copy(max_rows)
        if self.lm_head is None:
            self._vocab_small = self.embed_tokens.weight.detach().to(torch.bfloat16)
        else:
            self._vocab_small = self.lm_head.small_weight
        self._small_rows = max_rows

    def quantize_weights(self, method: str) -> None:
        """Hold every linear and the vocabulary projection as weight-only `method` ("int8" |
        "int4", models/quant.py); a tied embedding keeps its float table for lookups. After
        load_weights; one-way. The vocabulary projection is int8 even under int4, as
        llama.cpp's 4-bit files keep it at 8 bits: its error reaches every logit directly."""
        for module in self.modules():
            if isinstance(module, Linear) and module is not self.lm_head:
                module.quantize(method)
        if self.lm_head is None:
            self._vocab_quant = quantize(self.embed_tokens.weight, "int8")
        else:
            self.lm_head.quantize("int8")
            self._vocab_quant = self.lm_head.quant

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named checkpoint tensors in; every parameter exactly once, none unknown."""
        targets = self._checkpoint_targets()
        seen: set[str] = set()
        for name, tensor in tensors:
            if name not in targets:
                raise ValueError(f"unknown tensor {name!r} in checkpoint")
            if name in seen:
                raise ValueError(f"tensor {name!r} appears twice in checkpoint")
            dst = targets[name]
            if tuple(dst.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}"
                )
            dst.copy_(tensor)
            seen.add(name)
        missing = sorted(set(targets) - seen)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")

    def _checkpoint_targets(self) -> dict[str, torch.Tensor]:
        """HF checkpoint name -> the (view of the) parameter it fills."""
        t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": self.embed_tokens.weight.data}
        t["model.norm.weight"] = self.norm.weight.data
        if self.lm_head is not None:
            t["lm_head.weight"] = self.lm_head.weight.data
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            attn, mlp = layer.self_attn, layer.mlp
            t[p + "input_layernorm.weight"] = layer.input_layernorm.weight.data
            t[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight.data
            kinds = ["weight"] + (["bias"] if attn.qkv_proj.bias is not None else [])
            for kind in kinds:
                for j, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                    t[f"{p}self_attn.{proj}.{kind}"] = attn.qkv_proj.part(j, kind).data
            _add_linear(t, p + "self_attn.o_proj", attn.o_proj)
            kinds = ["weight"] + (["bias"] if mlp.gate_up_proj.bias is not None else [])
            for kind in kinds:
                for j, proj in enumerate(("gate_proj", "up_proj")):
                    t[f"{p}mlp.{proj}.{kind}"] = mlp.gate_up_proj.part(j, kind).data
            _add_linear(t, p + "mlp.down_proj", mlp.down_proj)
        return t


def _add_linear(t: dict[str, torch.Tensor], prefix: str, lin: Linear) -> None:
    t[prefix + ".weight"] = lin.weight.data
    if lin.bias is not None:
        t[prefix + ".bias"] = lin.bias.data
