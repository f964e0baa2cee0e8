"""A compiled grammar and the per-request Matcher that walks it.

Every pattern R is compiled as `(?:R)\\x00`: R is complete exactly where the NUL end marker
may follow (outlines-core's own final states wrongly reject most tokens that leave them).
A CompiledGrammar is shared by all its matchers (its caches are per state); a Matcher belongs
to one thread.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np

from .jump_forward import jump_forward
from .vocabulary import Vocabulary

if TYPE_CHECKING:
    import torch

    from ..tokenizer import Tokenizer

log = logging.getLogger(__name__)

MAX_ROLLBACK = 1024  # tokens a Matcher can undo (jump-forward drafts are capped below this)


class CompiledGrammar:
    """One pattern's Index plus per-state caches shared by all its matchers.

    Mask rows are int32 words over ids [0, vocab_size] (the last id is the end marker, whose bit
    is always cleared); EOS bits are set exactly in final states.
    """

    def __init__(self, regex: str, index: Any, vocab: Vocabulary, num_bytes: int) -> None:
        self.regex, self.index, self.vocab, self.num_bytes = regex, index, vocab, num_bytes
        self.num_words = (vocab.vocab_size + 1 + 31) // 32
        self.max_cached_rows = 4096
        self._rows: OrderedDict[int, np.ndarray] = OrderedDict()
        self._final: dict[int, bool] = {}
        self._finished: dict[int, bool] = {}
        self.dead_states: set[int] = set()
        self.jump_cache: dict[int, tuple[int | None, int]] = {}  # owned by jump_forward.py

    def is_final(self, state: int) -> bool:
        if (final := self._final.get(state)) is None:
            end = self.index.get_next_state(state, self.vocab.end_marker_id)
            final = self._final[state] = end is not None and self.index.is_final_state(end)
        return final

    def allowed_ids(self, state: int) -> list[int]:
        marker = self.vocab.end_marker_id
        return [t for t in self.index.get_allowed_tokens(state) if t != marker]

    def is_finished(self, state: int) -> bool:
        """Nothing but EOS can follow (true in a dead state too: it can only end)."""
        if (finished := self._finished.get(state)) is None:
            finished = self._finished[state] = not self.allowed_ids(state)
            if finished and not self.is_final(state):
                self.dead_states.add(state)
        return finished

    def mask_row(self, state: int, guide: Any) -> np.ndarray:
        """The allowed-token bitmask row for `state` (`guide` must stand at `state`)."""
        row = self._rows.get(state)
        if row is not None:
            self._rows.move_to_end(state)
            return row
        row = np.empty(self.num_words, dtype=np.int32)
        guide.write_mask_into(row.ctypes.data, row.size, 4)
        bits = row.view(np.uint32)
        for token_id in (self.vocab.end_marker_id, *self.vocab.eos_token_ids):
            bits[token_id // 32] &= ~np.uint32(1 << (token_id % 32))
        if self.is_final(state) or not bits.any():
            if not self.is_final(state):
                self.dead_states.add(state)
            for token_id in self.vocab.eos_token_ids:
                bits[token_id // 32] |= np.uint32(1 << (token_id % 32))
        self._rows[state] = row
        if len(self._rows) > self.max_cached_rows:
            self._rows.popitem(last=False)
        return row


class Matcher:
    """One request's position in a compiled grammar."""

    __slots__ = ("grammar", "state", "is_terminated", "num_accepted", "_guide")

    def __init__(self, grammar: CompiledGrammar) -> None:
        from outlines_core import Guide

        self.grammar = grammar
        self.state: int = grammar.index.get_initial_state()
        self.is_terminated = False  # EOS accepted
        self.num_accepted = 0
        # Advanced in lockstep; writes uncached mask rows; can undo a rejected draft.
        self._guide = Guide(grammar.index, max_rollback=MAX_ROLLBACK)

    @property
    def error(self) -> str | None:
        """Set when no token can continue the pattern here (the request can only end)."""
        if self.state in self.grammar.dead_states:
            return f"no token can continue the constraint after {self.num_accepted} tokens"
        return None

    def allows(self, token_id: int) -> bool:
        vocab = self.grammar.vocab
        if token_id in vocab.eos_token_ids:
            return self.is_final()
        if self.is_terminated or not 0 <= token_id < vocab.vocab_size:
            return False
        return self.grammar.index.get_next_state(self.state, token_id) is not None

    def accept_token(self, token_id: int) -> None:
        """Advance over `token_id`; ValueError if the pattern does not allow it here."""
        if not self.allows(token_id):
            vocab = self.grammar.vocab
            data = vocab.token_bytes[token_id] if 0 <= token_id < vocab.vocab_size else None
            raise ValueError(f"token {token_id} ({data!r}) is not allowed by the constraint here")
        if token_id in self.grammar.vocab.eos_token_ids:
            self.is_terminated = True
            return
        self.state = self.grammar.index.get_next_state(self.state, token_id)
        self._guide.advance(token_id, return_tokens=False)
        self.num_accepted += 1

    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted (non-EOS) tokens, at most MAX_ROLLBACK."""
        if num_tokens:
            self._guide.rollback_state(num_tokens)
            self.state = self._guide.get_state()
            self.num_accepted -= num_tokens

    def is_final(self) -> bool:
        """The text so far matches the whole pattern: EOS is allowed."""
        return not self.is_terminated and self.grammar.is_final(self.state)

    def is_finished(self) -> bool:
        """Nothing but EOS can follow: the request should finish now."""
        return self.is_terminated or self.grammar.is_finished(self.state)

    def fill_mask(self, bitmask: Any, row: int | None = None) -> None:
        """Write this request's allowed tokens into `bitmask[row]` (or the 1-D `bitmask`).

        bitmask: int32 CPU tensor or array, [num_words] or [batch, num_words], with
        num_words >= ceil(vocab_size / 32); words past the vocabulary are zeroed.
        """
        words = bitmask.numpy() if hasattr(bitmask, "numpy") else bitmask
        target = words if row is None else words[row]
        if target.shape[-1] * 32 < self.grammar.vocab.vocab_size:
            raise ValueError(f"bitmask row of {target.shape[-1]} words cannot hold the vocabulary")
        source = self.grammar.mask_row(self.state, self._guide)
        n = min(len(source), target.shape[-1])
        target[:n] = source[:n]
        target[n:] = 0
        if self.is_terminated:
            target[:] = 0

    def jump_forward(self, tokenizer: Tokenizer, *, stop_before_merge: bool = True) -> list[int]:
        """Ids of the text the pattern forces next, already accepted (see jump_forward.py)."""
        return jump_forward(self, tokenizer, stop_before_merge=stop_before_merge)


def fill_bitmask(
    matchers: list[Matcher | None],
    vocab_size: int,
    out: torch.Tensor | None = None,
    errors: dict[int, str] | None = None,
) -> torch.Tensor:
    """[B, ceil(vocab_size / 32)] int32 masks; a None row is all ones (unconstrained).
    errors: where given, a matcher that raises leaves its row all zeros (nothing allowed)
    and its error here by row, so only its own request fails; otherwise the error rises."""
    import torch

    num_words = (vocab_size + 31) // 32
    if out is None:
        out = torch.empty(len(matchers), num_words, dtype=torch.int32)
    if tuple(out.shape) != (len(matchers), num_words) or out.dtype != torch.int32:
        raise ValueError(f"out must be int32 [{len(matchers)}, {num_words}], got {out.shape}")
    words = out.numpy()  # numpy, not torch ops: no intra-op thread wake-ups per step
    words.fill(-1)
    for row, matcher in enumerate(matchers):
        if matcher is None:
            continue
        try:
            matcher.fill_mask(words, row)
        except Exception as e:  # noqa: BLE001 - this row's request fails; the others go on
            if errors is None:
                raise
            log.exception("computing a constraint's mask failed")
            words[row] = 0
            errors[row] = f"{type(e).__name__}: {e}"
    return out
