"""Live servers for the HTTP tests: uvicorn in a background thread on a free loopback port,
over engines built from the tiny random Llama (fast, gibberish) or SmolLM2-135M (sensible)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from stemma.runtime.engine import Engine
from stemma.runtime.server.app import create_app

API_KEY = "test-key"
SMALL_BODY_LIMIT = 4096


class LiveServer:
    """A uvicorn server for `app` on 127.0.0.1, serving from a daemon thread."""

    def __init__(self, app: Any, engine: Engine) -> None:
        self.engine = engine
        self.api_key: str | None = app.state.server.api_key
        self.max_request_bytes: int = app.state.server.max_request_bytes
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def tiny_engine(tiny_llama_dir: Path) -> Iterator[Engine]:
    engine = Engine(
        str(tiny_llama_dir), dtype="float32", max_total_tokens=16384, max_running_requests=64
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def server(tiny_engine: Engine) -> Iterator[LiveServer]:
    live = LiveServer(create_app(tiny_engine, served_model_name="tiny"), tiny_engine)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def guarded_server(tiny_engine: Engine) -> Iterator[LiveServer]:
    """The same engine behind an API key and a small request-body limit."""
    app = create_app(tiny_engine, api_key=API_KEY, max_request_bytes=SMALL_BODY_LIMIT)
    live = LiveServer(app, tiny_engine)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def smol_server() -> Iterator[LiveServer]:
    """SmolLM2-135M-Instruct, for the few tests that need sensible output."""
    engine = Engine("smollm2-135m", dtype="float32")
    live = LiveServer(create_app(engine), engine)
    yield live
    live.stop()
    engine.shutdown()


def sse_events(response: httpx.Response) -> list[Any]:
    """The `data:` payloads of a finished server-sent-event response; "[DONE]" stays a string."""
    events: list[Any] = []
    for line in response.text.splitlines():
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.fixture(scope="session")
def parse_sse():
    return sse_events


def wait_until_idle(engine: Engine, timeout: float = 30.0) -> dict[str, Any]:
    """Poll the engine's metrics until nothing runs or waits; returns that snapshot."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = engine.get_metrics()
        if metrics["num_running"] == 0 and metrics["num_waiting"] == 0:
            return metrics
        assert time.monotonic() < deadline, f"engine still busy: {metrics['num_running']} running"
        time.sleep(0.05)


@pytest.fixture(scope="session")
def idle_metrics():
    return wait_until_idle


@pytest.fixture(scope="session")
def short_server(tiny_llama_dir: Path) -> Iterator[LiveServer]:
    """A tiny-model server with a 48-token context, so fuzzed requests stay short, and a 2 s
    compile limit, so a fuzzed schema whose automaton is large costs 2 s (its answer is then a
    400, which the fuzz test accepts), not the default 20."""
    engine = Engine(
        str(tiny_llama_dir),
        dtype="float32",
        max_total_tokens=4096,
        context_length=48,
        grammar_timeout_s=2.0,
    )
    live = LiveServer(create_app(engine), engine)
    yield live
    live.stop()
    engine.shutdown()
