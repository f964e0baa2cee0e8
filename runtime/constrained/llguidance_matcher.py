"""`LLGuidanceMatcher`: one request's position in a compiled llguidance grammar, with the methods
the scheduler calls on the outlines Matcher (matcher.py). Its mask sets EOS exactly where the text
is complete or nothing else can follow; at most `MAX_ROLLBACK` accepted tokens can be undone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .jump_forward import utf8_prefix

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

MAX_ROLLBACK = 1024  # as the outlines Matcher: jump-forward drafts stay far below it


class LLGuidanceMatcher:
    """One request's position in an llguidance grammar (same interface as matcher.Matcher)."""

    __slots__ = ("_m", "eos_token_ids", "vocab_size", "is_terminated", "num_accepted")

    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self._m, self.vocab_size, self.eos_token_ids = matcher, vocab_size, eos_token_ids
        self.is_terminated = False  # EOS accepted
        self.num_accepted = 0

    @property
    def error(self) -> str | None:
        """Set when the grammar failed mid-way (e.g. a step ran out of llguidance's fuel)."""
        if self._m.is_error():
            return (
                f"constraint failed after {self.num_accepted} tokens: "
                + (self._m.get_error().strip().splitlines() or ["unknown error"])[0]
            )
        return None

    def allows(self, token_id: int) -> bool:
        if token_id in self.eos_token_ids:
            return self.is_final()
        if self.is_terminated or not 0 <= token_id < self.vocab_size:
            return False
        return self._m.validate_tokens([token_id]) == 1

    def accept_token(self, token_id: int) -> None:
        """Advance over `token_id`; ValueError if the grammar does not allow it here."""
        if not self.allows(token_id):
            raise ValueError(
                self.error or f"token {token_id} is not allowed by the constraint here"
            )
        if token_id in self.eos_token_ids:
            self.is_terminated = True
            return
        if not self._m.consume_token(token_id):
            raise ValueError(f"token {token_id}: {self.error}")
        self.num_accepted += 1

    def after(self, token_id: int) -> Any:
        """A copy of the grammar past `token_id` (an llguidance LLMatcher), or None where it
        does not take it: for a look further ahead that leaves this matcher as it is."""
        m = self._m.deep_copy()
        return m if m.consume_token(token_id) else None

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted (non-EOS) tokens."""
        if num_tokens:
            if num_tokens > min(MAX_ROLLBACK, self.num_accepted) or not self._m.rollback(
                num_tokens
            ):
                why = f" ({error})" if (error := self.error) else ""  # a lexer limit, say
                raise ValueError(f"cannot roll back {num_tokens} tokens{why}")
            self.num_accepted -= num_tokens

    def is_final(self) -> bool:
        """The text so far is a complete match: EOS is allowed."""
        return not self.is_terminated and self._m.is_accepting()

    def is_finished(self) -> bool:
        """Nothing but EOS can follow (an errored grammar can only end too)."""
        return self.is_terminated or self._m.is_stopped() or self._m.is_error()

    def fill_mask(self, bitmask: Any, row: int | None = None) -> None:
        """Write the allowed tokens into `bitmask[row]` (or the 1-D `bitmask`): int32 words
        over ids; EOS bits set exactly where the text is complete or nothing else can follow."""
        words = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        target = words if row is None else words[row]
        num_words = (self.vocab_size + 31) // 32
        if target.shape[-1] < num_words:
            raise ValueError(f"bitmask row of {target.shape[-1]} words cannot hold the vocabulary")
        if self.is_terminated:
            target[:] = 0
            return
        target[num_words:] = 0
        self._m.unsafe_compute_mask_ptr(target.ctypes.data, num_words * 4)  # every word of it
        bits = target.view(np.uint32)
        for token_id in self.eos_token_ids:
            bits[token_id // 32] &= ~np.uint32(1 << (token_id % 32))
        if self._m.is_accepting() or not bits.any():
            for token_id in self.eos_token_ids:
                bits[token_id // 32] |= np.uint32(1 << (token_id % 32))

    def jump_forward(self, tokenizer: Tokenizer, *, stop_before_merge: bool = True) -> list[int]:
        """Ids of the text the grammar forces next, already accepted.

        stop_before_merge: llguidance's own forced tokens, which stop before any token the
        model could merge with free text. Otherwise (a draft the model verifies token by
        token, runtime/scheduler/draft.py) the whole forced text, tokenized canonically."""
        if self.is_finished():
            return []
        if stop_before_merge:
            ids = list(self._m.compute_ff_tokens())
        else:
            text = utf8_prefix(self._m.compute_ff_bytes())
            ids = tokenizer.encode(text) if text else []
        num_taken = self._m.try_consume_tokens(ids) if ids else 0
        self.num_accepted += num_taken
        return ids[:num_taken]
