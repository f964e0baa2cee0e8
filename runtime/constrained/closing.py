"""Early closing: when a constrained request's token budget only just suffices to finish its
constraint, the rest of its output is the shortest completion found, so it ends valid within
max_new_tokens instead of being cut inside a string or an array.

`ClosingMatcher` wraps a request's matcher. Now and then a mask first looks for a short
completion from the current state (`closing_path`: a depth-first search over closing tokens
and one token per character class, taking the grammar's forced text whole, trying first the
tokens that leave the fewest strings, arrays and objects open — `Nesting`, a JSON-text
measure — then the closing tokens before the others, and a token that repeats one of the last
few after the others, so that a digit run or a `{"type":{"type":...` recursion is not
followed down to the limit; and inside a string that cannot close yet, a `pattern`'s example
whole, pattern_example.py, for an unanchored pattern lets every character through until the
text holds a match). Once that completion is within MARGIN tokens of the budget, the
mask allows only its next token, then only EOS. Before that it is the inner matcher
unchanged: exact until it triggers.

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

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer
    from .backend import GrammarMatcher

WINDOW = 1024  # remaining tokens at which the first completion is searched for
MARGIN = 8  # how far ahead of the budget a found completion is taken
MAX_SEARCH_TOKENS = 128  # tokens one search may try (accept + roll back), plus 2 per token of
# its limit: a completion of 100 tokens is not found in 128 tries if it takes any detour
RETRY_AFTER = 32  # tokens before a search that found nothing is tried again (doubling)
RECENT = 4  # a token among the last RECENT of the path is tried after the others
GUARD = 16  # within this many tokens of the last completion found, a token that opens or
# separates (`,` `{` `[`) is allowed only if a completion still fits after it
MAX_GUARDED = 32  # such tokens checked at one step
EXAMPLE_CONTEXT = 64  # tokens of the path (and characters before it) a string's text is read from
# Tried first, in this order: closers, then separators and the shortest JSON values.
_CLOSING_TEXTS = ['"}', '"]', "}}", "]}", "}]", "]]", '"', "}", "]", ",", "0", '""', "null"]
_CLOSING_TEXTS += ["false", "true", "[]", "{}", ":", "1", "a", "e", "x", "-", "."]


class Nesting(NamedTuple):
    """How much of a JSON text is still open: containers, and whether inside a string. A
    tuple: the search's memo of `feed` hashes it in C."""

    depth: int = 0
    in_string: bool = False
    escaped: bool = False

    def feed(self, text: str) -> Nesting:
        return _fed(self, text)

    def _feed(self, text: str) -> Nesting:
        depth, in_string, escaped = self.depth, self.in_string, self.escaped
        for ch in text:
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "[{":
                depth += 1
            elif ch in "]}":
                depth = max(depth - 1, 0)
        return Nesting(depth, in_string, escaped)

    @property
    def open(self) -> int:
        return self.depth + self.in_string + self.escaped


@functools.lru_cache(maxsize=1 << 16)
def _fed(nesting: Nesting, text: str) -> Nesting:
    """Nesting.feed, remembered: a search feeds the same few texts at the same few depths."""
    return nesting._feed(text)


@dataclass(slots=True, frozen=True)
class ClosingTokens:
    """The model's ids for the closing texts and its one-character tokens, with their text."""

    closing: np.ndarray  # ids, in priority order
    short: np.ndarray  # ids, by character class (see `_char_class`), then id
    short_class: np.ndarray  # per short token: its character class
    texts: dict[int, str]
    vocab_size: int
    words: np.ndarray  # of the closing then the short tokens: each one's mask word
    shifts: np.ndarray  # and its bit in it
    structural: np.ndarray  # per id: its text has a `,`, `{` or `[` (GUARD)
    structural_texts: dict[int, str]  # and those tokens' texts
    encoded: dict[str, list[int]] = field(default_factory=dict)  # `ids`' memo

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> ClosingTokens:
        closing = []
        for text in _CLOSING_TEXTS:
            ids = tokenizer.encode(text)
            if len(ids) == 1 and ids[0] not in closing:
                closing.append(ids[0])
        texts = {t: tokenizer.decode([t]) for t in range(tokenizer.vocab_size)}
        short = [t for t, text in texts.items() if t not in closing and len(text) == 1]
        kept = {t: texts[t] for t in (*closing, *short)}
        short.sort(key=lambda t: (_char_class(texts[t]), t))
        ids = np.array(closing, dtype=np.int64), np.array(short, dtype=np.int64)
        classes = np.array([_char_class(texts[t]) for t in short], dtype=np.int64)
        every = np.concatenate(ids)
        shifts = (every & 31).astype(np.uint32)
        opening = {t: text for t, text in texts.items() if set(text) & set(",{[")}
        structural = np.zeros(tokenizer.vocab_size, dtype=bool)
        structural[list(opening)] = True
        return cls(
            *ids, classes, kept, tokenizer.vocab_size, every >> 5, shifts, structural, opening
        )

    def allowed(self, m: GrammarMatcher, row: np.ndarray) -> list[int]:
        """The closing tokens `m` allows, then its first allowed short token of each character
        class (by class): one mask."""
        m.fill_mask(row)
        on = (row.view(np.uint32)[self.words] >> self.shifts) & 1
        num_closing = len(self.closing)
        closing = self.closing[on[:num_closing] == 1]
        allowed = np.flatnonzero(on[num_closing:])
        classes = self.short_class[allowed]
        first = (
            allowed[np.concatenate(([True], classes[1:] != classes[:-1]))]
            if allowed.size
            else allowed
        )
        return closing.tolist() + self.short[first].tolist()

    def ids(self, tokenizer: Tokenizer, text: str) -> list[int]:
        """`text`'s ids (a pattern example or its rest), remembered: searches ask again."""
        ids = self.encoded.get(text)
        if ids is None:
            if len(self.encoded) >= 4096:
                self.encoded.clear()
            ids = self.encoded[text] = tokenizer.encode(text)
        return ids


def _char_class(text: str) -> int:
    """Digits, lower-case and upper-case letters and non-ASCII characters are one class each
    (one of them stands for the rest in a search); any other character is its own class."""
    ch = text[0]
    if not ch.isascii():
        return 1
    if ch.isdigit() or ch.isalpha():
        return 2 + ch.isdigit() + 2 * ch.isupper()
    return 8 + ord(ch)


def closing_path(
    m: GrammarMatcher,
    limit: int,
    tokens: ClosingTokens,
    tokenizer: Tokenizer,
    nesting: Nesting | None = None,
    examples: Sequence[str] = (),
    before: str = "",
) -> list[int] | None:
    """A completion of at most `limit` tokens that makes `m` final, or None; `m` is left as
    it was (each token tried is accepted, then rolled back). nesting: of the text so far.
    examples: string contents (JSON-escaped) tried whole inside a string that cannot close
    there, once a string, each kept only where the string can close after it
    (pattern_example.py: what a `pattern` matches); where the string's text so far ends with
    the start of one (a prefix the grammar forced, say), its rest is tried first. before: the
    end of the text so far."""
    path: list[int] = []
    budget = [MAX_SEARCH_TOKENS + 2 * limit]
    row = np.zeros((tokens.vocab_size + 31) // 32, dtype=np.int32)
    quote = next((t for t in tokens.closing.tolist() if tokens.texts[t] == '"'), None)

    def write(text: str, ids: list[int], at: Nesting) -> bool:
        """Whether writing `ids` (when `m` takes them all and the string can close after
        them) leads to a completion."""
        taken = 0
        for t in ids:
            if not m.allows(t):
                break
            m.accept_token(t)
            path.append(t)
            taken += 1
        budget[0] -= max(taken, 1)
        closes = taken == len(ids) and (quote is None or m.allows(quote))
        if closes and len(path) <= limit and search(at.feed(text), True):
            return True
        del path[len(path) - taken :]
        m.rollback(taken)
        return False

    def search(at: Nesting, tried: bool = False) -> bool:
        tried = tried and at.in_string  # examples are tried once a string
        if m.is_final():
            return True
        if len(path) >= limit or budget[0] <= 0:
            return False
        forced = m.jump_forward(tokenizer, stop_before_merge=True)
        if forced:
            path.extend(forced)
            budget[0] -= len(forced)
            if len(path) <= limit and search(at.feed(tokenizer.decode(forced)), tried):
                return True
            del path[len(path) - len(forced) :]
            m.rollback(len(forced))
            return False
        options = tokens.allowed(m, row)
        after = {t: at.feed(tokens.texts[t]) for t in options}
        recent = path[-RECENT:]
        # stable: the closing texts' priority, then token order, break ties
        moves: list[Any] = sorted(options, key=lambda t: (after[t].open, t in recent))
        if examples and at.in_string and not at.escaped and not tried:
            closing = sum(after[t].open < at.open for t in moves)  # those close the string
            rests = _example_rests(examples, before, path, tokenizer)
            moves[closing:closing] = [(rest, tokens.ids(tokenizer, rest)) for rest in rests]
            tried = True
        for move in moves:
            if isinstance(move, tuple):
                if write(*move, at):
                    return True
            else:
                budget[0] -= 1
                m.accept_token(move)
                path.append(move)
                if search(after[move], tried):
                    return True
                path.pop()
                m.rollback(1)
            if budget[0] <= 0:
                return False
        return False

    found = search(nesting or Nesting())
    if found:
        m.rollback(len(path))
    return path if found else None


def _example_rests(
    examples: Sequence[str], before: str, path: list[int], tokenizer: Tokenizer
) -> list[str]:
    """The examples to try where a string stands, each as: the rest of it after the longest
    start of it the string's text ends with (a prefix the grammar forced, say), the whole of
    it, then its rests after each punctuation mark (what follows a part the output wrote its
    own way: `iglu:abc` then `a/0` of `iglu:a/0`)."""
    text = (before if len(path) <= EXAMPLE_CONTEXT else "") + tokenizer.decode(
        path[-EXAMPLE_CONTEXT:]
    )
    content = text.rsplit('"', 1)[-1]  # the string's text so far (an escaped quote aside)
    rests: dict[str, None] = {}  # in order, once each
    for example in examples:
        longest = min(len(example) - 1, len(content))
        start = next((k for k in range(longest, 0, -1) if content.endswith(example[:k])), 0)
        if start:
            rests.setdefault(example[start:])
        rests.setdefault(example)
        for k in range(1, len(example)):
            if not example[k - 1].isalnum():
                rests.setdefault(example[k:])
    return list(rests)


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
        before = "".join(self.texts[-EXAMPLE_CONTEXT:])[-EXAMPLE_CONTEXT:]
        path = closing_path(
            self.inner,
            remaining,
            self.tokens,
            self.tokenizer,
            self.nesting[-1],
            self.examples,
            before,
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
        words = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        target = words if row is None else words[row]
        if rest is None:
            self.inner.fill_mask(bitmask, row)
            self._guard(target)
            return
        target[:] = 0
        bits = target.view(np.uint32)
        for t in rest[:1] or sorted(self.eos_token_ids):
            bits[t // 32] |= np.uint32(1 << (t % 32))

    def _guard(self, target: np.ndarray) -> None:
        """Near the end of the budget (within GUARD tokens of the last completion found),
        refuse each allowed token that opens or separates (`},` starting another item whose
        required keys would not fit, say) after which no completion fits in the tokens left:
        one token can lengthen the completion by more than MARGIN, and the output would be
        cut. The other tokens, and all of them where none would be left, stay allowed."""
        remaining = self.max_new_tokens - self.num_accepted
        found = self.found_length
        if found is None or self.missed or remaining - found > GUARD or remaining <= 1:
            return
        bits = np.unpackbits(target.view(np.uint8), bitorder="little")[: self.tokens.vocab_size]
        allowed = np.flatnonzero(bits)
        at = self.nesting[-1]
        candidates = [
            t
            for t in allowed[self.tokens.structural[allowed]].tolist()
            if not at.in_string or '"' in self.tokens.structural_texts[t]
        ][:MAX_GUARDED]
        before = "".join(self.texts[-EXAMPLE_CONTEXT:])[-EXAMPLE_CONTEXT:]
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
