"""`stemma serve --dp-size N`: the worker command lines and the router launch; end to end
(two servers behind sglang-router on the tiny model) as a slow test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from stemma.runtime.server.app import _without
from stemma.runtime.server.data_parallel import router_command, wait_healthy, warn_if_exposed


def test_worker_argv_drops_the_front_door_flags():
    argv = ["--model", "m", "--dp-size", "2", "--port=30000", "--host", "0.0.0.0", "--tp-size", "2"]
    assert _without(argv, ("--dp-size", "--port", "--host")) == ["--model", "m", "--tp-size", "2"]


def test_router_launch_is_one_cache_aware_command():
    cmd = router_command(["http://127.0.0.1:1", "http://127.0.0.1:2"], "127.0.0.1", 30000)
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    assert cmd[cmd.index("--policy") + 1] == "cache_aware"
    assert cmd[cmd.index("--worker-urls") + 1 : cmd.index("--policy")] == [
        "http://127.0.0.1:1",
        "http://127.0.0.1:2",
    ]


def test_the_router_gets_the_api_key():
    urls = ["http://127.0.0.1:1"]
    cmd = router_command(urls, "0.0.0.0", 30000, api_key="sk-test")
    assert cmd[cmd.index("--api-key") + 1] == "sk-test"
    assert cmd[cmd.index("--host") + 1 : cmd.index("--host") + 4] == ["0.0.0.0", "--port", "30000"]
    assert "--api-key" not in router_command(urls, "127.0.0.1", 30000)


@pytest.mark.parametrize(
    "host, key, warnings",
    [
        ("0.0.0.0", None, ["listens on 0.0.0.0 without --api-key: anyone who reaches it"]),
        ("0.0.0.0", "sk", ["listens on 0.0.0.0: the API key and prompts cross the network"]),
        ("127.0.0.1", None, []),
        ("::1", None, []),
    ],
)
def test_a_router_off_loopback_is_warned_about(caplog, host, key, warnings):
    with caplog.at_level("WARNING", logger="stemma.server"):
        warn_if_exposed(host, key)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == len(warnings)
    assert all(w in m for w, m in zip(warnings, messages))


@pytest.mark.slow
def test_two_servers_behind_the_router(tiny_llama_dir):
    pytest.importorskip("sglang_router")
    port = 31700
    cmd = [sys.executable, "-m", "stemma", "serve", "--model", str(tiny_llama_dir), "--dtype",
           "float64", "--port", str(port), "--dp-size", "2", "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, 120)
        body = {"text": "The quick brown", "sampling_params": {"max_new_tokens": 4},
                "model": "default", "log_metrics": True, "return_hidden_states": False}  # fmt: skip
        req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            assert json.loads(r.read())["meta_info"]["completion_tokens"] == 4
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


@pytest.mark.slow
def test_the_router_requires_the_api_key(tiny_llama_dir):
    pytest.importorskip("sglang_router")
    port, key = 31710, "sk-dp-test"
    cmd = [sys.executable, "-m", "stemma", "serve", "--model", str(tiny_llama_dir), "--dtype",
           "float64", "--port", str(port), "--dp-size", "2", "--api-key", key,
           "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    body = json.dumps({"text": "The quick brown", "sampling_params": {"max_new_tokens": 2}})

    def post(path: str, data: bytes, auth: str | None) -> int:
        headers = {"Content-Type": "application/json"} | (
            {"Authorization": f"Bearer {auth}"} if auth else {}
        )
        try:
            with urllib.request.urlopen(urllib.request.Request(url + path, data, headers),
                                        timeout=60) as r:  # fmt: skip
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        wait_healthy(url, proc, 120)
        assert post("/generate", body.encode(), None) == 401
        assert post("/generate", body.encode(), "sk-wrong") == 401
        assert post("/generate", body.encode(), key) == 200
        worker = json.dumps({"url": "http://127.0.0.2:1"}).encode()
        assert post("/workers", worker, None) == 401  # worker management (/add_worker before)
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
