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

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ..weight_plan import WeightPlan
from .config import ModelConfig
from .layers import (
    GateUpLinear,
    GemmaRMSNorm,
    Linear,
    MergedLinear,
    RMSNorm,
    RowParallelLinear,
    VocabParallelEmbedding,
    softcap,
)
from .parallel import TPGroup, TPLayout
from .rope import RotaryEmbedding
from .shard import Shard, add_linear, add_parts, shift
from .weights import FORMS, LinearSpec, WeightForm, build_form
from .weights.few_rows import FewRowsWeight

if TYPE_CHECKING:  # the executor passes these in; the model names them only as types
    from ..executor.attention import AttentionBackend
    from ..executor.forward_batch import ForwardBatch
    from ..executor.memory import KVPool


class CompiledDecode(Protocol):
    """The decode step compiled whole (executor/compiled.py)."""

    def forward(
        self, fb: ForwardBatch, pool: KVPool, attn: AttentionBackend
    ) -> torch.Tensor | None: ...


# attend(q, k, v, attention): one layer's attention over the context, [tokens, heads,
# head_dim]: the backend's in an eager step, the compiled step's own in its graph.
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "Attention"], torch.Tensor]


def make_norm(cfg: ModelConfig, dim: int, dtype: torch.dtype) -> RMSNorm:
    return (GemmaRMSNorm if cfg.gemma_norms else RMSNorm)(dim, cfg.rms_norm_eps, dtype)


class Attention(nn.Module):
    """This rank's heads (all of them without tensor parallelism): q|k|v column-parallel,
    o_proj row-parallel."""

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, tp: TPGroup):
        super().__init__()
        lay = TPLayout.of(cfg, tp.rank, tp.size)
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = (
            lay.num_heads,
            lay.num_kv_heads,
            cfg.head_dim,
        )
        q_size, kv_size = lay.num_heads * cfg.head_dim, lay.num_kv_heads * cfg.head_dim
        self.qkv_proj = MergedLinear(
            cfg.hidden_size, [q_size, kv_size, kv_size], cfg.qkv_bias, dtype
        )
        self.o_proj = RowParallelLinear(q_size, cfg.hidden_size, cfg.o_bias, dtype, tp)
        self.q_norm = make_norm(cfg, cfg.head_dim, dtype) if cfg.qk_norm else None
        self.k_norm = make_norm(cfg, cfg.head_dim, dtype) if cfg.qk_norm else None
        self.sm_scale = cfg.attn_scale or cfg.head_dim**-0.5
        self.window = cfg.layer_window(layer_id)
        self.softcap = cfg.attn_softcap

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (normed where the model norms them, rotated) and v as heads, from x:
        [tokens, hidden]."""
        n, num_q, num_qk = x.shape[0], self.num_heads, self.num_heads + self.num_kv_heads
        # q|k|v as heads: [n, num_heads + 2 * num_kv_heads, head_dim]; q and k rotate together.
        qkv = self.qkv_proj(x).view(n, num_qk + self.num_kv_heads, self.head_dim)
        qk = qkv[:, :num_qk]
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qk[:, :num_q]), self.k_norm(qk[:, num_q:])], dim=1)
        qk = RotaryEmbedding.apply(qk, (cos, sin))
        return qk[:, :num_q], qk[:, num_q:], qkv[:, num_qk:]

    def out(self, o: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """residual + o_proj(o) (o_proj(o) alone for residual None)."""
        return self.o_proj(o.reshape(o.shape[0], self.num_heads * self.head_dim), residual)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, tp: TPGroup):
        super().__init__()
        inter = cfg.intermediate_size // tp.size
        self.gate_up_proj = GateUpLinear(
            cfg.hidden_size,
            inter,
            cfg.mlp_bias,
            dtype,
            "silu" if cfg.hidden_act == "silu" else "gelu",
        )
        self.down_proj = RowParallelLinear(inter, cfg.hidden_size, cfg.mlp_bias, dtype, tp)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """residual + mlp(x) (mlp(x) alone for residual None)."""
        return self.down_proj(self.gate_up_proj(x), residual)


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP; Gemma also norms each one's output before its residual add
    (post_attention_layernorm is then that output norm, pre_feedforward_layernorm the MLP's)."""

    def __init__(self, cfg: ModelConfig, layer_id: int, dtype: torch.dtype, tp: TPGroup):
        super().__init__()
        self.input_layernorm = make_norm(cfg, cfg.hidden_size, dtype)
        self.self_attn = Attention(cfg, layer_id, dtype, tp)
        self.post_attention_layernorm = make_norm(cfg, cfg.hidden_size, dtype)
        self.mlp = MLP(cfg, dtype, tp)
        self.sandwich = cfg.gemma_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = make_norm(cfg, cfg.hidden_size, dtype)
            self.post_feedforward_layernorm = make_norm(cfg, cfg.hidden_size, dtype)

    def forward(self, x: torch.Tensor, cos_sin: tuple, attend: Attend) -> torch.Tensor:
        """x: [tokens, hidden] through attention and MLP."""
        q, k, v = self.before_attention(x, *cos_sin)
        return self.after_attention(attend(q, k, v, self.self_attn), x)

    def before_attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return self.self_attn.qkv(self.input_layernorm(x), cos, sin)

    def after_attention(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The attention output o back to the residual stream, then the MLP."""
        if self.sandwich:
            x = x + self.post_attention_layernorm(self.self_attn.out(o, None))
            h = self.mlp(self.pre_feedforward_layernorm(x), residual=None)
            return x + self.post_feedforward_layernorm(h)
        x = self.self_attn.out(o, x)
        return self.mlp(self.post_attention_layernorm(x), residual=x)


class DecoderForCausalLM(nn.Module):
    def __init__(
        self, cfg: ModelConfig, dtype: torch.dtype = torch.float32, tp: TPGroup | None = None
    ):
        """tp: this process's rank in a tensor-parallel group (models/parallel.py); the model
        then holds only that rank's shard."""
        super().__init__()
        self.cfg = cfg
        self.dtype = dtype
        self.tp = tp = tp or TPGroup()
        self.layout = lay = TPLayout.of(cfg, tp.rank, tp.size)
        self.embed_tokens = VocabParallelEmbedding(
            lay.vocab_shard, cfg.hidden_size, dtype, tp, lay.vocab_start
        )
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype, tp) for i in range(cfg.num_layers))
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
        # The vocabulary projection: [rows, hidden] -> [rows, vocab shard].
        self.lm_head = Linear(cfg.hidden_size, lay.vocab_shard, False, dtype)
        self.compiled: CompiledDecode | None = None  # executor/compiled.py, when enabled
        if cfg.tie_word_embeddings:
            self.lm_head.weight = None  # the embedding table, once loaded (load_weights)

    def build_rope_tables(self) -> None:
        """Compute the RoPE tables (non-persistent buffers: computed, not loaded)."""
        for rope in self.ropes.values():
            rope.build_tables()

    @torch.inference_mode()
    def forward(
        self, fb: ForwardBatch, pool: KVPool, attn: AttentionBackend
    ) -> torch.Tensor | None:
        """Logits for the rows fb.logits_idx: [num_logit_rows, vocab_size], in the model's
        dtype (the output processor widens reduced-precision logits where it needs to).
        Under tensor parallelism rank 0 gets the gathered logits, other ranks None."""
        attn.init_forward_metadata(fb)
        if self.compiled is not None:
            logits = self.compiled.forward(fb, pool, attn)
            if logits is not None:  # a step it takes
                return logits

        def attend(q, k, v, a: Attention) -> torch.Tensor:
            return attn.forward(q, k, v, a.layer_id, fb, pool, a.sm_scale, a.window, a.softcap)

        return self.project(self.hidden(fb.input_ids, fb.positions, fb.logits_idx, attend))

    def hidden(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        logits_idx: torch.Tensor | None,
        attend: Attend,
    ) -> torch.Tensor:
        """The final norm's output for rows logits_idx (every row for None) of these tokens,
        each layer attending through `attend`."""
        x = self.embed_tokens(input_ids)
        if self.cfg.embed_scale is not None:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        tables = {name: rope.table(positions) for name, rope in self.ropes.items()}
        for layer, rope in zip(self.layers, self.layer_rope):
            x = layer(x, tables[rope], attend)
        return self.norm(x if logits_idx is None else x[logits_idx])

    def project(self, x: torch.Tensor) -> torch.Tensor | None:
        """Logits [rows, vocab_size] of the final norm's output (rank 0's; None elsewhere)."""
        logits = self.tp.gather_last_dim(self.lm_head(x))
        if logits is None:
            return None
        if logits.shape[-1] != self.cfg.vocab_size:  # the last shard's padding rows
            logits = logits[:, : self.cfg.vocab_size].contiguous()
        if self.cfg.final_softcap is not None:
            logits = softcap(logits, self.cfg.final_softcap)
        return logits

    def apply_plan(
        self,
        plan: WeightPlan,
        given: dict[Linear, WeightForm] | None = None,
        input_maxima: dict[Linear, torch.Tensor] | None = None,
    ) -> None:
        """Hold every linear's weight in the plan's linear form and the vocabulary
        projection's in its vocabulary form (models/weights/). given: forms already built
        for some linears (a GGUF's own 4-bit blocks, gguf_int4.py); input_maxima: each
        linear's calibrated input range (executor/calibrate.py), for forms that smooth by it.
        A form that holds a weight in another layout frees the float one, so apply a plan
        once after load_weights (which holds every weight plain). A tied embedding keeps its
        table for lookups."""
        given, maxima = given or {}, input_maxima or {}
        folded: dict[Linear, torch.Tensor] = {}  # a folded norm's scale, by the linear fed
        if FORMS[plan.linear_form].folds_norms and not self.cfg.gemma_norms:
            for layer in self.layers:  # Gemma's norms cast after scaling; they stay
                qkv, gate_up = layer.self_attn.qkv_proj, layer.mlp.gate_up_proj
                folded[qkv] = layer.input_layernorm.fold_into(qkv)
                folded[gate_up] = layer.post_attention_layernorm.fold_into(gate_up)
        for module in self.modules():
            if isinstance(module, Linear) and module is not self.lm_head:
                own = given.get(module)
                if own is not None and not plan.own_form:  # given for every step
                    module.hold(own)
                    continue
                gated = isinstance(module, GateUpLinear)
                spec = LinearSpec(is_gated=gated, input_max=maxima.get(module))
                form = build_form(plan.linear_form, module.weight, plan, spec)
                if own is not None:  # the own blocks take a folded norm's scale apart
                    form = FewRowsWeight(own, plan.own_rows, form, folded.get(module))
                module.hold(form)
        vocab = LinearSpec(is_vocab=True)
        head = build_form(plan.vocab_form, self.lm_head.weight, plan, vocab)
        if plan.own_vocab_form:  # the checkpoint's own 8-bit weights for steps of few rows
            own = build_form(plan.own_vocab_form, self.lm_head.weight, plan, vocab)
            head = FewRowsWeight(own, plan.own_vocab_rows, head)
        self.lm_head.hold(head)

    @property
    def num_linears(self) -> int:
        """The linears the plan's linear form applies to (the vocabulary projection apart)."""
        return sum(isinstance(m, Linear) and m is not self.lm_head for m in self.modules())

    def load_weights(self, tensors: Iterable[tuple[str, Any]]) -> None:
        """Copy HF-named checkpoint tensors in; every parameter exactly once, none unknown.
        A tensor may be a torch tensor or a safetensors slice: under tensor parallelism only
        this rank's rows or columns of it are read."""
        targets = self._checkpoint_targets()
        seen: set[str] = set()
        for name, tensor in tensors:
            if name not in targets:
                raise ValueError(f"unknown tensor {name!r} in checkpoint")
            if name in seen:
                raise ValueError(f"tensor {name!r} appears twice in checkpoint")
            targets[name].load(name, tensor)
            seen.add(name)
        missing = sorted(set(targets) - seen)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}")
        if self.tp.rank > 0:  # a row-parallel bias is added by rank 0 alone
            for module in self.modules():
                if isinstance(module, RowParallelLinear) and module.bias is not None:
                    module.bias.data.zero_()
        if self.cfg.tie_word_embeddings:  # tied here: to_empty would have untied them
            self.lm_head.weight = self.embed_tokens.weight
        self.apply_plan(WeightPlan())  # plain until the model runner applies its plan

    def _checkpoint_targets(self) -> dict[str, Shard]:
        """HF checkpoint name -> the (view of the) parameter it fills, and which part."""
        cfg, lay, hd = self.cfg, self.layout, self.cfg.head_dim
        vocab = (lay.vocab_start, min(cfg.vocab_size, lay.vocab_start + lay.vocab_shard))
        q = (lay.num_heads * lay.rank * hd, lay.num_heads * (lay.rank + 1) * hd)
        kv = (lay.kv_head_start * hd, (lay.kv_head_start + lay.num_kv_heads) * hd)
        inter = (lay.intermediate_size * lay.rank, lay.intermediate_size * (lay.rank + 1))
        nq, nkv, ni = cfg.num_heads * hd, cfg.num_kv_heads * hd, cfg.intermediate_size
        t: dict[str, Shard] = {
            "model.embed_tokens.weight": Shard(self.embed_tokens.weight, 0, cfg.vocab_size, [vocab])
        }
        t["model.norm.weight"] = Shard(self.norm.weight)
        if not cfg.tie_word_embeddings:
            t["lm_head.weight"] = Shard(self.lm_head.weight, 0, cfg.vocab_size, [vocab])
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            norms = ["input_layernorm", "post_attention_layernorm"]
            if layer.sandwich:
                norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
            for norm in norms:
                t[f"{p}{norm}.weight"] = Shard(getattr(layer, norm).weight)
            attn, mlp = layer.self_attn, layer.mlp
            if attn.q_norm is not None:
                t[p + "self_attn.q_norm.weight"] = Shard(attn.q_norm.weight)
                t[p + "self_attn.k_norm.weight"] = Shard(attn.k_norm.weight)
            if cfg.fused_checkpoint:  # Phi-3: q|k|v and gate|up stored merged
                qkv = [q, shift(kv, nq), shift(kv, nq + nkv)]
                add_linear(t, p + "self_attn.qkv_proj", attn.qkv_proj, 0, nq + 2 * nkv, qkv)
                gate_up = [inter, shift(inter, ni)]
                add_linear(t, p + "mlp.gate_up_proj", mlp.gate_up_proj, 0, 2 * ni, gate_up)
            else:
                qkv_parts = {"q_proj": (nq, q), "k_proj": (nkv, kv), "v_proj": (nkv, kv)}
                add_parts(t, p + "self_attn.", attn.qkv_proj, qkv_parts)
                mlp_parts = {"gate_proj": (ni, inter), "up_proj": (ni, inter)}
                add_parts(t, p + "mlp.", mlp.gate_up_proj, mlp_parts)
            add_linear(t, p + "self_attn.o_proj", attn.o_proj, 1, nq, [q])
            add_linear(t, p + "mlp.down_proj", mlp.down_proj, 1, ni, [inter])
        return t
