"""Verified jump-forward: text a constraint forces is appended as a draft and checked by the
model in the same forward that computes its K/V (the grammar is the draft model of
speculative decoding). Round r samples position r of every request still verifying, under
its constraint's mask; a draft token stands only if it is what the model itself sampled there.
So the output is exactly what token-by-token constrained decoding gives (greedy: the same ids;
seeded sampling: the same draws), while accepted drafts cost no forward passes of their own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .req import FinishReason, Req

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

MAX_DRAFT_TOKENS = 64  # well inside the Matcher's rollback window (MAX_ROLLBACK = 1024)


def make_draft(req: Req, tokenizer: Tokenizer, context_len: int) -> None:
    """After a token is verified: the ids the constraint forces next, kept pending (not in
    output_ids, the matcher not advanced) until the model confirms them. The draft runs to
    the end of the forced text, boundary token included: verification, not the draft,
    decides where forced text meets free text. It stops where decoding without it would
    have stopped: at max_new_tokens, and short of the context, whose last position never
    gets K/V (the step that samples it is the request's last)."""
    m = req.grammar
    room = min(
        req.params.max_new_tokens - len(req.output_ids) - 1,  # the round after the draft
        context_len - 1 - req.seq_len,
    )
    if m is None or room <= 0 or m.is_finished():
        return
    forced = m.jump_forward(tokenizer, stop_before_merge=False)
    m.rollback(len(forced))
    req.draft = forced[: min(room, MAX_DRAFT_TOKENS)]


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
        req.finish = FinishReason("abort", message=f"constraint: {err}")
        return
    if token not in eos_ids and m.is_finished():
        req.finish = FinishReason("stop", matched=None)
