"""Multi-node tensor parallelism on loopback: two processes play two nodes (tp_size 2, nnodes 2,
float64 tiny Llama). The engine's node and `stemma serve --node-rank 1` give tp_size 1's
greedy ids; a killed node fails requests naming its rank; shutting node 0 down makes node 1
exit 0; a missing node, or one with another model or another secret, fails the engine's start
naming it. Both nodes share SECRET through STEMMA_DIST_SECRET."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from stemma.runtime.config import EngineConfig
from stemma.runtime.engine import Engine, EngineUnavailable
from stemma.runtime.executor.tensor_parallel import TensorParallel
from stemma.runtime.executor.tp_auth import SECRET_ENV

from .test_tensor_parallel import OPTS, _gone

GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
SECRET = "0123456789abcdef-two-node-test"


@pytest.fixture(autouse=True)
def shared_secret(monkeypatch):
    """Node 0 (this process) reads the group's secret from the environment, as node 1 does."""
    monkeypatch.setenv(SECRET_ENV, SECRET)


def free_addr() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def start_node(model: Path, addr: str, tp_size: int = 2, secret: str = SECRET) -> subprocess.Popen:
    """`stemma serve` as node 1 of 2: the upper half of tp_size ranks."""
    cmd = [sys.executable, "-m", "stemma", "serve", "--model", str(model),
           "--tp-size", str(tp_size), "--nnodes", "2", "--node-rank", "1",
           "--dist-init-addr", addr, "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", SECRET_ENV: secret}
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)


def children(pid: int) -> list[int]:
    """The live processes whose parent is pid."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            kids.append(int(stat.parent.name))
    return kids


def two_node_engine(model: Path, tp_size: int = 2, **opts) -> tuple[Engine, subprocess.Popen]:
    addr = free_addr()
    node = start_node(model, addr, tp_size)
    try:
        engine = Engine(str(model), tp_size=tp_size, nnodes=2, dist_init_addr=addr, **OPTS, **opts)
    except BaseException:
        node.kill()
        node.wait()
        raise
    return engine, node


def test_two_nodes_equal_tp1_and_node1_exits_with_the_engine(tiny_llama_dir, make_prompts):
    """tp_size 4 over 2 nodes: each node's process spawns one more rank (2 KV heads,
    replicated across ranks)."""
    prompts = make_prompts([5, 40, 3], 384, 7)  # 40 tokens: chunked prefill (16 a chunk)
    with Engine(str(tiny_llama_dir), **OPTS) as tp1:
        want = [o["output_ids"] for o in tp1.generate(input_ids=prompts, sampling_params=GREEDY)]
    engine, node = two_node_engine(tiny_llama_dir, tp_size=4)
    try:
        assert list(engine.tp.procs) == [1] and engine.tp.remote == [2, 3]
        node_ranks = children(node.pid)  # rank 3 and multiprocessing's resource tracker
        assert node_ranks
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == want
    finally:
        engine.shutdown()
    try:
        assert node.wait(10) == 0, node.stderr.read()
    finally:
        node.kill()
    deadline = time.monotonic() + 5  # multiprocessing's resource tracker exits after it
    while any(not _gone(pid) for pid in node_ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in node_ranks if not _gone(pid)] == []


@pytest.mark.parametrize("when", ["mid-stream", "idle"])
def test_killed_node_fails_requests_naming_its_rank(tiny_llama_dir, make_prompts, step_gate, when):
    """Mid-stream, rank 0 is held after the prefill until node 1 is killed, so the next step
    finds rank 1 gone on any CPU and the request ends with the first token only."""
    engine, node = two_node_engine(tiny_llama_dir, dist_timeout_s=5.0)
    try:
        [prompt] = make_prompts([8], 384, 5)
        if when == "mid-stream":
            gate = step_gate(engine, free=1)  # the prefill: the first token
            stream = engine.generate(
                input_ids=prompt, sampling_params={"max_new_tokens": 480, "ignore_eos": True},
                stream=True,
            )  # fmt: skip
            next(stream)
        node.kill()
        start = time.monotonic()
        if when == "mid-stream":
            gate.release()
            *_, last = stream
            reason = last["meta_info"]["finish_reason"]
            assert reason["type"] == "abort"
            assert "rank 1 on node 1 died or hung" in reason["message"]
            assert len(last["output_ids"]) == 1
        else:  # the watchdog: no step runs, the heartbeat goes stale
            while engine.unavailable is None and time.monotonic() - start < 30:
                time.sleep(0.1)
        assert time.monotonic() - start < 30
        with pytest.raises(EngineUnavailable, match="rank 1 on node 1 died or hung"):
            engine.generate(input_ids=prompt, sampling_params=GREEDY)
    finally:
        node.kill()
        node.wait()
        engine.shutdown()


def test_missing_node_fails_the_start_naming_its_ranks(tiny_llama_dir):
    addr = free_addr()
    with pytest.raises(RuntimeError) as e:
        Engine(str(tiny_llama_dir), tp_size=2, nnodes=2, dist_init_addr=addr,
               dist_connect_timeout_s=1.0, **OPTS)  # fmt: skip
    assert f"rank(s) [1] (node(s) [1]) did not connect to {addr} within 1 s" in str(e.value)
    assert "--node-rank 1 --dist-init-addr" in str(e.value)


@pytest.mark.parametrize(
    ("node_model", "secret", "error"),
    [
        ("tiny_qwen2_dir", SECRET, "rank 1 failed to connect: .* is not rank 0's"),
        ("tiny_llama_dir", "another secret, 16+ bytes long", "node 1's secret is not"),
    ],
    ids=["another-model", "another-secret"],
)
def test_a_node_that_disagrees_fails_the_start(tiny_llama_dir, node_model, secret, error, request):
    addr = free_addr()
    node = start_node(request.getfixturevalue(node_model), addr, secret=secret)
    try:
        with pytest.raises(RuntimeError, match=error):
            Engine(str(tiny_llama_dir), tp_size=2, nnodes=2, dist_init_addr=addr, **OPTS)
        assert node.wait(10) != 0
    finally:
        node.kill()
        node.wait()


def test_several_nodes_need_a_secret(monkeypatch, tiny_llama_dir):
    monkeypatch.delenv(SECRET_ENV)
    with pytest.raises(ValueError, match="nnodes=2 needs one secret on every node"):
        Engine(str(tiny_llama_dir), tp_size=2, nnodes=2, dist_init_addr=free_addr(), **OPTS)


def test_node_options_are_checked():
    with pytest.raises(ValueError, match="nnodes=2 needs dist_init_addr HOST:PORT"):
        Engine("unused", tp_size=2, nnodes=2)
    with pytest.raises(ValueError, match="nnodes=2 does not divide tp_size=3"):
        Engine("unused", tp_size=3, nnodes=2, dist_init_addr="127.0.0.1:1")
    cfg = EngineConfig(tp_size=2, nnodes=2, node_rank=1, dist_init_addr="127.0.0.1:1")
    with pytest.raises(ValueError, match="runs only worker ranks"):
        TensorParallel(cfg, "unused", torch.float64)
