"""ASGI middleware around the app: the request body limit and per-route request counting for
/metrics (the keys and Host checks are in auth.py). Each answers refusals with the JSON error
body."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response
from .metrics import ServerMetrics

log = logging.getLogger("stemma.server")


class BodyLimitMiddleware:
    """Requests whose body is over `max_bytes` get a 413 JSON error: at once when
    Content-Length says so, else as soon as the streamed body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large()(scope, receive, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # rendered by the HTTPException handler
                raise HTTPException(413, self._message())
            return message

        await self.app(scope, counting_receive, send)

    def _message(self) -> str:
        return f"the request body is over the limit of {self.max_bytes} bytes"

    def _too_large(self) -> ASGIApp:
        return error_response(413, self._message())


class RequestCounter:
    """Counts responses by route and status for /metrics; logs every 4xx/5xx."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the client gets if the app raises before responding

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.count_request(route, status)
            if status >= 400:
                log.info("%s %s -> %d", scope["method"], scope["path"], status)
