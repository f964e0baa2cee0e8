"""`BesideMatcher`: a grammar matcher that also enforces what the grammar leaves out, `uniqueItems`
(unique_items.py) and, under `property_order="any"`, an object's key rules (property_order.py).

A token is allowed when the grammar allows it and the scanner (json_scanner.py), tried on a copy,
takes it. So a repeated string or object is refused at the token that would close it, while other
ways on are open. Where the item or key so far begins an earlier one (`"re` after `"red"`), the
token is also refused when the scanner refuses what the grammar then forces or every token it then
allows (up to `MAX_LOOKAHEAD`): an enum item is refused before its last letter, not left at a
closing quote that nothing may follow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .json_scanner import KEY, KEY_START, JsonScanner
from .property_order import ObjectKeys
from .unique_items import UniqueArrays

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

MAX_LOOKAHEAD = 64  # tokens tried after a token that could lead only to repeats
SNAPSHOT_EVERY = 16  # tokens between the scanner's snapshots: a rollback re-reads at most this many
MAX_SNAPSHOTS = 64  # kept besides the first (1,024 tokens back); past them, from the start


_ONES = np.array([bin(b).count("1") for b in range(256)], dtype=np.int64)  # bits set per byte


def _allowed_ids(matcher: Any, vocab_size: int, at_most: int) -> np.ndarray | None:
    """The ids an llguidance LLMatcher allows next; None where they are more than at_most
    (counted before they are listed)."""
    words = np.zeros((vocab_size + 31) // 32, dtype=np.uint32)
    matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
    if _ONES[words.view(np.uint8)].sum() > at_most:
        return None
    return np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")[:vocab_size])


class TokenBytes:
    """Each token's bytes, and which tokens can end a value (a candidate for a repeat).
    Counted over all the vocabulary's bytes at once (numpy), not token by token: a pass over
    49k tokens is paid by a service's first compile that needs it."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        self.bytes = token_bytes
        n = len(token_bytes)
        flat = np.frombuffer(b"".join(token_bytes), dtype=np.uint8)
        lengths = np.fromiter(map(len, token_bytes), dtype=np.int64, count=n)
        owner = np.repeat(np.arange(n), lengths)  # the token each byte belongs to

        def counts(chars: bytes) -> np.ndarray:
            return np.bincount(owner[np.isin(flat, list(chars))], minlength=n)

        quotes = counts(b'"')
        self.has_quote = quotes > 0
        self.has_backslash = counts(b"\\") > 0
        self.may_end = (quotes > 1) | (counts(b",]} \t\n\rel") > 0)
        # a quote, a comma or a closing bracket: what ends a key or an object
        self.structural = counts(b'",]}') > 0
        # a quote with a comma or a closing bracket after it: what ends a string, then more
        first_quote = np.full(n, len(flat), dtype=np.int64)
        at_quote = np.flatnonzero(flat == ord('"'))
        np.minimum.at(first_quote, owner[at_quote], at_quote)
        at_end = np.flatnonzero(np.isin(flat, list(b",]}")))
        self.quote_then_more = np.zeros(n, dtype=bool)
        self.quote_then_more[owner[at_end[at_end > first_quote[owner[at_end]]]]] = True
        # the tokens that open a container: outside every watched one, only they may break
        # a rule, by closing it in the same token (`{}`) or writing a key in it
        self.opens = np.flatnonzero(counts(b"{[") > 0)
        self.opens_word, self.opens_bit = self.opens >> 5, (self.opens & 31).astype(np.uint32)
        self.id_of = {b: i for i, b in enumerate(token_bytes) if b}
        self.by_quoted: dict[bytes, list[int]] = {}  # by their bytes up to their first quote
        starts = np.cumsum(lengths) - lengths
        for i, quote in zip(
            np.flatnonzero(self.has_quote).tolist(),
            (first_quote - starts)[self.has_quote].tolist(),
        ):
            self.by_quoted.setdefault(token_bytes[i][: quote + 1], []).append(i)

    def prefixes(self, rests: list[bytes]) -> list[int]:
        """The tokens whose bytes begin one of `rests`."""
        return [
            self.id_of[r[:k]] for r in rests for k in range(1, len(r) + 1) if r[:k] in self.id_of
        ]

    def completing(self, rests: list[bytes]) -> list[int]:
        """The tokens that write one of `rests` (each ending at a quote) up to that quote."""
        return [t for r in rests for t in self.by_quoted.get(r, ())]


class BesideMatcher:
    """A grammar matcher that also refuses a repeated item where `uniqueItems` holds, and a
    key that breaks its object's key rule."""

    def __init__(
        self, inner: Any, arrays: UniqueArrays, tokens: TokenBytes, keys: ObjectKeys | None = None
    ) -> None:
        """inner: a GrammarMatcher (backend.py) of the grammar without those `uniqueItems`
        (and with those objects' properties in any order)."""
        self.inner, self.arrays, self.keys, self.tokens = inner, arrays, keys, tokens
        self.scanner = JsonScanner(arrays, keys)
        self.ids: list[int] = []
        # (tokens, text length, the scanner there) after 0, SNAPSHOT_EVERY, 2 * SNAPSHOT_EVERY,
        # ... tokens, the first and the last MAX_SNAPSHOTS kept: a rollback restarts from the
        # last one before its point, not from the first byte
        self.snapshots = [(0, 0, self.scanner.snapshot())]

    @property
    def error(self) -> str | None:
        return self.inner.error

    @property
    def is_terminated(self) -> bool:
        return self.inner.is_terminated

    @property
    def num_accepted(self) -> int:
        return self.inner.num_accepted

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self.inner.eos_token_ids

    def refuses(self, token_id: int) -> bool:
        """Taking `token_id` would complete an item equal to an earlier one of its array or
        break a key rule, or leave the grammar nothing else to do (see the module)."""
        if not self.scanner.watching or not 0 <= token_id < len(self.tokens.bytes):
            return False
        trial = self.scanner.trial_copy()
        if not trial.feed(self.tokens.bytes[token_id]):
            return True
        if not trial.may_repeat() or not hasattr(self.inner, "after"):
            return False
        after = self.inner.after(token_id)  # a copy of the grammar past the token
        if after is None:
            return False
        forced = trial.trial_copy()
        if not forced.feed(after.compute_ff_bytes()):
            return True
        allowed = _allowed_ids(after, len(self.tokens.bytes), MAX_LOOKAHEAD)
        if allowed is None or not len(allowed):
            return False
        eos = self.inner.eos_token_ids
        return all(
            t not in eos and not trial.trial_copy().feed(self.tokens.bytes[t])
            for t in allowed.tolist()
        )

    def allows(self, token_id: int) -> bool:
        return self.inner.allows(token_id) and not self.refuses(token_id)

    def accept_token(self, token_id: int) -> None:
        if token_id in self.inner.eos_token_ids:
            self.inner.accept_token(token_id)
            return
        if self.refuses(token_id):
            raise ValueError(
                f"token {token_id} repeats an item of an array with uniqueItems or breaks "
                "an object's key rule"
            )
        self.inner.accept_token(token_id)
        self._take(token_id)

    def _take(self, token_id: int) -> None:
        """The scanner past a token the grammar took."""
        self.scanner.feed(self.tokens.bytes[token_id])
        self.ids.append(token_id)
        if len(self.ids) % SNAPSHOT_EVERY == 0:
            here = (len(self.ids), len(self.scanner.text), self.scanner.snapshot())
            self.snapshots.append(here)
            if len(self.snapshots) > MAX_SNAPSHOTS + 1:
                del self.snapshots[1]

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)
        if num_tokens:
            del self.ids[len(self.ids) - num_tokens :]
            while self.snapshots[-1][0] > len(self.ids):
                self.snapshots.pop()
            at, length, there = self.snapshots[-1]
            text = self.scanner.text
            del text[length:]
            self.scanner = there.snapshot()
            self.scanner.text = text
            for token_id in self.ids[at:]:
                self.scanner.feed(self.tokens.bytes[token_id])

    def is_final(self) -> bool:
        return self.inner.is_final()

    def is_finished(self) -> bool:
        return self.inner.is_finished()

    def fill_mask(self, bitmask: Any, row: int | None = None) -> None:
        self.inner.fill_mask(bitmask, row)
        scanner, tokens = self.scanner, self.tokens
        if not scanner.watching:
            return
        words = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        target = (words if row is None else words[row]).view(np.uint32)
        eos = self.inner.eos_token_ids
        if not scanner.inside_watched:  # only a token that opens a container may break one
            on = (target[tokens.opens_word] >> tokens.opens_bit) & 1
            self._drop_refused(target, tokens.opens[on == 1].tolist(), eos)
            _end_if_empty(target, eos)
            return
        bits = np.unpackbits(target.view(np.uint8), bitorder="little")[: len(tokens.bytes)]
        allowed = bits.astype(bool)
        # the tokens that may be refused: those that can close a string, end a value or
        # begin a key, and those that begin what is left of an earlier item or key
        if scanner.in_string and scanner.structural_only() and scanner.quote_ends_quietly():
            near = tokens.quote_then_more  # the string's end itself cannot fail here
            if scanner.state == KEY and (done := tokens.completing(scanner.rests())):
                near = near.copy()  # but as the end of an earlier key, it repeats it
                near[done] = True
        elif scanner.in_string:
            near = tokens.has_quote
        else:
            near = tokens.structural if scanner.structural_only() else tokens.may_end
        if scanner.state == KEY_START:
            near = near | tokens.has_quote
        if prefixes := tokens.prefixes(scanner.rests()):  # see refuses()
            near = near.copy()
            near[prefixes] = True
        if (rests := scanner.key_rests()) is not None:
            # finitely many keys may come: a token without a quote or an escape that begins
            # none of them is refused outright, the others are tried
            keep = tokens.has_quote | tokens.has_backslash
            keep[tokens.prefixes(rests)] = True
            _clear(target, allowed & ~keep)
            near = keep
        self._drop_refused(target, np.flatnonzero(allowed & near).tolist(), eos)
        _end_if_empty(target, eos)

    def _drop_refused(self, target: np.ndarray, ids: list[int], eos: frozenset[int]) -> None:
        """Clear in the mask words `target` the bit of each of `ids` that `refuses`."""
        for token_id in ids:
            if token_id not in eos and self.refuses(token_id):
                target[token_id // 32] &= ~np.uint32(1 << (token_id % 32))

    def jump_forward(self, tokenizer: Tokenizer, *, stop_before_merge: bool = True) -> list[int]:
        """The grammar's forced tokens, up to the first the scanner refuses."""
        ids = self.inner.jump_forward(tokenizer, stop_before_merge=stop_before_merge)
        for taken, token_id in enumerate(ids):
            # the grammar has taken them all: only the scanner is asked (no look ahead)
            if not self.scanner.trial_copy().feed(self.tokens.bytes[token_id]):
                self.inner.rollback(len(ids) - taken)
                return ids[:taken]
            self._take(token_id)
        return ids


def _end_if_empty(target: np.ndarray, eos: frozenset[int]) -> None:
    """Nothing left: the output may only end, as at a grammar's dead end."""
    if not target.any():
        for t in eos:
            target[t // 32] |= np.uint32(1 << (t % 32))


def _clear(target: np.ndarray, refused: np.ndarray) -> None:
    """Clear the bits of the `refused` ids (a bool per id) in the mask words `target`."""
    padded = np.zeros(len(target) * 32, dtype=bool)
    padded[: len(refused)] = refused
    target &= ~np.packbits(padded, bitorder="little").view(np.uint32)
