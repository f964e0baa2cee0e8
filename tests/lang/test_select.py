"""select: the three scoring methods, and requests that score exactly each choice's tokens."""

from __future__ import annotations

import pytest
from stemma.lang import (
    function,
    greedy_token_selection,
    select,
    token_length_normalized,
    unconditional_likelihood_normalized,
)

CHOICES = ["organ", "organism", "antidisestablishmentarianism"]
# Token ids of the fake tokenizer: organ=1, ism=2, ant=3, id=4, is=5, est=6, ablish=7, ...
CHOICE_IDS = [[1], [1, 2], [3, 4, 5, 6, 7, 8, 9, 2]]
# Conditional logprobs: "organ" and "organism" tie on the first token, the long word's later
# tokens are near certain; unconditionally "ism" is unlikely, so "organism" gains most.
CONDITIONAL = {
    (1,): [-0.1],
    (1, 2): [-0.1, -0.3],
    (3, 4, 5, 6, 7, 8, 9, 2): [-0.4, -0.2, -0.05, -0.01, -0.01, -0.01, -0.01, -0.01],
}
UNCONDITIONAL = {
    (1,): [None],
    (1, 2): [None, -1.4],
    (3, 4, 5, 6, 7, 8, 9, 2): [None, -0.2, -0.05, -0.01, -0.01, -0.01, -0.01, -0.01],
}
PREFIX = "Pick a word: "


@function
def pick(s, method):
    s += PREFIX + select("word", choices=CHOICES, choices_method=method)
    s += "."


def _backend(make_backend, bos_ids=None):
    return make_backend(logprobs=CONDITIONAL, unconditional=UNCONDITIONAL, bos_ids=bos_ids)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        (token_length_normalized, "antidisestablishmentarianism"),
        (greedy_token_selection, "organ"),
        (unconditional_likelihood_normalized, "organism"),
    ],
)
def test_each_method_picks_its_choice(make_backend, method, expected):
    state = pick.run(method=method, backend=_backend(make_backend))
    assert state["word"] == expected
    assert state.text() == f"{PREFIX}{expected}."


def test_scored_tokens_are_exactly_each_choices_tokens(make_backend):
    backend = _backend(make_backend)
    state = pick.run(method=token_length_normalized, backend=backend)
    meta = state.get_meta_info("word")
    prefix_ids = backend.tokenize(PREFIX)
    warm, scoring = backend.requests
    assert warm == {"input_ids": prefix_ids, "sampling_params": {"max_new_tokens": 0}}
    assert scoring["input_ids"] == [prefix_ids + ids for ids in CHOICE_IDS]
    assert scoring["logprob_start_len"] == len(prefix_ids)
    assert scoring["sampling_params"] == {"max_new_tokens": 0}
    assert scoring["return_logprob"] is True
    assert [[e[1] for e in entries] for entries in meta["input_token_logprobs"]] == CHOICE_IDS
    assert meta["normalized_prompt_logprobs"] == pytest.approx([-0.1, -0.2, -0.0875])
    assert meta["choice_token_ids"] == CHOICE_IDS


def test_unconditional_scores_the_choice_tokens_alone(make_backend):
    backend = _backend(make_backend)
    state = pick.run(method=unconditional_likelihood_normalized, backend=backend)
    meta = state.get_meta_info("word")
    unconditional = backend.requests[2]
    assert unconditional["input_ids"] == CHOICE_IDS
    assert unconditional["logprob_start_len"] == 0
    assert meta["normalized_unconditional_prompt_logprobs"] == pytest.approx([-0.1, 0.5, -0.05])


def test_greedy_meta_holds_the_padded_logprob_matrix(make_backend):
    state = pick.run(method=greedy_token_selection, backend=_backend(make_backend))
    matrix = state.get_meta_info("word")["greedy_logprob_matrix"]
    assert matrix[0] == pytest.approx([-0.1] * 8)
    assert matrix[1] == pytest.approx([-0.1, -0.3] + [-0.2] * 6)


def test_a_bos_adding_tokenizer_keeps_bos_out_of_the_choice_tokens(make_backend):
    backend = _backend(make_backend, bos_ids=[0])
    state = pick.run(method=unconditional_likelihood_normalized, backend=backend)
    assert state["word"] == "organism"
    _, scoring, unconditional = backend.requests
    prefix_ids = backend.tokenize(PREFIX)
    assert prefix_ids[0] == 0
    assert scoring["input_ids"] == [prefix_ids + ids for ids in CHOICE_IDS]
    assert unconditional["input_ids"] == [[0] + ids for ids in CHOICE_IDS]
    assert unconditional["logprob_start_len"] == 1


def test_methods_take_sglangs_call_signature():
    decision = greedy_token_selection(
        choices=["a", "b"],
        normalized_prompt_logprobs=[-1.0, -0.5],
        input_token_logprobs=[[[-1.0, 1, None]], [[-0.5, 2, None]]],
        output_token_logprobs=[[], []],
    )
    assert decision.decision == "b"
    with pytest.raises(ValueError, match="unconditional"):
        unconditional_likelihood_normalized(
            choices=["a"],
            normalized_prompt_logprobs=[-1.0],
            input_token_logprobs=[[[-1.0, 1, None]]],
            output_token_logprobs=[[]],
        )


@pytest.mark.parametrize(
    ("choices", "error"),
    [(None, TypeError), ("ab", TypeError), ([], ValueError), (["a", ""], ValueError)],
)
def test_bad_select_choices_are_rejected(choices, error):
    with pytest.raises(error, match="choices"):
        select("x", choices=choices)
