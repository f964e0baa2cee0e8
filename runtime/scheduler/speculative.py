"""Speculative decoding without a draft model: SGLang's NGRAM algorithm (prompt lookup).

`NGramDraft` proposes what followed the most recent earlier occurrence of the request's last
n tokens (n from `MAX_NGRAM` down to `MIN_NGRAM`) in its own prompt and output: a rewrite of
a given text, code edited in place, a quoted document, a multi-turn chat that repeats itself.
Drafts are verified like every draft (draft.py): the output is what decoding without them
gives, so a wrong draft costs only time: its rows in the forward, and a step off the
attention backend's decode path.

Whether to draft at all at a batch size is measured (`DraftGate`: output tokens per second of
epochs of decode steps with drafting allowed against epochs without, per batch-size bucket).
How many tokens a request drafts is `DraftBudget`'s decision each step, from the request's
acceptance so far (a geometric model: each draft token stands with probability `a` once
those before it stood) and the cost of a row (`StepCost`, fitted to the engine's own
steps): the j-th draft token is worth its row while a^j * T(B) / B > c, for a step of B rows
taking T(B) seconds and c seconds per extra row. So one request on a CPU, where weights
dominate and a row costs about 1% of the step, drafts whenever anything matches; a large
batch drafts only what almost always stands, and not at all where its epochs measure slower.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .req import Req

if TYPE_CHECKING:
    from ...radix import RadixTree
    from .batch import ScheduledBatch

MIN_NGRAM, MAX_NGRAM = 2, 4  # suffix lengths looked up, longest first
COST_WINDOW = 256  # steps the row-cost fit remembers


class NGramIndex:
    """For every n-gram (n <= max_n) of a token sequence, where its latest occurrence ends;
    the sequence's own last n tokens are entered only once a token follows them, so a lookup
    finds an earlier occurrence and the tokens after it."""

    __slots__ = ("tokens", "ends", "max_n")

    def __init__(self, max_n: int = MAX_NGRAM) -> None:
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}
        self.max_n = max_n

    def extend(self, new: list[int]) -> None:
        tokens, ends = self.tokens, self.ends
        for token in new:
            i = len(tokens)
            for n in range(1, min(self.max_n, i) + 1):
                ends[tuple(tokens[i - n : i])] = i  # the n-gram before position i
            tokens.append(token)

    def lookup(self, max_tokens: int, min_n: int = MIN_NGRAM) -> list[int]:
        """Up to max_tokens tokens that followed the longest matching suffix, [] if none."""
        tokens, size = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, size), min_n - 1, -1):
            end = self.ends.get(tuple(tokens[size - n :]))
            if end is not None:
                return tokens[end : end + max_tokens]
        return []


class StepCost:
    """Seconds a step takes against the rows it computes, fitted by least squares over the
    recent steps: T(rows) = base + per_row * rows. Until the rows have varied (a prefill
    and a decode step do), the extra row is taken as free."""

    def __init__(self, window: int = COST_WINDOW) -> None:
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)
        self.base, self.per_row = 0.0, 0.0

    def record(self, rows: int, seconds: float) -> None:
        self.samples.append((rows, seconds))
        n = len(self.samples)
        mean_r = sum(r for r, _ in self.samples) / n
        mean_t = sum(t for _, t in self.samples) / n
        var = sum((r - mean_r) ** 2 for r, _ in self.samples)
        if var > 0:
            cov = sum((r - mean_r) * (t - mean_t) for r, t in self.samples)
            self.per_row = max(cov / var, 0.0)
        self.base = max(mean_t - self.per_row * mean_r, 0.0)

    def seconds(self, rows: int) -> float:
        return self.base + self.per_row * rows


class DraftGate:
    """Whether drafting pays at a batch size, measured in epochs: EPOCH decode steps in a
    row of one batch-size bucket (powers of two) with drafting allowed, or not, throughout.
    An epoch's output tokens per second (its first step left out: it pays for the epoch
    before, e.g. the attention backend's decode copy rebuilt after draft steps) updates that
    arm's moving average; each epoch takes the faster arm, every EXPLORE-th the other one, so
    both stay measured. Drafting starts allowed; the second epoch measures it off."""

    EPOCH = 16
    EXPLORE = 8
    WEIGHT = 0.25  # of the newest epoch in a moving average

    def __init__(self) -> None:
        self.rates: dict[tuple[int, bool], float] = {}  # (bucket, drafting) -> tokens / s
        self.epochs: dict[int, int] = {}  # epochs begun per bucket
        self.bucket: int | None = None
        self.arm = True  # drafting allowed in the current epoch
        self.steps, self.tokens, self.seconds = 0, 0, 0.0

    def record(self, batch_size: int, tokens: int, seconds: float) -> None:
        """One decode step of the current epoch (a new bucket begins a new epoch)."""
        bucket = batch_size.bit_length()
        if bucket != self.bucket:
            self._begin(bucket)
            return
        self.steps += 1
        if self.steps > 1:
            self.tokens += tokens
            self.seconds += seconds
        if self.steps >= self.EPOCH:
            key, rate = (bucket, self.arm), self.tokens / max(self.seconds, 1e-9)
            old = self.rates.get(key)
            self.rates[key] = rate if old is None else old + self.WEIGHT * (rate - old)
            self._begin(bucket)

    def _begin(self, bucket: int) -> None:
        n = self.epochs[bucket] = self.epochs.get(bucket, 0) + 1
        on, off = self.rates.get((bucket, True)), self.rates.get((bucket, False))
        if on is None or off is None:
            self.arm = on is None
        else:
            self.arm = (on >= off) != (n % self.EXPLORE == 0)
        self.bucket, self.steps, self.tokens, self.seconds = bucket, 0, 0, 0.0


@dataclass(slots=True)
class DraftBudget:
    """How many draft tokens a request gets this step (see the module)."""

    max_tokens: int  # --speculative-num-draft-tokens minus the token the step samples anyway
    cost: StepCost = field(default_factory=StepCost)
    gate: DraftGate = field(default_factory=DraftGate)
    batch_size: int = 1  # requests in the last decode step (the batch a draft will join)
    is_open: bool = True  # the gate's decision for the drafts made after this step

    def observe(self, batch: ScheduledBatch, seconds: float, tokens: int) -> None:
        """One step's wall time against its rows, and the output tokens it produced. Prefill
        steps enter the row fit too: their many rows measure a row's cost before any draft
        has run; decode steps feed the gate and set the batch a draft joins."""
        if not batch.reqs:
            return
        self.cost.record(sum(batch.num_new), seconds)
        if not any(batch.is_prefill):
            self.batch_size = len(batch.reqs)
            self.gate.record(self.batch_size, tokens, seconds)
            self.is_open = self.gate.arm

    def length(self, req: Req) -> int:
        if self.max_tokens <= 0 or not self.is_open:
            return 0
        row = self.cost.per_row
        per_token = self.cost.seconds(self.batch_size) / self.batch_size  # a sampled token's
        if row <= 0 or per_token <= 0:
            return self.max_tokens
        # the j-th token pays while a^j * per_token > row: j < log(row / per_token) / log(a)
        worth = math.log(row / per_token) / math.log(acceptance(req))
        return max(0, min(self.max_tokens, math.ceil(worth) - 1))


def acceptance(req: Req) -> float:
    """The chance a draft token stands once those before it did: stood / (stood + cut),
    with one of each assumed before any is seen."""
    return (req.num_forced_tokens + 1) / (req.num_forced_tokens + req.num_drafts_cut + 2)


class NGramDraft:
    """Prompt lookup over the request's verified tokens (prompt and output), as long as the
    budget allows; a constrained request's draft ends before the first token its grammar
    refuses."""

    def __init__(self, budget: DraftBudget, min_n: int = MIN_NGRAM, max_n: int = MAX_NGRAM):
        self.budget, self.min_n, self.max_n = budget, min_n, max_n

    def propose(self, req: Req) -> list[int]:
        limit = self.budget.length(req)
        if limit <= 0:
            return []
        index = req.ngrams
        if index is None:
            index = req.ngrams = NGramIndex(self.max_n)
        done = len(index.tokens)
        size = len(req.input_ids) + len(req.output_ids)
        if done < len(req.input_ids):
            index.extend(req.input_ids[done:])
            done = len(req.input_ids)
        if done < size:
            index.extend(req.output_ids[done - len(req.input_ids) :])
        draft = index.lookup(limit, self.min_n)
        if draft and req.grammar is not None:
            draft = allowed_prefix(req.grammar, draft)
        return draft


class RadixDraft:
    """What earlier requests wrote after this request's exact sequence so far: the radix
    cache holds every finished request's prompt and output, so a request that repeats one
    (a retried call, an agent step that recurs, the same question again) drafts the rest of
    the earlier answer along the most recently used path."""

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
