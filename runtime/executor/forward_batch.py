"""ForwardBatch: everything the model and the attention backends see for one step.

Tokens of all requests are packed back to back (request i owns rows
qo_indptr[i]:qo_indptr[i+1]); each request's whole KV context after this step is
kv_indices[kv_indptr[i]:kv_indptr[i+1]], so new tokens appear at its tail.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # every request adds >= 1 token (prefill, chunked prefill)
    DECODE = "decode"  # every request adds exactly 1 token
    MIXED = "mixed"  # extends and decodes in one batch

    @staticmethod
    def of(prefix_lens: list[int], extend_lens: list[int]) -> ForwardMode:
        if all(e == 1 for e in extend_lens):
            return ForwardMode.DECODE
        if any(e == 1 and p > 0 for e, p in zip(extend_lens, prefix_lens)):
            return ForwardMode.MIXED
        return ForwardMode.EXTEND


@dataclass(slots=True)
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    req_pool_idx: torch.Tensor  # [B] int32
    seq_lens: torch.Tensor  # [B] int32, context length after this step
    prefix_lens: torch.Tensor  # [B] int32, tokens already in the KV pool
    extend_lens: torch.Tensor  # [B] int32, tokens computed this step
    out_cache_loc: torch.Tensor  # [num_tokens] int32, slots this step's K/V go to
    qo_indptr: torch.Tensor  # [B+1] int32
    kv_indptr: torch.Tensor  # [B+1] int32
    kv_indices: torch.Tensor  # [sum(seq_lens)] int32
    # Host copies of the lengths: backends loop over requests without syncing.
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    # Rows of the packed tokens whose logits are wanted: the last token of each
    # request by default, every token when prompt logprobs are asked for.
    logits_idx: torch.Tensor  # [num_logit_rows] int64
    # Each request's row epoch (ReqToTokenPool.epochs): a row and its epoch name one request.
    row_epochs: list[int]

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @staticmethod
    def build(
        req_to_token: torch.Tensor,
        req_pool_idx: list[int],
        prefix_lens: list[int],
        input_ids: list[list[int]],
        out_cache_loc: torch.Tensor,
        logit_rows: list[list[int]] | None = None,
        device: torch.device | str = "cpu",
        row_epochs: list[int] | None = None,
    ) -> ForwardBatch:
        """Pack one step. input_ids[i] are request i's new tokens, already written
        (with their slots) into req_to_token at positions prefix_lens[i]:.
        logit_rows[i] lists offsets within request i's new tokens whose logits are
        wanted (default: the last one). row_epochs[i]: request i's row epoch (default 0)."""
        extend_lens = [len(t) for t in input_ids]
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens)]
        if any(e < 1 for e in extend_lens):
            raise ValueError("every request in a batch must add at least one token")
        mode = ForwardMode.of(prefix_lens, extend_lens)
        flat_ids = [t for ids in input_ids for t in ids]
        positions = [p + j for p, e in zip(prefix_lens, extend_lens) for j in range(e)]
        qo_indptr = [0]
        for e in extend_lens:
            qo_indptr.append(qo_indptr[-1] + e)
        kv_indptr = [0]
        for s in seq_lens:
            kv_indptr.append(kv_indptr[-1] + s)
        rows = torch.tensor(req_pool_idx, dtype=torch.int64)
        kv_indices = torch.cat([req_to_token[r, :s] for r, s in zip(rows.tolist(), seq_lens)]).to(
            torch.int32
        )
        if logit_rows is None:
            logits_idx = [qo_indptr[i + 1] - 1 for i in range(len(extend_lens))]
        else:
            logits_idx = [qo_indptr[i] + j for i, js in enumerate(logit_rows) for j in js]

        def i32(x: list[int]) -> torch.Tensor:
            return torch.tensor(x, dtype=torch.int32, device=device)

        return ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(flat_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            req_pool_idx=i32(req_pool_idx),
            seq_lens=i32(seq_lens),
            prefix_lens=i32(prefix_lens),
            extend_lens=i32(extend_lens),
            out_cache_loc=out_cache_loc.to(device=device, dtype=torch.int32),
            qo_indptr=i32(qo_indptr),
            kv_indptr=i32(kv_indptr),
            kv_indices=kv_indices.to(device),
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=extend_lens,
            logits_idx=torch.tensor(logits_idx, dtype=torch.int64, device=device),
            row_epochs=list(row_epochs) if row_epochs is not None else [0] * len(extend_lens),
        )
