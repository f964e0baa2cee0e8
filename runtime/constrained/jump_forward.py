"""Jump-forward: append the text a pattern forces next without running the model.

A byte is forced at a state that is not final when every allowed token starts with it. The
forced bytes are read off the Index alone (walking single-byte tokens), encoded with the
model's tokenizer, and committed only up to the first byte position from which some token the
automaton allows could reach past the forced text; so the model, never the jump, picks every
token that touches free text (see `jump_forward` for the exact rule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..tokenizer import Tokenizer

MAX_FORCED_BYTES = 1024


# What the jump reads of matcher.py's classes, spelled out so this module imports nothing back.
class CompiledGrammar(Protocol):
    index: Any
    vocab: Any
    jump_cache: dict[int, tuple[int | None, int]]

    def is_final(self, state: int) -> bool: ...
    def allowed_ids(self, state: int) -> list[int]: ...


class Matcher(Protocol):
    grammar: CompiledGrammar
    state: int
    is_terminated: bool

    def allows(self, token_id: int) -> bool: ...
    def accept_token(self, token_id: int) -> None: ...


def state_info(grammar: CompiledGrammar, state: int) -> tuple[int | None, int]:
    """(the forced next byte or None, the longest allowed token in bytes) at `state`; cached.

    The longest-token length is only computed where a byte is forced (elsewhere it is 0).
    """
    info = grammar.jump_cache.get(state)
    if info is None:
        forced: int | None = None
        longest = 0
        if not grammar.is_final(state):
            token_bytes = grammar.vocab.token_bytes
            for token_id in grammar.allowed_ids(state):
                data = token_bytes[token_id]
                assert data, "the index only holds ordinary tokens"
                if forced is None:
                    forced = data[0]
                elif data[0] != forced:
                    forced, longest = None, 0
                    break
                longest = max(longest, len(data))
        info = grammar.jump_cache[state] = (forced, longest)
    return info


def forced_path(grammar: CompiledGrammar, state: int) -> tuple[bytes, list[int]]:
    """The bytes forced from `state` on, and the state before each of them."""
    single_byte_ids = grammar.vocab.single_byte_ids()
    forced, states = bytearray(), []
    while len(forced) < MAX_FORCED_BYTES:
        byte, _ = state_info(grammar, state)
        token_id = single_byte_ids.get(byte) if byte is not None else None
        nxt = None if token_id is None else grammar.index.get_next_state(state, token_id)
        if nxt is None:
            break
        forced.append(byte)
        states.append(state)
        state = nxt
    return bytes(forced), states


def utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` that is whole UTF-8 characters ('' if it starts mid-one)."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


def jump_forward(
    matcher: Matcher, tokenizer: Tokenizer, *, stop_before_merge: bool = True
) -> list[int]:
    """Accept and return the ids of the forced text, committed canonically (maybe none).

    1. F = the forced bytes, cut to whole UTF-8 characters (none if they start mid-character).
    2. limit = the first position p in F from which an allowed token is longer than F[p:], i.e.
       where the model could choose a token that merges forced and free text.
    3. ids = tokenizer.encode(F); commit them in order while each token's bytes are exactly the
       next bytes of F, end at or before `limit`, and the automaton accepts the token.
    Tokens before the jump are never re-tokenized, so a merge across the start of F (e.g. a
    model-chosen `{` followed by a forced `"`) stays split, exactly as the model produced it.

    stop_before_merge=False skips step 2 (limit = len(F)): for a draft the model verifies
    token by token (runtime/scheduler/draft.py), where a boundary token the model would not pick is
    simply rejected, and one it would pick is a forward pass saved.
    """
    if matcher.is_terminated:
        return []
    grammar = matcher.grammar
    forced, states = forced_path(grammar, matcher.state)
    text = utf8_prefix(forced)
    if not text:
        return []
    limit = len(forced)
    if stop_before_merge:
        limit = next(
            (p for p, s in enumerate(states) if state_info(grammar, s)[1] > len(forced) - p),
            limit,
        )
    ids: list[int] = []
    pos = 0
    for token_id in tokenizer.encode(text):
        data = grammar.vocab.token_bytes[token_id] if token_id < grammar.vocab.vocab_size else None
        if not data or pos + len(data) > limit or forced[pos : pos + len(data)] != data:
            break
        if not matcher.allows(token_id):
            break
        matcher.accept_token(token_id)
        ids.append(token_id)
        pos += len(data)
    return ids
