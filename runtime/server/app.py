"""stemma's HTTP server: FastAPI + uvicorn over one Engine; SGLang's native routes and the
OpenAI API (`stemma serve`).

The server is a thin, strict layer: pydantic models at the edge, converted to the engine's
request dicts in the route; every bad input is a 4xx with a JSON error body and the server
keeps serving. It binds to loopback unless told otherwise; SIGTERM stops accepting, lets
in-flight requests finish for --graceful-timeout seconds, then aborts the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import time
import types
from dataclasses import fields
from typing import Any, get_type_hints

import uvicorn
from fastapi import FastAPI

from ..config import EngineConfig
from ..engine import Engine
from ..executor.tp_node import serve_node
from .auth import LOOPBACK_BINDS, ApiKeyMiddleware, LoopbackHostMiddleware
from .data_parallel import serve_dp
from .debug import router as debug_router
from .errors import install_error_handlers
from .metrics import ServerMetrics
from .middleware import BodyLimitMiddleware, RequestCounter
from .openai.routes import router as openai_router
from .routes import router as native_router
from .state import ServerState

log = logging.getLogger("stemma.server")
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SHUTDOWN_MESSAGE = "the server shut down before the request finished"


def create_app(
    engine: Engine,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    admin_api_key: str | None = None,
    host: str | None = None,
) -> FastAPI:
    """The ASGI app serving `engine` (the caller owns the engine and shuts it down). `host` is
    the address the server binds: on loopback, Host headers must name loopback (auth.py)."""
    app = FastAPI(title="stemma", summary="SGLang-compatible and OpenAI-compatible LLM server")
    metrics = ServerMetrics(engine)
    app.state.server = ServerState(
        engine, served_model_name or engine.config.model, api_key, max_request_bytes, metrics,
        admin_api_key=admin_api_key,
    )  # fmt: skip
    install_error_handlers(app)
    app.include_router(native_router)
    app.include_router(openai_router)
    app.include_router(debug_router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    app.add_middleware(ApiKeyMiddleware, api_key=api_key, admin_api_key=admin_api_key)
    if host in LOOPBACK_BINDS:
        app.add_middleware(LoopbackHostMiddleware)
    app.add_middleware(RequestCounter, metrics=metrics)  # outermost: sees 401s and 413s too
    return app


class GracefulServer(uvicorn.Server):
    """uvicorn's graceful shutdown (stop accepting, let connections finish), plus: requests
    still running after `graceful_timeout_s` are aborted, so their clients get an error event
    or response instead of a cut connection, and none is left when the event loop closes."""

    def __init__(self, config: uvicorn.Config, state: ServerState, graceful_timeout_s: float):
        super().__init__(config)
        self.state, self.graceful_timeout_s = state, graceful_timeout_s

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        watchdog = asyncio.create_task(self._abort_late())
        try:
            await super().shutdown(sockets)
        finally:
            watchdog.cancel()
        await self._wait_for_requests(5.0)

    async def _abort_late(self) -> None:
        await asyncio.sleep(self.graceful_timeout_s)
        if self.state.active:
            log.warning("aborting %d request(s) still running at shutdown", len(self.state.active))
        for rid in list(self.state.active):
            self.state.engine.abort(rid, SHUTDOWN_MESSAGE)

    async def _wait_for_requests(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.state.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)


# ---- command line -----------------------------------------------------------------------------
def _add_config_option(group: Any, name: str, hint: Any, default: Any) -> None:
    flag = "--" + name.replace("_", "-")
    if isinstance(hint, types.UnionType):  # `X | None`
        hint = next(a for a in hint.__args__ if a is not type(None))
    if hint is bool:
        group.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        return
    group.add_argument(flag, type=hint, default=default, help=f"default: {default}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stemma serve",
        description="Serve one model over HTTP: SGLang /generate and the OpenAI API.",
    )
    parser.add_argument(
        "--model",
        "--model-path",  # SGLang's name
        dest="model",
        default="smollm2-135m",
        help="built-in name, HF directory or GGUF file (default: smollm2-135m)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="default: loopback only")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    parser.add_argument(
        "--admin-api-key",
        default=None,
        help="the key for /flush_cache, abort_all and /debug/* (refused to --api-key holders)",
    )
    parser.add_argument(
        "--served-model-name", default=None, help="the name /v1 clients use (default: --model)"
    )
    parser.add_argument("--max-request-bytes", type=int, default=DEFAULT_MAX_REQUEST_BYTES)
    parser.add_argument(
        "--graceful-timeout",
        type=int,
        default=30,
        help="seconds in-flight requests get to finish after SIGTERM",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument(
        "--dp-size",
        type=int,
        default=1,
        help="data parallelism: N servers on --port + 1.. behind sglang-router (cache_aware)",
    )
    group = parser.add_argument_group("engine options (EngineConfig)")
    hints = get_type_hints(EngineConfig)
    for f in fields(EngineConfig):
        if f.name != "model":
            _add_config_option(group, f.name, hints[f.name], f.default)
    return parser


def main(argv: list[str]) -> int:
    """`stemma serve ...`: load the model, then serve until SIGINT / SIGTERM."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = {f.name: getattr(args, f.name) for f in fields(EngineConfig) if f.name != "model"}
    try:
        cfg = EngineConfig.from_kwargs(model=args.model, **options)
    except (ValueError, TypeError) as e:
        parser.error(str(e))
    if cfg.node_rank > 0:  # another node's tensor-parallel ranks: no server, no scheduler
        return serve_node(cfg)
    if args.dp_size > 1:
        return serve_dp(_without(argv, ("--dp-size", "--port", "--host")), args.dp_size,
                        args.host, args.port, args.api_key)  # fmt: skip
    if args.host not in LOOPBACK_BINDS and args.api_key is None:
        log.warning("serving on %s without --api-key: anyone who reaches it can use it", args.host)
    engine = Engine(args.model, **options)
    try:
        app = create_app(
            engine,
            served_model_name=args.served_model_name,
            api_key=args.api_key,
            max_request_bytes=args.max_request_bytes,
            admin_api_key=args.admin_api_key,
            host=args.host,
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=False,
            timeout_graceful_shutdown=args.graceful_timeout + 5,  # a backstop behind ours
        )
        server = GracefulServer(config, app.state.server, args.graceful_timeout)
        # uvicorn shuts down gracefully on SIGINT / SIGTERM, then re-raises the signal to the
        # handlers it found; these let main() return so the engine is shut down too.
        handlers = {sig: signal.signal(sig, _note_signal) for sig in STOP_SIGNALS}
        try:
            server.run()
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    finally:
        engine.shutdown()
    return 0


def _without(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """argv minus each flag in `flags` and its value (`--flag v` or `--flag=v`)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not arg.startswith(tuple(f + "=" for f in flags)):
            out.append(arg)
    return out


def _note_signal(signum: int, frame: object) -> None:
    log.info("stopped by %s", signal.Signals(signum).name)
