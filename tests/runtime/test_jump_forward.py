"""Jump-forward: forced text read off the Index, committed as the tokenizer's own ids, never
past a point where the model could pick a token merging forced and free text; decoding with it
gives the same text as decoding without it."""

from __future__ import annotations

from typing import Any

import pytest
from stemma.bench.tool_schemas import tool_call, weather_args
from stemma.runtime.constrained.jump_forward import forced_path, utf8_prefix
from stemma.runtime.constrained.matcher import Matcher
from stemma.runtime.constrained.spec import ConstraintSpec

TOOL_CALL = tool_call(weather_args(("city", "unit")))


def _matcher(service: Any, spec: Any) -> Matcher:
    handle = service.submit(spec)
    assert handle.wait(60) and handle.error is None, handle.error
    return handle.matcher()


def _bytes(vocab: Any, ids: list[int]) -> bytes:
    return b"".join(vocab.token_bytes[i] for i in ids)


def test_forced_path_reads_the_schema_skeleton(grammar_service: Any) -> None:
    m = _matcher(grammar_service, ConstraintSpec.create(json_schema=TOOL_CALL))
    forced, states = forced_path(m.grammar, m.state)
    assert forced == b'{"name":"get_weather","arguments":{"city":"'
    assert len(states) == len(forced) and states[0] == m.state


def test_jump_commits_canonical_ids_and_stops_before_free_text(
    grammar_service: Any, smollm_tokenizer: Any, smollm_vocab: Any
) -> None:
    m = _matcher(grammar_service, ConstraintSpec.create(json_schema=TOOL_CALL))
    ids = m.jump_forward(smollm_tokenizer)
    text = _bytes(smollm_vocab, ids).decode()
    # '":"' could be followed by a token such as '"P' opening the free string: stop before it.
    assert text == '{"name":"get_weather","arguments":{"city'
    assert ids == smollm_tokenizer.encode(text)
    assert m.num_accepted == len(ids) and m.jump_forward(smollm_tokenizer) == []


def test_forced_token_that_could_merge_with_free_text_is_left_to_the_model(
    grammar_service: Any, smollm_tokenizer: Any, smollm_vocab: Any
) -> None:
    # ' cat' then 's' or ' sat': ' cats' is one token, so ' cat' must not be committed.
    merging = _matcher(grammar_service, "The cat(s| sat)")
    assert _bytes(smollm_vocab, merging.jump_forward(smollm_tokenizer)) == b"The"
    assert smollm_tokenizer.encode(" cats") == [smollm_tokenizer._tok.token_to_id("Ġcats")]
    assert merging.allows(smollm_tokenizer.encode(" cats")[0])
    # A draft the model verifies goes to the end of the forced text.
    draft = _matcher(grammar_service, "The cat(s| sat)")
    assert _bytes(smollm_vocab, draft.jump_forward(smollm_tokenizer, stop_before_merge=False)) == (
        b"The cat"
    )
    # No token spans ' cat' + ' sat', so the whole forced text goes in.
    separate = _matcher(grammar_service, "The cat( sat| ran)")
    assert _bytes(smollm_vocab, separate.jump_forward(smollm_tokenizer)) == b"The cat"


def test_forced_bytes_ending_mid_character_are_cut(
    grammar_service: Any, smollm_tokenizer: Any, smollm_vocab: Any
) -> None:
    m = _matcher(grammar_service, "x(你们|你他)")  # 们 and 他 share their first two bytes
    forced, _ = forced_path(m.grammar, m.state)
    assert forced == "x你".encode() + b"\xe4\xbb"
    assert utf8_prefix(forced) == "x你" and utf8_prefix(b"\xbb") == ""
    committed = _bytes(smollm_vocab, m.jump_forward(smollm_tokenizer))
    assert "x你".encode().startswith(committed) and committed


def test_no_jump_in_final_or_terminated_states(grammar_service: Any, smollm_tokenizer: Any) -> None:
    m = _matcher(grammar_service, "(ab)?")
    assert m.is_final() and m.jump_forward(smollm_tokenizer) == []
    m.accept_token(min(m.grammar.vocab.eos_token_ids))
    assert m.jump_forward(smollm_tokenizer) == []


def _follow(
    matcher: Matcher, target: bytes, tokenizer: Any, by_bytes: dict[bytes, int], jump: bool
) -> tuple[list[int], int]:
    """A model that wants to write `target`: each step, the longest allowed token it starts with.

    Returns the ids and how many of them jump-forward appended.
    """
    token_bytes = matcher.grammar.vocab.token_bytes
    ids: list[int] = []
    pos = num_jumped = 0
    while pos < len(target):
        if jump and (forced := matcher.jump_forward(tokenizer)):
            assert forced == tokenizer.encode(_bytes(matcher.grammar.vocab, forced).decode())
            ids += forced
            num_jumped += len(forced)
            pos += sum(len(token_bytes[t]) for t in forced)
            continue
        token_id = next(
            t
            for n in range(min(64, len(target) - pos), 0, -1)
            if (t := by_bytes.get(target[pos : pos + n])) is not None and matcher.allows(t)
        )
        matcher.accept_token(token_id)
        ids.append(token_id)
        pos += len(token_bytes[token_id])
    assert matcher.is_final()
    return ids, num_jumped


def test_jump_forward_keeps_the_text_of_token_by_token_decoding(
    grammar_service: Any,
    regex_corpus: list[str],
    schema_corpus: list[dict[str, Any]],
    fake_lm: Any,
    smollm_tokenizer: Any,
    smollm_vocab: Any,
) -> None:
    """Greedy decoding by a model whose choice depends on text only: same text either way."""
    by_bytes = {data: i for i, data in reversed(list(enumerate(smollm_vocab.token_bytes))) if data}
    specs = [ConstraintSpec(regex=r) for r in regex_corpus]
    specs += [ConstraintSpec.create(json_schema=s) for s in schema_corpus]
    handles = [grammar_service.submit(spec) for spec in specs]
    total_jumped = 0
    for handle in handles:
        assert handle.wait(60) and handle.error is None, handle.error
        ids, _ = fake_lm.generate(handle.matcher(), jump=False, seed=7)
        target = _bytes(smollm_vocab, ids)
        plain, _ = _follow(handle.matcher(), target, smollm_tokenizer, by_bytes, jump=False)
        jumped, num_jumped = _follow(handle.matcher(), target, smollm_tokenizer, by_bytes, True)
        assert _bytes(smollm_vocab, plain) == _bytes(smollm_vocab, jumped) == target
        total_jumped += num_jumped
    assert total_jumped > 2 * len(handles)


@pytest.mark.parametrize("seed", [None, 3])
def test_jump_forward_forces_much_of_a_tool_call(
    grammar_service: Any, fake_lm: Any, smollm_tokenizer: Any, seed: int | None
) -> None:
    m = _matcher(grammar_service, ConstraintSpec.create(json_schema=TOOL_CALL))
    ids, num_forced = fake_lm.generate(m, jump=True, seed=seed)
    assert num_forced >= 8 and num_forced / len(ids) > 0.3
