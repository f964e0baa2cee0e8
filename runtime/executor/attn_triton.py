"""The Triton attention backend: same interface and ForwardBatch as TorchAttnBackend.

DECODE batches run the split-K decode kernel; EXTEND and MIXED batches run the extend kernel
(a mixed batch's decodes are extends of length 1). Both read every request's whole context,
this step's tokens included, through fb.kv_indices after the new K/V are written to the pool.
"""

from __future__ import annotations

import torch

from ...kernels.decode_attn import decode_attention
from ...kernels.extend_attn import extend_attention
from .forward_batch import ForwardBatch, ForwardMode
from .memory import KVPool


class TritonAttnBackend:
    """Keeps the host-side bounds of the batch so no layer syncs with the device."""

    def __init__(self) -> None:
        self.is_decode = False
        self.max_seq_len = 0
        self.max_extend_len = 0

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self.is_decode = fb.mode == ForwardMode.DECODE
        self.max_seq_len = max(fb.seq_lens_cpu, default=0)
        self.max_extend_len = max(fb.extend_lens_cpu, default=0)

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        layer_id: int,
        fb: ForwardBatch,
        pool: KVPool,
        sm_scale: float,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        if window is not None or softcap is not None:  # ModelRunner refuses such models
            raise NotImplementedError("the triton backend has no sliding window or softcap")
        pool.write(layer_id, fb.out_cache_loc, k, v)
        k_buffer, v_buffer = pool.k[layer_id], pool.v[layer_id]
        if self.is_decode:
            # One token per request, so q's rows are already [batch, num_heads, head_dim].
            return decode_attention(
                q, k_buffer, v_buffer, fb.kv_indptr, fb.kv_indices, sm_scale,
                max_seq_len=self.max_seq_len,
            )  # fmt: skip
        return extend_attention(
            q, k_buffer, v_buffer, fb.qo_indptr, fb.kv_indptr, fb.kv_indices, sm_scale,
            max_extend_len=self.max_extend_len,
        )  # fmt: skip
