"""Before the forward: each scheduled request's new tokens, the KV slots they are written to,
and the logit rows the step must return for it (planned here, read by output_processor.py).

A request needs the logits of its last verified token and of each draft token when it samples
this step (the rounds of verification, draft.py), and those of every prompt position from
logprob_start_len on when prompt logprobs were asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..executor.forward_batch import ForwardBatch
from ..executor.model_runner import ModelRunner
from .batch import ScheduledBatch
from .req import Req


@dataclass(slots=True)
class RowPlan:
    first_row: int  # this request's first row in the step's logits
    input_positions: list[int]  # prompt positions p whose logits score token p + 1
    num_sample: int  # rows after those that sample (1 + draft length), 0 = none


def prepare_step(runner: ModelRunner, batch: ScheduledBatch) -> tuple[ForwardBatch, list[RowPlan]]:
    """The step's ForwardBatch and each request's row plan, in batch order."""
    rows, prefix_lens, input_ids, out_loc, logit_rows, plans = [], [], [], [], [], []
    num_rows = 0
    for req, n in zip(batch.reqs, batch.num_new):
        start = req.kv_len
        rows.append(req.row)
        prefix_lens.append(start)
        input_ids.append(req.fill_ids[start : start + n])
        out_loc += req.slots[start : start + n]
        plan = plan_rows(req, start, n, num_rows)
        sample_rows = list(range(n - plan.num_sample, n))
        wanted = [p - start for p in plan.input_positions] + sample_rows
        logit_rows.append(wanted)
        num_rows += len(wanted)
        plans.append(plan)
    fb = runner.build_batch(rows, prefix_lens, input_ids, out_loc, logit_rows)
    return fb, plans


def plan_rows(req: Req, start: int, n: int, first_row: int) -> RowPlan:
    """The logit rows of `req` computing tokens start .. start + n - 1 this step."""
    completes = start + n == req.seq_len
    sample = completes and req.params.max_new_tokens > len(req.output_ids)
    positions: list[int] = []
    if req.wants_input_logprobs and not req.output_ids:
        first = max(max(req.logprob.logprob_start_len, 1) - 1, start)
        last = min(len(req.input_ids) - 2, start + n - 1)
        positions = list(range(first, last + 1))
    # The last token and each draft token's position: the rounds of verification.
    num_sample = 1 + len(req.draft) if sample else 0
    return RowPlan(first_row, positions, num_sample)
