"""The OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions.

Each request is parsed by its pydantic model, turned into one engine batch right here (prompts
tokenized, every (prompt, sample) pair an item, so `n` > 1 with a `seed` gives seed, seed+1, ...)
and answered from the engine's outputs, as one JSON body or as server-sent events. Chat
prompts and constraints are built in openai/chat.py; tool calls follow openai/tools.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from ..errors import ERROR_RESPONSES, APIError
from ..routes import get_state
from ..state import ServerState, sse_response, until_disconnected
from .chat import chat_grammar, chat_max_tokens, chat_prompt, grammar_extras
from .protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from .response import chat_choice, completion_choice, raise_if_aborted, usage
from .stream import (
    ChatChoiceStream,
    CompletionChoiceStream,
    StreamSpec,
    openai_events,
)
from .tools import parse_tool_calls, plan_tools

router = APIRouter(prefix="/v1", tags=["openai"], responses=ERROR_RESPONSES)


def _model_card(state: ServerState) -> dict[str, Any]:
    return {
        "id": state.served_model_name,
        "object": "model",
        "created": int(state.started),
        "owned_by": "stemma",
        "root": state.engine.config.model,
        "max_model_len": state.context_len,
    }


@router.get("/models")
async def list_models(request: Request) -> dict[str, Any]:
    return {"object": "list", "data": [_model_card(get_state(request))]}


@router.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    state = get_state(request)
    _check_model(state, model_id)
    return _model_card(state)


def _check_model(state: ServerState, name: str | None) -> None:
    if name is not None and name not in (state.served_model_name, state.engine.config.model):
        raise APIError(
            404,
            f"the model {name!r} does not exist; this server serves {state.served_model_name!r}",
            "model",
            "model_not_found",
        )


def _sampling(body: SamplingFields, max_new_tokens: int, grammar: dict[str, Any]) -> dict[str, Any]:
    sp = {
        "max_new_tokens": max_new_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "stop": body.stop,
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "logit_bias": body.logit_bias,
        "top_k": body.top_k,
        "min_p": body.min_p,
        "repetition_penalty": body.repetition_penalty,
        "min_new_tokens": body.min_tokens,
        "stop_token_ids": body.stop_token_ids,
        "ignore_eos": body.ignore_eos,
        "skip_special_tokens": body.skip_special_tokens,
        "no_stop_trim": body.no_stop_trim,
        "close_early": body.close_early,
        "property_order": body.property_order,
        **grammar,
    }
    return {k: v for k, v in sp.items() if v is not None}


def _engine_request(
    state: ServerState,
    body: SamplingFields,
    prompts: list[list[int]],
    max_tokens: tuple[int | None, str],
    grammar: dict[str, Any],
    logprobs: dict[str, Any],
    request_id: str,
) -> tuple[dict[str, Any], list[str]]:
    """One engine batch: each prompt n times (prompt-major), seeds seed, seed+1, ..."""
    limit, param = max_tokens
    ids, params = [], []
    for prompt in prompts:
        state.check_budget(len(prompt), limit, param)
        sp = _sampling(body, state.context_len - len(prompt) if limit is None else limit, grammar)
        for j in range(body.n):
            ids.append(prompt)
            params.append(sp if body.seed is None else sp | {"seed": body.seed + j})
    rids = [f"{request_id}-{k}" for k in range(len(ids))]
    req = {
        "input_ids": ids,
        "sampling_params": params,
        "rid": rids,
        "stream": body.stream,
        "cache_salt": body.cache_salt,
        **logprobs,
    }
    return req, rids


# ---- /v1/completions --------------------------------------------------------------------------
def _check_num_prompts(state: ServerState, prompt: Any, n: int) -> None:
    """Prompts x n within max_request_items, before any prompt is tokenized."""
    is_batch = isinstance(prompt, list) and bool(prompt) and not isinstance(prompt[0], int)
    num, limit = (len(prompt) if is_batch else 1) * n, state.engine.config.max_request_items
    if num > limit:
        raise APIError(
            400,
            f"the request asks for {num} generations (prompts x n); the limit is {limit} "
            "(--max-request-items)",
            "prompt",
        )


def _completion_prompts(state: ServerState, prompt: Any) -> tuple[list[list[int]], list[str]]:
    """Token ids and text of each prompt."""
    items = (
        [prompt]
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int))
        else list(prompt)
    )
    if not items:
        raise APIError(400, "prompt is empty", "prompt")
    ids, texts = [], []
    for item in items:
        if isinstance(item, str):
            ids.append(state.tokenize_prompt(item, "prompt"))
            texts.append(item)
            continue
        if not item or min(item) < 0 or max(item) >= state.engine.vocab_size:
            raise APIError(
                400,
                f"prompt token ids must be a non-empty list in [0, {state.engine.vocab_size - 1}]",
                "prompt",
            )
        ids.append(list(item))
        texts.append(state.engine.tokenizer.decode(item, False))
    return ids, texts


@router.post("/completions")
async def completions(body: CompletionRequest, request: Request) -> Response:
    state, start = get_state(request), time.monotonic()
    _check_model(state, body.model)
    if body.suffix is not None:
        raise APIError(400, "suffix is not supported", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, "best_of is only supported equal to n", "best_of")
    _check_num_prompts(state, body.prompt, body.n)
    ids, texts = _completion_prompts(state, body.prompt)
    top_n = body.logprobs
    logprobs = {
        "return_logprob": top_n is not None,
        "top_logprobs_num": top_n or 0,
        "return_text_in_logprobs": True,
        "logprob_start_len": 0 if body.echo and top_n is not None else -1,
    }
    spec = _stream_spec("text_completion", "cmpl", state, body)
    limit = (body.max_tokens, "max_tokens")
    extras = await asyncio.to_thread(grammar_extras, body, state.engine.config)
    req, rids = _engine_request(state, body, ids, limit, extras, logprobs, spec.id)
    echoes = [texts[k // body.n] if body.echo else None for k in range(len(rids))]
    job = _Job(
        req,
        rids,
        spec,
        "POST /v1/completions",
        start,
        "text_completion",
        streams=[CompletionChoiceStream(k, echoes[k], top_n) for k in range(len(rids))],
        choice=lambda k, out: completion_choice(k, out, echoes[k], top_n),
    )
    return await _respond(request, state, job)


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    state, start = get_state(request), time.monotonic()
    _check_model(state, body.model)
    try:
        plan = plan_tools(body)
    except ValueError as e:
        raise APIError(400, str(e), "tool_choice") from None
    if body.top_logprobs and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    ids = chat_prompt(state, body, plan)
    logprobs = {
        "return_logprob": body.logprobs,
        "top_logprobs_num": body.top_logprobs or 0,
        "return_text_in_logprobs": True,
    }
    spec = _stream_spec("chat.completion.chunk", "chatcmpl", state, body)
    grammar = await asyncio.to_thread(chat_grammar, body, plan, state.engine.config)
    req, rids = _engine_request(
        state, body, [ids], chat_max_tokens(body), grammar, logprobs, spec.id
    )

    def choice(k: int, out: dict[str, Any]) -> dict[str, Any]:
        calls = parse_tool_calls(out["text"], plan.names) if plan.mode != "none" else None
        return chat_choice(k, out, calls, body.logprobs)

    streams = [ChatChoiceStream(k, plan, body.logprobs) for k in range(len(rids))]
    job = _Job(
        req, rids, spec, "POST /v1/chat/completions", start, "chat.completion", streams, choice
    )
    return await _respond(request, state, job)


# ---- answering --------------------------------------------------------------------------------
@dataclass(slots=True)
class _Job:
    """One OpenAI request, ready for the engine, and how to answer it either way."""

    req: dict[str, Any]
    rids: list[str]
    spec: StreamSpec
    route: str
    start: float
    object_name: str  # of the non-streaming body
    streams: list[Any]  # per-choice stream state (ChatChoiceStream | CompletionChoiceStream)
    choice: Callable[[int, dict[str, Any]], dict[str, Any]]  # non-streaming choice k


def _stream_spec(
    object_name: str, prefix: str, state: ServerState, body: SamplingFields
) -> StreamSpec:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamSpec(
        object_name, f"{prefix}-{uuid.uuid4().hex}", state.served_model_name, body.n, include_usage
    )


async def _respond(request: Request, state: ServerState, job: _Job) -> Response:
    if job.req["stream"]:
        chunks = await state.open_stream(job.req, job.rids)
        route = f"{job.route} (stream)"
        events = openai_events(state, chunks, job.rids, job.spec, job.streams, route, job.start)
        return sse_response(events)
    outs = await until_disconnected(request, state.run(job.req, job.rids))
    raise_if_aborted(outs)
    metas = [o["meta_info"] for o in outs]
    state.log_batch(job.route, metas, job.start)
    choices = [job.choice(k, out) for k, out in enumerate(outs)]
    answer = job.spec.envelope(choices, usage=usage(metas, job.spec.n))
    return JSONResponse(answer | {"object": job.object_name})
