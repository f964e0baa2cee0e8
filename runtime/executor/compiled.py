"""The compiled step (SGLang's `--enable-torch-compile`): each decoder layer's work on tokens
apart, before attention (norm, q|k|v, q/k norms, RoPE) and after it (o_proj, residual, norms,
MLP), compiled by PyTorch Inductor; attention stays eager (its paged lookups change shape
every step). A batch-1 step's small operations (views, casts, norms, RoPE, residual adds:
thousands a step) become a few fused kernels per layer, and the linears run the same
weight forms as eager.

One compiled function serves every layer (the layer is an argument; its weights are graph
inputs) and every row count up to `max_rows`: Dynamo specializes one row (decode at batch 1)
and makes the count symbolic at the second size it sees. `warm_up` compiles both at start;
Inductor caches the compiled code on disk (`cache_dir`), so a later start loads it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch._inductor.config

from ..models.layers import form_row_limits

if TYPE_CHECKING:
    from ..models.decoder import DecoderForCausalLM, DecoderLayer
    from .forward_batch import ForwardBatch

log = logging.getLogger("stemma.engine")
RECOMPILE_LIMIT = 64  # Dynamo's per-function limit; a graph per layer would stay inside it


class CompiledLayers:
    def __init__(self, layer_cls: type[DecoderLayer], max_rows: int) -> None:
        self.max_rows = max_rows
        self._before = torch.compile(layer_cls.before_attention)
        self._after = torch.compile(layer_cls.after_attention)
        self.compile_s = 0.0  # warm_up's compile (or cache load) time

    def takes(self, fb: ForwardBatch) -> bool:
        return fb.num_tokens <= self.max_rows

    def before(self, layer: DecoderLayer):
        return functools.partial(self._before, layer)

    def after(self, layer: DecoderLayer):
        return functools.partial(self._after, layer)

    @classmethod
    def build(cls, model: DecoderForCausalLM, max_rows: int, cache_dir: Path) -> CompiledLayers:
        """Compiled layers for `model`, warmed up: both shapes compiled (or loaded) now."""
        cache_dir = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir)))
        cache_dir.mkdir(parents=True, exist_ok=True)
        # Round where eager rounds (a float32 norm inside a float64 or bfloat16 model), so the
        # compiled layers give eager's values rather than more precise ones.
        torch._inductor.config.emulate_precision_casts = True
        dynamo = torch._dynamo.config
        dynamo.cache_size_limit = max(dynamo.cache_size_limit, RECOMPILE_LIMIT)
        compiled = cls(type(model.layers[0]), max_rows)
        start, depth = time.perf_counter(), sys.getrecursionlimit()
        try:
            compiled.warm_up(model)
        finally:  # Inductor lifts the interpreter's recursion limit for good; the server's
            sys.setrecursionlimit(depth)  # bounds on nested request bodies rely on it
        compiled.compile_s = time.perf_counter() - start
        log.info(
            "compiled decoder layers in %.1f s (Inductor cache: %s, %.1f MB)",
            compiled.compile_s,
            cache_dir,
            directory_mb(cache_dir),
        )
        return compiled

    @torch.inference_mode()
    def warm_up(self, model: DecoderForCausalLM) -> None:
        """Run every layer at one row, at two (the symbolic row count) and one row past each
        limit where a linear changes form (weights/few_rows.py: Dynamo compiles the other
        side of the branch then, so a form Inductor cannot lower fails here, not in a step)."""
        cfg = model.cfg
        device = next(model.parameters()).device
        layout = model.layout
        past = {n + 1 for n in form_row_limits(model.layers) if n + 1 <= self.max_rows}
        for rows in sorted({1, 2} | past):
            positions = torch.arange(rows, device=device)
            tables = {name: rope.table(positions) for name, rope in model.ropes.items()}
            x = torch.zeros(rows, cfg.hidden_size, dtype=model.dtype, device=device)
            o = torch.zeros(rows, layout.num_heads, cfg.head_dim, dtype=model.dtype, device=device)
            for layer, rope in zip(model.layers, model.layer_rope):
                self._before(layer, x, *tables[rope])
                self._after(layer, o, x)


def directory_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
