"""Speculative decoding by prompt lookup (SGLang's NGRAM): drafts from the request's own
tokens, verified in the forward that computes their K/V, so the output is what decoding
without drafts gives; the draft length follows measured acceptance and step cost."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from stemma.runtime.config import EngineConfig
from stemma.runtime.engine import Engine
from stemma.runtime.sampling.params import SamplingParams
from stemma.runtime.sampling.sampler import SamplingState
from stemma.runtime.scheduler.batch import ScheduledBatch
from stemma.runtime.scheduler.ngram import NGramIndex
from stemma.runtime.scheduler.req import Req
from stemma.runtime.scheduler.speculative import EVIDENCE_HALF_LIFE, DraftBudget, acceptance
from stemma.runtime.scheduler.speculative_sources import NGramDraft
from stemma.runtime.scheduler.step_cost import COST_WINDOW, STALE_STEPS, StepCost

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a century. Every night "
    "its lamp turned slowly, sweeping a pale beam across the black water, warning ships away "
    "from the rocks below. The keeper climbed the narrow stairs each evening to trim the wick."
)


def make_req(input_ids: list[int], output_ids: list[int] = ()) -> Req:
    params = SamplingParams(max_new_tokens=64)
    sampling = SamplingState.create(params, list(input_ids), 128)
    req = Req(rid="r", input_ids=list(input_ids), params=params, sampling=sampling)
    req.output_ids = list(output_ids)
    return req


# ---- the index and the draft source ---------------------------------------------------------
def test_lookup_finds_the_latest_earlier_occurrence_longest_suffix_first():
    index = NGramIndex(max_n=3)
    index.extend([1, 2, 3, 4, 9, 2, 3, 5, 7, 1, 2, 3])
    # suffix (1, 2, 3) occurred at 0..2, followed by 4 9 2
    assert index.lookup(3) == [4, 9, 2]
    index.extend([6])
    assert index.lookup(3) == []  # (3, 6) and (6,) with min_n 2: never seen before
    index.extend([1, 2])
    # (6, 1, 2) never; (1, 2) latest at 9..10, followed by 3 6 1
    assert index.lookup(3) == [3, 6, 1]
    # the suffix itself is not its own earlier occurrence
    fresh = NGramIndex()
    fresh.extend([4, 5])
    assert fresh.lookup(4) == []


def test_a_repetition_drafts_past_its_own_period():
    """An occurrence that runs into the end (a repeating list) goes on from the draft itself,
    as the copy of a repetition would."""
    index = NGramIndex(max_n=4)
    index.extend([7, 8, 1, 2, 1, 2, 1, 2])  # "None, None, None": a period of 2
    assert index.lookup(5) == [1, 2, 1, 2, 1]
    index = NGramIndex(max_n=3)
    index.extend([5, 3, 4, 6, 3, 4, 6, 3, 4])  # a period of 3: (6, 3, 4) last ended at 6
    assert index.lookup(7) == [6, 3, 4, 6, 3, 4, 6]
    index.extend([9])  # the period broken: (4, 9) never seen
    assert index.lookup(7) == []


def test_draft_source_follows_prompt_and_output_incrementally():
    budget = DraftBudget(max_tokens=4)
    source = NGramDraft(budget)
    req = make_req([10, 11, 12, 13, 14, 15, 16], [20, 11, 12])
    assert source.propose(req) == [13, 14, 15, 16]
    req.output_ids += [13, 99]
    assert source.propose(req) == []  # (13, 99) never seen
    assert req.ngrams is not None and req.ngrams.tokens == [*req.input_ids, *req.output_ids]


class _Grammar:
    """Allows only even tokens; records that it is left where it was."""

    def __init__(self) -> None:
        self.accepted: list[int] = []

    def is_finished(self) -> bool:
        return False

    def allows(self, token: int) -> bool:
        return token % 2 == 0

    def accept_token(self, token: int) -> None:
        self.accepted.append(token)

    def rollback(self, n: int) -> None:
        del self.accepted[len(self.accepted) - n :]


def test_constrained_draft_ends_before_the_first_refused_token():
    req = make_req([2, 4, 6, 8, 7, 10, 2, 4])
    req.grammar = _Grammar()
    assert NGramDraft(DraftBudget(max_tokens=8)).propose(req) == [6, 8]
    assert req.grammar.accepted == []


# ---- how much to draft, from injected measurements ---------------------------------------------
def fitted(base: float, per_row: float, per_draft_step: float = 0.0) -> StepCost:
    cost = StepCost()
    for rows, drafted in ((1, False), (2, True), (4, True), (8, True), (1, False), (3, True)):
        cost.record(rows, drafted, base + per_row * rows + per_draft_step * drafted)
    return cost


def test_step_cost_fits_base_per_row_and_the_draft_step():
    (span,) = fitted(0.030, 0.0005, 0.004).spans
    assert span.base == pytest.approx(0.030)
    assert span.per_row == pytest.approx(0.0005)
    assert span.per_draft_step == pytest.approx(0.004)
    flat = StepCost()
    for _ in range(4):
        flat.record(1, False, 0.03)
    (span,) = flat.spans
    assert (span.per_row, span.per_draft_step) == (0.0, 0.0)  # nothing varied: none measured
    assert span.base == pytest.approx(0.03)


def few_rows_cost(measured_past_limit: bool = True) -> StepCost:
    """A CPU step on the GGUF's int4 blocks up to 4 rows (10 ms + 1 ms a row, +0.5 ms off the
    decode path), on packed bfloat16 past them (25 ms whatever the rows)."""
    cost = StepCost(limits=[4])
    for rows, drafted in ((1, False), (2, True), (4, True), (1, False), (3, True)):
        cost.record(rows, drafted, 0.010 + 0.001 * rows + 0.0005 * drafted)
    if measured_past_limit:
        for rows in (5, 8, 6):
            cost.record(rows, True, 0.025)
    return cost


def test_step_cost_fits_each_span_between_row_limits_apart():
    cost = few_rows_cost()
    below, past = cost.spans
    fit = (below.base, below.per_row, below.per_draft_step)
    assert fit == pytest.approx((0.010, 0.001, 0.0005))
    assert past.base == pytest.approx(0.025) and past.per_row == pytest.approx(0.0, abs=1e-12)
    assert cost.seconds(4, True) == pytest.approx(0.0145)
    assert cost.seconds(5, True) == pytest.approx(0.025)
    assert list(cost.seconds(torch.tensor([1, 4, 8]).numpy(), True)) == pytest.approx(
        [0.0115, 0.0145, 0.025]
    )
    # a span no step has reached is priced as the one below it: crossing is tried
    unknown = few_rows_cost(measured_past_limit=False)
    assert unknown.seconds(8, True) == pytest.approx(0.010 + 0.008 + 0.0005)


def test_budget_drafts_while_a_draft_token_pays_for_its_row():
    req = make_req([1, 2, 3])
    # a one-request CPU step: 30 ms, a row 0.5 ms: drafts whenever anything may stand
    cheap = DraftBudget(max_tokens=7, cost=fitted(0.030, 0.0005), batch_size=1)
    assert cheap.length(req) == 5  # nothing seen yet: a = 1/2, and 0.5^6 * 30.5 ms < 0.5 ms
    req.num_forced_tokens = 50
    assert cheap.length(req) == 7
    req.num_forced_tokens = 0
    # a large batch, compute-bound: a row costs about what a sampled token does
    bound = DraftBudget(max_tokens=7, cost=fitted(0.002, 0.0015), batch_size=64)
    assert bound.length(req) == 0
    # acceptance decides in between: a^j * per_token > row
    mid = DraftBudget(max_tokens=16, cost=fitted(0.010, 0.001), batch_size=4)
    per_token = (0.010 + 0.004) / 4
    req.num_forced_tokens, req.num_drafts_cut = 98, 0  # a = 0.99
    good = mid.length(req)
    req.num_forced_tokens, req.num_drafts_cut = 0, 98  # a = 0.01
    poor = mid.length(req)
    assert good == 16 and poor == 0
    req.num_forced_tokens, req.num_drafts_cut = 8, 8  # a = 0.5
    a = acceptance(req)
    expect = max(j for j in range(17) if j == 0 or a**j * per_token > 0.001)
    assert mid.length(req) == expect > 0
    # no slope measured yet: rows are taken as free
    assert DraftBudget(max_tokens=5).length(req) == 5


def test_a_new_request_starts_from_what_recent_drafts_did():
    """A request's acceptance starts from the engine's recent drafts (decayed), not from one
    half: a step 10 ms and a row 12 ms (a token 22 ms), so at one half no draft pays."""
    budget = DraftBudget(max_tokens=7, cost=fitted(0.010, 0.012), batch_size=1)
    fresh = make_req([1, 2, 3])
    assert budget.prior == 0.5 and budget.length(fresh) == 0
    for _ in range(20):  # a rewrite's drafts: 9 of 10 tokens stand
        for stood in [True] * 9 + [False]:
            budget.learn(stood)
    assert 0.85 < budget.prior < 0.95
    assert acceptance(fresh, budget.prior) == pytest.approx(budget.prior)
    budget.lengths.clear()  # (a step's end clears the lengths it priced)
    assert budget.length(fresh) > 0
    fresh.num_forced_tokens, fresh.num_drafts_cut = 0, 30  # its own refusals outweigh it
    assert budget.length(fresh) == 0
    for _ in range(1000):  # free text's drafts, later: the rewrite's decay away
        budget.learn(False)
    assert budget.prior < 0.05


def test_a_request_whose_first_drafts_were_refused_drafts_again_later():
    """A request's own refusals fade as it samples tokens without a draft (half every
    EVIDENCE_HALF_LIFE), back to the prior: one whose drafts were cut before the text it
    copies began drafts again later rather than never, and sooner than one refused more."""
    budget = DraftBudget(max_tokens=7, cost=fitted(0.010, 0.008), batch_size=1)
    for _ in range(20):  # recent requests' drafts: 9 of 10 tokens stood
        for stood in [True] * 9 + [False]:
            budget.learn(stood)
    once, often = make_req([1, 2, 3]), make_req([1, 2, 3])
    once.num_drafts_cut, often.num_drafts_cut = 3, 12
    assert budget.length(once) == budget.length(often) == 0
    waited = {}
    for req in (once, often):
        while budget.length(req) == 0:
            req.output_ids.append(7)
            budget.lengths.clear()  # a step's end
        waited[id(req)] = len(req.output_ids)
    assert 0 < waited[id(once)] < waited[id(often)] < 8 * EVIDENCE_HALF_LIFE
    # with no draft for long, only the prior is left
    often.output_ids += [7] * 40 * EVIDENCE_HALF_LIFE
    assert acceptance(often, budget.prior) == pytest.approx(budget.prior, abs=1e-6)
    often.drafted_at = len(often.output_ids)  # a draft verified now: its counts weigh whole
    assert acceptance(often, budget.prior) == pytest.approx((2 * budget.prior) / 14)


def drafted(req: Req, n: int) -> Req:
    req.draft, req.speculative_draft = list(range(n)), True
    req.num_draft_tokens += n
    return req


def test_a_steps_drafts_are_dropped_unless_together_they_pay_for_leaving_the_decode_path():
    # 32 requests, a plain step 80 ms (2.5 ms a token), a row 0.5 ms, a draft step +20 ms
    budget = DraftBudget(max_tokens=7, cost=fitted(0.064, 0.0005, 0.020), batch_size=32)
    poor = [drafted(make_req([1, 2]), 2) for _ in range(3)]  # a = 1/2: 0.75 tokens each
    budget.settle(poor)  # 2.25 tokens * 2.5 ms < 20 ms + 3 ms
    assert all(r.draft == [] and r.num_draft_tokens == 0 for r in poor)
    good = [drafted(make_req([1, 2]), 4) for _ in range(12)]
    for r in good:
        r.num_forced_tokens = 40  # a = 41/42: ~3.8 tokens each
    budget.settle(good)  # ~45 tokens * 2.5 ms > 20 ms + 24 ms
    assert all(len(r.draft) == 4 for r in good)
    jump = make_req([1, 2])
    jump.draft = [5, 6]  # a constraint's forced text: never the budget's to drop
    budget.settle([jump, *poor])
    assert jump.draft == [5, 6]


def test_drafts_stay_under_a_row_limit_unless_crossing_it_saves_more():
    req = make_req([1, 2, 3])
    budget = DraftBudget(max_tokens=7, cost=few_rows_cost(), batch_size=1)
    # one request, a token 11 ms: at a = 0.7, 3 drafts save 1.53 tokens for 3 ms of rows,
    # 7 would save 2.14 for 13.5 ms past the limit
    req.num_forced_tokens, req.num_drafts_cut = 69, 29
    assert acceptance(req) == pytest.approx(0.7)
    assert budget.length(req) == 3
    # at a = 0.95, 7 drafts save 5.3 tokens: worth the packed step
    req.num_forced_tokens, req.num_drafts_cut = 94, 4
    assert budget.length(req) == 7
    # not measured past the limit yet: priced as below it, so the limit is crossed (the j-th
    # token pays while 0.7^j * 11 ms > 1 ms)
    req.num_forced_tokens, req.num_drafts_cut = 69, 29
    assert DraftBudget(7, few_rows_cost(measured_past_limit=False)).length(req) == 6


def test_with_no_request_waiting_a_batchs_draft_token_saves_only_its_row():
    """A fixed batch steps as often as its slowest request needs: a token one request gains
    frees its row in a later step (T(B) - T(B - 1)), not its share of a step, unless a
    waiting request takes the row; one request's step goes whole."""
    queue: list[int] = []
    # 32 requests, a plain step 30 + 0.5 ms a row (46 ms, 1.44 ms a request), a draft step
    # 20 ms more
    cost = fitted(0.030, 0.0005, 0.020)
    budget = DraftBudget(max_tokens=7, cost=cost, batch_size=32, waiting=lambda: len(queue))
    assert budget.token_value == pytest.approx(0.0005)
    queue.append(1)
    assert budget.token_value == pytest.approx(0.046 / 32)
    assert DraftBudget(7, cost, batch_size=1, waiting=lambda: 0).token_value == pytest.approx(
        0.0305
    )
    # 8 drafts of 4 tokens that all but surely stand (a = 0.999): 32 tokens are worth 46 ms
    # as shares, more than the draft step's 20 ms and 32 rows' 16 ms; as rows, 16 ms, less
    plain = [make_req([1, 2]) for _ in range(24)]
    for waiting in ([1], []):
        queue[:] = waiting
        good = [drafted(make_req([1, 2]), 4) for _ in range(8)]
        for r in good:
            r.num_forced_tokens = 998
        budget.settle([*good, *plain])
        assert all(len(r.draft) == (4 if waiting else 0) for r in good)
    # with no request waiting, each request looks up all it may: every request's drafts
    # together could save the batch whole steps (settle prices them: the next test)
    sure = make_req([1, 2])
    sure.num_forced_tokens = 998
    for waiting in ([], [1]):
        queue[:] = waiting
        budget.lengths.clear()
        budget.hopeless = None  # (a step's end clears both)
        assert budget.length(sure) == 7
    # where no step of drafts could pay, however sure, none is looked up: 64 requests, a
    # row costing what a step saves a request (compute-bound), a draft step 20 ms more
    queue.clear()
    bound = DraftBudget(7, fitted(0.002, 0.0015, 0.020), batch_size=64, waiting=lambda: 0)
    assert bound.length(sure) == 0 and bound.hopeless


def test_a_batch_in_lockstep_keeps_the_drafts_that_save_it_whole_steps():
    """With no request waiting, the batch ends when the request with the most tokens left
    does: it ends j steps sooner when every request gains what it needs to finish j steps
    before that one does now, so drafts every request has are worth whole steps (a batch of
    rewrites), and one request without a draft leaves them worth their rows."""
    # 8 requests: a plain step 34 ms (30 + 0.5 a row), a draft step 20 ms more
    cost = fitted(0.030, 0.0005, 0.020)

    def fresh(batch_size: int = 8) -> DraftBudget:
        return DraftBudget(max_tokens=7, cost=cost, batch_size=batch_size, waiting=lambda: 0)

    def batch(num: int, draft: int, ahead: int = 0) -> list[Req]:
        return [drafted(make_req([1, 2], [7] * ahead), draft) for _ in range(num)]

    # nothing tried yet: each step saved at one half, so 4 tokens each save ~2 steps (68 ms)
    # for 32 rows and the draft step (36 ms); as rows alone (0.5 ms a token) they would not pay
    budget = fresh()
    good = batch(8, 4)
    budget.settle(good)
    assert [len(r.draft) for r in good] == [4] * 8
    assert all(r.num_draft_tokens == 4 and r.speculative_draft for r in good)
    one_short = [*batch(7, 4), make_req([1, 2])]  # the last has nothing to draft
    budget = fresh()
    budget.settle(one_short)
    assert all(r.draft == [] and r.num_draft_tokens == 0 for r in one_short)
    # a request 3 tokens behind the others: its first 3 tokens each save a step alone; the
    # 4th saves one more only with a token from every other request
    behind, ahead = batch(1, 4), batch(3, 4, ahead=3)
    budget = fresh(batch_size=4)
    budget.settle([*behind, *ahead])
    assert len(behind[0].draft) == 4 and [len(r.draft) for r in ahead] == [1, 1, 1]
    assert sum(r.num_draft_tokens for r in (*behind, *ahead)) == 7


def test_a_batch_whose_last_request_finds_no_draft_looks_up_nothing_more():
    """In lockstep every request looks up all it may, since together their drafts could
    save the batch whole steps; once one of the requests the batch's end waits for (the
    most tokens left) has found none, no step can be saved, and the rest are priced alone,
    by their rows: here hopeless, so they look nothing up. A request with fewer tokens
    left needs no draft for the batch to end sooner, so its miss changes nothing."""
    budget = DraftBudget(7, fitted(0.030, 0.0005, 0.020), batch_size=8, waiting=lambda: 0)
    behind = make_req([1, 2], [7] * 3)
    reqs = [make_req([1, 2], [7]) for _ in range(6)]
    for r in (behind, *reqs):
        r.kv_len = r.seq_len - 1  # decoding: the newest token lacks K/V
    budget.begin_drafts([behind, *reqs])
    assert budget.top_left == 63
    assert budget.length(reqs[0]) == 7 and budget.together
    budget.missed(behind)
    assert budget.length(reqs[1]) == 7 and budget.together
    budget.missed(reqs[2])
    assert not budget.together and budget.hopeless
    assert budget.length(reqs[3]) == 0
    # the next step starts over (observe clears the step's pricing)
    budget.observe(ScheduledBatch(reqs=[], num_new=[], is_prefill=[]), 0.0)
    assert budget.length(reqs[4]) == 7 and budget.together


def test_what_lockstep_steps_saved_decides_the_next_ones():
    """The chance that a lockstep step saves j steps is what such steps saved lately: a batch
    whose drafts all stood goes on drafting together, one whose drafts were refused stops,
    and tries again once that evidence has faded (LOCKSTEP_DECAY a step)."""
    budget = DraftBudget(7, fitted(0.030, 0.0005, 0.020), batch_size=8, waiting=lambda: 0)
    assert budget.steps_chance() == [0.5] * 7

    def step(stand: int) -> list[Req]:
        """One lockstep step of 8 requests drafting 4 tokens: plan, then `stand` of each
        request's tokens confirmed; returns the next step's drafts after settle."""
        reqs = [drafted(make_req([1, 2]), 4) for _ in range(8)]
        budget.settle(reqs)
        for r in reqs:
            r.num_forced_tokens += min(stand, len(r.draft))
        nxt = [drafted(make_req([1, 2]), 4) for _ in range(8)]
        budget.settle(nxt)  # scores the step before, then plans this one
        return nxt

    assert all(len(r.draft) == 4 for r in step(stand=4))
    assert budget.steps_chance()[:4] == [pytest.approx(2 / 3)] * 4
    budget.pending = None
    for _ in range(6):  # every draft refused: the batch saved nothing
        step(stand=0)
        budget.pending = None
    assert budget.steps_chance()[0] <= 0.25  # 2 / 8: it stopped trying after 4 refusals
    assert all(r.draft == [] for r in step(stand=0))
    # some steps later the counts have faded, so the batch tries again
    for _ in range(1500):
        budget.observe(ScheduledBatch(reqs=[], num_new=[], is_prefill=[]), 0.0)
    assert budget.steps_chance()[0] > 0.45
    reqs = [drafted(make_req([1, 2]), 4) for _ in range(8)]
    budget.settle(reqs)
    assert all(len(r.draft) == 4 for r in reqs)


def test_a_draft_that_crosses_into_a_stair_of_the_int4_kernel_runs_to_its_end():
    """SmolLM2's compiled step on the GGUF's int4 blocks (AMD EPYC): 8.7 ms at one row, 11.9
    at 4 (one pass of the kernel over the weights), 23 at 5 to 8 (two). Priced per stair
    (limits 4 and 8, as layers.cost_row_limits gives them), rows up to a stair's end cost
    alike, so a draft that crosses into the second stair runs to its end."""
    cost = StepCost(limits=[4, 8])
    for _ in range(4):
        for rows, drafted, seconds in ((1, False, 0.0087), (4, True, 0.0119), (2, True, 0.0103)):
            cost.record(rows, drafted, seconds)
        for rows in (8, 5, 8):
            cost.record(rows, True, 0.023)
    budget = DraftBudget(max_tokens=7, cost=cost, batch_size=1)
    req = make_req([1, 2, 3])
    # a = 1/2: the third draft saves 0.125 * 8.7 ms, more than its row's ~0.5 ms; a fourth
    # would cost the second stair (11 ms more)
    assert budget.length(req) == 3
    req.num_forced_tokens, req.num_drafts_cut = 82, 16  # a = 0.83
    assert acceptance(req) == pytest.approx(0.83)
    assert budget.length(req) == 7  # never 4 to 6: the stair's rows up to 8 cost the same
    # one linear over 1-8 rows (no stair) prices a row at 2.3 ms: at a = 1/2 only the first
    # draft pays for its row (4.35 ms saved), the second saves 2.2
    linear = StepCost(limits=[8])
    for _ in range(4):
        for rows, seconds in ((1, 0.0087), (4, 0.0119), (2, 0.0103), (8, 0.023), (5, 0.023)):
            linear.record(rows, rows > 1, seconds)
    req.num_forced_tokens, req.num_drafts_cut = 0, 0
    assert DraftBudget(max_tokens=7, cost=linear, batch_size=1).length(req) == 1


def test_a_steps_drafts_are_cut_to_stay_under_a_row_limit():
    budget = DraftBudget(max_tokens=7, cost=few_rows_cost(), batch_size=2)
    a, b = drafted(make_req([1, 2]), 3), drafted(make_req([1, 2]), 3)
    for r in (a, b):
        r.num_forced_tokens, r.num_drafts_cut = 69, 29  # a = 0.7
    # 2 rows + 6 drafts cross the limit (25 ms); 2 drafts, the likeliest, stay under it
    budget.settle([a, b])
    assert (a.draft, b.draft) == ([0], [0])
    assert a.num_draft_tokens == b.num_draft_tokens == 1
    assert a.speculative_draft and b.speculative_draft


def test_config_takes_sglang_flags_and_refuses_others():
    cfg = EngineConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=16)
    assert cfg.speculative_num_draft_tokens == 16
    with pytest.raises(ValueError, match="speculative_algorithm must be one of.*'EAGLE'"):
        EngineConfig(speculative_algorithm="EAGLE")
    with pytest.raises(ValueError, match=r"speculative_num_draft_tokens must be in \[2, 65\].*1"):
        EngineConfig(speculative_algorithm="NGRAM", speculative_num_draft_tokens=1)
    from stemma.runtime.server.app import build_parser

    args = build_parser().parse_args(
        ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]
    )
    assert (args.speculative_algorithm, args.speculative_num_draft_tokens) == ("NGRAM", 4)


# ---- the engine: exact output, fewer forwards ---------------------------------------------------
def rewrite_prompt(engine: Engine) -> str:
    ask = f"Repeat this paragraph word for word.\n\n{PARAGRAPH}"
    return engine.apply_chat_template([{"role": "user", "content": ask}])


def test_greedy_float64_equals_decoding_without_drafts_in_fewer_forwards():
    """A rewrite, a free-text request and a constrained one in one batch, in float64."""
    outs, steps, metrics = {}, {}, {}
    for algo in (None, "NGRAM"):
        cfg = {"dtype": "float64", "kv_cache_mb": 64, "speculative_algorithm": algo}
        with Engine("smollm2-135m", **cfg) as e:
            texts = [
                rewrite_prompt(e),
                e.apply_chat_template([{"role": "user", "content": "Tell me a fact."}]),
                e.apply_chat_template([{"role": "user", "content": "Pick a color."}]),
            ]
            params = [
                {"max_new_tokens": 48, "temperature": 0},
                {"max_new_tokens": 24, "temperature": 0},
                {"max_new_tokens": 24, "temperature": 0, "regex": "(red|green|blue)( ok)*"},
            ]
            outs[algo] = e.generate(texts, params)
            if algo is not None:
                learned = (e.core.outputs.budget.stood, e.core.outputs.budget.cut)
            steps[algo] = e.get_metrics()["num_steps"]
            metrics[algo] = e.get_metrics()
    assert [o["output_ids"] for o in outs["NGRAM"]] == [o["output_ids"] for o in outs[None]]
    assert steps["NGRAM"] < steps[None]
    meta = outs["NGRAM"][0]["meta_info"]
    assert meta["spec_num_correct_drafts"] > 0
    assert meta["spec_accept_length"] > 1.5
    assert meta["spec_verify_ct"] < meta["completion_tokens"]
    assert 0 < meta["spec_accept_rate"] <= 1
    assert "spec_verify_ct" not in outs[None][0]["meta_info"]
    assert metrics["NGRAM"]["spec_num_correct_drafts"] >= meta["spec_num_correct_drafts"]
    assert learned[0] + learned[1] > 0  # the budget's prior learned from the drafts verified


def test_seeded_sampling_draws_the_same_tokens():
    ids = {}
    for algo in (None, "NGRAM"):
        with Engine("smollm2-135m", kv_cache_mb=64, speculative_algorithm=algo) as e:
            out = e.generate(
                rewrite_prompt(e), {"max_new_tokens": 40, "temperature": 0.7, "seed": 11}
            )
            ids[algo] = out["output_ids"]
            if algo:
                assert out["meta_info"]["spec_num_correct_drafts"] > 0
    assert ids["NGRAM"] == ids[None]


def chi2_p_value(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test of equal distributions (bins with few counts pooled)."""
    keys = sorted(set(a) | set(b), key=lambda k: -(a[k] + b[k]))
    rows, rest = [], [0, 0]
    for k in keys:
        if a[k] + b[k] >= 10:
            rows.append([a[k], b[k]])
        else:
            rest[0] += a[k]
            rest[1] += b[k]
    if sum(rest):
        rows.append(rest)
    table = torch.tensor(rows, dtype=torch.float64)
    if table.shape[0] < 2:
        return 1.0
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    df = torch.tensor((table.shape[0] - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, stat / 2))


def test_unseeded_sampling_keeps_the_distribution(monkeypatch):
    """Without seeds the draws differ, but each position's distribution and the joint one of
    the first two tokens stay the model's, with drafts standing and cut along the way."""
    # Steps measured as free, so every draft that matches is verified (what this CPU
    # measures would decide how many: the test is about the draws, not the budget).
    monkeypatch.setattr(StepCost, "record", lambda self, rows, drafted, seconds: None)
    n, new = 192, 6
    samples, metrics = {}, {}
    for algo, seed in ((None, 1), ("NGRAM", 2)):
        with Engine(  # eight at a time
            "smollm2-135m",
            kv_cache_mb=128,
            random_seed=seed,
            speculative_algorithm=algo,
            max_running_requests=8,
        ) as e:
            params = {"max_new_tokens": new, "temperature": 1.0, "ignore_eos": True}
            outs = e.generate([rewrite_prompt(e)] * n, [params] * n)
            samples[algo] = [o["output_ids"] for o in outs]
            metrics[algo] = e.get_metrics()
    spec = metrics["NGRAM"]
    assert spec["spec_num_correct_drafts"] > n  # drafts stood ...
    assert spec["spec_num_correct_drafts"] < spec["spec_num_proposed_drafts"]  # ... and were cut
    for pos in range(new):
        a = Counter(s[pos] for s in samples[None])
        b = Counter(s[pos] for s in samples["NGRAM"])
        assert chi2_p_value(a, b) > 1e-4, pos
    pairs = [Counter(tuple(s[:2]) for s in samples[k]) for k in (None, "NGRAM")]
    assert chi2_p_value(*pairs) > 1e-4


def test_a_repeated_request_drafts_the_earlier_answer_from_the_radix_cache():
    """Free text prompt lookup cannot guess; the second time, the tree holds the answer."""
    cfg = {"dtype": "float64", "kv_cache_mb": 64, "speculative_algorithm": "NGRAM"}
    with Engine("smollm2-135m", **cfg) as e:
        ask = e.apply_chat_template([{"role": "user", "content": "Name three rivers."}])
        params = {"max_new_tokens": 32, "temperature": 0, "ignore_eos": True}
        first, second = e.generate(ask, params), e.generate(ask, params)
    assert second["output_ids"] == first["output_ids"]
    one, two = first["meta_info"], second["meta_info"]
    # drafts of up to 7 (--speculative-num-draft-tokens 8), all standing
    assert two["spec_verify_ct"] <= 8 and two["spec_verify_ct"] * 3 < one.get("spec_verify_ct", 32)
    assert two["spec_num_correct_drafts"] == two["spec_num_proposed_drafts"] >= 24


def test_the_cost_fit_equals_least_squares_over_the_window():
    """The fit from running sums (the normal equations, summed afresh once per window) gives
    what a least-squares solve over the last `window` steps gives, past many wrap-arounds."""
    rng = np.random.default_rng(0)
    span = StepCost(window=64).spans[0]
    steps = []
    for _ in range(1000):
        rows = int(rng.integers(1, 9))
        drafted = rows > 1 and bool(rng.integers(0, 2))
        seconds = 0.008 + 0.0015 * rows + 0.006 * drafted + float(rng.normal(0, 0.0005))
        span.record(rows, drafted, seconds)
        steps.append((1.0, rows, int(drafted), seconds))
    last = np.array(steps[-64:])
    want = np.linalg.lstsq(last[:, :3], last[:, 3], rcond=None)[0]
    assert (span.base, span.per_row, span.per_draft_step) == pytest.approx(want, rel=1e-9)


def test_the_cost_fit_is_least_squares_with_no_term_negative():
    """Where the unbounded least squares would make a term negative (a draft step measured
    cheaper than a plain one of its rows, in noise; rows that barely vary), the fit is the
    bounded optimum: every term >= 0, and the KKT conditions hold (a term above zero has no
    slope in the squared error; one held at zero, a slope that only raises it)."""
    rng = np.random.default_rng(1)
    negative_seen = 0
    for trial in range(200):
        span = StepCost(window=32).spans[0]
        rows = rng.integers(5, 9, size=32)
        drafted = rng.integers(0, 2, size=32).astype(bool)
        # a random true cost, some terms negative, in noise
        truth = rng.normal(0.0, 0.01, size=3) + np.array([0.02, 0.0, 0.0])
        seconds = truth[0] + truth[1] * rows + truth[2] * drafted + rng.normal(0, 0.002, 32)
        for r, d, s in zip(rows, drafted, seconds):
            span.record(int(r), bool(d), float(s))
        x = np.stack([np.ones(32), rows, drafted.astype(float)], axis=1)
        unbounded = np.linalg.lstsq(x, seconds, rcond=None)[0]
        negative_seen += bool((unbounded < 0).any())
        beta = np.array([span.base, span.per_row, span.per_draft_step])
        assert (beta >= 0).all()
        slope = x.T @ (x @ beta - seconds)  # the squared error's gradient / 2
        scale = np.abs(x.T @ seconds).max()
        for j in range(3):
            if beta[j] > 1e-12:
                assert abs(slope[j]) <= 1e-7 * scale, (trial, j, beta, slope)
            else:
                assert slope[j] >= -1e-7 * scale, (trial, j, beta, slope)
        if (unbounded >= 0).all():
            assert beta == pytest.approx(unbounded, rel=1e-9, abs=1e-12)
    assert negative_seen > 50  # the bound mattered in many trials


def test_a_plain_step_is_priced_near_what_plain_steps_took():
    """A span of 5-8 rows where nearly every step had 8 rows, and the few of 5 rows came at a
    busy moment (slower): the unbounded fit has a negative cost a row, and clamping it alone
    priced an 8-row step at its base, three times what 8-row steps took (every draft then
    looked as if it saved time). The bounded fit prices it near what they took."""
    cost = StepCost(window=256)
    for i in range(40):
        cost.record(8, False, 0.022 + 0.0004 * (i % 3))
    for _ in range(3):
        cost.record(5, False, 0.040)
    (span,) = cost.spans
    assert min(span.base, span.per_row, span.per_draft_step) >= 0
    assert cost.seconds(8, False) == pytest.approx(0.0236, rel=0.05)


def test_what_the_fit_has_not_measured_in_a_while_is_tried_again():
    """Drafts measured at a busy moment (another job on the cores) would stay priced so for
    good, since only draft steps measure them: one request whose plain steps are fast again,
    and whose drafts priced so never pay, never drafts to measure them anew. After
    STALE_STEPS steps without them, a span's samples, and a term its steps no longer vary,
    are forgotten: priced as never measured, the drafts are tried."""
    cost = StepCost(limits=[4])  # 1-4 rows, 5-8 rows
    for rows in (1, 3, 1, 4, 1, 2):  # busy: a row 6 ms, leaving the decode path 30 ms
        cost.record(rows, rows > 1, 0.016 + 0.006 * rows + 0.030 * (rows > 1))
    for _ in range(3):
        cost.record(8, True, 0.016 + 0.006 * 8 + 0.030)
    budget = DraftBudget(max_tokens=7, cost=cost, batch_size=1)
    sure = make_req([1, 2])
    sure.num_forced_tokens = 98  # a = 0.99
    plain = ScheduledBatch(reqs=[sure], is_prefill=[False], num_new=[1])
    for _ in range(COST_WINDOW):  # quiet again: one row 10 ms
        budget.observe(plain, 0.010)
    assert cost.seconds(1) == pytest.approx(0.010)
    budget.settle([drafted(sure, 7)])  # ~6.7 tokens (67 ms) < 30 ms + 7 rows as measured
    assert sure.draft == []
    for _ in range(STALE_STEPS):
        budget.observe(plain, 0.010)
    below, past = cost.spans
    assert below.per_row == below.per_draft_step == 0.0
    assert cost.seconds(8, True) == cost.seconds(1) == pytest.approx(0.010)
    budget.settle([drafted(sure, 7)])
    assert len(sure.draft) == 7
    cost.record(6, True, 0.040)  # measured afresh: the busy samples are gone
    assert past.num_samples == 3 and cost.spans[1].num_samples == 1
    assert cost.seconds(6, True) == pytest.approx(0.040)


def test_a_step_that_compiled_is_no_measure_of_step_cost():
    """A step during which Dynamo compiled a graph (the first batch of a new size: seconds)
    does not enter the fit; the count is Dynamo's own."""
    from stemma.runtime.engine_core import graphs_compiled

    budget = DraftBudget(max_tokens=7, cost=StepCost())
    batch = ScheduledBatch(reqs=[make_req([1, 2])], is_prefill=[False], num_new=[1])
    budget.observe(batch, 0.020)
    budget.observe(batch, 11.0, measured=False)
    (span,) = budget.cost.spans
    assert span.num_samples == 1 and span.base == pytest.approx(0.020)
    before = graphs_compiled()
    torch.compile(lambda t: t * 2 + 1, backend="eager")(torch.ones(3))
    assert graphs_compiled() > before
