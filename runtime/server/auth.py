"""Who may call what. The API key opens the ordinary routes; the admin key (SGLang's
--admin-api-key) also opens the admin ones: /flush_cache, /abort_request with abort_all, and
/debug/*. With no key at all (local development, loopback by default) every route is open;
with an API key but no admin key the admin routes are refused (403) to everyone; with only an
admin key the ordinary routes are open and the admin ones need it. On a
loopback bind the Host header must name loopback, so a web page whose name resolves to
127.0.0.1 cannot reach the server through a browser (DNS rebinding).
"""

from __future__ import annotations

import hmac
from typing import Literal

from fastapi import Request
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError, error_response

OPEN_PATHS = frozenset({"/health"})  # answered without any key
LOOPBACK_BINDS = frozenset({"127.0.0.1", "localhost", "::1"})
LOOPBACK_HOST_NAMES = ("localhost", "127.0.0.1", "[::1]")  # as Host headers carry them
Role = Literal["user", "admin"]  # scope["state"]["role"], set by ApiKeyMiddleware


class ApiKeyMiddleware:
    """With an API key set, every route but OPEN_PATHS needs `Authorization: Bearer KEY`
    (the API key or the admin key): 401 otherwise. Records the caller's role for
    `require_admin`. Keys compare as bytes, so any header value (non-ASCII included) is a
    401, never a crash."""

    def __init__(self, app: ASGIApp, api_key: str | None, admin_api_key: str | None = None):
        self.app = app
        self.api_key = None if api_key is None else api_key.encode()
        self.admin_api_key = None if admin_api_key is None else admin_api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        role = self._role(given or b"")
        scope.setdefault("state", {})["role"] = role
        if role is not None or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        message = "missing API key" if not given else "invalid API key"
        response = error_response(
            401,
            f"{message}: send 'Authorization: Bearer <key>'",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)

    def _role(self, header: bytes) -> Role | None:
        """The admin role for the admin key (and for everyone when no key is set), the user
        role for the API key (and for everyone when only an admin key is set), None: refused."""
        if self.api_key is None and self.admin_api_key is None:
            return "admin"
        scheme, _, token = header.partition(b" ")
        token = token.strip() if scheme.lower() == b"bearer" else b""
        if self.admin_api_key is not None and hmac.compare_digest(token, self.admin_api_key):
            return "admin"
        if self.api_key is None or hmac.compare_digest(token, self.api_key):
            return "user"
        return None


def require_admin(request: Request) -> None:
    """A route dependency: APIError 403 unless the caller holds the admin key (or the server
    has no key at all)."""
    if request.scope.get("state", {}).get("role") == "admin":
        return
    if request.app.state.server.admin_api_key is None:
        raise APIError(
            403,
            f"{request.url.path} is an admin route and this server has an API key but no "
            "admin key: start it with --admin-api-key and send that key",
            code="admin_key_required",
        )
    raise APIError(403, f"{request.url.path} needs the admin key", code="admin_key_required")


class LoopbackHostMiddleware:
    """Starlette's TrustedHostMiddleware over LOOPBACK_HOST_NAMES (any port), answering a
    foreign Host header with a 400 JSON error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.check = TrustedHostMiddleware(self._passed, list(LOOPBACK_HOST_NAMES), False)

    @staticmethod
    async def _passed(scope: Scope, receive: Receive, send: Send) -> None:
        scope["stemma.host_ok"] = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def discard(message: Message) -> None:
            pass  # the check's own plain-text refusal; ours is JSON

        await self.check(scope, receive, discard)
        if scope.pop("stemma.host_ok", False):
            await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")[:100]
        response = error_response(
            400,
            f"Host header {host!r} is not a loopback name: this server binds loopback and "
            f"answers only {', '.join(LOOPBACK_HOST_NAMES)} (with any port)",
            param="host",
        )
        await response(scope, receive, send)
