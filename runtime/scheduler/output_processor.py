"""OutputProcessor: from one forward's logits to appended tokens, logprobs and finish reasons.

After the forward (the rows were planned before it, planner.py) it records prompt logprobs,
samples all requests at once in rounds (verifying drafts, draft.py), then checks stop
conditions and asks the draft sources for the next draft. What one request's own
outputs raise (its logprobs, stops, draft) fails that request alone, never its batch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from ..constrained.closing import MAX_REFUSED, ClosingMatcher, StartPaths
from ..constrained.closing_search import ClosingTokens
from ..constrained.matcher import fill_bitmask
from ..sampling.sampler import AllMaskedError, SampleOutput, Sampler, picks_plain_max
from ..tokenizer import Tokenizer
from .batch import ScheduledBatch
from .draft import ConstraintDraft, DraftSource, accept_into_grammar, drop_draft, make_draft
from .planner import RowPlan
from .req import FinishKind, FinishReason, Req
from .speculative import DraftBudget
from .stop import StopMatcher, StopSpec

log = logging.getLogger("stemma.outputs")


class OutputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        sampler: Sampler,
        context_len: int,
        jump_forward: bool = True,
        speculative: DraftBudget | None = None,
    ):
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.context_len = context_len
        self.eos_ids = tokenizer.eos_token_ids
        # Where drafts come from, first proposal wins: the text a constraint forces
        # (jump-forward), then speculation's sources (build_core adds them, when on).
        self.drafts: list[DraftSource] = [ConstraintDraft(tokenizer)] if jump_forward else []
        self.budget = speculative  # prices the speculative drafts (speculative.py)
        self._closing_tokens: ClosingTokens | None = None  # built on first use
        self._start_paths = StartPaths()  # early closing's first searches, by constraint

    def matcher_for(self, req: Req, matcher: Any) -> Any:
        """The request's constraint matcher, with early closing where its params ask for it."""
        if not req.params.closes_early:
            return matcher
        if self._closing_tokens is None:
            self._closing_tokens = ClosingTokens.from_tokenizer(self.tokenizer)
        budget = req.params.max_new_tokens
        start = None
        if (handle := req.grammar_handle) is not None:  # a fresh matcher of its constraint
            # the spec's digest, not the spec: a remembered search keeps no schema alive
            key = (type(handle).__name__, handle.spec.key, req.closing_examples)
            start = (self._start_paths, key)
        return ClosingMatcher(
            matcher, budget, self._closing_tokens, self.tokenizer, req.closing_examples, start
        )

    # ---- after the forward ----------------------------------------------------------------
    def process(
        self, batch: ScheduledBatch, plans: list[RowPlan], logits: torch.Tensor
    ) -> list[Req]:
        """Advance every request in the batch; returns those that finished. logits: the
        model's, in its dtype (bfloat16 ones are widened unless only argmaxes are read)."""
        logits = self.widen(batch.reqs, plans, logits)
        for req, n in zip(batch.reqs, batch.num_new):
            req.kv_len += n
        for req, plan in zip(batch.reqs, plans):
            if plan.input_positions:
                with failing_alone(req, num_verified=0):
                    self.record_input_logprobs(req, plan, logits)
        active = [
            (r, p.first_row + len(p.input_positions))
            for r, p in zip(batch.reqs, plans)
            if p.num_sample and r.finish is None
        ]
        for req, _ in active:
            req.num_decode_steps += 1
        round_idx = 0
        while active:  # round r: position r of every request still verifying
            active = self.sample_round(active, round_idx, logits)
            round_idx += 1
        done: list[Req] = []
        if self.budget is not None:
            self.budget.begin_drafts(batch.reqs)
        for req in batch.reqs:
            if req.finish is None and not req.is_prefilling and not req.draft:
                with failing_alone(req, num_verified=None):
                    req.finish = self.check_finish(req)
                    if req.finish is None and self.drafts:
                        make_draft(req, self.drafts, self.context_len)
                        if self.budget is not None and not (req.draft and req.speculative_draft):
                            self.budget.missed(req)
            if req.finish is not None:
                mark_closed_early(req)
                done.append(req)
        if self.budget is not None:  # the step's drafts, together, must pay for themselves
            self.budget.settle(batch.reqs)
        return done

    @staticmethod
    def widen(reqs: list[Req], plans: list[RowPlan], logits: torch.Tensor) -> torch.Tensor:
        """float32 logits, unless every row is a plain greedy choice (no logprobs, penalties
        or bias; a constraint's mask may apply): an argmax over bfloat16 logits is exact, -inf
        where a mask refuses included, and skipping the copy saves a [rows, vocab] float32
        pass per decode step."""
        if logits.dtype in (torch.float32, torch.float64):
            return logits
        plain = all(
            not r.logprob.return_logprob and not p.input_positions for r, p in zip(reqs, plans)
        )
        if plain and picks_plain_max([r.sampling for r in reqs]):
            return logits
        return logits.float()

    def sample_round(self, active: list[tuple[Req, int]], r: int, logits) -> list[tuple[Req, int]]:
        """Sample position r for each request; keep those whose draft token was confirmed."""
        live = []
        for req, row in active:
            if req.grammar is not None and req.grammar.is_finished():
                drop_draft(req, r)  # the constraint is complete: nothing more to sample
                req.finish = req.finish or FinishReason.stop(None)
            else:
                live.append((req, row))
        if not live:
            return []
        reqs = [req for req, _ in live]
        out, dead = self.sample(reqs, take_rows(logits, [row + r for _, row in live]))
        still = []
        for i, (req, row) in enumerate(live):
            if i in dead:
                drop_draft(req, r)
                req.finish = FinishReason.abort(dead[i])
                continue
            token = out.next_ids[i]
            confirmed = r < len(req.draft) and token == req.draft[r]
            with failing_alone(req, num_verified=r):
                self.advance(req, token, confirmed, r, out, i)
            if req.finish is not None:
                if req.draft:  # finished on a confirmed token: the rest of the draft goes
                    drop_draft(req, r + 1)
            elif confirmed:
                still.append((req, row))
        return still

    def advance(self, req: Req, token: int, confirmed: bool, r: int, out, i: int) -> None:
        """Append round r's sampled token to one request and check whether it finished."""
        if self.budget is not None and req.speculative_draft and r < len(req.draft):
            self.budget.learn(confirmed)  # a speculative draft token verified
            req.drafted_at = len(req.output_ids)
        if not confirmed:
            req.num_drafts_cut += r < len(req.draft)
            drop_draft(req, r)
        self.append_token(req, token, out.logprobs[i], out.top_logprobs, i)
        req.num_forced_tokens += confirmed
        accept_into_grammar(req, token, self.eos_ids)
        if req.finish is None and (stop := self.check_finish(req)) is not None:
            req.finish = stop

    def sample(self, reqs: list[Req], logits: torch.Tensor):
        """One sampler call over these rows, under their constraints' masks: the output, and
        by row why a row failed (nothing allowed, or its constraint raised computing its
        mask), so that only its request fails."""
        matchers = [r.grammar for r in reqs]
        masks = None
        failed: dict[int, str] = {}  # rows whose mask raised: nothing allowed, so they fail
        if any(m is not None for m in matchers):
            masks = fill_bitmask(matchers, self.sampler.vocab_size, errors=failed)
        # More top logprobs than the vocabulary holds are all of it (torch.topk would raise).
        vocab = logits.shape[-1]
        top_n = [
            min(r.logprob.top_logprobs_num, vocab) if r.logprob.return_logprob else 0 for r in reqs
        ]
        want = any(r.logprob.return_logprob for r in reqs)
        states = [r.sampling for r in reqs]
        bitmask = None if masks is None else masks.to(logits.device)
        dead: dict[int, str] = {}
        try:
            out = self.sampler.sample(logits, states, bitmask, top_n, want)
        except AllMaskedError as e:  # those rows fail; the rest of the batch goes on
            masked = "no token is allowed: every logit was masked (constraint or bias)"
            out, dead = e.output, {i: failed.get(i, masked) for i in e.row_idxs}
        if masks is not None:
            self.sample_again(reqs, logits, masks, top_n, want, out, dead)
        return out, dead

    def sample_again(
        self,
        reqs: list[Req],
        logits: torch.Tensor,  # [B, V]
        masks: torch.Tensor,  # [B, ceil(V / 32)] int32, on the CPU: refused bits cleared here
        top_n: list[int],
        want: bool,
        out: SampleOutput,  # the first draw, replaced row by row
        dead: dict[int, str],
    ) -> None:
        """Where early closing refuses the token sampled (ClosingMatcher.refuses: no
        completion would fit after it), mask it and sample that row again, up to MAX_REFUSED
        times: the draw is then the one the mask with every refused token cleared gives. A
        row whose mask that leaves empty keeps its first token."""
        rows = [
            i for i, r in enumerate(reqs) if i not in dead and isinstance(r.grammar, ClosingMatcher)
        ]
        first: dict[int, tuple[int, float]] = {}
        words = masks.numpy().view(np.uint32)
        for _ in range(MAX_REFUSED):
            rows = [i for i in rows if _refuses(reqs[i], out.next_ids[i])]
            if not rows:
                return
            for i in rows:
                t = out.next_ids[i]
                first.setdefault(i, (t, out.logprobs[i]))
                words[i, t // 32] &= ~np.uint32(1 << (t % 32))
            at = torch.tensor(rows, dtype=torch.long)
            try:
                again = self.sampler.sample(
                    logits[at.to(logits.device)],
                    [reqs[i].sampling for i in rows],
                    masks[at].to(logits.device),
                    [top_n[i] for i in rows],
                    want,
                )
                empty = set()
            except AllMaskedError as e:
                again, empty = e.output, set(e.row_idxs)
            for j, i in enumerate(rows):
                out.next_ids[i], out.logprobs[i] = (
                    first[i] if j in empty else (again.next_ids[j], again.logprobs[j])
                )
            rows = [i for j, i in enumerate(rows) if j not in empty]

    def record_input_logprobs(self, req: Req, plan: RowPlan, logits: torch.Tensor) -> None:
        """The logprob of each planned prompt position's next token, and its top list."""
        if not req.input_logprobs and req.logprob.logprob_start_len == 0:
            req.input_logprobs.append((None, req.input_ids[0]))
            req.input_top_logprobs.append(None)
        n = len(plan.input_positions)
        lp = torch.log_softmax(logits[plan.first_row : plan.first_row + n].double(), dim=-1)
        targets = torch.tensor([req.input_ids[p + 1] for p in plan.input_positions])
        picked = lp.gather(1, targets[:, None])[:, 0].tolist()
        req.input_logprobs += list(zip(picked, targets.tolist()))
        k = min(req.logprob.top_logprobs_num, lp.shape[-1])
        if k > 0:
            vals, ids = lp.topk(k, dim=-1)
            req.input_top_logprobs += [list(zip(v, i)) for v, i in zip(vals.tolist(), ids.tolist())]

    def append_token(self, req: Req, token: int, logprob: float, top, i: int) -> None:
        req.output_ids.append(token)
        req.sampling.record(token)
        if req.logprob.return_logprob:
            req.output_logprobs.append((logprob, token))
            if req.logprob.top_logprobs_num > 0 and top is not None:
                req.output_top_logprobs.append(top[i])

    def check_finish(self, req: Req) -> FinishReason | None:
        p = req.params
        if p.max_new_tokens == 0:
            return FinishReason.length_of(0)
        if not req.output_ids:
            return None
        last = req.output_ids[-1]
        if last in self.eos_ids and not p.ignore_eos:
            return FinishReason.stop(last)
        if p.stop_token_ids and last in p.stop_token_ids:
            return FinishReason.stop(last)
        if p.stop or p.stop_regex:
            if (matched := self.stop_matcher(req).feed(req.output_ids)) is not None:
                return FinishReason.stop(matched)
        if len(req.output_ids) >= p.max_new_tokens:
            return FinishReason.length_of(p.max_new_tokens)
        # The verified sequence: during verification rounds the draft still holds tokens
        # that output_ids already has, and seq_len would count them twice.
        if len(req.input_ids) + len(req.output_ids) >= self.context_len:
            return FinishReason.length_of(len(req.output_ids))
        return None

    def stop_matcher(self, req: Req) -> StopMatcher:
        """The request's matcher; the engine builds it at parse time (refusing a stop regex
        with no linear-time automaton), requests built without the engine get one here."""
        if req.stop is None:
            spec = StopSpec.compile(req.params)
            assert spec is not None, "only requests with stops have a matcher"
            req.stop = spec.matcher(self.tokenizer)
        return req.stop


def _refuses(req: Req, token: int) -> bool:
    """Whether early closing refuses the token sampled; where asking raises, the token
    stands, and taking it fails the request alone (failing_alone) rather than the batch."""
    try:
        return req.grammar.refuses(token)
    except Exception:  # noqa: BLE001 - this request's own failure, met when it takes the token
        log.exception("request %s: early closing could not check a token", req.rid)
        return False


def mark_closed_early(req: Req) -> None:
    """A constrained output that early closing completed ends as a length finish, flagged."""
    if req.finish is not None and req.finish.kind is FinishKind.STOP:
        if isinstance(req.grammar, ClosingMatcher) and req.grammar.closed_early:
            req.finish = FinishReason.length_of(len(req.output_ids), closed_early=True)


@contextlib.contextmanager
def failing_alone(req: Req, num_verified: int | None) -> Iterator[None]:
    """Finish `req` with an abort if its own output handling raises, so the rest of the
    batch goes on. num_verified: how many of its draft tokens this step verified (their K/V
    stands); None when the draft has no K/V yet."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - this request fails; the batch and engine go on
        log.exception("request %s failed in output processing", req.rid)
        if num_verified is None:
            req.draft = []
        elif req.draft:
            drop_draft(req, num_verified)
        req.finish = FinishReason.abort(f"output processing: {type(e).__name__}: {e}")


def take_rows(logits: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """logits[rows]: a view when the rows are consecutive (a plain decode step), otherwise
    one index_select (list indexing copies through a much slower path)."""
    first = rows[0]
    if rows[-1] - first == len(rows) - 1 and rows == list(range(first, first + len(rows))):
        return logits[first : first + len(rows)]
    return logits.index_select(0, torch.tensor(rows, device=logits.device))
