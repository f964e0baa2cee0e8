"""Req: one generation request's state from arrival to finish, owned by the scheduler thread.

Slot ownership: slots[:num_tree_slots] belong to the radix tree (locked through last_node);
slots[num_tree_slots:] are the request's private slots (allocated in whole pages). Tokens
fill_ids[:kv_len] have their K/V written; the rest are still to compute. fill_ids ends with
the unverified draft (runtime/scheduler/draft.py), which output_ids never contains.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from ..sampling.params import SamplingParams
from ..sampling.sampler import SamplingState

if TYPE_CHECKING:
    from ...radix import RadixNode
    from ..constrained.backend import GrammarHandleLike, GrammarMatcher
    from .ngram import NGramIndex
    from .stop import StopMatcher


class FinishKind(str, Enum):
    """Why a request ended; the value is SGLang's finish_reason type."""

    STOP = "stop"  # EOS, a stop token / string / regex, or a completed constraint
    LENGTH = "length"  # max_new_tokens or the context length
    ABORT = "abort"  # an error, a refusal or the caller; message says which

    def __str__(self) -> str:
        return self.value


@dataclass(slots=True)
class FinishReason:
    kind: FinishKind
    matched: int | str | None = None
    length: int | None = None
    message: str | None = None
    closed_early: bool = False  # a length finish whose output early closing completed

    @staticmethod
    def stop(matched: int | str | None) -> FinishReason:
        """matched: the stop token id or the stop text, None for a completed constraint."""
        return FinishReason(FinishKind.STOP, matched=matched)

    @staticmethod
    def length_of(length: int, closed_early: bool = False) -> FinishReason:
        return FinishReason(FinishKind.LENGTH, length=length, closed_early=closed_early)

    @staticmethod
    def abort(message: str) -> FinishReason:
        return FinishReason(FinishKind.ABORT, message=message)

    def to_dict(self) -> dict[str, Any]:
        if self.kind is FinishKind.STOP:
            return {"type": "stop", "matched": self.matched}
        if self.kind is FinishKind.LENGTH:
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


@dataclass(slots=True)
class LogprobRequest:
    return_logprob: bool = False
    logprob_start_len: int = -1  # -1: output only; k >= 0: prompt positions k.. as well
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False


@dataclass(slots=True)
class Req:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    sampling: SamplingState
    logprob: LogprobRequest = field(default_factory=LogprobRequest)
    namespace: Any = None
    arrival_time: float = field(default_factory=time.monotonic)

    output_ids: list[int] = field(default_factory=list)
    row: int | None = None  # req_to_token row while running
    slots: list[int] = field(default_factory=list)
    num_tree_slots: int = 0
    last_node: RadixNode | None = None  # locked radix node covering slots[:num_tree_slots]
    kv_len: int = 0
    cached_tokens: int = 0  # prompt tokens served from the cache (largest over admissions)
    finish: FinishReason | None = None
    grammar_handle: GrammarHandleLike | None = None  # compiling; admitted when ready
    grammar: GrammarMatcher | None = None  # its matcher (backend.py), once compiled
    draft: list[int] = field(default_factory=list)  # forced by the constraint, not yet verified
    num_forced_tokens: int = 0  # verified draft tokens (they needed no forward of their own)
    num_draft_tokens: int = 0  # draft tokens proposed (speculative.py; SGLang's spec_* counts)
    num_drafts_cut: int = 0  # drafts the model refused before their end
    drafted_at: int = 0  # output tokens when its last draft was verified (speculative.acceptance)
    speculative_draft: bool = False  # the pending draft is speculation's, not a constraint's
    num_decode_steps: int = 0  # forwards that sampled for this request (SGLang's spec_verify_ct)
    ngrams: NGramIndex | None = None  # its tokens' n-grams, for prompt lookup drafts
    stop: StopMatcher | None = None  # its stop strings and regexes over the decoded output
    # strings its schema's patterns match, for early closing's search (pattern_example.py):
    # found as the request is made, on the caller's thread, not the scheduler's
    closing_examples: tuple[str, ...] = ()

    # Logprobs gathered so far: (logprob, token_id) and per-position top lists.
    input_logprobs: list[tuple[float | None, int]] = field(default_factory=list)
    input_top_logprobs: list[list[tuple[float, int]] | None] = field(default_factory=list)
    output_logprobs: list[tuple[float, int]] = field(default_factory=list)
    output_top_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)
    first_token_time: float | None = None

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids + self.draft

    @property
    def tokens_left(self) -> int:
        """Tokens it may still sample (max_new_tokens less those sampled)."""
        return self.params.max_new_tokens - len(self.output_ids)

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids) + len(self.draft)

    @property
    def num_private_slots(self) -> int:
        return len(self.slots) - self.num_tree_slots

    @property
    def is_prefilling(self) -> bool:
        """More than the newest token lacks K/V (a prompt, or a sequence after retraction)."""
        return self.kv_len < len(self.input_ids) + len(self.output_ids) - 1

    @property
    def num_pending(self) -> int:
        """Tokens without K/V yet: 1 for a decode, more after a jump-forward."""
        return self.seq_len - self.kv_len

    @property
    def wants_input_logprobs(self) -> bool:
        return self.logprob.return_logprob and self.logprob.logprob_start_len >= 0

    def max_prefix_len(self) -> int:
        """How much of the prompt may come from the cache: at least one token is computed
        (its logits give the first output), and prompt logprobs need logits from
        position max(start, 1) - 1 on."""
        limit = len(self.input_ids) + len(self.output_ids) - 1
        if self.wants_input_logprobs:
            limit = min(limit, max(self.logprob.logprob_start_len, 1) - 1)
        return max(limit, 0)
