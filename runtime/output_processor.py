"""OutputProcessor: from one forward's logits to appended tokens, logprobs and finish reasons.

Per request it plans which logit rows the step needs (the last computed position when a
token is to be sampled; every prompt position from logprob_start_len on when prompt
logprobs were asked for), samples all requests at once, then checks stop conditions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from .forward_batch import ForwardBatch
from .grammar import fill_bitmask
from .model_runner import ModelRunner
from .req import FinishReason, Req
from .sampler import AllMaskedError, Sampler
from .tokenizer import Tokenizer


@dataclass(slots=True)
class RowPlan:
    first_row: int  # this request's first row in the step's logits
    input_positions: list[int]  # prompt positions p whose logits score token p + 1
    sample: bool  # the last planned row samples the next token


class OutputProcessor:
    def __init__(
        self, tokenizer: Tokenizer, sampler: Sampler, context_len: int, jump_forward: bool = True
    ):
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.context_len = context_len
        self.eos_ids = tokenizer.eos_token_ids
        self.jump_forward = jump_forward

    # ---- before the forward ---------------------------------------------------------------
    def build_forward(self, runner: ModelRunner, batch) -> tuple[ForwardBatch, list[RowPlan]]:
        rows, prefix_lens, input_ids, out_loc, logit_rows, plans = [], [], [], [], [], []
        num_rows = 0
        for req, n in zip(batch.reqs, batch.num_new):
            start = req.kv_len
            fill = req.fill_ids
            rows.append(req.row)
            prefix_lens.append(start)
            input_ids.append(fill[start : start + n])
            out_loc += req.slots[start : start + n]
            plan = self.plan_rows(req, start, n, num_rows)
            wanted = [p - start for p in plan.input_positions] + ([n - 1] if plan.sample else [])
            logit_rows.append(wanted)
            num_rows += len(wanted)
            plans.append(plan)
        fb = runner.build_batch(rows, prefix_lens, input_ids, out_loc, logit_rows)
        return fb, plans

    @staticmethod
    def plan_rows(req: Req, start: int, n: int, first_row: int) -> RowPlan:
        completes = start + n == req.seq_len
        sample = completes and req.params.max_new_tokens > len(req.output_ids)
        positions: list[int] = []
        if req.wants_input_logprobs and not req.output_ids:
            first = max(max(req.logprob.logprob_start_len, 1) - 1, start)
            last = min(len(req.input_ids) - 2, start + n - 1)
            positions = list(range(first, last + 1))
        return RowPlan(first_row, positions, sample)

    # ---- after the forward ----------------------------------------------------------------
    def process(self, batch, plans: list[RowPlan], logits: torch.Tensor) -> list[Req]:
        """Advance every request in the batch; returns those that finished."""
        for req, n in zip(batch.reqs, batch.num_new):
            req.kv_len += n
        self.record_input_logprobs(batch.reqs, plans, logits)
        sampling = [(r, p) for r, p in zip(batch.reqs, plans) if p.sample]
        done: list[Req] = []
        if sampling:
            rows = [p.first_row + len(p.input_positions) for _, p in sampling]
            reqs = [r for r, _ in sampling]
            top_n = [r.logprob.top_logprobs_num if r.logprob.return_logprob else 0 for r in reqs]
            matchers = [r.grammar for r in reqs]
            bitmask = None
            if any(m is not None for m in matchers):
                bitmask = fill_bitmask(matchers, self.sampler.vocab_size).to(logits.device)
            try:
                out = self.sampler.sample(logits[rows], [r.sampling for r in reqs], bitmask, top_n)
                dead: set[int] = set()
            except AllMaskedError as e:  # those rows fail; the rest of the batch goes on
                out, dead = e.output, set(e.row_idxs)
            for i, req in enumerate(reqs):
                if i in dead:
                    req.finish = FinishReason("abort", message="no token is allowed: every "
                                              "logit was masked (constraint or bias)")
                    continue
                self.append_token(req, out.next_ids[i], out.logprobs[i], out.top_logprobs, i)
                if req.grammar is not None:
                    self.advance_grammar(req, out.next_ids[i])
        for req in batch.reqs:
            if req.finish is None and not req.is_prefilling:
                req.finish = self.check_finish(req)
            if req.finish is not None:
                done.append(req)
        return done

    def record_input_logprobs(self, reqs: list[Req], plans: list[RowPlan], logits) -> None:
        for req, plan in zip(reqs, plans):
            if not plan.input_positions:
                continue
            if not req.input_logprobs and req.logprob.logprob_start_len == 0:
                req.input_logprobs.append((None, req.input_ids[0]))
                req.input_top_logprobs.append(None)
            n = len(plan.input_positions)
            lp = torch.log_softmax(logits[plan.first_row : plan.first_row + n].double(), dim=-1)
            targets = torch.tensor([req.input_ids[p + 1] for p in plan.input_positions])
            picked = lp.gather(1, targets[:, None])[:, 0].tolist()
            req.input_logprobs += list(zip(picked, targets.tolist()))
            k = req.logprob.top_logprobs_num
            if k > 0:
                vals, ids = lp.topk(k, dim=-1)
                req.input_top_logprobs += [
                    list(zip(v, i)) for v, i in zip(vals.tolist(), ids.tolist())
                ]

    def append_token(self, req: Req, token: int, logprob: float, top, i: int) -> None:
        req.output_ids.append(token)
        req.sampling.record(token)
        if req.logprob.return_logprob:
            req.output_logprobs.append((logprob, token))
            if req.logprob.top_logprobs_num > 0 and top is not None:
                req.output_top_logprobs.append(top[i])

    def advance_grammar(self, req: Req, token: int) -> None:
        """Move the constraint over the sampled token, then append what it forces next
        (jump-forward: those tokens get their K/V in the next step, without sampling)."""
        m = req.grammar
        try:
            m.accept_token(token)
        except ValueError as err:  # cannot happen under the mask; never continue off-grammar
            req.finish = FinishReason("abort", message=f"constraint: {err}")
            return
        if token in self.eos_ids:
            return
        if m.is_finished():
            req.finish = FinishReason("stop", matched=None)
            return
        if not self.jump_forward:
            return
        room = req.params.max_new_tokens - len(req.output_ids)
        forced = m.jump_forward(self.tokenizer)[:room] if room > 0 else []
        for t in forced:
            req.output_ids.append(t)
            req.sampling.record(t)
            if req.logprob.return_logprob:  # forced, not sampled: no model logprob
                req.output_logprobs.append((None, t))
                if req.logprob.top_logprobs_num > 0:
                    req.output_top_logprobs.append([])
        req.num_forced_tokens += len(forced)
        if forced and m.is_finished():
            req.finish = FinishReason("stop", matched=None)

    def check_finish(self, req: Req) -> FinishReason | None:
        p = req.params
        if p.max_new_tokens == 0 or not req.output_ids:
            return FinishReason("length", length=0) if p.max_new_tokens == 0 else None
        last = req.output_ids[-1]
        if last in self.eos_ids and not p.ignore_eos:
            return FinishReason("stop", matched=last)
        if p.stop_token_ids and last in p.stop_token_ids:
            return FinishReason("stop", matched=last)
        if p.stop or p.stop_regex:
            tail = self.tail_text(req)
            for s in p.stop or []:
                if s in tail:
                    return FinishReason("stop", matched=s)
            for pattern in p.stop_regex or []:
                m = re.search(pattern, self.tokenizer.decode(req.output_ids))
                if m:
                    return FinishReason("stop", matched=m.group(0))
        if len(req.output_ids) >= p.max_new_tokens:
            return FinishReason("length", length=p.max_new_tokens)
        if req.seq_len >= self.context_len:
            return FinishReason("length", length=len(req.output_ids))
        return None

    def tail_text(self, req: Req) -> str:
        """Enough decoded output to see any stop string that ends at the newest token."""
        longest = max(len(s) for s in req.params.stop)
        ids = req.output_ids[-(longest + 2) :]
        return self.tokenizer.decode(ids, req.params.skip_special_tokens)
