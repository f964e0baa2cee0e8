"""What every route shares: the engine, the served model's limits, the rids in flight, and the
helpers that keep the server a thin layer (submit a request dict, stream it as server-sent
events, cancel it when the client goes away, log one line per request batch).

Invariant: a request the server submitted is in `active` until its final output is out or it
is aborted, so `/abort_request {"abort_all": true}` reaches every one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse

from ..engine import Engine
from .errors import APIError
from .metrics import ServerMetrics

log = logging.getLogger("stemma.server")
T = TypeVar("T")
SSE_DONE = b"data: [DONE]\n\n"


@dataclass(slots=True)
class ServerState:
    engine: Engine
    served_model_name: str
    api_key: str | None
    max_request_bytes: int
    metrics: ServerMetrics
    context_len: int = 0
    admin_api_key: str | None = None  # opens the admin routes too (auth.py)
    started: float = field(default_factory=time.time)
    active: dict[str, None] = field(default_factory=dict)  # an insertion-ordered set of rids

    def __post_init__(self) -> None:
        self.context_len = int(self.engine.get_model_info()["max_context_length"])

    async def run(self, req: dict[str, Any], rids: list[str]) -> Any:
        """`Engine.async_generate(**req)` for a non-streaming request."""
        self.active.update(dict.fromkeys(rids))
        try:
            return await self._generate(req)
        finally:
            self.release(rids)

    async def open_stream(self, req: dict[str, Any], rids: list[str]) -> AsyncIterator[Any]:
        """The engine's chunk iterator for a streaming request; the caller releases `rids`
        when the stream ends."""
        self.active.update(dict.fromkeys(rids))
        try:
            stream: AsyncIterator[Any] = await self._generate(req)
        except BaseException:
            self.release(rids)
            raise
        return stream

    async def _generate(self, req: dict[str, Any]) -> Any:
        try:
            return await self.engine.async_generate(**req)
        except (ValueError, TypeError) as e:  # the engine's verdict on the request's values
            raise APIError(400, str(e)) from None

    def release(self, rids: Iterable[str]) -> None:
        for rid in rids:
            self.active.pop(rid, None)

    def check_budget(self, prompt_len: int, max_new_tokens: int | None, param: str) -> None:
        """The prompt must leave room in the context for at least one token and for
        max_new_tokens when it is set."""
        ctx = self.context_len
        if prompt_len >= ctx:
            raise APIError(
                400,
                f"the prompt has {prompt_len} tokens; the context length is {ctx}",
                param,
                "context_length_exceeded",
            )
        if max_new_tokens is not None and prompt_len + max_new_tokens > ctx:
            raise APIError(
                400,
                f"{param}={max_new_tokens} plus the prompt's {prompt_len} tokens "
                f"exceeds the context length {ctx}",
                param,
                "context_length_exceeded",
            )

    def tokenize_prompt(self, text: str, param: str) -> list[int]:
        ids = self.engine.tokenize(text)
        if not ids:
            raise APIError(400, f"{param} is empty", param)
        return ids

    def log_batch(
        self, route: str, metas: list[dict[str, Any]], start: float, stopped: str | None = None
    ) -> None:
        """One line per request batch: items, new/cached prompt tokens, throughput; or why it
        stopped before every item finished."""
        seconds = time.monotonic() - start
        if stopped is not None:
            log.info("%s: stopped after %.2f s: %s", route, seconds, stopped)
            return
        prompt = sum(m.get("prompt_tokens", 0) for m in metas)
        cached = sum(m.get("cached_tokens", 0) for m in metas)
        generated = sum(m.get("completion_tokens", 0) for m in metas)
        log.info(
            "%s: %d req, %d new + %d cached prompt tokens, %d generated in %.2f s (%.1f tok/s)",
            route,
            len(metas),
            prompt - cached,
            cached,
            generated,
            seconds,
            generated / seconds if seconds > 0 else 0.0,
        )


def sse(obj: Any) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; if the client goes away first, cancel it (the engine aborts its requests
    and frees their KV) and answer 499."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task
    raise APIError(499, "the client disconnected")
