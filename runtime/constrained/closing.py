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
as long each time. MARGIN covers one token that lengthens the completion by several; one
that lengthens it by more (`},` starting another item with its required keys, `{"` opening
an object of a recursion) is refused within GUARD tokens of the last completion found, where
no completion fits after it (`refuses`: asked of the token sampled, which the sampler then
draws again without it).

The first search, at the first token, starts where every fresh matcher of the constraint
starts: `StartPaths` remembers its outcome by constraint and budget, so the requests of a
batch that share a schema and max_new_tokens search once between them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .closing_search import EXAMPLE_CONTEXT, ClosingTokens, Nesting, closing_path

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

WINDOW = 1024  # remaining tokens at which the first completion is searched for
MARGIN = 8  # how far ahead of the budget a found completion is taken
RETRY_AFTER = 32  # tokens before a search that found nothing is tried again (doubling)
GUARD = 128  # within this many tokens of the last completion found, a token that opens or
# separates (`,` `{` `[`) is taken only if a completion still fits after it (`refuses`)
MAX_REFUSED = 32  # tokens refused so at one step, after which the sample stands


class StartPaths:
    """The first searches' outcomes (a completion, or None for none found), by constraint
    and budget, the most recent `size`. A search from a fresh matcher's state, with no text
    before it, finds what any other such search of that constraint and limit finds."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._paths: OrderedDict[Hashable, tuple[int, ...] | None] = OrderedDict()

    def get(self, key: Hashable) -> tuple[bool, list[int] | None]:
        """(whether it is known, the completion)."""
        if key not in self._paths:
            return False, None
        self._paths.move_to_end(key)
        path = self._paths[key]
        return True, None if path is None else list(path)

    def put(self, key: Hashable, path: list[int] | None) -> None:
        self._paths[key] = None if path is None else tuple(path)
        self._paths.move_to_end(key)
        while len(self._paths) > self.size:
            self._paths.popitem(last=False)


class ClosingMatcher:
    """A request's matcher with early closing over a budget of `max_new_tokens` outputs.
    start: where the first search's outcome is remembered, and the constraint's key there
    (equal keys: the same constraint, compiled by the same backend, and the same
    `examples`); None searches from the start every time."""

    def __init__(
        self,
        inner: Any,
        max_new_tokens: int,
        tokens: ClosingTokens,
        tokenizer: Tokenizer,
        examples: Sequence[str] = (),
        start: tuple[StartPaths, Hashable] | None = None,
    ) -> None:
        self.inner, self.tokens, self.tokenizer = inner, tokens, tokenizer
        self.examples = examples  # string contents the search tries whole (closing_path)
        self.start = start
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
        self.checked: tuple[int, int, list[int]] | None = None  # `refuses`' last completion:
        # where it was asked (num_accepted), of which token, and the completion after it

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
        path = self._search(remaining)
        self.searched_depth, self.missed = depth, path is None
        self.deepest = max(self.deepest, depth)
        if path is None:  # tried again later and later: a miss costs its whole search budget
            self.found_length = None
            self.next_search = self.num_accepted + (RETRY_AFTER << min(self.misses, 4))
            self.misses += 1
            return
        self._found(path)

    def _search(self, remaining: int) -> list[int] | None:
        """closing_path from where the output stands; from the start, remembered."""
        key = None
        if self.start is not None and self.num_accepted == 0:
            paths, key = self.start[0], (self.start[1], remaining)
            known, path = paths.get(key)
            if known:
                return path
        path = closing_path(
            self.inner,
            remaining,
            self.tokens,
            self.tokenizer,
            self.nesting[-1],
            self.examples,
            self._text_before(),
        )
        if key is not None:
            paths.put(key, path)
        return path

    def _found(self, path: list[int]) -> None:
        """A completion from where the output stands: taken once it only just fits, else the
        next search is due half way to that point."""
        remaining = self.max_new_tokens - self.num_accepted
        self.found_length = len(path)
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
            checked, self.checked = self.checked, None
            if (
                rest is None
                and checked is not None
                and checked[:2] == (self.num_accepted - 1, token_id)
            ):
                self._found(checked[2])  # `refuses` searched from here: no need to again

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
        self.checked = None
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
            return
        words = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        target = words if row is None else words[row]
        target[:] = 0
        bits = target.view(np.uint32)
        for t in rest[:1] or sorted(self.eos_token_ids):
            bits[t // 32] |= np.uint32(1 << (t % 32))

    def _text_before(self) -> str:
        """The end of the output's text, where a search reads a string's content from."""
        return "".join(self.texts[-EXAMPLE_CONTEXT:])[-EXAMPLE_CONTEXT:]

    def refuses(self, token_id: int) -> bool:
        """Whether the sampler should choose again without `token_id`: near the end of the
        budget (within GUARD tokens of the last completion found), a token that opens or
        separates (`},` starting another item whose required keys would not fit, `{"` opening
        an object in a recursion) after which no completion fits in the tokens left. One
        token can lengthen the completion by more than MARGIN, and the output would be cut.
        Asked of the token sampled, not of every allowed one: the sampler masks a refused
        token and samples again (OutputProcessor.sample), which draws from the mask with
        every such token cleared, for one search a step instead of one a candidate."""
        remaining = self.max_new_tokens - self.num_accepted
        found = self.found_length
        text = self.tokens.structural.get(token_id)
        if self.path is not None or found is None or text is None:
            return False  # found is None where the last search missed
        if remaining - found > GUARD or remaining <= 1:
            return False
        at = self.nesting[-1]
        if at.in_string and '"' not in text:
            return False  # a string's own `,` / `{` / `[` characters
        self.inner.accept_token(token_id)  # raises where the token is not allowed at all
        try:
            path = closing_path(
                self.inner,
                remaining - 1,
                self.tokens,
                self.tokenizer,
                at.feed(text),
                self.examples,
                (self._text_before() + text)[-EXAMPLE_CONTEXT:],
            )
        finally:
            self.inner.rollback(1)
        if path is None:
            return True
        self.checked = (self.num_accepted, token_id, path)
        return False

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
