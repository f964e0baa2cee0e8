"""Drafts, verified: tokens a draft source proposes (first of all the text a constraint forces,
jump-forward) are appended as a draft and checked by the model in the same forward that
computes their K/V (the source is the draft model of speculative decoding). Round r samples
position r of every request still verifying, under its constraint's mask; a draft token
stands only if it is what the model itself sampled there.
So the output is exactly what token-by-token constrained decoding gives (greedy: the same ids;
seeded sampling: the same draws), while accepted drafts cost no forward passes of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..config import MAX_DRAFT_TOKENS
from .req import FinishReason, Req

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer


class DraftSource(Protocol):
    """Proposes the tokens a request may write next, verified in the next forward. Output
    never depends on a source: a draft token stands only where the model samples it too."""

    speculative: bool  # its drafts are speculation's, kept only where they pay (speculative.py)

    def propose(self, req: Req) -> list[int]:
        """Token ids to verify after req's last verified token ([] for none)."""
        ...


class ConstraintDraft:
    """The text the request's constraint forces next (jump-forward). The matcher is left where
    it was: its tokens are accepted as they are verified."""

    speculative = False

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def propose(self, req: Req) -> list[int]:
        m = req.grammar
        if m is None or m.is_finished():
            return []
        # To the end of the forced text, boundary token included: verification, not the
        # draft, decides where forced text meets free text.
        forced = m.jump_forward(self.tokenizer, stop_before_merge=False)
        m.rollback(len(forced))
        return forced


def make_draft(req: Req, sources: list[DraftSource], context_len: int) -> None:
    """After a token is verified: the first source's proposal, kept pending (not in
    output_ids) until the model confirms it. It stops where decoding without it would have
    stopped: at max_new_tokens, and short of the context, whose last position never gets K/V
    (the step that samples it is the request's last)."""
    room = min(
        req.tokens_left - 1,  # the round after the draft
        context_len - 1 - req.seq_len,
        MAX_DRAFT_TOKENS,
    )
    if room <= 0:
        return
    for source in sources:
        if proposed := source.propose(req):
            req.draft = proposed[:room]
            req.num_draft_tokens += len(req.draft)
            req.speculative_draft = source.speculative
            return


def drop_draft(req: Req, num_verified: int) -> None:
    """Forget the draft past its first num_verified tokens (their K/V was computed but is
    no longer part of the sequence: those slots are simply overwritten later)."""
    req.kv_len -= len(req.draft) - num_verified
    req.draft = []


def accept_into_grammar(req: Req, token: int, eos_ids: frozenset[int]) -> None:
    """Advance the constraint over a verified token; finish when it is complete."""
    m = req.grammar
    if m is None:
        return
    try:
        m.accept_token(token)
    except ValueError as err:  # cannot happen under the mask; never continue off-grammar
        req.finish = FinishReason.abort(f"constraint: {err}")
        return
    if token not in eos_ids and m.is_finished():
        req.finish = FinishReason.stop(None)
