"""`stemma serve`: options generated from EngineConfig, and the real process: it serves on
loopback, logs each request batch, and on SIGTERM lets in-flight requests finish for
--graceful-timeout seconds, aborts the rest (their streams end with an error event) and
exits 0."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
import uvicorn
from stemma.runtime.config import EngineConfig
from stemma.runtime.server.app import GracefulServer, build_parser, create_app, main

GRACEFUL_TIMEOUT_S = 60  # a bound on a hang: the process exits once its streams are done


def test_every_engine_option_is_a_flag():
    parser = build_parser()
    args = parser.parse_args(["--kv-cache-mb", "64", "--disable-radix-cache", "--page-size", "4"])
    names = {f.name for f in dataclasses.fields(EngineConfig)} - {"model"}
    assert names <= set(vars(args))
    assert (args.kv_cache_mb, args.disable_radix_cache, args.page_size) == (64, True, 4)
    defaults = parser.parse_args([])
    assert defaults.host == "127.0.0.1" and defaults.port == 30000 and defaults.api_key is None
    assert defaults.max_total_tokens is None and defaults.dtype == EngineConfig().dtype


def test_a_bad_engine_option_exits_before_loading(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--dtype", "int3"])
    assert info.value.code == 2
    assert "dtype" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def read_stream(url: str, body: dict, first_event: threading.Event, out: list[str]) -> None:
    """Collect data payloads until the stream ends or the server cuts it."""
    try:
        with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data:"):
                    out.append(line[len("data:") :].strip())
                    first_event.set()
    except httpx.HTTPError:
        out.append("<cut>")
    first_event.set()


def launch(model_dir: str, port: int, log_path) -> subprocess.Popen:
    """`python -m stemma serve` on the tiny model; returns once /health answers."""
    command = [sys.executable, "-m", "stemma", "serve", "--model", model_dir, "--port", str(port)]
    command += ["--dtype", "float32", "--max-total-tokens", "20000"]
    command += ["--graceful-timeout", str(GRACEFUL_TIMEOUT_S)]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, "the server did not come up"
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).raise_for_status()
            return process
        except httpx.HTTPError:
            time.sleep(0.2)


def stream_in_background(url: str, body: dict) -> tuple[threading.Thread, list[str]]:
    """Start reading a stream; returns once its first event arrived."""
    started, events = threading.Event(), []
    thread = threading.Thread(target=read_stream, args=(url, body, started, events))
    thread.start()
    assert started.wait(30)
    return thread, events


def test_serve_then_sigterm_finishes_in_flight_requests_and_exits_0(tiny_llama_dir, tmp_path):
    """The real process: SIGTERM while a stream runs; the stream finishes, the process
    exits 0. The graceful timeout only bounds a hang: the process exits as soon as the
    stream is done, so no CPU is too slow or too fast for it. (Aborting requests still
    running at the timeout: the in-process test below, with the engine held.)"""
    port, log_path = free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    process = launch(str(tiny_llama_dir), port, log_path)
    try:
        assert httpx.post(f"{url}/generate", json={"text": "warm up"}).status_code == 200
        sp = {"max_new_tokens": 200, "ignore_eos": True}
        body = {"text": "The quick fox", "sampling_params": sp, "stream": True}
        thread, events = stream_in_background(url, body)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=GRACEFUL_TIMEOUT_S + 30) == 0
        thread.join(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert events[-1] == "[DONE]" and '"length": 200' in events[-2]
    log_text = log_path.read_text()
    assert "Uvicorn running on http://127.0.0.1" in log_text
    assert re.search(r"POST /generate: 1 req, \d+ new \+ 0 cached prompt tokens", log_text)
    assert "stopped by SIGTERM" in log_text
    assert "Traceback" not in log_text


def test_shutdown_aborts_requests_still_running_at_the_graceful_timeout(
    tiny_engine, step_gate, monkeypatch, caplog
):
    """In-process, with the engine held after the first token: the 32 long requests cannot
    finish before the graceful timeout on any CPU, so the shutdown aborts them (their
    streams end with a 503 error event); the engine is released once all 32 aborts are
    sent."""
    gate = step_gate(tiny_engine, free=1)  # the prefill: every request's first token
    real_abort, aborts = tiny_engine.abort, []

    def abort(rid: str, message: str = "aborted by the caller") -> None:
        real_abort(rid, message)
        aborts.append(rid)
        if len(aborts) == 32:
            gate.release()

    monkeypatch.setattr(tiny_engine, "abort", abort)
    app = create_app(tiny_engine)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    server = GracefulServer(config, app.state.server, graceful_timeout_s=0.2)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    long_sp = {"max_new_tokens": 480, "ignore_eos": True}
    long_body = {"text": ["The lazy dog"] * 32, "sampling_params": long_sp, "stream": True}
    with caplog.at_level(logging.INFO, logger="stemma.server"):
        long_thread, long_events = stream_in_background(url, long_body)
        assert gate.held.wait(30)  # the engine waits before the second token
        server.should_exit = True
        thread.join(timeout=60)
        long_thread.join(timeout=60)
    assert not thread.is_alive() and not long_thread.is_alive()
    assert len(set(aborts)) == 32  # (the streams, as they end, abort their rids again)
    assert long_events[-1] == "[DONE]"
    error = json.loads(long_events[-2])["error"]
    assert "shut down" in error["message"] and error["code"] == 503
    assert "aborting 32 request(s) still running at shutdown" in caplog.text
    assert "POST /generate (stream): stopped after" in caplog.text
