"""`stemma serve`: options generated from EngineConfig, and the real process: it serves on
loopback, logs each request batch, and on SIGTERM lets in-flight requests finish for
--graceful-timeout seconds, aborts the rest (their streams end with an error event) and
exits 0."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from stemma.runtime.config import EngineConfig
from stemma.runtime.server.app import build_parser, main

GRACEFUL_TIMEOUT_S = 2


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


def test_serve_then_sigterm_finishes_short_requests_and_aborts_long_ones(tiny_llama_dir, tmp_path):
    port, log_path = free_port(), tmp_path / "server.log"
    url = f"http://127.0.0.1:{port}"
    process = launch(str(tiny_llama_dir), port, log_path)
    try:
        assert httpx.post(f"{url}/generate", json={"text": "warm up"}).status_code == 200
        long_sp = {"max_new_tokens": 480, "ignore_eos": True}
        short_sp = {"max_new_tokens": 20, "ignore_eos": True}
        long_body = {"text": ["The lazy dog"] * 32, "sampling_params": long_sp, "stream": True}
        short_body = {"text": "The quick fox", "sampling_params": short_sp, "stream": True}
        long_thread, long_events = stream_in_background(url, long_body)
        short_thread, short_events = stream_in_background(url, short_body)
        sent_at = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
        assert time.monotonic() - sent_at < GRACEFUL_TIMEOUT_S + 15
        long_thread.join(timeout=30)
        short_thread.join(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert short_events[-1] == "[DONE]" and '"length": 20' in short_events[-2]
    assert long_events[-1] == "[DONE]"
    error = json.loads(long_events[-2])["error"]
    assert "shut down" in error["message"] and error["code"] == 503
    log_text = log_path.read_text()
    assert "Uvicorn running on http://127.0.0.1" in log_text
    assert re.search(r"POST /generate: 1 req, \d+ new \+ 0 cached prompt tokens", log_text)
    assert "aborting 32 request(s) still running at shutdown" in log_text
    assert "POST /generate (stream): stopped after" in log_text
    assert "stopped by SIGTERM" in log_text
    assert "Traceback" not in log_text
