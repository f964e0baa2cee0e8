"""The native routes, field-compatible with SGLang's server: /generate (POST or PUT; JSON or
server-sent events), model and server info, load, health, cache flush, abort, tokenize and
detokenize (also under /v1), and /metrics.

A stream always ends with `data: [DONE]`; a request that fails mid-stream sends one
`data: {"error": {...}}` event first. Leaving a stream early aborts its engine requests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from .auth import require_admin
from .errors import ERROR_RESPONSES, APIError, abort_status, error_dict
from .native import AbortIn, DetokenizeIn, GenerateIn, TokenizeIn, native_request
from .state import SSE_DONE, ServerState, sse, sse_response, until_disconnected

router = APIRouter(responses=ERROR_RESPONSES)
HEALTH_TIMEOUT_S = 20.0


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.server
    return state


@router.post("/generate", tags=["native"])
@router.put("/generate", tags=["native"], operation_id="generate_put")
async def generate(body: GenerateIn, request: Request) -> Response:
    """SGLang's /generate: one response, a list for a batch, or server-sent events."""
    state, start = get_state(request), time.monotonic()
    req, rids = await asyncio.to_thread(native_request, body, state)  # /health stays live
    if body.stream:
        chunks = await state.open_stream(req, rids)
        return sse_response(_native_events(state, chunks, rids, start))
    out = await until_disconnected(request, state.run(req, rids))
    state.log_batch("POST /generate", [o["meta_info"] for o in _as_list(out)], start)
    return JSONResponse(out)


async def _native_events(
    state: ServerState, chunks: AsyncIterator[dict[str, Any]], rids: list[str], start: float
) -> AsyncIterator[bytes]:
    metas: list[dict[str, Any]] = []
    stopped: str | None = "the client disconnected"  # None once every item finished
    try:
        async with aclosing(chunks):  # type: ignore[type-var]
            async for chunk in chunks:
                finish = chunk["meta_info"]["finish_reason"]
                if finish is not None and finish["type"] == "abort":
                    stopped = finish.get("message") or "the request was aborted"
                    yield sse(error_dict(abort_status(stopped), stopped))
                    break
                yield sse(chunk)
                if finish is not None:
                    metas.append(chunk["meta_info"])
            else:
                stopped = None
        yield SSE_DONE
    finally:
        state.release(rids)
        state.log_batch("POST /generate (stream)", metas, start, stopped)


def _as_list(out: Any) -> list[dict[str, Any]]:
    return out if isinstance(out, list) else [out]


@router.get("/model_info", tags=["native"])
@router.get("/get_model_info", tags=["native"])
async def model_info(request: Request) -> dict[str, Any]:
    state = get_state(request)
    return state.engine.get_model_info() | {"served_model_name": state.served_model_name}


@router.get("/server_info", tags=["native"])
@router.get("/get_server_info", tags=["native"])
async def server_info(request: Request) -> dict[str, Any]:
    state = get_state(request)
    metrics = await asyncio.to_thread(state.engine.get_metrics)
    try:
        stemma_version = version("stemma-lm")
    except PackageNotFoundError:
        stemma_version = "unknown"
    return {
        "version": stemma_version,
        "served_model_name": state.served_model_name,
        "engine_config": dataclasses.asdict(state.engine.config),
        "dtype": state.engine.dtype.name,  # what dtype "auto" resolved to
        "dtype_reason": state.engine.dtype.reason,
        "context_length": state.context_len,
        "max_request_bytes": state.max_request_bytes,
        "api_key_required": state.api_key is not None,
        "uptime_s": time.time() - state.started,
        "num_active_requests": len(state.active),
        "internal_states": [{k: v for k, v in metrics.items() if not isinstance(v, list)}],
    }


@router.get("/health", tags=["native"])
async def health(request: Request) -> JSONResponse:
    """The server answers, and the engine takes requests (503 once it cannot, e.g. a lost
    tensor-parallel rank); /health_generate checks that it generates too."""
    unavailable = get_state(request).engine.unavailable
    if unavailable is not None:
        return JSONResponse(error_dict(503, unavailable), 503)
    return JSONResponse({"status": "ok"})


@router.get("/health_generate", tags=["native"])
async def health_generate(request: Request) -> JSONResponse:
    """Healthy when the engine generates one token within HEALTH_TIMEOUT_S."""
    state = get_state(request)
    req = {"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
    try:
        out = await asyncio.wait_for(state.run(req, []), HEALTH_TIMEOUT_S)
    except TimeoutError:
        return JSONResponse(error_dict(503, "no token within the health timeout"), 503)
    if out["meta_info"]["finish_reason"]["type"] == "abort":
        message = out["meta_info"]["finish_reason"]["message"]
        return JSONResponse(error_dict(503, f"generation failed: {message}"), 503)
    return JSONResponse({"status": "ok"})


@router.post("/flush_cache", tags=["native"], dependencies=[Depends(require_admin)])
async def flush_cache(request: Request) -> dict[str, Any]:
    """Empty the radix cache; 409 while requests are running. Admin only (auth.py)."""
    try:
        await asyncio.to_thread(get_state(request).engine.flush_cache)
    except RuntimeError as e:
        raise APIError(409, f"cache not flushed: {e}") from None
    return {"success": True, "message": "cache flushed"}


@router.post("/abort_request", tags=["native"])
async def abort_request(body: AbortIn, request: Request) -> dict[str, Any]:
    """Abort one request by rid (unknown rids are ignored), or every request this server runs
    (abort_all: admin only)."""
    state = get_state(request)
    if body.abort_all == (body.rid is not None):
        raise APIError(400, "send either 'rid' or 'abort_all': true", "rid")
    if body.abort_all:
        require_admin(request)
    rids = list(state.active) if body.abort_all else [body.rid or ""]
    for rid in rids:
        state.engine.abort(rid, "aborted by /abort_request")
    return {"success": True, "aborted": rids}


@router.post("/tokenize", tags=["native"])
@router.post("/v1/tokenize", tags=["native"], operation_id="tokenize_v1")
async def tokenize(body: TokenizeIn, request: Request) -> dict[str, Any]:
    """SGLang's /tokenize: a prompt (or a list of them) or chat messages to token ids."""
    state = get_state(request)
    given = [name for name in ("prompt", "text", "messages") if getattr(body, name) is not None]
    if len(given) != 1:
        raise APIError(400, f"send exactly one of 'prompt' or 'messages', got {given}", "prompt")
    if body.messages is not None:
        add_generation_prompt = body.add_generation_prompt is not False
        try:
            text = state.engine.apply_chat_template(body.messages, add_generation_prompt)
        except Exception as e:  # the template's own error (bad roles, missing content ...)
            raise APIError(400, f"messages could not be rendered: {e}", "messages") from None
        prompt: str | list[str] = text
    else:
        prompt = body.prompt if body.prompt is not None else body.text or ""
    if isinstance(prompt, list):
        token_lists = [state.engine.tokenize(p) for p in prompt]
        return {
            "tokens": token_lists,
            "count": [len(t) for t in token_lists],
            "max_model_len": state.context_len,
        }
    tokens = state.engine.tokenize(prompt)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": state.context_len}


@router.post("/detokenize", tags=["native"])
@router.post("/v1/detokenize", tags=["native"], operation_id="detokenize_v1")
async def detokenize(body: DetokenizeIn, request: Request) -> dict[str, Any]:
    """SGLang's /detokenize: token ids (a list, or a list of lists) to text."""
    engine = get_state(request).engine
    is_batch = bool(body.tokens) and isinstance(body.tokens[0], list)
    batch: list[list[int]] = body.tokens if is_batch else [body.tokens]  # type: ignore[assignment,list-item]
    for ids in batch:
        bad = [t for t in ids if not 0 <= t < engine.vocab_size]
        if bad:
            raise APIError(400, f"tokens {bad[:5]} are outside the vocabulary", "tokens")
    texts = [engine.tokenizer.decode(ids, body.skip_special_tokens) for ids in batch]
    return {"text": texts if is_batch else texts[0]}


@router.get("/get_load", tags=["native"])
async def get_load(request: Request) -> list[dict[str, int]]:
    """SGLang's /get_load: per data-parallel rank (one here), requests and tokens in use."""
    metrics = await asyncio.to_thread(get_state(request).engine.get_metrics)
    return [
        {
            "dp_rank": 0,
            "num_reqs": metrics["num_running"] + metrics["num_waiting"],
            "num_waiting_reqs": metrics["num_waiting"],
            "num_tokens": metrics["kv_capacity"] - metrics["kv_free"],
        }
    ]


@router.get("/metrics", tags=["native"], response_class=Response)
async def metrics(request: Request) -> Response:
    """Prometheus text format."""
    body = await get_state(request).metrics.render()
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
