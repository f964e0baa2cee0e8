"""Matchers: masks equal the automaton's allowed tokens (EOS exactly in final states), rows are
cached per state, a mixed batch never leaks one request's mask into another, and outlines-core's
final-state defect is routed around by the end marker."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from outlines_core import Index
from stemma.kernels.token_bitmask import apply_token_bitmask_ref
from stemma.runtime.constrained.matcher import Matcher, fill_bitmask
from stemma.runtime.constrained.spec import ConstraintSpec


def _matcher(service: Any, spec: Any) -> Matcher:
    handle = service.submit(spec)
    assert handle.wait(60) and handle.error is None, handle.error
    return handle.matcher()


def _allowed(matcher: Matcher, num_words: int | None = None) -> set[int]:
    vocab_size = matcher.grammar.vocab.vocab_size
    row = np.empty(num_words or (vocab_size + 31) // 32, dtype=np.int32)
    matcher.fill_mask(row)
    bits = np.unpackbits(row.view(np.uint8), bitorder="little")
    return set(np.flatnonzero(bits).tolist())


def _byte_ids(matcher: Matcher, text: str) -> list[int]:
    single = matcher.grammar.vocab.single_byte_ids()
    return [single[b] for b in text.encode()]


def test_mask_is_exactly_the_allowed_tokens_plus_eos_in_final_states(
    grammar_service: Any, smollm_tokenizer: Any
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]}
    m = _matcher(grammar_service, ConstraintSpec.create(json_schema=schema))
    eos = set(m.grammar.vocab.eos_token_ids)
    for token_id in smollm_tokenizer.encode('{"n":"hi there"}'):
        expected = set(m.grammar.allowed_ids(m.state)) | (eos if m.is_final() else set())
        assert _allowed(m) == expected
        assert eos.isdisjoint(expected) != m.is_final()
        m.accept_token(token_id)
    assert m.is_final() and m.is_finished() and _allowed(m) == eos


def test_accept_token_rejects_what_the_mask_forbids(grammar_service: Any) -> None:
    m = _matcher(grammar_service, "(yes|no)")
    eos = min(m.grammar.vocab.eos_token_ids)
    with pytest.raises(ValueError, match="not allowed"):
        m.accept_token(_byte_ids(m, "x")[0])
    with pytest.raises(ValueError, match="not allowed"):
        m.accept_token(eos)
    with pytest.raises(ValueError, match="not allowed"):
        m.accept_token(m.grammar.vocab.end_marker_id)
    for token_id in _byte_ids(m, "yes"):
        m.accept_token(token_id)
    assert m.is_final() and m.is_finished() and m.error is None
    m.accept_token(eos)
    assert m.is_terminated and not m.is_final() and _allowed(m) == set()


def test_final_but_not_finished_keeps_other_tokens(grammar_service: Any) -> None:
    """What min_new_tokens relies on: masking EOS in a final state leaves a token to pick."""
    m = _matcher(grammar_service, "a+")
    m.accept_token(_byte_ids(m, "a")[0])
    assert m.is_final() and not m.is_finished()
    assert _allowed(m) - m.grammar.vocab.eos_token_ids


@pytest.mark.parametrize(
    ("regex", "text"),
    [
        ("(ab)+", "abab"),
        (r"[0-9]+(\.[0-9]+)?", "1.5"),
        ("a(bc)?", "abc"),
        ("[\u4e00-\u9fff]+", "日本語"),
    ],
)
def test_tokens_leaving_final_states_are_allowed(
    grammar_service: Any, regex: str, text: str
) -> None:
    """outlines-core 0.2.14 alone rejects these byte-by-byte paths; the end marker fixes it."""
    m = _matcher(grammar_service, regex)
    raw = Index(regex, m.grammar.vocab.to_outlines())
    raw_state: int | None = raw.get_initial_state()
    for token_id in _byte_ids(m, text):
        m.accept_token(token_id)
        raw_state = None if raw_state is None else raw.get_next_state(raw_state, token_id)
    assert m.is_final()
    assert raw_state is None


def test_mask_rows_are_cached_per_state(grammar_service: Any) -> None:
    m = _matcher(grammar_service, "(ab)+")
    a, b = _byte_ids(m, "ab")
    start = m.state
    first = m.grammar.mask_row(start, m._guide)
    for token_id in (a, b):
        m.accept_token(token_id)
    looped = m.state
    _allowed(m)
    # Visiting a known state again needs no guide at all.
    assert m.grammar.mask_row(start, None) is first
    assert m.grammar.mask_row(looped, None) is m.grammar.mask_row(looped, None)


def test_mixed_batch_never_leaks_masks(grammar_service: Any, smollm_vocab: Any) -> None:
    vocab_size = smollm_vocab.vocab_size
    digits = _matcher(grammar_service, "[0-9]+")
    yes_no = _matcher(grammar_service, "(yes|no)")
    out = fill_bitmask([digits, None, yes_no, None], vocab_size)
    assert out.shape == (4, (vocab_size + 31) // 32) and out.dtype == torch.int32
    assert bool((out[1] == -1).all()) and bool((out[3] == -1).all())
    logits = torch.randn(4, vocab_size)
    masked = logits.clone()
    apply_token_bitmask_ref(masked, out)
    assert torch.equal(masked[1], logits[1]) and torch.equal(masked[3], logits[3])
    for row, matcher in ((0, digits), (2, yes_no)):
        finite = set(torch.isfinite(masked[row]).nonzero().flatten().tolist())
        assert finite == _allowed(matcher)
    # Reusing the buffer with the rows swapped leaves nothing stale behind.
    fill_bitmask([None, yes_no, None, digits], vocab_size, out=out)
    assert bool((out[0] == -1).all()) and bool((out[2] == -1).all())
    assert torch.equal(out[1], fill_bitmask([yes_no], vocab_size)[0])


def test_padded_model_vocab_gets_zero_words(grammar_service: Any, smollm_vocab: Any) -> None:
    m = _matcher(grammar_service, "[0-9]+")
    padded = fill_bitmask([m], smollm_vocab.vocab_size + 64)
    assert padded.shape[1] == (smollm_vocab.vocab_size + 64 + 31) // 32
    assert bool((padded[0, smollm_vocab.vocab_size // 32 :] == 0).all())
    with pytest.raises(ValueError, match="cannot hold"):
        m.fill_mask(np.empty(10, dtype=np.int32))


def test_a_dead_end_ends_the_request_with_an_error(grammar_service: Any) -> None:
    m = _matcher(grammar_service, "a\\x00")  # NUL is the end marker: never generated
    m.accept_token(_byte_ids(m, "a")[0])
    assert m.is_finished() and not m.is_final()
    assert "no token can continue" in m.error
    assert _allowed(m) == set(m.grammar.vocab.eos_token_ids)
