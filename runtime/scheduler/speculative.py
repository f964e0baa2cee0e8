"""Speculative decoding without a draft model (SGLang's NGRAM algorithm): two draft sources
after the constraint's forced text. `RadixDraft` proposes what the radix cache holds after
the request's exact sequence so far (an earlier answer to the same prompt); `NGramDraft`
proposes what followed the latest earlier occurrence of the request's last n tokens (n from
`MAX_NGRAM` down to `MIN_NGRAM`) in its own prompt and output: a rewrite, code edited in
place, a quoted document. Drafts are verified like every draft (draft.py), so a wrong one
costs only time: its rows in the forward, and a step off the attention backend's decode path.

`DraftBudget` decides from measurements. How many tokens a request drafts: from its
acceptance so far (a geometric model: each draft token stands with probability `a` once
those before it stood) and the cost of a row (`StepCost`, fitted to the engine's own decode
steps), the j-th draft token being worth its row while a^j * T(B) / B > c, for a step of B
rows taking T(B) seconds and c seconds per extra row. Whether a step's drafts pay at all
(`settle`): the fit has a term d for leaving the decode path, which any draft step pays
whatever its rows, and the drafts go unless the tokens they are expected to save outweigh d
plus their rows. So one request on a CPU, where weights dominate, drafts whenever anything
matches; a large batch drafts only what is likely to stand, and only where it pays for d.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .ngram import MAX_NGRAM, MIN_NGRAM, NGramIndex
from .req import Req

if TYPE_CHECKING:
    from ...radix import RadixTree
    from .batch import ScheduledBatch
    from .draft import DraftSource

COST_WINDOW = 256  # steps the row-cost fit remembers


class StepCost:
    """Seconds a decode step takes, fitted by least squares over the recent ones:
    T = base + per_row * rows + per_draft_step * [the step verifies drafts]. The last term is
    what leaving the attention backend's one-row decode path costs, whatever the rows. A
    term whose feature has not varied yet keeps its last value (zero at first: drafting is
    tried, and so measured)."""

    def __init__(self, window: int = COST_WINDOW) -> None:
        self.samples: deque[tuple[int, int, float]] = deque(maxlen=window)
        self.base, self.per_row, self.per_draft_step = 0.0, 0.0, 0.0

    def record(self, rows: int, drafted: bool, seconds: float) -> None:
        self.samples.append((rows, int(drafted), seconds))
        data = np.array(self.samples, dtype=np.float64)
        varied = [j for j in (0, 1) if np.ptp(data[:, j]) > 0]
        known = np.array([self.per_row, self.per_draft_step])
        fixed = [j for j in (0, 1) if j not in varied]
        target = data[:, 2] - data[:, fixed] @ known[fixed]
        design = np.column_stack([np.ones(len(data)), data[:, varied]])
        coef = np.linalg.lstsq(design, target, rcond=None)[0]
        for j, c in zip(varied, coef[1:]):
            if j == 0:
                self.per_row = max(float(c), 0.0)
            else:
                self.per_draft_step = max(float(c), 0.0)
        self.base = max(float(coef[0]), 0.0)

    def seconds(self, rows: int, drafted: bool = False) -> float:
        return self.base + self.per_row * rows + self.per_draft_step * drafted


@dataclass(slots=True)
class DraftBudget:
    """How many draft tokens a request gets, and whether a step's drafts pay at all (see the
    module)."""

    max_tokens: int  # --speculative-num-draft-tokens minus the token the step samples anyway
    cost: StepCost = field(default_factory=StepCost)
    batch_size: int = 1  # requests in the last decode step (the batch a draft will join)

    def observe(self, batch: ScheduledBatch, seconds: float) -> None:
        """One step's wall time; decode steps (drafts verified or not) enter the fit."""
        if batch.reqs and not any(batch.is_prefill):
            self.batch_size = len(batch.reqs)
            self.cost.record(sum(batch.num_new), any(n > 1 for n in batch.num_new), seconds)

    @property
    def per_token(self) -> float:
        """What one sampled token costs now: a plain step's time over its requests."""
        return self.cost.seconds(self.batch_size) / self.batch_size

    def length(self, req: Req) -> int:
        if self.max_tokens <= 0:
            return 0
        row, per_token = self.cost.per_row, self.per_token
        if row <= 0 or per_token <= 0:
            return self.max_tokens
        # the j-th token pays while a^j * per_token > row: j < log(row / per_token) / log(a)
        worth = math.log(row / per_token) / math.log(acceptance(req))
        return max(0, min(self.max_tokens, math.ceil(worth) - 1))

    def settle(self, reqs: list[Req]) -> None:
        """Drop the step's speculative drafts unless, together, the tokens they are expected
        to save are worth more than the draft step costs (its rows and leaving the decode
        path). Constraint drafts stay: they are verified whatever the budget."""
        drafts = [r for r in reqs if r.draft and r.speculative_draft]
        if not drafts:
            return
        saved = sum(expected_accepted(acceptance(r), len(r.draft)) for r in drafts)
        cost = self.cost.per_draft_step + self.cost.per_row * sum(len(r.draft) for r in drafts)
        if saved * self.per_token >= cost:  # nothing measured yet (both 0): tried
            return
        for r in drafts:
            r.num_draft_tokens -= len(r.draft)
            r.draft, r.speculative_draft = [], False


def expected_accepted(a: float, k: int) -> float:
    """Tokens expected to stand of a k-token draft when each stands with probability a once
    those before it did: a + a^2 + ... + a^k."""
    return a * (1 - a**k) / (1 - a) if a < 1 else float(k)


def acceptance(req: Req) -> float:
    """The chance a draft token stands once those before it did: stood / (stood + cut),
    with one of each assumed before any is seen."""
    return (req.num_forced_tokens + 1) / (req.num_forced_tokens + req.num_drafts_cut + 2)


class NGramDraft:
    """Prompt lookup over the request's verified tokens (prompt and output), as long as the
    budget allows; a constrained request's draft ends before the first token its grammar
    refuses."""

    speculative = True  # its drafts are the budget's to keep or drop (DraftBudget.settle)

    def __init__(self, budget: DraftBudget, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM):
        self.budget, self.min_n, self.max_n = budget, min_n, max_n

    def propose(self, req: Req) -> list[int]:
        limit = self.budget.length(req)
        if limit <= 0:
            return []
        index = req.ngrams
        if index is None:
            index = req.ngrams = NGramIndex(self.max_n)
        prompt = req.input_ids  # the index holds prompt + output so far; feed what is new
        if len(index.tokens) < len(prompt):
            index.extend(prompt[len(index.tokens) :])
        index.extend(req.output_ids[len(index.tokens) - len(prompt) :])
        draft = index.lookup(limit, self.min_n)
        if draft and req.grammar is not None:
            draft = allowed_prefix(req.grammar, draft)
        return draft


class RadixDraft:
    """What earlier requests wrote after this request's exact sequence so far: the radix
    cache holds every finished request's prompt and output, so a request that repeats one
    (a retried call, an agent step that recurs, the same question again) drafts the rest of
    the earlier answer along the most recently used path."""

    speculative = True

    def __init__(self, budget: DraftBudget, tree: RadixTree):
        self.budget, self.tree = budget, tree

    def propose(self, req: Req) -> list[int]:
        node = req.last_node
        if node is None or not node.is_attached:
            return []
        limit = self.budget.length(req)
        if limit <= 0:
            return []
        start, prompt = req.num_tree_slots, len(req.input_ids)
        if start < prompt:
            after = req.input_ids[start:] + req.output_ids
        else:
            after = req.output_ids[start - prompt :]
        draft = self.tree.continuation(node, after, limit)
        if draft and req.grammar is not None:
            draft = allowed_prefix(req.grammar, draft)
        return draft


def speculative_sources(budget: DraftBudget, tree: RadixTree | None) -> list[DraftSource]:
    """The NGRAM sources, in order: the radix tree's exact history first, then prompt lookup."""
    return [*([RadixDraft(budget, tree)] if tree is not None else []), NGramDraft(budget)]


def allowed_prefix(matcher, draft: list[int]) -> list[int]:
    """The draft up to the first token the constraint refuses (the matcher is left where it
    was)."""
    taken = 0
    try:
        for token in draft:
            if matcher.is_finished() or not matcher.allows(token):
                break
            matcher.accept_token(token)
            taken += 1
    finally:
        if taken:
            matcher.rollback(taken)
    return draft[:taken]
