"""select: score each choice by the logprobs of exactly its own tokens after the state's text.

Requests: the prefix ids are prefilled once (`max_new_tokens: 0`), then one batched request
sends `input_ids = prefix_ids + choice_ids` per choice with `logprob_start_len = len(prefix_ids)`,
so `input_token_logprobs` cover the choice's tokens and nothing before them. The unconditional
method sends a second batch with only the (BOS +) choice tokens. Choice ids are `tokenize(choice)`
with the ids of `tokenize("")` (a BOS the runtime adds) removed from the front.
"""

from __future__ import annotations

import math
import random
from typing import Any

from .backend import Backend, BackendError
from .choices import TokenLogprobs, logprob_values, mean
from .context import RunContext
from .ir import Select
from .requests import as_responses, warm_request


def score_select(ctx: RunContext, text: str, node: Select) -> tuple[str, dict[str, Any]]:
    """The chosen choice and the select's meta info (every score the method computed)."""
    backend = ctx.require_backend()
    select_choice = getattr(backend, "select_choice", None)
    if callable(select_choice):  # a backend without token ids chooses its own way (OpenAI)
        return select_choice(text, node.choices, node.method)
    prefix_ids = list(backend.tokenize(text))
    empty_ids = ctx.tokenize_cached("")
    choice_ids = [choice_tokens(ctx, choice, empty_ids) for choice in node.choices]
    if prefix_ids:
        as_responses(backend.generate(warm_request(prefix_ids)), 1)
    conditional, responses = score_tokens(backend, prefix_ids, choice_ids)
    unconditional = None
    if node.method.requires_unconditional_logprobs:
        unconditional, _ = score_tokens(backend, empty_ids, choice_ids)
    decision = node.method(
        choices=node.choices,
        normalized_prompt_logprobs=[mean(logprob_values(e)) for e in conditional],
        input_token_logprobs=conditional,
        output_token_logprobs=[r["meta_info"].get("output_token_logprobs", []) for r in responses],
        unconditional_token_logprobs=unconditional,
    )
    if decision.decision not in node.choices:
        raise ValueError(f"choices_method returned {decision.decision!r}, not one of the choices")
    chosen = decision.decision
    if node.temperature > 0:
        normalized = [mean(logprob_values(e)) for e in conditional]
        chosen = sample_choice(node.choices, normalized, node.temperature)
    meta = {
        **decision.meta_info,
        "choices": node.choices,
        "decision": chosen,
        "choice_token_ids": choice_ids,
        "prompt_tokens": len(prefix_ids),
        "cached_tokens": [r["meta_info"].get("cached_tokens") for r in responses],
    }
    return chosen, meta


def sample_choice(choices: list[str], scores: list[float], temperature: float) -> str:
    """A choice drawn with probability softmax(scores / temperature)."""
    top = max(scores)
    weights = [math.exp((score - top) / temperature) for score in scores]
    return random.choices(choices, weights=weights)[0]


def choice_tokens(ctx: RunContext, choice: str, empty_ids: list[int]) -> list[int]:
    """The ids of `choice` alone (without the BOS the runtime's tokenizer may prepend)."""
    ids = ctx.tokenize_cached(choice)
    if empty_ids and ids[: len(empty_ids)] == empty_ids:
        ids = ids[len(empty_ids) :]
    if not ids:
        raise ValueError(f"select choice {choice!r} tokenizes to no tokens")
    return ids


def score_tokens(
    backend: Backend, context_ids: list[int], choice_ids: list[list[int]]
) -> tuple[list[TokenLogprobs], list[dict[str, Any]]]:
    """Per choice, [logprob, id, text] of exactly its tokens given `context_ids`; the responses."""
    req = {
        "input_ids": [context_ids + ids for ids in choice_ids],
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": len(context_ids),
        "return_text_in_logprobs": True,
    }
    responses = as_responses(backend.generate(req), len(choice_ids))
    scored = []
    for ids, response in zip(choice_ids, responses, strict=True):
        entries = response["meta_info"].get("input_token_logprobs") or []
        entries = [list(e) for e in entries[len(entries) - len(ids) :]]
        if [e[1] for e in entries] != ids:
            raise BackendError(
                f"input_token_logprobs cover ids {[e[1] for e in entries]}, expected {ids}"
            )
        scored.append(entries)
    return scored, responses
