"""Early closing's search: a short completion of a constrained output from where it stands.

`closing_path` is a depth-first search over closing tokens and one token per character class,
taking the grammar's forced text whole, trying first the tokens that leave the fewest strings,
arrays and objects open (`Nesting`, a JSON-text measure), then the closing tokens before the
others, and a token that repeats one of the last few after the others, so that a digit run or
a `{"type":{"type":...` recursion is not followed down to the limit. Inside a string that
cannot close yet it also writes a `pattern`'s example whole (pattern_example.py), since an
unanchored pattern lets every character through until the text holds a match. Each token
tried is accepted, then rolled back: the matcher is left as it was. The search keeps its own
stack (`_Node`), since a completion can be a thousand tokens long. closing.py decides when to
search and what to do with the completion.
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

MAX_SEARCH_TOKENS = 128  # tokens one search may try (accept + roll back), plus 2 per token of
# its limit: a completion of 100 tokens is not found in 128 tries if it takes any detour
RECENT = 4  # a token among the last RECENT of the path is tried after the others
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
    structural: dict[int, str]  # the tokens whose text has a `,`, `{` or `[` (GUARD)
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
        structural = {t: text for t, text in texts.items() if set(text) & set(",{[")}
        return cls(*ids, classes, kept, tokenizer.vocab_size, every >> 5, shifts, structural)

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
    return _Search(m, limit, tokens, tokenizer, examples, before).run(nesting or Nesting())


@dataclass(slots=True)
class _Node:
    """A state of the search: its moves in order, the next to try, and how many tokens the
    move that led to it took (rolled back when every move from it fails)."""

    at: Nesting
    tried: bool  # the examples were tried in this string
    moves: list[Any]  # token ids, and (text, ids) of examples
    after: dict[int, Nesting]  # each token move's nesting
    taken: int
    next: int = 0


class _Search:
    """`closing_path`'s depth-first search. Its stack is its own, not Python's: a completion
    can be a thousand tokens long. Every token on `path` is accepted by `m`."""

    def __init__(
        self,
        m: GrammarMatcher,
        limit: int,
        tokens: ClosingTokens,
        tokenizer: Tokenizer,
        examples: Sequence[str],
        before: str,
    ) -> None:
        self.m, self.limit, self.tokens, self.tokenizer = m, limit, tokens, tokenizer
        self.examples, self.before = examples, before
        self.path: list[int] = []
        self.budget = MAX_SEARCH_TOKENS + 2 * limit  # tokens left to try
        self.row = np.zeros((tokens.vocab_size + 31) // 32, dtype=np.int32)
        self.quote = next((t for t in tokens.closing.tolist() if tokens.texts[t] == '"'), None)
        self.stack: list[_Node] = []

    def run(self, nesting: Nesting) -> list[int] | None:
        found = self._enter(nesting, False, 0)
        while found is not True and self.stack:
            if found is False and self.budget <= 0:
                break  # a move failed with the budget spent
            node = self.stack[-1]
            if node.next == len(node.moves):  # every move failed: so did the one that led here
                self.stack.pop()
                self._undo(node.taken)
                found = False
                continue
            node.next += 1
            found = self._move(node, node.moves[node.next - 1])
        self.m.rollback(len(self.path))
        return self.path if found is True else None

    def _move(self, node: _Node, move: Any) -> bool | None:
        """Take one move from `node` and enter where it leads (see `_enter`)."""
        if not isinstance(move, tuple):
            self.budget -= 1
            self.m.accept_token(move)
            self.path.append(move)
            return self._enter(node.after[move], node.tried, 1)
        text, ids = move  # an example's text: taken where `m` takes all of it
        taken = 0
        for t in ids:
            if not self.m.allows(t):
                break
            self.m.accept_token(t)
            self.path.append(t)
            taken += 1
        self.budget -= max(taken, 1)
        closes = taken == len(ids) and (self.quote is None or self.m.allows(self.quote))
        if closes and len(self.path) <= self.limit:
            return self._enter(node.at.feed(text), True, taken)
        self._undo(taken)
        return False

    def _enter(self, at: Nesting, tried: bool, taken: int) -> bool | None:
        """The state reached by a move of `taken` tokens: True where `m` is final there, False
        where it is a dead end (the move rolled back), None once its moves are stacked. The
        grammar's forced text is taken whole on the way."""
        m, path = self.m, self.path
        while True:
            tried = tried and at.in_string  # examples are tried once a string
            if m.is_final():
                return True
            if len(path) >= self.limit or self.budget <= 0:
                self._undo(taken)
                return False
            forced = m.jump_forward(self.tokenizer, stop_before_merge=True)
            if not forced:
                break
            path.extend(forced)
            self.budget -= len(forced)
            taken += len(forced)
            if len(path) > self.limit:
                self._undo(taken)
                return False
            at = at.feed(self.tokenizer.decode(forced))
        self.stack.append(self._node(at, tried, taken))
        return None

    def _node(self, at: Nesting, tried: bool, taken: int) -> _Node:
        """The moves from here: the tokens that leave the fewest containers open first (the
        closing texts' priority, then token order, break ties; one of the last few tokens
        after the others), and inside a string not tried yet the examples, before the tokens
        that do not close it."""
        options = self.tokens.allowed(self.m, self.row)
        after = {t: at.feed(self.tokens.texts[t]) for t in options}
        recent = self.path[-RECENT:]
        moves: list[Any] = sorted(options, key=lambda t: (after[t].open, t in recent))
        if self.examples and at.in_string and not at.escaped and not tried:
            closing = sum(after[t].open < at.open for t in moves)  # those close the string
            rests = _example_rests(self.examples, self.before, self.path, self.tokenizer)
            moves[closing:closing] = [(r, self.tokens.ids(self.tokenizer, r)) for r in rests]
            tried = True
        return _Node(at, tried, moves, after, taken)

    def _undo(self, taken: int) -> None:
        del self.path[len(self.path) - taken :]
        self.m.rollback(taken)


def _example_rests(
    examples: Sequence[str], before: str, path: list[int], tokenizer: Tokenizer
) -> list[str]:
    """The examples to try where a string stands, each as: the rest of it after the longest
    start of it the string's text ends with (a prefix the grammar forced, say), its rest
    after as many characters as the string holds (`1234` then `aaaa-aaaa-1aaa-...` of a
    UUID's example: a fixed-width format written in the output's own characters), the whole
    of it, then its rests after each punctuation mark (what follows a part the output wrote
    its own way: `iglu:abc` then `a/0` of `iglu:a/0`)."""
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
        if 0 < len(content) < len(example):  # its own characters in the example's places
            rests.setdefault(example[len(content) :])
        rests.setdefault(example)
        for k in range(1, len(example)):
            if not example[k - 1].isalnum():
                rests.setdefault(example[k:])
    return list(rests)
