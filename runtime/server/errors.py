"""HTTP errors: every failure leaves the server as an OpenAI-style JSON body
`{"error": {"message", "type", "param", "code"}}` with a 4xx/5xx status.

Bad input (pydantic validation; the engine's ValueError / TypeError, which route code turns into
APIError) is a 400 naming the field;
a failure inside the server is a 500 that is logged; nothing takes the server down.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from ..engine import EngineUnavailable
from ..engine_state import QueueFull

log = logging.getLogger("stemma.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    """The body of every non-2xx response."""

    error: ErrorDetail


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Malformed or out-of-range input"},
    401: {"model": ErrorResponse, "description": "Missing or wrong API key"},
    413: {"model": ErrorResponse, "description": "Request body too large"},
}


class APIError(Exception):
    """Raised by route code; rendered by the handler below."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def error_dict(
    status: int, message: str, param: str | None = None, code: str | int | None = None
) -> dict[str, Any]:
    error_type = _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {
        "error": {
            "message": message,
            "type": error_type,
            "param": param,
            "code": code if code is not None else status,
        }
    }


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(error_dict(status, message, param, code), status, headers=headers)


def abort_status(message: str | None) -> int:
    """Status for a request the engine finished with "abort": its own failure is a 500, a
    shutdown a 503; anything else (a grammar that failed to compile, a duplicate rid, an
    /abort_request) was caused by the request, a 400."""
    text = message or ""
    if text.startswith("engine error"):
        return 500
    if "shut down" in text:
        return 503
    return 400


_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def _is_union_tag(part: object) -> bool:
    """pydantic names the member of a union it tried ("str", "list[int]", "SamplingParamsIn")
    in an error's location; field names are lower-case identifiers."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper() or part in _TYPE_NAMES)


def validation_message(errors: list[Any] | tuple[Any, ...]) -> tuple[str, str | None]:
    """One readable line naming each bad field, and the first field's dotted name.

    For a union, only the errors of the members that got furthest are kept: a wrong
    `max_new_tokens` inside a `sampling_params` object is reported, not also "not a list"."""
    located = []
    for err in errors:
        loc = tuple(str(x) for x in err.get("loc", ()) if x != "body" and not _is_union_tag(x))
        located.append((loc, err))
    deepest = [
        (loc, err)
        for loc, err in located
        if not any(len(other) > len(loc) and other[: len(loc)] == loc for other, _ in located)
    ]
    parts: list[str] = []
    first: str | None = None
    for loc, err in deepest:
        name = ".".join(loc) or "body"
        if err.get("type") == "json_invalid":
            parts.append(f"the body is not valid JSON: {err.get('ctx', {}).get('error', '')}")
            continue
        first = first or name
        if not loc and isinstance(err.get("input"), bytes):
            parts.append("the body must be a JSON object sent with Content-Type: application/json")
        elif err.get("type") == "extra_forbidden":
            parts.append(f"unknown field {name!r}")
        else:
            parts.append(f"{name}: {err.get('msg', 'invalid')}")
    unique = list(dict.fromkeys(parts))
    return "; ".join(unique[:6]) + ("; ..." if len(unique) > 6 else ""), first


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, APIError)
        return error_response(exc.status, exc.message, exc.param, exc.code)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = validation_message(exc.errors())
        return error_response(400, message, param)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        return error_response(exc.status_code, message, headers=exc.headers)

    async def on_crash(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)

    async def on_unavailable(request: Request, exc: Exception) -> JSONResponse:
        return error_response(503, str(exc))  # refused (a lost tensor-parallel rank), not a crash

    app.add_exception_handler(EngineUnavailable, on_unavailable)

    async def on_queue_full(request: Request, exc: Exception) -> JSONResponse:
        return error_response(429, str(exc), code="max_queued_requests")

    app.add_exception_handler(QueueFull, on_queue_full)
    app.add_exception_handler(Exception, on_crash)
