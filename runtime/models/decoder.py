"""The one decoder: Llama, Mistral, Qwen2/2.5, Qwen3, Gemma 2/3 and Phi-3 as switches of
ModelConfig (models/config.py), over a ForwardBatch.

The switches: q/k/v and o biases, q/k norms over head_dim (Qwen3, Gemma 3), per-layer sliding
windows and RoPE tables (Mistral, Gemma), Gemma's (1 + w) norms around both attention and MLP
with a scaled embedding, GeGLU, attention and final logit soft-capping, and a query scale.
Parameter names follow HF checkpoints except the merged q|k|v and gate|up projections (Phi-3
stores them merged); `load_weights` maps checkpoint tensors onto them strictly (each exactly
once, none unknown).
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
    GemmaRMSNorm,
    Linear,
    MergedLinear,
    RMSNorm,
    bfloat16_matmul,
    pack_weight,
    packed_linear,
    softcap,
)
from .quant import QuantizedWeight, quantize
from .rope import RotaryEmbedding

if TYPE_CHECKING:  # the executor passes these in; the model names them only as types
    from ..executor.attention import AttentionBackend
    from ..executor.forward_batch import ForwardBatch
    from ..executor.memory import KVPool


def make_norm(cfg: ModelConfig, dim: int, dtype: torch.dtype) -> RMSNorm:
    return (GemmaRMSNorm if cfg.gemma_norms else RMSNorm)(dim, cfg.rms_norm_eps, dtype)


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
        self.q_norm = make_norm(cfg, cfg.head_dim, dtype) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, cfg.head_dim, dtype) if cfg.qk_norm else None
        self.sm_scale = cfg.attn_scale or cfg.head_dim**-0.5
        self.window = cfg.layer_window(layer_id)
        self.softcap = cfg.attn_softcap

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        fb: ForwardBatch,
        pool: KVPool,
        attn: AttentionBackend,
        residual: torch.Tensor | None,
    ) -> torch.Tensor:
        """residual + attention(x) (attention(x) alone for residual None); x: [tokens, hidden]."""
        n, num_q, num_qk = x.shape[0], self.num_heads, self.num_heads + self.num_kv_heads
        # q|k|v as heads: [n, num_heads + 2 * num_kv_heads, head_dim]; q and k rotate together.
        qkv = self.qkv_proj(x).view(n, num_qk + self.num_kv_heads, self.head_dim)
        qk = qkv[:, :num_qk]
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qk[:, :num_q]), self.k_norm(qk[:, num_q:])], dim=1)
        qk = RotaryEmbedding.apply(qk, cos_sin)
        q, k, v = qk[:, :num_q], qk[:, num_q:], qkv[:, num_qk:]
        o = attn.forward(
            q,
            k,
            v,
            self.layer_id,
            fb,
            pool,
            self.sm_scale,
            window=self.window,
            softcap=self.softcap,
        )
        return self.o_proj(o.reshape(n, num_q * self.head_dim), residual)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        inter = cfg.intermediate_size
        self.gate_up_proj = GateUpLinear(
            cfg.hidden_size,
            inter,
            cfg.mlp_bias,
            dtype,
            "silu" if cfg.hidden_act == "silu" else "gelu",
        )
        self.down_proj = Linear(inter, cfg.hidden_size, cfg.mlp_bias, dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """residual + mlp(x) (mlp(x) alone for residual None)."""
        return self.down_proj(self.gate_up_proj(x), residual)


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP; Gemma also norms each one's output before its residual add
    (post_attention_layernorm is then that output norm, pre_feedforward_layernorm the MLP's)."""

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = make_norm(cfg, cfg.hidden_size, dtype)
        self.self_attn = Attention(cfg, layer_id, dtype)
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size, dtype)
        self.mlp = MLP(cfg, dtype)
        self.sandwich = cfg.gemma_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size, dtype)
            self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size, dtype)

    def forward(self, x, cos_sin, fb, pool, attn):
        if self.sandwich:
            h = self.self_attn(self.input_layernorm(x), cos_sin, fb, pool, attn, residual=None)
            x = x + self.post_attention_layernorm(h)
            h = self.mlp(self.pre_feedforward_layernorm(x), residual=None)
            return x + self.post_feedforward_layernorm(h)
        x = self.self_attn(self.input_layernorm(x), cos_sin, fb, pool, attn, residual=x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class DecoderForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.embed_tokens = Embedding(cfg.vocab_size, cfg.hidden_size, dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype) for i in range(cfg.num_layers))
        self.norm = make_norm(cfg, cfg.hidden_size, dtype)
        # One RoPE table per layer type with its own parameters (Gemma 3: local and global).
        rope = cfg.rope_parameters or {"full_attention": {"rope_theta": cfg.rope_theta}}
        self.ropes = nn.ModuleDict(
            {
                name: RotaryEmbedding(
                    cfg.head_dim,
                    params,
                    cfg.rope_max_position or cfg.max_position,
                    cfg.max_position,
                    dtype,
                )  # fmt: skip
                for name, params in rope.items()
            }
        )
        self.layer_rope = [cfg.layer_rope(i) for i in range(cfg.num_layers)]
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

    def build_rope_tables(self) -> None:
        """Compute the RoPE tables (non-persistent buffers: computed, not loaded)."""
        for rope in self.ropes.values():
            rope.build_tables()

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, pool: KVPool, attn: AttentionBackend) -> torch.Tensor:
        """Logits for the rows fb.logits_idx: [num_logit_rows, vocab_size], in the model's
        dtype (the output processor widens reduced-precision logits where it needs to)."""
        attn.init_forward_metadata(fb)
        x = self.embed_tokens(fb.input_ids)
        if self.cfg.embed_scale is not None:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        tables = {name: rope.table(fb.positions) for name, rope in self.ropes.items()}
        for layer, rope in zip(self.layers, self.layer_rope):
            x = layer(x, tables[rope], fb, pool, attn)
        x = self.norm(x[fb.logits_idx])
        logits = self.project_vocab(x)
        if self.cfg.final_softcap is not None:
            logits = softcap(logits, self.cfg.final_softcap)
        return logits

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
            if not self.cfg.gemma_norms:  # Gemma's norms cast after scaling; they stay
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
            norms = ["input_layernorm", "post_attention_layernorm"]
            if layer.sandwich:
                norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
            for norm in norms:
                t[f"{p}{norm}.weight"] = getattr(layer, norm).weight.data
            attn, mlp = layer.self_attn, layer.mlp
            if attn.q_norm is not None:
                t[p + "self_attn.q_norm.weight"] = attn.q_norm.weight.data
                t[p + "self_attn.k_norm.weight"] = attn.k_norm.weight.data
            if self.cfg.fused_checkpoint:  # Phi-3: q|k|v and gate|up as stored here
                _add_linear(t, p + "self_attn.qkv_proj", attn.qkv_proj)
                _add_linear(t, p + "mlp.gate_up_proj", mlp.gate_up_proj)
            else:
                _add_parts(t, p + "self_attn.", attn.qkv_proj, ("q_proj", "k_proj", "v_proj"))
                _add_parts(t, p + "mlp.", mlp.gate_up_proj, ("gate_proj", "up_proj"))
            _add_linear(t, p + "self_attn.o_proj", attn.o_proj)
            _add_linear(t, p + "mlp.down_proj", mlp.down_proj)
        return t


def _add_linear(t: dict[str, torch.Tensor], prefix: str, lin: Linear) -> None:
    t[prefix + ".weight"] = lin.weight.data
    if lin.bias is not None:
        t[prefix + ".bias"] = lin.bias.data


def _add_parts(
    t: dict[str, torch.Tensor], prefix: str, merged: MergedLinear, names: tuple[str, ...]
) -> None:
    """Each stacked part of a merged linear under its own checkpoint name."""
    for kind in ["weight"] + (["bias"] if merged.bias is not None else []):
        for j, name in enumerate(names):
            t[f"{prefix}{name}.{kind}"] = merged.part(j, kind).data
