"""Early closing: when a constrained request's token budget only just suffices to finish its
constraint, the rest of its output is the shortest completion found, so it ends valid within
max_new_tokens instead of being cut inside a string or an array.

`ClosingMatcher` wraps a request's matcher. Now and then a mask first looks for a short
completion from the current state (`closing_path`, closing_search.py). Once that completion is
within MARGIN tokens of the budget, the mask allows only its next token, then only EOS. Before
that it is the inner matcher unchanged: exact until it triggers.

When to search: first when at most WINDOW tokens of the budget remain (for most requests: at
the first token, since the shortest completion of a large schema's required keys can take
hundreds of tokens), then half way to the point where the last completion found would be
taken, so a completion that grows with the output is followed in a few searches; at once when
the output is nested deeper than at any search before (a token that opens an object whose
required keys take a hundred tokens; a recursion searches once per level, each search about
as long as the depth); after a miss, when a container closes or RETRY_AFTER tokens on, twice
as long each time. MARGIN
covers one token that lengthens the completion by several; one that lengthens it by more (`},`
starting another item with its required keys) is refused near the end, within GUARD tokens of
the last completion found, where no completion fits after it (`_guard`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .closing_search import EXAMPLE_CONTEXT, ClosingTokens, Nesting, closing_path

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

WINDOW = 1024  # remaining tokens at which the first completion is searched for
MARGIN = 8  # how far ahead of the budget a found completion is taken
RETRY_AFTER = 32  # tokens before a search that found nothing is tried again (doubling)
GUARD = 16  # within this many tokens of the last completion found, a token that opens or
# separates (`,` `{` `[`) is allowed only if a completion still fits after it
MAX_GUARDED = 32  # such tokens checked at one step


class ClosingMatcher:
    """A request's matcher with early closing over a budget of `max_new_tokens` outputs."""

    def __init__(
        self,
        inner: Any,
        max_new_tokens: int,
        tokens: ClosingTokens,
        tokenizer: Tokenizer,
        examples: Sequence[str] = (),
    ) -> None:
        self.inner, self.tokens, self.tokenizer = inner, tokens, tokenizer
        self.examples = examples  # string contents the search tries whole (closing_path)
        self.eos_token_ids = frozenset(tokenizer.eos_token_ids)
        self.max_new_tokens = max_new_tokens
        self.num_accepted = 0  # output tokens the constraint has taken (EOS not counted)
        self.nesting = [Nesting()]  # after each accepted token: the text's open structure
        self.texts: list[str] = []  # each accepted token's text
        self.path: list[int] | None = None  # the completion being forced, once triggered
        self.path_start = 0  # num_accepted when it was
        self.closed_early = False
        self.next_search = 0  # num_accepted at which to search again
        self.searched_depth = 0  # containers open at the last search
        self.missed = False  # the last search found no completion within the budget
        self.found_length: int | None = None  # the last completion found, in tokens
        self.deepest = 0  # the most containers open at any search
        self.misses = 0  # searches that found nothing

    @property
    def error(self) -> str | None:
        return self.inner.error

    def _forced(self) -> list[int] | None:
        """The rest of the completion being forced ([] once it is complete), or None."""
        if self.path is None:
            return None
        return self.path[self.num_accepted - self.path_start :]

    def _maybe_close(self) -> None:
        """Search for a completion when one may be due (see the module's docstring)."""
        remaining = self.max_new_tokens - self.num_accepted
        if self.path is not None or not 0 < remaining <= WINDOW or self.inner.is_finished():
            return
        depth = self.nesting[-1].depth
        if self.missed:
            moved = depth < self.searched_depth
        else:  # deeper than any search has been: the completion may have grown a lot at once
            moved = depth > self.deepest
        if self.num_accepted < self.next_search and not moved:
            return
        path = closing_path(
            self.inner,
            remaining,
            self.tokens,
            self.tokenizer,
            self.nesting[-1],
            self.examples,
            self._text_before(),
        )
        self.searched_depth, self.missed = depth, path is None
        self.found_length = None if path is None else len(path)
        self.deepest = max(self.deepest, depth)
        if path is None:  # tried again later and later: a miss costs its whole search budget
            self.next_search = self.num_accepted + (RETRY_AFTER << min(self.misses, 4))
            self.misses += 1
            return
        if len(path) + MARGIN >= remaining:
            self.path, self.path_start, self.closed_early = path, self.num_accepted, True
        else:
            self.next_search = self.num_accepted + max(1, (remaining - len(path) - MARGIN) // 2)

    def allows(self, token_id: int) -> bool:
        rest = self._forced()
        if rest is None:
            return self.inner.allows(token_id)
        if rest:
            return token_id == rest[0]
        return token_id in self.eos_token_ids and self.inner.allows(token_id)

    def accept_token(self, token_id: int) -> None:
        rest = self._forced()
        if rest is not None and rest and token_id != rest[0]:
            raise ValueError(f"token {token_id} leaves the closing path here")
        self.inner.accept_token(token_id)
        if token_id not in self.eos_token_ids:
            self._taken([token_id])

    def _taken(self, ids: list[int]) -> None:
        for t in ids:
            text = self.tokens.texts.get(t)
            text = self.tokenizer.decode([t]) if text is None else text
            self.nesting.append(self.nesting[-1].feed(text))
            self.texts.append(text)
        self.num_accepted += len(ids)

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)
        self.num_accepted -= num_tokens
        del self.nesting[len(self.nesting) - num_tokens :]
        del self.texts[len(self.texts) - num_tokens :]
        if self.path is not None and self.num_accepted < self.path_start:
            self.path, self.closed_early = None, False  # back before it was taken

    def is_final(self) -> bool:
        return self.inner.is_final()

    def is_finished(self) -> bool:
        rest = self._forced()
        return self.inner.is_finished() or (rest == [] and self.inner.is_final())

    def fill_mask(self, bitmask: Any, row: int | None = None) -> None:
        self._maybe_close()
        rest = self._forced()
        if rest is None:
            self.inner.fill_mask(bitmask, row)
            self._guard(bitmask, row)
            return
        target = _row(bitmask, row)
        target[:] = 0
        bits = target.view(np.uint32)
        for t in rest[:1] or sorted(self.eos_token_ids):
            bits[t // 32] |= np.uint32(1 << (t % 32))

    def _text_before(self) -> str:
        """The end of the output's text, where a search reads a string's content from."""
        return "".join(self.texts[-EXAMPLE_CONTEXT:])[-EXAMPLE_CONTEXT:]

    def _guard(self, bitmask: Any, row: int | None) -> None:
        """Near the end of the budget (within GUARD tokens of the last completion found),
        refuse each allowed token that opens or separates (`},` starting another item whose
        required keys would not fit, say) after which no completion fits in the tokens left:
        one token can lengthen the completion by more than MARGIN, and the output would be
        cut. The other tokens, and all of them where none would be left, stay allowed."""
        remaining = self.max_new_tokens - self.num_accepted
        found = self.found_length
        if found is None or self.missed or remaining - found > GUARD or remaining <= 1:
            return
        target = _row(bitmask, row)
        bits = np.unpackbits(target.view(np.uint8), bitorder="little")[: self.tokens.vocab_size]
        allowed = np.flatnonzero(bits)
        at = self.nesting[-1]
        candidates = [
            t
            for t in allowed[self.tokens.structural[allowed]].tolist()
            if not at.in_string or '"' in self.tokens.structural_texts[t]
        ][:MAX_GUARDED]
        before = self._text_before()
        refused = []
        for t in candidates:
            text = self.tokens.structural_texts[t]
            self.inner.accept_token(t)
            after = (before + text)[-EXAMPLE_CONTEXT:]
            path = closing_path(
                self.inner,
                remaining - 1,
                self.tokens,
                self.tokenizer,
                at.feed(text),
                self.examples,
                after,
            )
            self.inner.rollback(1)
            if path is None:
                refused.append(t)
        if refused and len(refused) < len(allowed):
            words = target.view(np.uint32)
            for t in refused:
                words[t // 32] &= ~np.uint32(1 << (t % 32))

    def jump_forward(self, tokenizer: Tokenizer, *, stop_before_merge: bool = True) -> list[int]:
        """The forced text, already accepted: the rest of the closing path once it is taken."""
        rest = self._forced()
        if rest:
            for t in rest:
                self.accept_token(t)
            return list(rest)
        if rest == []:
            return []
        ids = self.inner.jump_forward(tokenizer, stop_before_merge=stop_before_merge)
        self._taken(ids)
        return ids


def _row(bitmask: Any, row: int | None) -> np.ndarray:
    """The mask words of `row` (a tensor's or an array's), writable in place."""
    words = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
    return words if row is None else words[row]
